"""How Triton's own search of an adopted `@triton.autotune` kernel is timed and recorded: by
`recording` (`flytune tune`) and by an adopted kernel's search tier (FLYTUNE_AUTOTUNE=1 emits its
winners) alike.

Timing (`timed_as_flytune`): with FLYTUNE_RANKING=synthetic each candidate still runs once but is
ranked by `bench.synthetic_ms`; under TRITON_INTERPRET=1, with no `do_bench` of the kernel's own,
candidates are timed on the wall clock (the interpreter has no driver for Triton's benchmarker).
Both are instance attributes set for the search's duration (`Patches`), Triton's code left as it is.

Checked outputs (`Checking`, inside a tuning session that checks outputs, as `flytune tune` runs a plan's
`autotuner` entry): before Triton times a config, the config launches once on the call's tensors as
the search found them and its outputs are compared with the reference's (`runtime.searching.outputs`: the plan
entry's reference function, else the first config Triton searches for the call that launches: the
objects its `prune_configs` returned, an `early_config_prune`'s own configs and pre_hooks included). A
config that differs is never timed: Triton sees it as infinitely slow, and its candidate carries the
error. Each launch here is Triton's own (`_launch`): the config's pre_hook, then the Autotuner's
`pre_hook(nargs, reset_only=True)` (its `reset_to_zero`), then the kernel, with no `restore_value`
undoing what it wrote. The call's tensors are as found again after each config is timed and after
flytune's selection re-times the finalists; then the winner launches on them once (`launch_winner`), so
the caller's tensors hold the winner's outputs, as after Triton's own run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...core import settings
from ...core.artifact import Artifact
from ...core.config import Config, space_hash
from ...core.errors import FlytuneError, SearchError, one_line
from ..searching import bench, outputs, placement, selection
from ..warming import binder
from .. import device, identity
from ..searching.bench import Candidate
from .triton_keys import artifact_key

# Triton's own (private) Autotuner attributes this adapter reaches: the method that times one config,
# and the do_bench the decorator was given
TRITON_BENCH, TRITON_USER_BENCH = "_bench", "_do_bench"
ROUND_BUDGET = (25.0, 100.0)   # ms of warm-up and timing Triton's do_bench takes per config, shared by a round


class Patches:
    """Instance attributes set on an Autotuner for a while; `restore()` puts back exactly what was there."""

    def __init__(self, obj):
        self.obj, self.saved = obj, []

    def set(self, attr: str, value) -> None:
        had = attr in vars(self.obj)
        self.saved.append((attr, had, vars(self.obj).get(attr)))
        setattr(self.obj, attr, value)

    def restore(self) -> None:
        for attr, had, old in reversed(self.saved):
            if had:
                setattr(self.obj, attr, old)
            else:
                delattr(self.obj, attr)
        self.saved.clear()


def own_timer(tuner):
    """The kernel's own `do_bench`, or None: also when Triton made it from the deprecated `warmup`,
    `rep` or `use_cuda_graph` arguments (a lambda of Triton's, over its GPU benchmarkers)."""
    timer = getattr(tuner, TRITON_USER_BENCH, None)
    return None if timer is None or (getattr(timer, "__module__", None) or "").startswith("triton.") else timer


def can_time(tuner) -> bool:
    """Whether Triton's search of `tuner` can time here as Triton times it: not on the interpreter
    (no driver) unless the kernel brings its own `do_bench`."""
    return not settings.current().interpret or own_timer(tuner) is not None


def timed_as_flytune(tuner, name: str, ranking: str, patches: Patches) -> None:
    """Set the timers a search of `tuner` uses under flytune's settings (the module docstring)."""
    if ranking == "synthetic":
        ranked, timer = _synthetic(tuner, name)
        patches.set(TRITON_BENCH, ranked)
        patches.set("do_bench", timer)
    elif not can_time(tuner):
        patches.set("do_bench", lambda fn, quantiles=None: [bench.cpu_bench(fn)] * 3)


def winner_artifact(tuner, name: str, ranking: str, key: dict, args: tuple, kwargs: dict, winner,
                    picked: "Picked | None" = None) -> Artifact:
    """The artifact of the winner a search just chose for a call, with provenance: Triton's pick, or
    flytune's selection over Triton's timings (`picked`: its candidates, record and output check)."""
    config = Config.coerce(winner)  # its data: a pre_hook stays in the declaration
    spec = binder.record(name, tuner.fn, args, kwargs, config)  # for `flytune warmup`
    space = space_hash([Config.coerce(c) for c in tuner.configs])
    if picked is None:
        return Artifact(name, key, device.current(), config, identity.provenance(candidates(tuner), space, ranking,
                                                                                 spec))
    prov = identity.provenance(picked.candidates, space, ranking, spec, selection=picked.selection.record,
                               outputs=picked.outputs)
    return Artifact(name, key, device.current(), config, prov)


def call_artifact_key(tuner, args: tuple, kwargs: dict) -> dict:
    return artifact_key(tuner, dict(zip(tuner.arg_names, args)), kwargs)


def candidates(tuner, errors: dict[Config, str] | None = None) -> list[Candidate]:
    """Every config Triton's last search of `tuner` timed, with its time (its `configs_timings`) and,
    where the output check rejected it, its error (`errors`)."""
    out = []
    for cfg, t in (getattr(tuner, "configs_timings", None) or {}).items():
        t0 = float(t[0] if isinstance(t, (list, tuple)) else t)
        c = Config.coerce(cfg)
        out.append(Candidate(c, t0 if math.isfinite(t0) else math.inf, (errors or {}).get(c)))
    return out


@dataclass
class Picked:
    """flytune's selection over one of Triton's searches (`select`)."""
    winner: object               # the triton.Config that won
    selection: selection.Selection
    candidates: list[Candidate]  # in Triton's order, finalists' times their round medians
    outputs: dict | None         # provenance.outputs


def select(tuner, name: str, ranking: str, key: dict, args: tuple, kwargs: dict, checking: "Checking") -> Picked:
    """The winner of the search Triton just ran for this call, chosen by flytune's rule (`runtime.searching.selection`:
    finalists re-timed in interleaved rounds by the search's own timer, the sequential test and its tie
    rule, hysteresis against the output's winner for `key`, and with none the guard: the first config
    Triton timed, the one it launches with no search, stays unless beaten by more than the margin).
    Triton's plain minimum is its pick only. A config the output check rejected never wins: where every
    candidate was rejected, a SearchError naming each."""
    objects = list(getattr(tuner, "configs_timings", None) or {})
    cands = candidates(tuner, checking.errors)
    by_candidate = {id(c): o for c, o in zip(cands, objects)}
    patches = Patches(tuner)
    budget = ranking != "synthetic" and own_timer(tuner) is None  # Triton's timer, on a round's share

    def retime(candidate: Candidate, fraction: float) -> float:
        if budget:  # a round times on 1/fraction of Triton's budget (25 ms warm-up, 100 ms), as a ported kernel's
            timer = bench.cpu_bench if settings.current().interpret else bench.gpu_bench
            warm, rep = max(ROUND_BUDGET[0] / fraction, 1.0), max(ROUND_BUDGET[1] / fraction, 1.0)
            patches.set("do_bench", lambda fn, quantiles=None: [timer(fn, warm, rep)] * 3)
        try:
            t = checking.timed(*args, config=by_candidate[id(candidate)], **kwargs)
        finally:
            patches.restore()
        return float(t[0] if isinstance(t, (list, tuple)) else t)

    rule = selection.SYNTHETIC if ranking == "synthetic" else selection.MEASURED
    tuner.nargs = dict(zip(tuner.arg_names, args))   # what Triton's timer reads; None again after its search
    try:
        chosen = selection.pick(cands, retime, rule, selection.shipped(name, key),
                                default=cands[0].config if cands else None)
    finally:
        tuner.nargs = None
        checking.restore()
    return Picked(by_candidate[id(chosen.winner)], chosen, cands, checking.record(cands))


class Checking:
    """The output check of Triton's searches of one Autotuner within `recording` (the module docstring).
    `call(args, kwargs)` opens each call's check, made at its first timed config; `errors` maps each
    rejected config to its error; `record` is the last search's `provenance.outputs`."""

    META = ("grid", "warmup")   # what Triton's launcher adds to a call's keywords: not the kernel's arguments

    def __init__(self, tuner, patches: Patches, heuristics: frozenset = frozenset()):
        self.tuner, self.errors, self.objects = tuner, {}, {}
        self.heuristics = heuristics   # what `@triton.heuristics` over the Autotuner adds to a call's keywords
        self.check: outputs.Check | None = None
        self.checked: dict | None = None   # why nothing was checked, where nothing was
        self.call_site: placement.Site | None = None
        self.timed = timed = getattr(tuner, TRITON_BENCH)   # Triton's, or the synthetic ranking's
        prune = tuner.prune_configs   # the class's, or the wrapper `adopt` installed

        def pruned(kwargs):
            # the configs Triton searches this call, as objects: early_config_prune may make new ones (their
            # pre_hooks with them), a perf_model may reorder or drop declared ones
            configs = prune(kwargs)
            self.objects = _by_config(configs)
            return configs

        def timing(*args, config, **meta):
            caught: list = []   # what Triton's timer raised, which its `_bench` may take as infinitely slow
            try:
                with _watched(tuner, caught):
                    t = timed(*args, config=config, **meta)
            except Exception as e:
                return failed(config, e)
            if caught and not math.isfinite(float(t[0] if isinstance(t, (list, tuple)) else t)):
                self.errors.setdefault(Config.coerce(config), f"{type(caught[-1]).__name__}: {caught[-1]}")
            return t

        def failed(config, e: Exception):
            """A config that failed: as Triton's `_bench` takes it, infinitely slow with its error recorded
            (out of resources, a compile-time assertion, ptxas), else the end of Triton's search."""
            if isinstance(e, FlytuneError):
                raise e
            if isinstance(e, _triton_skips()):
                self.errors.setdefault(Config.coerce(config), f"{type(e).__name__}: {e}")
                return [math.inf] * 3
            # what Triton does not take for a failed config (the interpreter's static_assert, a launch
            # error) ends its search: the job fails naming the config
            raise SearchError(f"{Config.coerce(config)} failed where Triton timed it, which ends Triton's "
                              f"search: {one_line(e)}", field="configs") from None

        def bench_checked(*args, config, **meta):
            if self.call_site is None or not self._open(args, meta):
                return timing(*args, config=config, **meta)
            try:
                self.check(Config.coerce(config))
            except outputs.WrongOutput as e:
                self.errors[Config.coerce(config)] = f"WrongOutput: {e}"
                self.check.restore()
                return [math.inf] * 3
            except outputs.ReferenceUnchecked:
                raise
            except Exception as e:  # noqa: BLE001 - it failed where the check launched it: never timed unchecked
                self.check.restore()
                return failed(config, e)
            self.check.restore()
            try:
                return timing(*args, config=config, **meta)
            finally:
                self.check.restore()
        patches.set("prune_configs", pruned)
        patches.set(TRITON_BENCH, bench_checked)

    def call(self, args: tuple, kwargs: dict) -> None:
        """A new call: its search, if it runs one, is checked under the policy of then."""
        self.check, self.checked, self.errors = None, None, {}
        self.objects = _by_config(self.tuner.configs)   # until Triton prunes them for this call
        kernel_kwargs = {k: v for k, v in kwargs.items() if k not in self.META and k not in self.heuristics}
        self.call_site = placement.Site(args, kernel_kwargs, {**dict(zip(self.tuner.arg_names, args)), **kernel_kwargs})

    def _open(self, args: tuple, meta: dict) -> bool:
        """Whether this search's configs are checked: the check made at its first config, where a policy asks."""
        if self.check is None and self.checked is None:
            if outputs.policy() is None:
                self.checked = {}
                return False
            configs = list(self.objects)   # the reference: the first of them that launches, as the guard's default
            self.check, checked = outputs.start(None, self.call_site, configs, self._launcher(args, meta))
            self.checked = checked or {}
        return self.check is not None

    def _launcher(self, args: tuple, meta: dict):
        def launch(config: Config) -> None:
            _launch(self.tuner, self.objects[config], args, meta)
        return launch

    def restore(self) -> None:
        """The call's tensors as its search found them, where a check holds their copies."""
        if self.check is not None:
            self.check.restore()

    def launch_winner(self, winner, args: tuple, kwargs: dict):
        """Where the check holds the call's tensors as found: put them back and launch `winner` once, as
        Triton's run launches its pick, so the caller's tensors hold the winner's outputs (the rounds
        re-timed after Triton's own launch ran on them, and `restore` undid it). Returns what that launch
        returns; None where nothing launched: without the copies the tensors stay as the last re-timed
        launch left them (Triton's timing restores its `restore_value` ones), as Triton's search leaves them."""
        if self.check is None:
            return None
        self.check.restore()
        self.tuner.nargs = dict(zip(self.tuner.arg_names, args))
        try:
            return _launch(self.tuner, winner, args, kwargs)
        finally:
            self.tuner.nargs = None

    def close(self) -> None:
        """The call ended: the copies of its inputs the check held go now."""
        self.check, self.call_site, self.objects = None, None, {}

    def record(self, cands: list[Candidate]) -> dict | None:
        """`provenance.outputs` of the search this call ran (None outside a tuning session that checks outputs)."""
        if self.check is not None:
            return self.check.record(cands)
        return self.checked or None


def _triton_skips() -> tuple:
    """The errors Triton's `_bench` takes for an infinitely slow config rather than the end of its search."""
    from triton.compiler.errors import CompileTimeAssertionFailure
    from triton.runtime.errors import OutOfResources, PTXASError

    return OutOfResources, CompileTimeAssertionFailure, PTXASError


class _watched:
    """Triton's timer of the Autotuner (its `do_bench`, Triton's or one set for the search) wrapped for a
    while so that what it raises is kept in `caught` (Triton's `_bench` turns some errors into an infinite
    time with no word of why; the candidate then says why)."""

    def __init__(self, tuner, caught: list):
        self.tuner, self.caught, self.done = tuner, caught, False

    def __enter__(self):
        tuner, caught = self.tuner, self.caught
        self.had, self.old = "do_bench" in vars(tuner), vars(tuner).get("do_bench")
        inner = tuner.do_bench

        def do_bench(fn, *args, **kwargs):
            try:
                return inner(fn, *args, **kwargs)
            except Exception as e:
                caught.append(e)
                raise
        do_bench.restore = lambda: self.__exit__()   # `recording` undone in a forked child mid-timing (`undo`)
        tuner.do_bench = do_bench
        return self

    def __exit__(self, *exc):
        if self.done:   # once: a forked child's `undo` may have put it back already
            return
        self.done = True
        if self.had:
            self.tuner.do_bench = self.old
        else:
            vars(self.tuner).pop("do_bench", None)


def _by_config(configs) -> dict:
    """{Config: the triton.Config object}, the first of equal ones, in order."""
    out: dict = {}
    for c in configs:
        out.setdefault(Config.coerce(c), c)
    return out


def _launch(tuner, obj, args: tuple, meta: dict):
    """Launch the config `obj` once, as Triton launches a config: its pre_hook, the Autotuner's
    `pre_hook(nargs, reset_only=True)` (its `reset_to_zero`), then the kernel, with no `restore_value`
    undoing what it wrote. `tuner.nargs` holds the call's positional arguments by name."""
    current = dict(meta, **obj.all_kwargs())
    full = {**tuner.nargs, **current}
    if obj.pre_hook:
        obj.pre_hook(full)
    tuner.pre_hook(full, reset_only=True)
    return tuner.fn.run(*args, **current)


def _synthetic(tuner, name: str):
    """Triton's `_bench`, ranking each config by `bench.synthetic_ms` of the call's artifact key."""
    original = getattr(tuner, TRITON_BENCH)
    current = [math.inf]

    def ranked(*args, config, **meta):
        current[0] = bench.synthetic_ms(name, artifact_key(tuner, tuner.nargs, meta), Config.coerce(config))
        return original(*args, config=config, **meta)

    def timer(kernel_call, quantiles=None):
        kernel_call()  # run all the same: a config that cannot launch must not win
        return [current[0]] * 3
    return ranked, timer
