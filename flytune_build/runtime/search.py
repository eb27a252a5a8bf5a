"""The search tier: time every candidate config on the caller's own inputs and pick the winner.

Invariants (pinned by tests/test_runtime.py):
- the caller's inputs are as they were when the search returns or raises: each candidate starts from
  them (`reset_to_zero` tensors zeroed, `restore_value` tensors copied back), and at the end both are
  copied back from the clones taken before the first candidate;
- a candidate that fails to compile or launch times as infinity, its error kept for the provenance;
  when every candidate fails, `bench.pick` raises a `SearchError` listing every error;
- on a GPU every candidate compiles concurrently before any is timed;
- with FLYTUNE_RANKING=synthetic each candidate still runs once (one that cannot launch never wins),
  but the ranking is a deterministic hash, never a measurement.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ..core import settings
from ..core.config import Config
from ..core.errors import DeclarationError
from . import bench, warning
from .bench import Candidate


@dataclass(frozen=True)
class SearchResult:
    """What one search found: the winner among every candidate timed (in declared order)."""
    winner: Candidate
    candidates: list[Candidate]
    seconds: float   # wall time of the search, precompiling included
    ranking: str     # measured | synthetic


def run(kernel, args: tuple, kwargs: dict, bound: dict, key: dict, grid) -> SearchResult:
    """Search the configs of `kernel` (an `Autotuned`) for this call; its inputs are left as they were."""
    configs = prune(kernel, bound, kwargs)
    rank = bench.ranking()
    with _inputs_kept(bound, kernel.reset_to_zero, kernel.restore_value) as fresh_inputs:
        start = time.perf_counter()

        def launch(cfg: Config):
            fresh_inputs()
            kernel.fn.run(*args, grid=grid, warmup=False, **kwargs, **cfg.launch_kwargs())

        if rank == "synthetic":
            candidates, winner = _synthetic(kernel.name, key, configs, launch)
        else:
            if not kernel.interpreted:
                _precompile(kernel, args, kwargs, grid, configs)
            candidates, winner = _measured(kernel, configs, launch)
    result = SearchResult(winner, candidates, time.perf_counter() - start, rank)
    if settings.current().print_autotuning:
        for c in candidates:
            t = f"{c.time_ms:.4f} ms" if math.isfinite(c.time_ms) else f"failed ({c.error})"
            print(f"[flytune]   {c.config}: {t}", file=sys.stderr)
        print(f"[flytune] {kernel.name} search took {result.seconds:.3f} s", file=sys.stderr)
    return result


def prune(kernel, bound: dict, kwargs: dict) -> list[Config]:
    """The candidates: the declared configs through `prune_configs_by` (Triton's `early_config_prune`,
    then the `top_k` best by `perf_model`)."""
    configs = kernel.configs
    rules = kernel.prune_configs_by
    early = rules.get("early_config_prune")
    if early is not None:
        configs = [Config.coerce(c) for c in early(configs, bound, **kwargs)]
        if not configs:
            raise DeclarationError("early_config_prune returned no config", file=kernel.name,
                                   field="prune_configs_by")
    model, top_k = rules.get("perf_model"), rules.get("top_k")
    if model is not None and top_k:
        k = int(len(configs) * top_k) if isinstance(top_k, float) else int(top_k)
        configs = sorted(configs, key=lambda c: model(**bound, **kwargs, **c.launch_kwargs()))[:max(k, 1)]
    return configs


@contextlib.contextmanager
def _inputs_kept(bound: dict, reset_to_zero: Sequence[str], restore_value: Sequence[str]):
    """Yields the function that resets the inputs before a candidate; on exit, restores them."""
    saved = {n: bound[n].clone() for n in dict.fromkeys(tuple(restore_value) + tuple(reset_to_zero))}

    def fresh_inputs():
        for n in reset_to_zero:
            bound[n].zero_()
        for n in restore_value:
            bound[n].copy_(saved[n])
    try:
        yield fresh_inputs
    finally:
        for n, t in saved.items():
            bound[n].copy_(t)


def _synthetic(name: str, key: dict, configs: list[Config], launch: Callable[[Config], None]):
    def rank(cfg: Config) -> float:
        launch(cfg)  # run all the same: a config that cannot launch must not win
        return bench.synthetic_ms(name, key, cfg)
    candidates = _timed(configs, rank)
    return candidates, bench.pick(candidates, lambda c: bench.synthetic_ms(name, key, c.config))


def _measured(kernel, configs: list[Config], launch: Callable[[Config], None]):
    screen, retime = _timer(kernel, bench.SCREEN_FRACTION), _timer(kernel, bench.TIE_ROUNDS)
    candidates = _timed(configs, lambda cfg: screen(lambda: launch(cfg)))
    return candidates, bench.pick(candidates, lambda c: retime(lambda: launch(c.config)))


def _timed(configs: list[Config], time_ms: Callable[[Config], float]) -> list[Candidate]:
    out = []
    for cfg in configs:
        c = Candidate(cfg)
        try:
            c.time_ms = time_ms(cfg)
        except Exception as e:  # a failing candidate times as infinity
            c.error = f"{type(e).__name__}: {e}"
        out.append(c)
    return out


def _timer(kernel, fraction: int = 1) -> Callable[[Callable[[], object]], float]:
    """The user's `do_bench`, else the default timer with 1/fraction of the warmup and rep budget."""
    if kernel.do_bench is not None:
        def user(fn):
            t = kernel.do_bench(fn)
            return float(t[0] if isinstance(t, (list, tuple)) else t)
        return user
    fn = bench.default_bench(kernel.interpreted)
    warmup, rep = max(kernel.warmup // fraction, 1), max(kernel.rep // fraction, 1)
    return lambda call: fn(call, warmup, rep)


def _precompile(kernel, args, kwargs, grid, configs):
    """Compile every candidate concurrently before timing any (Triton compiles on worker threads)."""
    try:
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return
    try:
        with ThreadPoolExecutor(max_workers=min(len(configs), os.cpu_count() or 4)) as pool:
            with AsyncCompileMode(pool, ignore_errors=True):
                for cfg in configs:
                    try:
                        kernel.fn.warmup(*args, grid=grid, **kwargs, **cfg.launch_kwargs())
                    except Exception:
                        pass  # the timed pass reports the failure
    except Exception as e:  # compiling lazily, one by one, is slower but still right
        warning.once(("precompile", kernel.name), f"flytune: concurrent precompile unavailable ({e}); "
                     "candidates compile one by one")
