"""Timing candidates: device events on a GPU, wall clock under the interpreter, or a synthetic rank.

A search times every candidate, then re-times the near-ties interleaved and breaks a remaining tie by
the declared config order, so repeated tunes agree.
"""
from __future__ import annotations

import hashlib
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..core import codec, settings
from ..core.config import Config
from ..core.errors import SearchError

SCREEN_BAND = 0.10    # after a short screening pass, candidates within 10% of the best are re-timed
NOISE_BAND = 0.03     # after re-timing, candidates within 3% of the best are a tie
TIE_ROUNDS = 3       # each re-timing round uses 1/TIE_ROUNDS of the full budget
MAX_RETIMED = 3      # at most this many finalists are re-timed
SCREEN_FRACTION = 10  # the screening pass uses 1/10 of the warmup and rep budget


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


def cpu_bench(fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> float:
    """Median wall-clock ms of `fn` (the interpreter runs on the CPU: no events to time with)."""
    fn()
    times = []
    budget = rep / 1000.0
    start = time.perf_counter()
    while len(times) < 3 or (time.perf_counter() - start < budget and len(times) < 100):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000.0)
    return statistics.median(times)


def gpu_bench(fn: Callable[[], object], warmup: int = 25, rep: int = 100) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def default_bench(interpreted: bool) -> Callable[..., float]:
    return cpu_bench if interpreted else gpu_bench


def pick(candidates: Sequence[Candidate], retime: Callable[[Candidate], float]) -> Candidate:
    """The winner: fastest, with near-ties re-timed interleaved and broken by declared order.

    The first times may come from a short screening pass: everything within SCREEN_BAND of the best is
    re-timed `TIE_ROUNDS` times, interleaved so drift hits every candidate alike, and judged on those.
    """
    ok = [c for c in candidates if math.isfinite(c.time_ms)]
    if not ok:
        errors = "; ".join(f"{c.config}: {c.error or 'failed'}" for c in candidates)
        raise SearchError(f"every candidate failed: {errors}", field="configs")
    best = min(c.time_ms for c in ok)
    band = sorted((c for c in ok if c.time_ms <= best * (1 + SCREEN_BAND)), key=lambda c: c.time_ms)
    finalists = {id(c) for c in band[:MAX_RETIMED]}
    band = [c for c in ok if id(c) in finalists]  # back in declared order
    if len(band) > 1:
        samples = {id(c): [] for c in band}
        for r in range(TIE_ROUNDS):
            order = band[r % len(band):] + band[:r % len(band)]
            for c in order:
                samples[id(c)].append(retime(c))
        for c in band:
            c.time_ms = statistics.median(samples[id(c)])
        best = min(c.time_ms for c in band)
        band = [c for c in band if c.time_ms <= best * (1 + NOISE_BAND)]
    return band[0]  # `candidates` is in declared order: the earliest of a tie wins
