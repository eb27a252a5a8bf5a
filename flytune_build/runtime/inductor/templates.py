"""GEMM template choices (max-autotune's `select_algorithm`, torch 2.10+) served and recorded.

Where Inductor turns a matmul's templates into its list of choices (the patch of runtime.inductor.hooks,
`install_gemm()`), the serving or recording innermost in the compiling context gets the call:

- a serving (`serve`) looks the lowering up through Inductor's own lookup (`hooks.lookup_choices`) over
  the GEMM winners of the servings open in this context: a hit is the one shipped choice. Inductor may ask
  for one lowering's choices in several calls, then selects among all of them once (`select`, the patch
  of `AlgorithmSelectorCache.__call__`): there a served lowering keeps only the shipped choice, so Inductor
  benchmarks nothing; an unserved one is Inductor's own list, counted as benchmarked where it holds more
  than one choice (FLYTUNE_AUTOTUNE=strict: a `TierMissError`).
- a recording (`note_keys`, then `record` from Inductor's feedback) notes each choice's key (flytune's,
  `key_of`, which must be Inductor's own), and once Inductor has timed a select's choices, flytune's
  selection picks the winner among those a table entry can name, re-timing finalists with Inductor's
  profiler benchmark, and Inductor is told that winner; where the scheduler then builds another choice
  with its epilogue fused (`built_as`), that one is recorded. One key, one winner per harvest.

A choice is a table entry: its template's uid, kwargs and source hash (`entry_of`), as core.gemm writes it.
"""
from __future__ import annotations

import contextvars
import math

from ...core import gemm, settings
from ...core.errors import ArtifactError, FlytuneError, TierMissError
from .. import warning
from ..serving.kernel import must_hit
from . import hooks

# a GEMM finalist's re-timing is Inductor's profiler benchmark of it (0.1-1 s): at most 3 finalists, 10 rounds
GEMM_LIMITS = {"max_finalists": 3, "max_rounds": 10}


def key_of(kernel_inputs, op_name: str) -> str:
    """flytune's key of a matmul's lowering (core.gemm.lookup_key): what a harvest records and a serving
    counts by; tests check it is Inductor's own (`hooks.inductor_gemm_key`) for the installed torch."""
    inputs, scalars = hooks.gemm_inputs(kernel_inputs)
    return gemm.lookup_key(inputs, scalars, op_name)


def ktc_of(choice):
    """The KernelTemplateChoice a benchmarked choice was made from (Inductor's `annotations["ktc"]`), or None."""
    return (getattr(choice, "annotations", None) or {}).get("ktc")


def entry_of(choice) -> tuple[str, dict, str | None] | None:
    """(template uid, kwargs, template source hash) of a benchmarked choice, as a table entry names it;
    None where no entry can (a choice added outside the template lookup, CUTLASS or CK, or kwargs that
    are not JSON scalars)."""
    ktc = ktc_of(choice)
    if ktc is None:
        return None
    kwargs = {k: _scalar(v) for k, v in ktc.params.to_kwargs().items()}
    if not all(isinstance(k, str) and (v is None or isinstance(v, (bool, int, float, str))) for k, v in kwargs.items()):
        return None
    source_hash = getattr(ktc.template, "src_hash", None)
    return ktc.template.uid, kwargs, source_hash if isinstance(source_hash, str) else None


def _scalar(v):
    """A kwarg as JSON holds it: a sympy integer or boolean (a size Inductor knows statically) as Python's."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if getattr(v, "is_Boolean", False) and v in (True, False):
        return bool(v)
    if getattr(v, "is_Integer", False):
        return int(v)
    return v


def choice_name(choice) -> str:
    return str(getattr(choice, "name", None) or type(choice).__name__)


# -- serving ---------------------------------------------------------------------------------------------------
class Lowering:
    """One matmul's lowering in progress in a context: Inductor asks for its choices in one or more
    finalize calls (torch 2.13's addmm: ATen's templates, the contiguous one, then the Triton ones), then
    selects among all of them once. `served`: the shipped choice, once a call offering its template made
    it; `made`: every choice handed to Inductor for this lowering (what its select must come from)."""

    def __init__(self, key: str, shipped):
        self.key, self.shipped = key, shipped
        self.served: list = []
        self.made: list = []

    def made_here(self, choices) -> bool:
        return any(ktc_of(c) is k for c in choices for k in self.made)


_lowering: contextvars.ContextVar[Lowering | None] = contextvars.ContextVar("flytune_gemm_lowering", default=None)


def serve(serving, here: list, original, handler, template_choices, kernel_inputs, templates, op_name, *args,
          **kwargs) -> list:
    """The choices of one finalize call of a lowering: the shipped choice where this call offers its template
    and Inductor's lookup over `here` (the servings open in this context, the first opened first) takes
    it; none once the lowering's shipped choice is made (the calls after it add nothing to benchmark); else
    Inductor's own, which the lowering's select drops where the shipped choice is among them (`select`)."""
    key = key_of(kernel_inputs, op_name)
    low = _lowering.get()
    offered = {t.uid for t in templates}
    if low is None or low.key != key or (low.served and low.shipped.entry.get("template_id") in offered):
        low = Lowering(key, next((o.gemm[key] for o in here if key in o.gemm), None))  # a new lowering
        _lowering.set(low)
    if low.shipped is not None:
        if low.served:
            return []
        if low.shipped.entry.get("template_id") in offered:  # the lowering's entry, as a one-key table
            got = hooks.lookup_choices({key: [low.shipped.entry]}, kernel_inputs, templates, op_name)
            if got:
                low.served = list(got)
                low.made += got
                return got
    out = original(handler, template_choices, kernel_inputs, templates, op_name, *args, **kwargs)
    low.made += out
    return out


def select(serving, original, cache, name, choices, *args, **kwargs):
    """Inductor's select among a lowering's choices: only the shipped one where the lowering made it
    (choices added outside the template lookup, CUTLASS, CK or C++, dropped with the rest), counted;
    only the user's where a lookup of the user's own answered one of the lowering's calls (theirs are the
    choices made from a template config no call flytune saw made), uncounted;
    Inductor's own list, counted as benchmarked where it holds more than one (FLYTUNE_AUTOTUNE=strict: a
    `TierMissError`). A select of no lowering made here (a convolution, flex attention) is Inductor's."""
    from .counts import Kernel

    low = _lowering.get()
    if low is None or not low.made_here(choices):
        return original(cache, name, choices, *args, **kwargs)
    _lowering.set(None)
    op, key, shipped = gemm.op_of(low.key), low.key, low.shipped
    theirs = [c for c in choices if ktc_of(c) is not None and not low.made_here([c])]
    if low.served and theirs:  # a handler of the user's answered part of this lowering: it decides, uncounted
        return original(cache, name, theirs, *args, **kwargs)
    if low.served:
        choices = [c for c in choices if any(ktc_of(c) is k for k in low.served)]
        if not choices:   # Inductor dropped the shipped choice, built as it selects it (`choice_or_none`: None)
            raise ArtifactError(f"the {gemm.describe(key)} choice {shipped.entry.get('template_id')} cannot be "
                                f"built by Inductor (its template declined the config for this matmul): it is not "
                                f"among the choices Inductor selects from", file=shipped.origin, field="config")
        serving.decided(Kernel(op, key, "offline", shipped.entry, shipped.origin, shipped.level, "gemm"))
        return original(cache, name, choices, *args, **kwargs)
    untaken = (f"Inductor's lookup did not take the choice the bundle holds for it ({shipped.origin}: "
               f"{shipped.entry.get('template_id')}; this lowering offers none of its template's configs, or the "
               f"template's source changed since the harvest: another template_hash)") if shipped is not None else None
    if untaken is not None:   # one warning per template and hash: a torch that changed a template leaves every key so
        warning.once(("inductor-gemm-unserved", shipped.entry.get("template_id"), shipped.entry.get("template_hash")),
                     f"{gemm.describe(key)}: {untaken}; the other shipped choices of this template Inductor does not "
                     f"take are counted when the serving closes, not said again")
    if len(choices) > 1:
        mode = settings.current().autotune
        if must_hit(mode):
            held = untaken if untaken is not None else f"is not in any installed bundle for {serving.device.spec()}"
            raise TierMissError(
                f"FLYTUNE_AUTOTUNE={mode}: Inductor GEMM choice {gemm.describe(key)} (lookup key {key}): {held}; "
                f"Inductor would benchmark {len(choices)} choices; harvest it on this device (`flytune harvest "
                f"--mode max-autotune-no-cudagraphs`) or unset {mode}", field="FLYTUNE_AUTOTUNE")
        serving.decided(Kernel(op, key, "autotune", kind="gemm"))
    elif choices:
        serving.decided(Kernel(op, key, "single", kind="gemm"))
    return original(cache, name, choices, *args, **kwargs)


# -- recording -------------------------------------------------------------------------------------------------
def note_keys(recording, out: list, kernel_inputs, op_name: str) -> None:
    """Note the key of each of a lowering's choices (`out`) in `recording.keys`; none where Inductor's own
    key is another (this torch changed its key: a table entry of flytune's would never be found)."""
    key = key_of(kernel_inputs, op_name)
    theirs = hooks.inductor_gemm_key(kernel_inputs, op_name)
    if theirs is not None and theirs != key:
        recording.note(f"Inductor's GEMM lookup key {theirs!r} is not flytune's {key!r}: this torch changed "
                       f"its key, so the {op_name} choice is not recorded")
        return
    for ktc in out:
        recording.keys[ktc] = key


def record(recording, timings: dict, name, choices, profiler_bench_fn) -> None:
    """Inductor timed a select's `choices` (`timings`: choice -> ms): the selection picks the winner among
    those a table entry names, recorded under their one key, and Inductor is told it (its time made the
    least). A select of no noted key is left as it is; one of several keys is noted, not recorded."""
    from ..searching.bench import Candidate

    named = [(c, entry_of(c), _key(recording, c)) for c in choices if c in timings]
    keys = {k for _, entry, k in named if entry is not None and k is not None}
    if not keys:
        return  # not a matmul lowering seen here (a convolution, flex attention): nothing to ship
    if len(keys) > 1:
        recording.note(f"a {name} select took its choices from {len(keys)} lookup keys: not recorded (a table "
                       f"entry serves one key, so a served compile still benchmarks it)")
        return
    (key,) = keys
    if len(key) > gemm.MAX_KEY:
        recording.note(f"the {name} key {gemm.describe(key)} is longer than {gemm.MAX_KEY} characters: not recorded")
        return
    configs = {}
    for c, entry, k in named:
        if entry is not None and k == key:
            try:
                configs[id(c)] = gemm.config_of(*entry)
            except FlytuneError:  # a kwarg no flytune config holds: this choice cannot be shipped
                pass
    shippable = [(c, configs[id(c)]) for c, _, _ in named if id(c) in configs]
    rec = recording.records.get(key)
    if rec is None:
        rec = recording.record(str(name), key, "", "gemm")
        rec.unshipped = [{"name": choice_name(c), "time_ms": _ms(timings[c])} for c, _, _ in named
                         if id(c) not in configs]
        candidates = [Candidate(config, _ms(timings[c])) for c, config in shippable]
        rec.space = [c.config for c in candidates]
        retime = Retime(timings, profiler_bench_fn, {id(cand): c for cand, (c, _) in zip(candidates, shippable)},
                        recording)
        rec.winner = recording.choose(rec, candidates, retime, **GEMM_LIMITS).config
    winner = next((c for c, config in shippable if config == rec.winner), None)
    if winner is not None:  # else a later select of this key without the first's winner: Inductor chooses
        timings[winner] = math.nextafter(min(timings.values()), -math.inf)


def built_as(recording, choice) -> None:
    """Inductor's scheduler built a select it had deferred (a MultiTemplateBuffer: max-autotune's epilogue
    benchmark) as `choice`. Where that is not the selection's winner, the choice with its epilogue fused beat
    the winner with the epilogue as a kernel of its own (Inductor's benchmark of the fused kernels): a
    served lowering is one choice, whose epilogue Inductor fuses unbenchmarked, so the choice built here is
    what it must be. It becomes the key's winner; `provenance.inductor.epilogue` names the candidate
    (`winner`, its index) and the selection's own (`unfused`), which core.choice reads."""
    entry, key = entry_of(choice), _key(recording, choice)
    rec = recording.records.get(key) if key is not None else None
    if entry is None or rec is None or rec.winner is None or rec.epilogue:
        return  # no key recorded here, or a second matmul of the key: its first build stands
    config = gemm.config_of(*entry)
    index = {c.config: i for i, c in enumerate(rec.candidates)}
    if config == rec.winner or config not in index or rec.winner not in index:
        return
    rec.epilogue = {"winner": index[config], "unfused": index[rec.winner]}
    rec.winner = config


def _key(recording, choice) -> str | None:
    ktc = ktc_of(choice)
    return None if ktc is None else recording.keys.get(ktc)


class Retime:
    """A GEMM finalist re-timed by Inductor's own profiler benchmark of that one choice; where that fails
    (no profiler here), Inductor's first timing stands in, said once in the recording's notes."""

    def __init__(self, timings: dict, bench_fn, by_candidate: dict, recording):
        self.timings, self.bench_fn, self.by_candidate, self.recording = timings, bench_fn, by_candidate, recording
        self.failed = bench_fn is None

    def __call__(self, candidate, fraction: float) -> float:
        choice = self.by_candidate[id(candidate)]
        if not self.failed:
            try:
                return _ms(self.bench_fn([choice])[choice])
            except Exception as e:  # noqa: BLE001 - Inductor's benchmark of its own choice, not ours to fix
                self.failed = True
                self.recording.note(f"Inductor's profiler benchmark of a GEMM choice failed ({type(e).__name__}: "
                                    f"{e}): GEMM choices were chosen from Inductor's own timings")
        return _ms(self.timings[choice])


def _ms(t) -> float:
    t = float(t)
    return t if math.isfinite(t) else math.inf
