"""`flytune harvest`: a model's Inductor autotune winners, recorded on the target GPU as flytune artifacts.

A compile entry is `module:function`, a function of the user's package that returns `(model,
example_inputs)`; the artifacts' kernel is `module.function` (so the package that holds the entry
owns them). The model is compiled once as asked (`torch.compile` with a mode and dynamic shapes or
not, or AOTInductor), with Inductor's caches off (every kernel autotuned, none read from an earlier
compile), while runtime.inductor records each autotuned kernel: its lookup hash, every candidate's
time, and the winner chosen by flytune's selection (the sequential test and its tie rule), which
Inductor then uses. A kernel Inductor did not autotune (one candidate) is not an artifact: there is
nothing to ship for it.
"""
from __future__ import annotations

import contextlib
import importlib
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import arguments, inductor, installed, settings
from ..core.artifact import Artifact
from ..core.config import Config
from ..core.codec import FUNCTION, Fields
from ..core.errors import ArtifactError, TuneError, UsageError, foreign_failure, one_line
from ..runtime.selection import Shipped
from .shipped import MIN_IMPROVEMENT_PCT
from .layout import expand


@dataclass
class Harvest:
    """What one harvest compiled and wrote."""
    entry: str
    kernel: str
    mode: str
    device: str
    seconds: float
    artifacts: list[Artifact] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)
    output: Path | None = None
    notes: list[str] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)  # Inductor kernel name -> new | kept | replaced

    def to_json(self) -> dict:
        return {"entry": self.entry, "kernel": self.kernel, "mode": self.mode, "device": self.device,
                "seconds": round(self.seconds, 3), "output": str(self.output) if self.output else None,
                "kernels": [{"name": a.provenance["inductor"]["name"], "lookup": a.key[inductor.AXIS],
                             "config": a.config.to_json(), "file": a.filename,
                             "outcome": self.outcomes.get(a.provenance["inductor"]["name"], "new")}
                            for a in self.artifacts],
                "notes": list(self.notes)}


def harvest(entry: str, *, output: str | Path = "artifacts/{arch}", mode: str = "default", dynamic: bool = False,
            min_improvement: float = MIN_IMPROVEMENT_PCT, allow_ci: bool = False) -> Harvest:
    """Compile `entry` (`module:function` returning `(model, example_inputs)`) on this GPU as `mode`
    asks (a torch.compile mode, or "aoti") and write each autotuned kernel's winner under `output`
    (a template: {arch}, {backend}, {device}). A winner `output` already holds for a kernel stays
    unless this run's is faster by more than `min_improvement` percent (as `flytune tune`). Prints
    nothing. Raises UsageError for an entry that cannot be used, and where CI is set unless `allow_ci`
    (shared runners do not choose winners)."""
    if not (isinstance(entry, str) and FUNCTION.fullmatch(entry.strip())):
        raise UsageError(f"the compile entry must be `module:function` (a function returning (model, "
                         f"example_inputs)), not {entry!r}")
    module, _, function = entry.strip().partition(":")
    min_improvement = arguments.percent(min_improvement, "min_improvement")
    allow_ci, dynamic = arguments.flag(allow_ci, "allow_ci"), arguments.flag(dynamic, "dynamic")
    output = arguments.path(output, "output")
    if mode not in inductor.MODES:
        raise UsageError(f"mode must be one of {', '.join(inductor.MODES)}, not {mode!r}")
    if settings.current().ci and not allow_ci:
        raise UsageError("refusing to harvest where CI is set: shared runners do not choose winners (harvest on "
                         "the intended GPU; allow_ci=True or --allow-ci overrides)")
    model, inputs = _setup(module, function, entry)
    from ..runtime import device, inductor as rt, recording

    dev = device.current()
    kernel = f"{module}.{function}"
    directory = expand(output, dev)
    shipped = {key: Shipped(config, min_improvement / 100) for key, config in _shipped(directory, kernel, dev).items()}
    start = time.perf_counter()
    with recording.Recording(shipped=shipped) as rec:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                rt.compile_once(model, inputs, mode, dynamic)
        except BaseException as e:
            if not foreign_failure(e):
                raise
            raise TuneError(f"compiling {entry} ({mode}) failed: {one_line(e)}", field="entry") from None
    seconds = time.perf_counter() - start
    arts = recording.artifacts(rec.records.values(), kernel, mode, dev)
    out = Harvest(entry, kernel, mode, dev.spec(), seconds, arts, output=directory)
    out.outcomes = {r.name: r.outcome or "new" for r in rec.records.values() if r.winner is not None}
    out.written = [a.save(out.output) for a in arts]
    if not arts:
        out.notes.append("Inductor autotuned no kernel of this compile, so nothing was written: a CPU compile "
                         "(Inductor emits C++ there) or a model whose kernels each have one config; harvest on "
                         "the target GPU")
    return out


def _shipped(directory: Path, kernel: str, dev) -> dict[str, Config]:
    """The winners `directory` already holds for `kernel` on `dev`, by lookup hash (unreadable files are
    the build's and `flytune verify`'s to report)."""
    out: dict[str, Config] = {}
    if not directory.is_dir():
        return out
    for doc, device, _, _ in installed.documents(installed.Source(str(directory), directory), kernel, []):
        if device == dev and inductor.is_inductor(doc["key"]):  # read and checked by the one directory reader
            out[doc["key"][inductor.AXIS]] = Config.from_json(doc["config"], Fields(directory, ArtifactError))
    return out


def _setup(module: str, function: str, entry: str):
    """(model, example_inputs) from the entry; what its import and call print goes to stderr (stdout is
    the caller's, `--json`'s), and whatever they raise, `sys.exit` too, is a TuneError naming the entry."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            fn = getattr(importlib.import_module(module), function)
            got = fn()
    except ImportError as e:
        raise UsageError(f"compile entry {entry}: module {module} cannot be imported ({e}); install the package "
                         f"(pip install -e .) or run from its directory") from None
    except AttributeError as e:
        if "has no attribute" in str(e) and function in str(e):
            raise UsageError(f"compile entry {entry}: module {module} has no {function}") from None
        raise TuneError(f"compile entry {entry} failed: {one_line(e)}", field="entry") from None
    except BaseException as e:
        if not foreign_failure(e):
            raise
        raise TuneError(f"compile entry {entry} failed: {one_line(e)}", field="entry") from None
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], (tuple, list))):
        raise UsageError(f"compile entry {entry} must return (model, example_inputs), example_inputs a tuple of "
                         f"tensors; it returned {type(got).__name__}")
    return got[0], tuple(got[1])
