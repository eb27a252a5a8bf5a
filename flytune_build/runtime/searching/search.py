"""The search tier: time every candidate config on the caller's inputs and pick the winner.

Invariants (pinned by tests/test_runtime.py):
- the caller's inputs are as they were when the search returns or raises: each candidate starts from
  them (`reset_to_zero` tensors zeroed, `restore_value` tensors copied back), and at the end both are
  copied back from the clones taken before the first candidate;
- a candidate that fails to compile or launch times as infinity, its error kept for the provenance;
  when every candidate fails, `selection.pick` raises a `SearchError` listing every error;
- on a GPU every candidate compiles concurrently before any is timed;
- with FLYTUNE_RANKING=synthetic each candidate still runs once (one that cannot launch never wins),
  but the ranking is a deterministic hash, never a measurement;
- inside a tuning session that checks outputs (`session`, as `flytune tune` opens), each candidate's outputs are checked against a reference
  (a config's, or the plan entry's reference function's) on the same inputs: one that differs times as
  infinity and never wins, its error saying where it differed;
- candidates are timed in declared order (the tie rule's order, `selection`), with one `bench.Measurement`
  chosen before any is timed; inside a session that holds the output's winners (`session.shipped`) the shipped winner is a finalist;
- on a GPU the passes and rounds rotate over `placement` copies of the inputs: the caller's tensors are
  placement 0, no copy is ever written back to them, and the copies are released before `run`
  returns or raises (tests/test_placement.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...core import settings
from ...core.config import Config
from ...core.errors import DeclarationError
from .. import callbacks, warning
from . import bench, outputs, placement, selection, session
from .bench import Candidate


@dataclass(frozen=True)
class SearchResult:
    """What one search found: the winner among every candidate timed (in declared order)."""
    winner: Candidate
    candidates: list[Candidate]
    seconds: float   # wall time of the search, precompiling included
    ranking: str     # measured | synthetic
    measurement: dict | None = None   # provenance.measurement: how the times were taken
    selection: dict | None = None     # provenance.selection: the band, the finalists, why the winner won
    hook_source: Any = None           # the config `early_config_prune` made for the winner, with its pre_hook
    outputs: dict | None = None       # provenance.outputs: the reference the candidates' outputs were checked against


@dataclass(frozen=True)
class Found:
    """One search's outcome, as the tuning engine takes it (`session.opened(collect=True)`): the kernel, its winner as an
    artifact with provenance, every candidate timed (declared order) and the winning candidate. Made
    where a search ends: by the autotuner, and by a recorded `@triton.autotune` search alike."""
    kernel: str
    artifact: Any
    candidates: list
    winner: Candidate


def report(found: Found) -> None:
    """A search ended: add it to every list the current tuning session collects into (`session.found`)."""
    for got in session.current().found:
        got.append(found)


def run(kernel, args: tuple, kwargs: dict, bound: dict, key: dict, grid) -> SearchResult:
    """Search the configs of `kernel` (an `Autotuned`) for this call; its inputs are left as they were."""
    pruned, sources = prune(kernel, bound, kwargs)
    configs = declared_order(pruned, kernel.configs)
    rank = bench.ranking()
    shipped = selection.shipped(kernel.name, key)
    default = _default(kernel, bound, configs)
    with _inputs_kept(bound, kernel.reset_to_zero, kernel.restore_value) as fresh_inputs:
        start = time.perf_counter()

        if rank == "synthetic" or kernel.interpreted:
            placements = placement.Placements([placement.Site(args, kwargs, bound)],
                                              "the interpreter" if kernel.interpreted else None)
        else:
            placements = placement.spread(args, kwargs, bound, selection.MEASURED.rounds,
                                          _hooks(kernel, configs, sources))
        launch = callbacks.Launcher(kernel, grid, fresh_inputs, placements.sites, sources)  # Triton's hooks around each
        try:
            if not kernel.interpreted and rank != "synthetic":
                _precompile(kernel, args, kwargs, grid, configs, sources)
            check, checked = outputs.start(kernel, placements.sites[0], configs, launch)
            if rank == "synthetic":
                candidates, chosen, measure = _synthetic(kernel, key, configs, check or launch, shipped, default)
                if check is not None:
                    check.restore()
            else:
                wrong = check.screen(configs) if check is not None else {}
                candidates, chosen, measure = _measured(kernel, configs, launch, shipped, placements, wrong, default)
            if check is not None:
                checked = check.record(candidates)
        finally:  # the copies go now, even when a traceback keeps this frame alive (`launch` shares the list)
            del placements.sites[1:]
            check = None  # the copies of the inputs the check held
    launch.settle(chosen.winner.config)
    result = SearchResult(chosen.winner, candidates, time.perf_counter() - start, rank, measure.to_json(),
                          chosen.record, sources.get(chosen.winner.config), checked)
    if settings.current().print_autotuning:
        for c in candidates:
            t = f"{c.time_ms:.4f} ms" if math.isfinite(c.time_ms) else f"failed ({c.error})"
            print(f"[flytune]   {c.config}: {t}", file=sys.stderr)
        print(f"[flytune] {kernel.name} search took {result.seconds:.3f} s", file=sys.stderr)
    return result


def _hooks(kernel, configs, sources) -> tuple:
    """Every hook a candidate's launch runs: the autotune pre/post hooks and the configs' pre_hooks."""
    owners = (kernel.hooks.owner(cfg, sources.get(cfg)) for cfg in configs)
    return tuple(h for h in (*kernel.search_hooks, *(o.pre_hook for o in owners if o is not None)) if h is not None)


def prune(kernel, bound: dict, kwargs: dict) -> tuple[list[Config], dict[Config, Any]]:
    """The candidates: the declared configs through `prune_configs_by`, called as Triton calls it:
    `early_config_prune(configs as declared, nargs, **kwargs)`, then the `top_k` best by
    `perf_model(**nargs, **kwargs, **config.all_kwargs())`, nargs being the arguments passed by position.
    With them, by data, every config `early_config_prune` returned, as it returned it (before `top_k`):
    one may carry a `pre_hook` the declared ones lack (gemlite's pruner attaches `init_to_zero` to the
    split-K configs it makes), which then launches with that config."""
    nargs = {name: v for name, v in bound.items() if name not in kwargs}
    returned = _early(kernel, nargs, kwargs)
    configs = [c for c, _ in returned] if returned else kernel.configs
    sources = dict(returned)
    rules = kernel.prune_configs_by
    model, top_k = rules.get("perf_model"), rules.get("top_k", 1.0)
    if model is not None:
        if isinstance(top_k, float) and top_k <= 1.0:  # a fraction of all the declared configs, as in Triton
            top_k = int(len(kernel.configs) * top_k)
        elif not isinstance(top_k, int) or isinstance(top_k, bool):
            raise DeclarationError(f"must be a float <= 1.0 or an int, not {top_k!r}", file=kernel.name,
                                   field="prune_configs_by.top_k")
        if len(configs) > top_k:
            configs = sorted(configs, key=lambda c: model(**nargs, **kwargs, **callbacks.all_kwargs(sources.get(c, c))))
            configs = configs[:max(top_k, 1)]
    return configs, sources


def made(kernel, bound: dict, kwargs: dict) -> dict[Config, Any]:
    """What the kernel's `early_config_prune` returns for this call, as `prune` calls it: each config (as
    flytune's Config) -> the object returned (which may carry a pre_hook); empty without a pruner."""
    return dict(_early(kernel, {name: v for name, v in bound.items() if name not in kwargs}, kwargs))


def _early(kernel, nargs: dict, kwargs: dict) -> list[tuple[Config, Any]]:
    """(flytune's Config, the object returned) for each config `early_config_prune(declared configs, nargs,
    **kwargs)` returns, consumed, in its order (duplicates kept, as Triton keeps them); [] without one."""
    early = kernel.prune_configs_by.get("early_config_prune")
    if early is None:
        return []
    returned = list(early(list(getattr(kernel, "declared", kernel.configs)), nargs, **kwargs))
    if not returned:
        raise DeclarationError("early_config_prune returned no config", file=kernel.name, field="prune_configs_by")
    return [(Config.coerce(c), c) for c in returned]


class _Reads(dict):
    """The arguments handed to an `early_config_prune`, which note each one it reads by name (`read`);
    any walk over them all (iteration, `keys`, `items`, `values`, a copy, `**`) sets `whole`."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: set[str] = set()
        self.whole = False

    def __getitem__(self, name):
        self.read.add(name)
        return dict.__getitem__(self, name)

    def get(self, name, default=None):
        self.read.add(name)
        return dict.get(self, name, default)

    def __contains__(self, name):
        self.read.add(name)
        return dict.__contains__(self, name)

    def __iter__(self):
        self.whole = True
        return dict.__iter__(self)

    def __eq__(self, other):
        self.whole = True
        return dict.__eq__(self, other)

    def __ne__(self, other):
        self.whole = True
        return dict.__ne__(self, other)

    def __repr__(self):
        self.whole = True
        return dict.__repr__(self)

    def __or__(self, other):   # operators are looked up on the type, not through __getattribute__
        self.whole = True
        return dict.__or__(self, other)

    def __ror__(self, other):
        self.whole = True
        return dict.__ror__(self, other)

    __hash__ = None

    def __getattribute__(self, name):   # a method that walks every argument (`keys`, `items`, `copy`, ...)
        if name in _WALKS:
            dict.__setattr__(self, "whole", True)
        return dict.__getattribute__(self, name)


_WALKS = frozenset(("keys", "items", "values", "copy", "pop", "popitem", "setdefault", "update", "__reduce__",
                    "__reduce_ex__"))


def prunes_by(kernel, bound: dict, kwargs: dict, names: Sequence[str], dtypes: Sequence[str] = ()) -> bool:
    """Whether the kernel's `early_config_prune`, called on `bound` as `prune` calls it and its result
    consumed, reads no argument but `names` and, of the arguments `dtypes`, only their `dtype` and
    `element_size()` (and walks none of the others): what it returns then depends on values the key
    holds, so a call made of stand-ins carrying them prunes as the call would. False where it raises.
    Not seen: keyword arguments (`**kwargs` reach it as a fresh dict; a warm-up's stand-ins pass every
    parameter by position) and reads through `dict`'s own methods called unbound."""
    typed = {name: _DtypeOnly(bound[name]) for name in dtypes if name in bound and name not in kwargs}
    nargs = _Reads({name: typed.get(name, v) for name, v in bound.items() if name not in kwargs})
    try:  # consumed (`_early`): a pruner returning a generator or `filter(...)` reads as it is consumed
        _early(kernel, nargs, kwargs)
    except Exception:  # noqa: BLE001 - a stand-in it cannot read: the call's own arguments decide
        return False
    return (not nargs.whole and nargs.read <= set(names) | set(typed)
            and not any(t.other for t in typed.values()))


class _DtypeOnly:
    """A tensor stand-in handed to a pruner: its `dtype` and `element_size()` read freely (the key holds
    the dtype), anything else noted (`other`)."""
    __slots__ = ("value", "other")

    def __init__(self, value):
        self.value, self.other = value, False

    @property
    def dtype(self):
        return self.value.dtype

    def element_size(self) -> int:
        return self.value.dtype.itemsize

    def __getattr__(self, name):
        self.other = True
        return getattr(self.value, name)


@contextlib.contextmanager
def _inputs_kept(bound: dict, reset_to_zero: Sequence[str], restore_value: Sequence[str]):
    """Yields the function that resets the inputs before a candidate; on exit, restores them."""
    saved = {n: bound[n].clone() for n in dict.fromkeys(tuple(restore_value) + tuple(reset_to_zero))}

    def fresh_inputs(where: dict | None = None):   # `where`: one placement's bound parameters
        where = bound if where is None else where
        for n in reset_to_zero:
            where[n].zero_()
        for n in restore_value:
            where[n].copy_(saved[n])
    try:
        yield fresh_inputs
    finally:
        for n, t in saved.items():
            bound[n].copy_(t)


def declared_order(configs: list[Config], declared: Sequence[Config]) -> list[Config]:
    """`configs` in the kernel's declared order (a config `early_config_prune` made up goes last)."""
    position: dict[Config, int] = {}
    for i, c in enumerate(declared):
        position.setdefault(c, i)
    return sorted(configs, key=lambda c: position.get(c, len(position)))


def _default(kernel, bound: dict, configs: list[Config]) -> Config | None:
    """The config the kernel runs with no tuned one: its `default` for this call, else its first config
    (what FLYTUNE_AUTOTUNE=0 launches); the winner must beat it (`selection.pick`)."""
    default = getattr(kernel, "default", None)  # an adopted kernel's search has none: its first config
    if default is None:
        return configs[0] if configs else None
    try:
        return Config.coerce(default(bound))
    except Exception:  # noqa: BLE001 - a default that fails here fails at its own call: no guard then
        return None


def _synthetic(kernel, key: dict, configs: list[Config], launch: Callable[[Config], None], shipped,
               default: Config | None = None):
    def rank(cfg: Config) -> float:
        launch(cfg)  # run all the same: a config that cannot launch must not win
        return bench.synthetic_ms(kernel.name, key, cfg)
    candidates = _timed(configs, rank)
    chosen = selection.pick(candidates, lambda c, _: bench.synthetic_ms(kernel.name, key, c.config),
                            selection.SYNTHETIC, shipped, default=default)
    return candidates, chosen, bench.Measurement("synthetic", kernel.num_warmups, kernel.num_reps)


def _measured(kernel, configs: list[Config], launch: callbacks.Launcher, shipped, placements: placement.Placements,
              wrong: dict[Config, Exception], default: Config | None = None):
    """Screening passes and finalist rounds each time a config on its next placement (`placement`);
    a config the output check failed (`wrong`: config -> its error, `outputs.Check.screen`) is not timed."""
    measure = dataclasses.replace(_measurement(kernel, configs, launch), placements=len(placements),
                                  placement_note=placements.note)
    screen = measure.bench(bench.SCREEN_FRACTION * measure.screen_passes)

    def screened(cfg: Config) -> float:
        if cfg in wrong:
            raise wrong[cfg]
        return screen(launch.at(cfg))
    candidates = _timed(configs, screened)
    for _ in range(measure.screen_passes - 1):  # interleaved passes, the least kept: a burst of load hits one
        _again(candidates, lambda c: screen(launch.at(c.config)))
    chosen = selection.pick(candidates, lambda c, fraction: measure.bench(fraction)(launch.at(c.config)),
                            selection.rule_for(measure.timer), shipped, default=default)
    return candidates, chosen, measure


def _measurement(kernel, configs: list[Config], launch: Callable[[Config], None]) -> bench.Measurement:
    """The kernel's own `do_bench`; CPU time under the interpreter; on a GPU, by a first estimate."""
    if kernel.do_bench is not None:
        return bench.Measurement("user", kernel.num_warmups, kernel.num_reps, user=kernel.do_bench)
    if kernel.interpreted:
        return bench.Measurement("cpu-time", kernel.num_warmups, kernel.num_reps)
    return bench.on_gpu(kernel.num_warmups, kernel.num_reps, [lambda cfg=cfg: launch(cfg) for cfg in configs])


def _again(candidates: list[Candidate], time_ms: Callable[[Candidate], float]) -> None:
    """Time each candidate that has not failed once more, keeping its least time."""
    for c in candidates:
        if math.isfinite(c.time_ms):
            try:
                c.time_ms = min(c.time_ms, time_ms(c))
            except Exception as e:  # a failing candidate times as infinity
                c.time_ms, c.error = math.inf, f"{type(e).__name__}: {e}"


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


def _precompile(kernel, args, kwargs, grid, configs, sources):
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
                        hook = kernel.hooks.bind(cfg, sources.get(cfg))  # it may set what the compile specialises on
                        if hook is not None:
                            hook(args, kwargs)
                        kernel.fn.warmup(*args, grid=grid, **kwargs, **cfg.launch_kwargs())
                    except Exception:
                        pass  # the timed pass reports the failure
    except Exception as e:  # compiling lazily, one by one, is slower but still right
        warning.once(("precompile", kernel.name), f"flytune: concurrent precompile unavailable ({e}); "
                     "candidates compile one by one")
