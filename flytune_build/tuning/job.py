"""One job of a tuning plan: one plan entry at one shape, tuned for one device.

`run` is the body of every tuning run, in process (`flytune tune`) and in a fleet worker alike: it
builds the setup's call, runs it with search forced (inside `tuning`), and returns each winner the
search of the entry's kernel chose, as an artifact with its provenance. It writes nothing.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..core import codec, streams
from ..core.artifact import Artifact
from ..core.codec import did_you_mean
from ..core.errors import FlytuneError, PlanError, ProjectError, UsageError, foreign_failure, one_line
from ..core.project import TuneEntry, shape_text


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
    """How a search of `entry` checks its candidates' outputs (its `runtime.searching.outputs.Policy`, in the job's
    tuning session); `reference` only where the entry names one (so an entry without one keeps the
    fingerprint it always had)."""
    options = {"check": entry.check, "rtol": entry.rtol, "atol": entry.atol}
    return options if entry.reference is None else {**options, "reference": entry.reference}


def tuning(root: Path, ranking: str | None = None):
    """The tuning session in which jobs of the project at `root` run (`runtime.searching.session`): search forced,
    no emit directory, the project root importable; all as it was on exit."""
    from ..runtime.searching import session

    return session.opened(root=Path(root), ranking=ranking)


def run(root: Path, entry: TuneEntry, shape: dict) -> list[Tuned]:
    """Build `entry`'s call at `shape`, run it, and return the winners its kernel's searches chose
    (none: the key was already tuned in this process, or the setup does not call the kernel). A kernel
    that is still not registered once the call ran is a UsageError naming those that are."""
    from ..runtime.searching import outputs, session
    from ..runtime.serving import registry

    file, path = entry.origin or (str(Path(root) / "pyproject.toml"), "")
    reference = load_reference(root, entry)
    field = f"{path}.setup" if path else "setup"
    call = load_setup(entry.setup, file, field)(**shape)
    if not callable(call):   # a setup returns the call to time, which it has built, not its result
        raise ProjectError(f"names {entry.setup!r}, which returned {type(call).__name__}: a setup "
                           f"returns the call to time (`return lambda: kernel[grid](...)`), not what the call "
                           f"returns", file=file, field=field)
    policy = outputs.Policy(entry.check, entry.rtol, entry.atol, reference, entry.reference, kernel=entry.kernel)
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


def imported(module: str, fail: Callable[[BaseException], Exception]):
    """`module`, imported with what it prints sent to stderr (stdout is the report's, `--json`); an import
    that raises anything but the user's KeyboardInterrupt raises `fail(error)` instead."""
    try:
        with streams.to_stderr():
            return importlib.import_module(module)
    except BaseException as e:
        if not foreign_failure(e):
            raise
        raise fail(e) from None


def load_setup(spec: str, file: Path | str, field: str = "setup"):
    """`module:attr`, or `module:attr.fn` (a dotted path: `kernel.fn` is the Autotuner under a
    `@triton.heuristics` wrapper). An error names `file` and `field`, where the plan entry says it, and
    what to do: a module that cannot be imported (whatever its import raises), or a name it lacks."""
    module, _, path = spec.partition(":")
    obj = imported(module, lambda e: ProjectError(
        f"names {spec!r}, which cannot be loaded: "
        f"{e if isinstance(e, ImportError) else f'its import raised {one_line(e)}'}{_missing_hint(e, module)}",
        file=file, field=field))
    attrs = path.split(".")
    for i, attr in enumerate(attrs):
        try:
            obj = getattr(obj, attr)
        except ImportError as e:  # a lazily imported attribute (a module's __getattr__)
            raise ProjectError(f"names {spec!r}, which cannot be loaded: {e}{_missing_hint(e, module)}", file=file,
                               field=field) from None
        except AttributeError:
            owner = f"{module}:{'.'.join(attrs[:i])}" if i else f"module {module}"
            close = difflib.get_close_matches(attr, [n for n in dir(obj) if not n.startswith("_")], n=1)
            hint = f" (did you mean `{module}:{'.'.join([*attrs[:i], close[0]])}`?)" if close else ""
            raise ProjectError(f"names {spec!r}, which cannot be loaded: {owner} has no attribute {attr!r}{hint}",
                               file=file, field=field) from None
    return obj


def load_kept(spec: str, file: Path | str, field: str):
    """What an `autotuner` entry names, or, where it names the Autotuner under a wrapper (`k.fn`, a
    `@triton.heuristics` over `@triton.autotune`), the wrapper the setup calls: what its heuristics add
    to a call's keywords is then told from the arguments the call passed (`triton_autotune.recording`).
    A ProjectError naming `file` and `field` where it names no @triton.autotune kernel."""
    from ..runtime.adapters.triton_keys import autotuner_of

    named = load_setup(spec, file, field)
    try:
        autotuner_of(named)
    except FlytuneError:
        # short: a job's failure is one line of at most 300 characters, the fix last
        raise ProjectError(f"names {spec!r}, {_what(named)}, not a @triton.autotune kernel: name the kernel "
                           f"@triton.autotune decorates, or leave `autotuner` out for a @flytune_build.autotune one",
                           file=file, field=field) from None
    outer = spec.removesuffix(".fn")
    while outer.endswith(".fn"):
        outer = outer.removesuffix(".fn")
    if outer == spec:
        return named
    try:
        wrapper = load_setup(outer, file, field)
        return wrapper if autotuner_of(wrapper) is autotuner_of(named) else named
    except FlytuneError:   # the wrapper holds another Autotuner, or none: the one named is recorded
        return named


def _what(obj) -> str:
    """What `obj` is, in words: `a function`, `a JITFunction`, `an int`."""
    name = "function" if callable(obj) and type(obj).__name__ in ("function", "builtin_function_or_method") \
        else type(obj).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def check_kernels(root: Path, entries) -> list[str]:
    """Refuse, before any job runs, a plan entry whose kernel is plainly misspelled: no setup registers it
    once the setups' modules (and the modules its dotted name starts with) are imported, and a registered
    kernel's name is within a typo of it. One ProjectError names the plan file, each such entry's
    `kernel` field, the kernel meant and the fix; nothing has run. Every other entry runs: one whose setup
    cannot be loaded, or whose kernel registers only when its setup runs (or never: its job fails naming
    the registered kernels), is its jobs' to report. Returns a warning for each `autotuner` entry whose
    kernel nothing adopts under its name by then: its artifacts would ship and never serve."""
    from ..runtime.serving import registry
    from ..runtime.searching import session

    loaded = []
    with session.importable(root):
        for entry in entries:
            file, path = entry.origin or (str(Path(root) / "pyproject.toml"), "")
            try:
                load_setup(entry.setup, file, f"{path}.setup" if path else "setup")
            except ProjectError:  # the entry's jobs fail naming it: the rest of the plan is tuned
                continue
            loaded.append((entry, file, path))
        for entry, _, _ in loaded:
            if registry.kernel(entry.kernel) is None:
                _import_prefix(entry.kernel)
        known = registry.kernels()
    misspelled = [(e, f, p) for e, f, p in loaded if not e.autotuner   # an adopted name is the user's own
                  and e.kernel not in known and difflib.get_close_matches(e.kernel, list(known), n=1, cutoff=TYPO)]
    if misspelled:
        raise _unregistered(misspelled, known)
    return [f"flytune: warning: {e.kernel} is adopted by no one once its setup's module is imported: the "
            f"artifacts this run writes ship, and serve once the package calls `flytune_build.triton.adopt("
            f"{e.autotuner.partition(':')[2].removesuffix('.fn')}, name=\"{e.kernel}\")` as it is imported"
            for e, _, _ in loaded if e.autotuner and e.kernel not in known]


TYPO = 0.8  # difflib's ratio from which an unregistered name is a registered one misspelled (a letter or two)


def _import_prefix(kernel: str) -> None:
    """Import the longest importable module `kernel`'s dotted name starts with (`mylib.ops` of
    `mylib.ops.add_kernel`): a kernel registers when its module is imported."""
    parts = kernel.split(".")
    for n in range(len(parts) - 1, 0, -1):
        try:
            with streams.to_stderr():
                importlib.import_module(".".join(parts[:n]))
            return
        except BaseException as e:
            if not foreign_failure(e):
                raise


def _unregistered(entries, known: dict) -> ProjectError:
    """The plan's kernels no setup registers, in one error: each entry's field, each name's nearest
    registered kernel, and the fix."""
    (entry, file, path), rest = entries[0], entries[1:]
    known_list = f"registered kernels: {', '.join(sorted(known)) or 'none'}"
    if not rest:
        names = f"names {entry.kernel!r}, a kernel no setup registers ({known_list})"
        names += did_you_mean(entry.kernel, known)
    else:
        names = f"names {entry.kernel!r}{did_you_mean(entry.kernel, known)}"
        for e, f, p in rest:
            where = f"`{p}.kernel`" if f == file else f"{f}: `{p}.kernel`"
            names += f", and {where} names {e.kernel!r}{did_you_mean(e.kernel, known)}"
        names += f": kernels no setup registers ({known_list})"
    return ProjectError(f"{names}: correct the name{'s' if rest else ''} in the plan (a kernel is named by its "
                        f"@autotune `name=`, else module.function; one its setup defines or imports only when it "
                        f"runs: import the kernel's module at the top of the setup's module)",
                        file=file, field=f"{path}.kernel" if path else "kernel")


def load_references(root: Path, entries) -> None:
    """Every reference function the entries name, imported (the project root importable) before any job
    runs: a PlanError naming the first that cannot be used."""
    from ..runtime.searching import session

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
    obj = imported(module, lambda e: PlanError(
        f"names {entry.reference!r}, whose module {module} cannot be imported: {one_line(e)}"
        f"{_missing_hint(e, module)}", file=file, field=field))
    fn = getattr(obj, name, None)
    if fn is None:
        raise PlanError(f"names {entry.reference!r}, but module {module} has no {name}", file=file, field=field)
    if not callable(fn):
        raise PlanError(f"names {entry.reference!r}, which is {type(fn).__name__}, not a function", file=file,
                        field=field)
    return fn


def _missing_hint(e: BaseException, module: str) -> str:
    """What to do when the module a plan names is not there (correct the name), or imports a package this
    environment lacks (install it)."""
    name = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    if name and (module == name or module.startswith(name + ".")):  # the module named, or a package of its path
        return (" (correct the module in the plan, or run `pip install -e .`: it is in neither the project root nor "
                "a package directory the project declares, such as src/)")
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
