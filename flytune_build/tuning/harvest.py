"""`flytune harvest`: a model's Inductor autotune winners, recorded on the target GPU as flytune artifacts.

A compile entry is `module:function`, a function of the user's package that returns `(model,
example_inputs)`; the artifacts' kernel is `module.function` (so the package that holds the entry
owns them). The model is compiled once as asked (`torch.compile` with a mode and dynamic shapes or
not, or AOTInductor), with Inductor's caches off (every kernel autotuned, none read from an earlier
compile), while runtime.inductor records each autotuned kernel: its lookup hash, every candidate's
time, and the winner chosen by flytune's selection (the sequential test and its tie rule), which
Inductor then uses. A kernel Inductor did not autotune (one candidate) is not an artifact: there is
nothing to ship for it. Under max-autotune (torch 2.10+) each GEMM template choice Inductor benchmarked
(`select_algorithm`) is recorded the same way: its lookup key (core.gemm), the winning template and its
kwargs, every choice's time; one artifact per key, of the same kernel.

A harvest is a job of `flytune tune`'s kind and follows its rules: it runs in the same tuning session
(`job.tuning(root)`: the project root importable, so the entry imports from a project that is not
installed, search forced; and `shipped=` the output's winners), reads the output's shipped winners
through `shipped.ShippedWinners`, and writes what `ShippedWinners.change` says: a kept winner's file is
left byte for byte.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..core import arguments, gemm, inductor, settings, streams
from ..core.artifact import Artifact
from ..core.codec import FUNCTION
from ..core.errors import FlytuneError, TuneError, UsageError, foreign_failure, one_line
from .job import tuning
from .layout import expand
from .shipped import MIN_IMPROVEMENT_PCT, ShippedWinners, read_output


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
    outcomes: dict[str, str] = field(default_factory=dict)  # label -> new | kept | replaced ...
    labels: dict[str, str] = field(default_factory=dict)    # lookup key -> label: a kernel's Inductor name,
    #                                                         a GEMM choice's op and shapes (core.gemm.describe)

    def label(self, art: Artifact) -> str:
        return self.labels.get(art.key[inductor.AXIS]) or art.provenance["inductor"]["name"]

    @property
    def gemm_choices(self) -> int:
        return sum(inductor.is_gemm(a.key) for a in self.artifacts)

    def to_json(self) -> dict:
        return {"entry": self.entry, "kernel": self.kernel, "mode": self.mode, "device": self.device,
                "seconds": round(self.seconds, 3), "output": str(self.output) if self.output else None,
                "kernels": [{"name": self.label(a), "lookup": a.key[inductor.AXIS], "gemm": inductor.is_gemm(a.key),
                             "config": a.config.to_json(), "file": a.filename,
                             "outcome": self.outcomes.get(self.label(a), "new")}
                            for a in self.artifacts],
                "notes": list(self.notes)}


def harvest(entry: str, *, project: str | Path = ".", output: str | Path = "artifacts/{arch}", mode: str = "default",
            dynamic: bool = False, min_improvement: float = MIN_IMPROVEMENT_PCT, allow_ci: bool = False) -> Harvest:
    """Compile `entry` (`module:function` returning `(model, example_inputs)`, imported from the
    `project` root as `flytune tune` imports a plan's setups) on this GPU as `mode` asks (a
    torch.compile mode, or "aoti") and write each autotuned kernel's winner under `output` (a template:
    {arch}, {backend}, {device}; relative to the working directory). A winner `output` already holds for
    a kernel stays unless this run's is faster by more than `min_improvement` percent, and its file is
    left byte for byte (as `flytune tune`). Prints nothing. Raises UsageError for an entry that cannot
    be used, and where CI is set unless `allow_ci` (shared runners do not choose winners); DeviceError
    where no GPU is visible (Inductor generates C++ for a CPU and autotunes nothing)."""
    if not (isinstance(entry, str) and FUNCTION.fullmatch(entry.strip())):
        raise UsageError(f"the compile entry must be `module:function` (a function returning (model, "
                         f"example_inputs)), not {entry!r}")
    module, _, function = entry.strip().partition(":")
    min_improvement = arguments.percent(min_improvement, "min_improvement")
    allow_ci, dynamic = arguments.flag(allow_ci, "allow_ci"), arguments.flag(dynamic, "dynamic")
    output = arguments.path(output, "output")
    root = Path(arguments.path(project, "project")).resolve()
    if not root.is_dir():
        raise UsageError(f"project {project}: not a directory (the project root the compile entry imports from)")
    if mode not in inductor.MODES:
        raise UsageError(f"mode must be one of {', '.join(inductor.MODES)}, not {mode!r}")
    if settings.current().ci and not allow_ci:
        raise UsageError("refusing to harvest where CI is set: shared runners do not choose winners (harvest on "
                         "the intended GPU; allow_ci=True or --allow-ci overrides)")
    from ..runtime import inductor as rt
    from ..runtime.searching import session

    kernel = f"{module}.{function}"
    with tuning(root):  # the tuning session of `flytune tune`: the project root importable, search forced
        model, inputs = _setup(module, function, entry, root)
        dev = rt.target_device()
        directory = expand(output, dev)
        winners = ShippedWinners(read_output(directory).get(kernel, {}), min_improvement)
        start = time.perf_counter()
        with session.opened(shipped=winners.lookup), rt.Recording(kernel=kernel) as rec:
            _compile(rt, model, inputs, mode, dynamic, entry)
        seconds = time.perf_counter() - start
    out = Harvest(entry, kernel, mode, dev.spec(), seconds, output=directory, notes=list(rec.notes))
    out.artifacts = rt.artifacts(rec.records.values(), kernel, mode, dev)
    for art in out.artifacts:
        if inductor.is_gemm(art.key):
            label = base = gemm.describe(art.key[inductor.AXIS])
            while label in out.outcomes:  # two keys of the same shapes (other strides): told apart
                label = f"{base} #{sum(k.startswith(base) for k in out.outcomes) + 1}"
            out.labels[art.key[inductor.AXIS]] = label
        change, written = winners.change(art)  # kept and unchanged: None, the file stays as it is
        out.outcomes[out.label(art)] = change
        if written is not None:
            out.written.append(written.save(directory))
            winners.saved(written)
    if not out.artifacts:
        out.notes.append("Inductor autotuned no kernel of this compile, so nothing was written: the entry's model "
                         "and inputs are on the CPU (Inductor generates C++ for them: return them on the GPU), "
                         "or each generated kernel had one config")
    return out


def _compile(rt, model, inputs: tuple, mode: str, dynamic: bool, entry: str) -> None:
    """runtime.inductor's compile; what it prints goes to stderr (stdout is `--json`'s), and whatever
    the model's compile raises is a TuneError naming the entry (flytune's own errors stay themselves)."""
    try:
        with streams.to_stderr():
            rt.compile_once(model, inputs, mode, dynamic)
    except FlytuneError:
        raise
    except BaseException as e:
        if not foreign_failure(e):
            raise
        raise TuneError(f"compiling {entry} ({mode}) failed: {one_line(e)}", field="entry") from None


def _setup(module: str, function: str, entry: str, root: Path):
    """(model, example_inputs) from the entry, its module imported with `root` importable; what its
    import and call print goes to stderr (stdout is the caller's, `--json`'s). An entry that cannot be
    used is a UsageError naming it and the fix; whatever its import or call raises otherwise, `sys.exit`
    too, is a TuneError naming the entry."""
    try:
        with streams.to_stderr():
            mod = importlib.import_module(module)
    except ImportError as e:
        raise UsageError(_import_advice(e, entry, module, root)) from None
    except BaseException as e:
        if not foreign_failure(e):
            raise
        raise TuneError(f"compile entry {entry} failed: {one_line(e)}", field="entry") from None
    if not hasattr(mod, function):
        raise UsageError(f"compile entry {entry}: module {module} has no {function}")
    fn = getattr(mod, function)
    if not callable(fn):
        raise UsageError(f"compile entry {entry}: {module}.{function} is {type(fn).__name__}, not a function: name "
                         f"a function of {module} that returns (model, example_inputs)")
    try:
        with streams.to_stderr():
            got = fn()
    except BaseException as e:
        if not foreign_failure(e):
            raise
        raise TuneError(f"compile entry {entry} failed: {one_line(e)}", field="entry") from None
    if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], (tuple, list))):
        raise UsageError(f"compile entry {entry} must return (model, example_inputs), example_inputs a tuple of "
                         f"tensors; it returned {type(got).__name__}")
    return got[0], tuple(got[1])


def _import_advice(e: ImportError, entry: str, module: str, root: Path) -> str:
    """Why the entry's module cannot be imported, and what to do: a module the project does not hold,
    or one it imports that this environment lacks."""
    lacking = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    if lacking and lacking.split(".")[0] != module.split(".")[0]:
        return (f"compile entry {entry}: module {module} cannot be imported: it imports {lacking}, which this "
                f"environment lacks (install {lacking.split('.')[0]})")
    return (f"compile entry {entry}: module {module} cannot be imported from the project root {root} ({e}); run "
            f"from the directory that holds it or pass --project DIR (project=...), or install the package "
            f"(pip install -e .)")
