"""How a search times its candidates: CUDA graphs or device events on a GPU, this process's CPU time
under the interpreter, the kernel's own `do_bench`, or a synthetic rank.

A search picks its `Measurement` once, before timing anything, and every time it takes comes from
it, so all candidates of one search are comparable. On a GPU a quick first estimate of the device
time (`quick_ms`) decides: a kernel faster than GRAPH_BELOW_MS is timed in CUDA graphs
(`triton.testing.do_bench_cudagraph`: many launches replayed back to back, no launch gaps, warm L2),
since a few-microsecond kernel timed one launch at a time measures mostly launch noise and the
events' resolution; anything slower is timed launch by launch with device events and an L2 flush
before each (`triton.testing.do_bench`). The choice and the budgets are recorded in each artifact's
`provenance.measurement`. Under the interpreter a kernel runs on this process's threads: its CPU
time is the work, while the wall clock of a shared CPU also counts every other process's (on a
loaded 2-core machine, twice the time from one call to the next). How the winner is chosen from the
times is `selection`.
"""
from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...core import codec, settings
from ...core.config import Config

SCREEN_FRACTION = 10    # screening times each candidate on 1/10 of the warmup and rep budget, in all
SCREEN_PASSES = 3       # in three interleaved passes, keeping each candidate's least time
GRAPH_BELOW_MS = 0.05   # a kernel whose quick estimate is under 50 us is timed in CUDA graphs
GRAPH_REPLAYS = 10      # do_bench_cudagraph replays its graph 10 times: its `rep` is a tenth of its time
REFINE_BELOW_MS = 0.2   # a first estimate under 200 us may be mostly launch path: `quick_ms` refines it


@dataclass
class Candidate:
    config: Config
    time_ms: float = math.inf
    error: str | None = None

    def to_json(self) -> dict:
        out = {"config": self.config.to_json(), "time_ms": self.time_ms if math.isfinite(self.time_ms) else None}
        if self.error:
            out["error"] = self.error[:4000]
        return out


def ranking() -> str:
    """`synthetic` when FLYTUNE_RANKING=synthetic: deterministic, for CI and interpreter artifacts."""
    return settings.current().ranking


def synthetic_ms(kernel: str, key: dict, config: Config) -> float:
    """A deterministic pseudo-time in [1, 2) ms: a stable ranking, never a measurement."""
    digest = hashlib.sha256(codec.canonical([kernel, key, config.to_json()])).digest()
    return 1.0 + int.from_bytes(digest[:6], "big") / float(1 << 48)


def cpu_bench(fn: Callable[[], object], warmup: float = 25, rep: float = 100) -> float:
    """The least CPU time of this process, in ms, over at least two calls of `fn` within `rep` ms of
    it (the interpreter: no device events to time with). The least, not the median: interruptions only
    ever add time."""
    fn()
    times = []
    budget = rep / 1000.0
    start = time.process_time()
    while len(times) < 2 or (time.process_time() - start < budget and len(times) < 100):
        t = time.process_time()
        fn()
        times.append((time.process_time() - t) * 1000.0)
    return min(times)


def gpu_bench(fn: Callable[[], object], warmup: float = 25, rep: float = 100) -> float:
    """Median ms of `fn` launched one at a time between device events, L2 flushed before each."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def graph_bench(fn: Callable[[], object], rep: float) -> float:
    """Median ms of `fn` in a CUDA graph of back-to-back launches (about `rep` ms per replay)."""
    from triton.testing import do_bench_cudagraph

    return float(do_bench_cudagraph(fn, rep=rep, return_mode="median"))


def quick_ms(fn: Callable[[], object]) -> float:
    """A first estimate of the kernel's device time. Five launches, each between device events, bound
    it from above: they also time Python's launch path (on an H200 a 2 us rmsnorm read 28-32 us and a
    7 us matmul 27 to 51 us, on both sides of GRAPH_BELOW_MS, so two cold runs timed one kernel with
    different timers). Under REFINE_BELOW_MS, where that path could decide the timer, a short CUDA
    graph of back-to-back launches (`graph_bench`) gives the device time; where no graph can be
    captured, the bound stands."""
    from triton import runtime

    di = runtime.driver.active.get_device_interface()
    fn()
    di.synchronize()
    events = [(di.Event(enable_timing=True), di.Event(enable_timing=True)) for _ in range(5)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    di.synchronize()
    bound = min(start.elapsed_time(end) for start, end in events)
    if bound >= REFINE_BELOW_MS:
        return bound
    try:
        return min(bound, graph_bench(fn, GRAPH_BELOW_MS))
    except Exception:  # noqa: BLE001 - no graph of this call: the bound decides (on_gpu checks graphs again)
        return bound


@dataclass(frozen=True)
class Measurement:
    """One search's timer and budget (the kernel's `warmup` and `rep`, in ms); `bench(n)` times on 1/n of it."""
    timer: str                        # one of core.choice.TIMERS
    warmup_ms: float
    rep_ms: float
    estimate_ms: float | None = None  # the quick first estimate that chose the timer (GPU)
    note: str | None = None
    user: Callable | None = field(default=None, compare=False)  # the kernel's own do_bench
    placements: int = 1               # the inputs' placements the passes and rounds rotate over (`placement`)
    placement_note: str | None = None  # why there is only one

    @property
    def screen_passes(self) -> int:
        return 1 if self.timer == "user" else SCREEN_PASSES  # the kernel's own do_bench sets its own budget

    @property
    def l2_flush(self) -> bool:
        return self.timer == "cuda-events"  # do_bench flushes L2 before each launch; a graph replays warm

    def bench(self, fraction: float) -> Callable[[Callable[[], object]], float]:
        """A timer of one call on 1/fraction of the budget."""
        warmup, rep = max(self.warmup_ms / fraction, 1.0), max(self.rep_ms / fraction, 1.0)
        if self.timer == "user":
            def user(fn):
                t = self.user(fn)
                return float(t[0] if isinstance(t, (list, tuple)) else t)
            return user
        if self.timer == "cuda-graph":
            return lambda fn: graph_bench(fn, rep / GRAPH_REPLAYS)
        if self.timer == "cuda-events":
            return lambda fn: gpu_bench(fn, warmup, rep)
        return lambda fn: cpu_bench(fn, warmup, rep)

    def to_json(self) -> dict:
        """`provenance.measurement`."""
        if self.timer == "synthetic":
            return {"timer": self.timer}
        out = {"timer": self.timer, "l2_flush": self.l2_flush, "warmup_ms": self.warmup_ms, "rep_ms": self.rep_ms,
               "screen_fraction": SCREEN_FRACTION, "screen_passes": self.screen_passes}
        if self.timer in ("cuda-graph", "cuda-events"):
            out["graph_below_ms"] = GRAPH_BELOW_MS
        if self.estimate_ms is not None:
            out["estimate_ms"] = float(f"{self.estimate_ms:.6g}")
        if self.note:
            out["note"] = self.note[:500]
        if self.timer != "cpu-time":
            out["placements"] = self.placements
            if self.placement_note:
                out["placement_note"] = self.placement_note[:300]
        return out


def on_gpu(warmup: float, rep: float, calls: Sequence[Callable[[], object]]) -> Measurement:
    """The GPU timer for these candidate calls: CUDA graphs when the fastest one's quick estimate is under
    GRAPH_BELOW_MS and a graph of it can be captured, device events otherwise."""
    estimates = []
    for call in calls:
        try:
            estimates.append((quick_ms(call), call))
        except Exception:  # noqa: BLE001 - this candidate fails; screening records why
            pass
    if not estimates:
        return Measurement("cuda-events", warmup, rep, note="no candidate launched for the first estimate")
    best, call = min(estimates, key=lambda e: e[0])
    if best >= GRAPH_BELOW_MS:
        return Measurement("cuda-events", warmup, rep, best)
    try:
        graph_bench(call, 0.1)
    except Exception as e:  # noqa: BLE001 - no graphs here: every candidate is timed launch by launch
        return Measurement("cuda-events", warmup, rep, best, f"CUDA graphs unavailable: {type(e).__name__}: {e}")
    return Measurement("cuda-graph", warmup, rep, best)
