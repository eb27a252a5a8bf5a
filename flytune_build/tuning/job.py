"""One job of a tuning plan: one plan entry at one shape, tuned for one device.

`run` is the body of every tuning run, in process (`flytune tune`) and in a fleet worker alike: it
builds the setup's call, runs it with search forced (inside `tuning`), and returns each winner the
search of the entry's kernel chose, as an artifact with its provenance. It writes nothing.
"""
from __future__ import annotations

import hashlib
import importlib
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from ..core import codec, streams
from ..core.artifact import Artifact
from ..core.codec import did_you_mean
from ..core.errors import FlytuneError, PlanError, ProjectError, UsageError, foreign_failure, one_line
from ..core.project import TuneEntry


@dataclass(frozen=True)
class Job:
    entry: TuneEntry
    shape: dict
    device: str          # the spec of the device it is tuned on (`DeviceIdentity.spec()`)

    @property
    def id(self) -> str:
        return job_id(self.entry, self.shape, self.device)

    def label(self) -> str:
        return f"{self.entry.kernel} {shape_text(self.shape)}"


@dataclass
class Tuned:
    """One search's winner."""
    artifact: Artifact
    winner: str
    time_ms: float
    margin: float | None     # the fastest other candidate's time / the winner's - 1


def job_id(entry: TuneEntry, shape: dict, device: str) -> str:
    """The job's name in `.flytune-tune-state`: the same for an in-process run and a fleet."""
    return hashlib.sha256(codec.canonical([entry.kernel, entry.setup, shape, device])).hexdigest()[:24]


def unknown_kernels(names, known, where: str, listing: str = "its kernels") -> UsageError:
    """The one rule for a kernel a plan or `--kernel` names that is not there: `kernel X: not <where>
    (<listing>: every known kernel)`, and the closest known name."""
    known = sorted(known)
    names = sorted(names)
    hint = next((h for h in (did_you_mean(n, known) for n in names) if h), "")
    return UsageError(f"kernel {', '.join(names)}: not {where} ({listing}: {', '.join(known) or 'none'}){hint}")


def check_options(entry: TuneEntry) -> dict:
    """How a search of `entry` checks its candidates' outputs (its `runtime.outputs.Policy`, in the job's
    tuning session); `reference` only where the entry names one (so an entry without one keeps the
    fingerprint it always had)."""
    options = {"check": entry.check, "rtol": entry.rtol, "atol": entry.atol}
    return options if entry.reference is None else {**options, "reference": entry.reference}


def shape_text(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def tuning(root: Path, ranking: str | None = None):
    """The tuning session in which jobs of the project at `root` run (`runtime.session`): search forced,
    no emit directory, the project root importable; all as it was on exit."""
    from ..runtime import session

    return session.opened(root=Path(root), ranking=ranking)


def run(root: Path, entry: TuneEntry, shape: dict) -> list[Tuned]:
    """Build `entry`'s call at `shape`, run it, and return the winners its kernel's searches chose
    (none: the key was already tuned in this process, or the setup does not call the kernel). A kernel
    that is still not registered once the call ran is a UsageError naming those that are."""
    from ..runtime import outputs, registry, session

    file, path = entry.origin or (str(Path(root) / "pyproject.toml"), "")
    reference = load_reference(root, entry)
    call = load_setup(entry.setup, file, f"{path}.setup" if path else "setup")(**shape)
    policy = outputs.Policy(entry.check, entry.rtol, entry.atol, reference, entry.reference)
    with session.opened(check=policy, collect=True) as tuned:
        found = tuned.found[-1]
        if entry.autotuner:  # a @triton.autotune kernel: capture what its own search picks
            from ..runtime.adapters.triton_autotune import recording

            with recording(load_kept(entry.autotuner, file, f"{path}.autotuner" if path else "autotuner"),
                           entry.kernel):
                call()
                sync()
        else:
            call()
            sync()
    if not entry.autotuner and registry.kernel(entry.kernel) is None:
        raise unknown_kernels([entry.kernel], registry.kernels(), "a kernel its setup registers",
                              "registered kernels")
    return [Tuned(f.artifact, str(f.winner.config), f.winner.time_ms, _margin(f.candidates, f.winner))
            for f in found if f.kernel == entry.kernel]


def carried(entry: TuneEntry, options: dict) -> dict:
    """A job's options with what a worker needs of its entry beyond the message's fields: its origin."""
    return {**options, "origin": list(entry.origin)} if entry.origin else options


def no_search_note(entry: TuneEntry, shape: dict) -> str:
    return (f"{entry.kernel} {shape}: no search ran (the key was already tuned in this run, the setup does not "
            f"call this kernel, or it calls it from a thread of its own that does not carry the job's context: "
            f"submit the launch as `contextvars.copy_context().run, fn`)")


def load_setup(spec: str, file: Path | str, field: str = "setup"):
    """`module:attr`, or `module:attr.fn` (a dotted path: `kernel.fn` is the Autotuner under a
    `@triton.heuristics` wrapper). An error names `file` and `field`, where the plan entry says it."""
    module, _, path = spec.partition(":")
    try:
        obj = importlib.import_module(module)
        for attr in path.split("."):
            obj = getattr(obj, attr)
        return obj
    except (ImportError, AttributeError) as e:
        raise ProjectError(f"names {spec!r}, which cannot be loaded: {e}{_missing_hint(e, module)}", file=file,
                           field=field) from None


def load_kept(spec: str, file: Path | str, field: str):
    """What an `autotuner` entry names, or, where it names the Autotuner under a wrapper (`k.fn`, a
    `@triton.heuristics` over `@triton.autotune`), the wrapper the setup calls: what its heuristics add
    to a call's keywords is then told from the arguments the call passed (`triton_autotune.recording`)."""
    from ..runtime.adapters.triton_keys import autotuner_of

    named = load_setup(spec, file, field)
    outer = spec.removesuffix(".fn")
    while outer.endswith(".fn"):
        outer = outer.removesuffix(".fn")
    if outer == spec:
        return named
    try:
        wrapper = load_setup(outer, file, field)
        return wrapper if autotuner_of(wrapper) is autotuner_of(named) else named
    except FlytuneError:   # `named` is no Autotuner: recording says so, naming the field
        return named


def load_references(root: Path, entries) -> None:
    """Every reference function the entries name, imported (the project root importable) before any job
    runs: a PlanError naming the first that cannot be used."""
    from ..runtime import session

    with session.importable(root):
        for entry in entries:
            load_reference(root, entry)


def load_reference(root: Path, entry: TuneEntry):
    """The function `entry.reference` names (None where it names none). A PlanError naming the entry's
    `reference` field where the entry cannot use one, its module cannot be imported (whatever the import
    raises), or the name is missing or not callable."""
    if entry.reference is None:
        return None
    file, path = entry.origin or (str(Path(root) / "pyproject.toml"), "")
    field = f"{path}.reference" if path else "reference"
    if not entry.check:
        raise PlanError("names a reference function, but the entry says check = false: nothing would be "
                        "compared with it", file=file, field=field)
    module, _, name = entry.reference.partition(":")
    try:
        with streams.to_stderr():  # stdout is the report's (`--json`)
            obj = importlib.import_module(module)
    except BaseException as e:
        if not foreign_failure(e):
            raise
        raise PlanError(f"names {entry.reference!r}, whose module {module} cannot be imported: {one_line(e)}"
                        f"{_missing_hint(e, module)}", file=file, field=field) from None
    fn = getattr(obj, name, None)
    if fn is None:
        raise PlanError(f"names {entry.reference!r}, but module {module} has no {name}", file=file, field=field)
    if not callable(fn):
        raise PlanError(f"names {entry.reference!r}, which is {type(fn).__name__}, not a function", file=file,
                        field=field)
    return fn


def _missing_hint(e: BaseException, module: str) -> str:
    """What to do when the setup's module imports a package this environment lacks."""
    name = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    if not name or module.split(".")[0] == name.split(".")[0]:
        return ""
    if name.split(".")[0] == "numpy":
        return " (Triton's CPU interpreter needs NumPy, which the torch CPU wheel does not bring: pip install numpy)"
    return f" (install {name.split('.')[0]} in this environment)"


def sync() -> None:
    """Wait for the GPU, where torch is loaded and has a device: a launch fails here, not later."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def device_healthy() -> bool:
    """False when the GPU context is broken (a fault is sticky: the process must be replaced)."""
    try:
        sync()
    except Exception:
        return False
    return True


def _margin(candidates, winner) -> float | None:
    """The fastest other candidate's time / the winner's - 1 (negative when a tie went to an earlier
    declared config that timed slower)."""
    others = [c.time_ms for c in candidates if c is not winner and math.isfinite(c.time_ms)]
    if not others or not math.isfinite(winner.time_ms) or winner.time_ms <= 0:
        return None
    return min(others) / winner.time_ms - 1
