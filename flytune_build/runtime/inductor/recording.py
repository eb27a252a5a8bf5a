"""Inductor winners recorded on the target GPU (`flytune harvest`): while a `Recording` is open, flytune's
selection decides what Inductor autotunes in the contexts it is open in.

Where Inductor benchmarks a kernel's candidates (`CachingAutotuner.benchmark_all_configs`), the selection
(runtime.searching.selection: the sequential test, its tie rule, hysteresis against a winner the output already
holds) picks the winner from Inductor's own timings and re-timings (`CachingAutotuner.bench`), and
Inductor is told that winner. Where Inductor's coordinate descent then moves from that winner to
another config, the same selection decides between the two, the start first on a tie: a move within
the noise, or within the margin of a shipped winner, is not taken. So two harvests agree, and a
re-harvest keeps what ships unless it is beaten. The shipped winner is the tuning session's
(`runtime.searching.session`: `shipped(kernel, key)`, as for every search of `flytune tune`). Each kernel becomes
one `Record`; `artifacts()` turns a compile entry's records into artifacts. The patched methods are
runtime.inductor.hooks'.

GEMM template choices (max-autotune, torch 2.10+: runtime.inductor.templates) are recorded the same way:
where Inductor turns a matmul's templates into choices (`finalize`), each choice's key is noted (flytune's,
which must be Inductor's own); once Inductor has timed them (its feedback saver, which the recording adds
while open and takes out again), the selection picks the winner among the choices a table entry can name,
re-timing finalists with Inductor's own profiler benchmark (`profiler_bench_fn`), and Inductor is told that
winner. Where Inductor deferred the select to its scheduler (max-autotune's epilogue benchmark) and the
scheduler built another choice, one whose fused epilogue beat the winner plus the epilogue as a kernel of
its own, that choice is what a served compile must build: it is recorded as the winner
(`provenance.inductor.epilogue`). One key has one winner per harvest (a second matmul of the same key keeps the first's). A
select whose choices came from several keys, or whose key is not Inductor's, is not recorded (`notes`).
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field, replace

from ...core import gemm, inductor
from ...core.artifact import Artifact
from ...core.config import Config, space_hash
from ...core.device import DeviceIdentity
from ...core.errors import TierMissError
from .. import device as running_device
from . import hooks, templates


@dataclass
class Record:
    """One generated kernel's autotune, as harvested."""
    name: str
    key: str
    size_hints: str
    heuristic: str
    candidates: list = field(default_factory=list)   # bench.Candidate, in Inductor's order
    winner: Config | None = None
    selection: dict | None = None
    coordesc: bool = False
    outcome: str | None = None                       # kept | replaced against a shipped winner
    space: list = field(default_factory=list)        # the configs Inductor offered (Config), its search space
    unshipped: list = field(default_factory=list)    # a GEMM select's choices no table entry names: name, time
    epilogue: dict | None = None                     # a GEMM choice the scheduler built with its epilogue fused


class Recording:
    """While open, every kernel Inductor autotunes in the contexts it is open in is chosen by flytune's
    selection and recorded (`records`, by lookup hash). The winner an output already holds for a kernel
    (runtime.searching.selection.Shipped) stays unless beaten by more than its margin (hysteresis): it is the
    tuning session's `shipped(kernel, {inductor_source: hash})`, or `shipped[hash]` where a map is
    given. `kernel`: the compile entry's flytune kernel (`module.function`) the session is asked for."""

    def __init__(self, rule=None, shipped: dict | None = None, kernel: str | None = None):
        self.records: dict[str, Record] = {}
        self.rule = rule
        self.shipped = shipped
        self.kernel = kernel
        self.depth = 0
        self.notes: list[str] = []                    # what was not recorded, and why (said once each)
        self.gemm = False                             # whether GEMM choices are recorded (this torch's hooks)
        self.keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # a lowering's choice -> its GEMM key
        self._saver = self.feedback                   # the one object added to and taken out of Inductor's list

    def __enter__(self) -> Recording:
        missing_hooks = hooks.missing()
        if missing_hooks:
            raise TierMissError(f"this torch lacks {', '.join(missing_hooks)}: Inductor winners can be harvested "
                                f"with {hooks.SUPPORTED}", field="torch")
        hooks.install()
        if self.depth == 0:
            lacking = hooks.missing_gemm()
            self.gemm = not lacking
            if lacking:
                self.note(f"this torch lacks {', '.join(lacking)}: GEMM template choices are not harvested "
                          f"(served with {hooks.GEMM_SUPPORTED})")
            else:
                hooks.install_gemm()
                hooks.add_feedback_saver(self._saver)
        self.depth += 1
        hooks.entered(self)
        return self

    def __exit__(self, *exc) -> None:
        if self.depth:
            self.depth -= 1
            hooks.left(self)
            if self.depth == 0 and self.gemm:
                hooks.remove_feedback_saver(self._saver)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def held(self, key: str):
        """The winner the output holds for the kernel of lookup hash `key` (selection.Shipped), or None."""
        from ..searching import session

        if self.shipped is not None:
            return self.shipped.get(key)
        lookup = session.current().shipped
        return None if lookup is None or self.kernel is None else lookup(self.kernel, {inductor.AXIS: key})

    # what the patched CachingAutotuner methods call (runtime.inductor.hooks)
    def precompile(self, original, autotuner, *args, **kwargs):
        return original(autotuner, *args, **kwargs)

    def benchmark(self, original, autotuner, *args, **kwargs) -> dict:
        from ..searching.bench import Candidate

        timings = original(autotuner, *args, **kwargs)
        launchers = list(timings)
        candidates = [Candidate(_config(lc), float(timings[lc])) for lc in launchers]
        rec = self._record(autotuner)
        rec.space = [c.config for c in candidates]
        winner = self._pick(autotuner, rec, candidates, launchers, args, kwargs)
        rec.winner = _config(winner)
        # Inductor keeps the least time: the selection's winner is given it, every other its own median
        out = {lc: c.time_ms for c, lc in zip(candidates, launchers)}
        out[winner] = math.nextafter(min(out.values()), -math.inf)
        return out

    def coordesc(self, autotuner, start, found, args: tuple, kwargs: dict):
        """Inductor's coordinate descent went from `start` (the benchmark's winner) to `found`: the
        selection decides between the two by re-timing both; returns the launcher Inductor keeps."""
        from ..searching.bench import Candidate

        if found is None or (found is start and not getattr(start.config, "found_by_coordesc", False)):
            return found  # Inductor ran no descent here (`_should_coordesc_tune` off): nothing to record
        rec = self._record(autotuner)
        rec.coordesc = True
        rec.space = rec.space or [_config(start)]  # one config offered: the descent's start is the space
        if found is not start and _config(found) != _config(start):
            pair = [Candidate(_config(lc), float(autotuner.bench(lc, *args, **kwargs))) for lc in (start, found)]
            found = self._pick(autotuner, rec, pair, [start, found], args, kwargs)
        kept = found
        kept.config.found_by_coordesc = True  # Inductor's mark of a final config: it runs no coordinate descent again
        rec.winner = _config(kept)
        return kept

    def finalize(self, original, handler, template_choices, kernel_inputs, templates_, op_name, *args, **kwargs):
        """Inductor's own choices for a matmul's lowering, each noted with the key it is looked up by."""
        out = original(handler, template_choices, kernel_inputs, templates_, op_name, *args, **kwargs)
        try:
            templates.note_keys(self, out, kernel_inputs, op_name)
        except Exception as e:  # noqa: BLE001 - a choice not recorded is said; the user's compile goes on
            self.note(f"the {op_name} choices' lookup key could not be read ({type(e).__name__}: {e}): not recorded")
        return out

    def select(self, original, cache, name, choices, *args, **kwargs):
        """Inductor's select, as it is: its feedback (`feedback`) is where a recording takes the timings."""
        return original(cache, name, choices, *args, **kwargs)

    def feedback(self, timings: dict, name, input_nodes, choices, profiler_bench_fn=None, *rest) -> None:
        """Inductor's feedback saver: a select's choices timed in this context are recorded (templates.record);
        one that cannot be is said in `notes`, and Inductor chooses it as it would."""
        if hooks.current() is not self:  # another context's compile is not this recording's
            return
        try:
            templates.record(self, timings, name, choices, profiler_bench_fn)
        except Exception as e:  # noqa: BLE001 - a choice not recorded is said; the user's compile goes on
            self.note(f"the {name} GEMM choice was not recorded: {type(e).__name__}: {e}")

    def built_as(self, choice) -> None:
        """Inductor's scheduler built a select it deferred as `choice` (templates.built_as)."""
        if hooks.current() is not self:
            return
        try:
            templates.built_as(self, choice)
        except Exception as e:  # noqa: BLE001 - a choice not recorded is said; the user's compile goes on
            self.note(f"the GEMM choice the scheduler built was not recorded: {type(e).__name__}: {e}")

    def choose(self, rec: Record, candidates: list, retime, **limits):
        """The selection over `candidates` against the output's winner for `rec.key`, recorded in `rec`
        (`limits`: the sequential test's max_finalists and max_rounds at most so many); returns the winner."""
        from ..searching import selection

        rule = self.rule or selection.MEASURED
        if limits and isinstance(rule, selection.Rule):
            rule = replace(rule, **{k: min(getattr(rule, k), v) for k, v in limits.items()})
        chosen = selection.pick(candidates, retime, rule, self.held(rec.key))
        rec.candidates, rec.selection, rec.outcome = candidates, chosen.record, chosen.outcome
        return chosen.winner

    def _pick(self, autotuner, rec: Record, candidates: list, launchers: list, args: tuple, kwargs: dict):
        """The selection over `candidates` (one per launcher, in Inductor's order), re-timed with Inductor's
        own `bench`, against the output's winner for this kernel; recorded in `rec`. Returns the winner's
        launcher."""
        by_candidate = {id(c): lc for c, lc in zip(candidates, launchers)}

        def retime(candidate, fraction):
            return float(autotuner.bench(by_candidate[id(candidate)], *args, **kwargs))

        winner = self.choose(rec, candidates, retime)
        autotuner.reset_to_zero_args(*args, **kwargs)
        return by_candidate[id(winner)]

    def _record(self, autotuner) -> Record:
        key = hooks.kernel_key(autotuner)
        if key not in self.records:
            heuristic = getattr(autotuner.heuristic_type, "name", str(autotuner.heuristic_type)).lower()
            self.record(hooks.kernel_name(autotuner), key, str(autotuner.size_hints), heuristic)
        return self.records[key]

    def record(self, name: str, key: str, size_hints: str, heuristic: str) -> Record:
        """A new record of the kernel (or GEMM choice) of lookup key `key`."""
        self.records[key] = Record(name, key, size_hints, heuristic)
        return self.records[key]


def artifacts(records, kernel: str, mode: str, dev: DeviceIdentity | None = None) -> list[Artifact]:
    """The records of one compile entry (`kernel`, the entry's dotted name) as artifacts for `dev`."""
    from ..identity import provenance

    dev = dev or running_device.current()
    out = []
    for rec in sorted(records, key=lambda r: r.key):
        if rec.winner is None:
            continue
        # the one search-space hash (core.config) of what Inductor offered, not of the pair a descent's move
        # was timed as: a re-harvest whose descent went elsewhere searched the same space
        space = space_hash(rec.space or [c.config for c in rec.candidates])
        prov = provenance(rec.candidates, space, "measured", selection=rec.selection)
        if gemm.is_key(rec.key):
            prov["inductor"] = {"name": rec.name, "mode": mode}
            if rec.unshipped:
                prov["inductor"]["unshipped"] = rec.unshipped
            if rec.epilogue:
                prov["inductor"]["epilogue"] = rec.epilogue
        else:
            prov["inductor"] = {"name": rec.name, "size_hints": rec.size_hints, "heuristic": rec.heuristic,
                                "mode": mode, "coordesc": rec.coordesc}
        out.append(Artifact(kernel, {inductor.AXIS: rec.key}, dev, rec.winner, prov))
    return out


def _config(launcher) -> Config:
    """The flytune config of an Inductor launcher (its triton.Config)."""
    c = launcher.config
    return inductor.config_of(c.kwargs, c.num_warps, c.num_stages)


recording = Recording  # `with recording() as r:` compiles made inside are chosen by flytune's selection and recorded
