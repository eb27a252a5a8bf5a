"""What a finished job depended on, so that a resumed run re-tunes a job whose inputs changed.

A job's winner holds only while its kernel's declared configs (the config space), the kernel's source,
the setup that builds its call, the output check (its tolerances, and the code of the module that
defines the reference function a plan entry names) and the toolchain (Triton, torch, CUDA/HIP and the compiler-relevant environment)
are what they were, and only in a run of the ranking it was tuned with. `of_plan` reads them once per
plan entry, in the driver, by importing each setup's module (the kernels it declares register as it
imports); `.flytune-tune-state` keeps them and the ranking with each finished job; `changed` says which
moved, `again` whether the job runs again and why.

Each part is a 16-hex-digit digest: enough to see a change, small enough that a state of many
thousand jobs stays within the reader's cap (`ledger.MAX_STATE_BYTES`). An entry whose setup cannot
be imported here has no fingerprint: its jobs run again (and fail there with the setup's own error).
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
from pathlib import Path

from ..core import codec, settings
from ..core.config import Config, space_hash
from ..core.errors import ProjectError
from ..core.project import TuneEntry
from . import job

# part -> what the run's summary says when it moved
PARTS = {"space": "config space changed", "source": "kernel source changed", "setup": "setup changed",
         "check": "output check changed", "toolchain": "toolchain changed"}
UNKNOWN = "tuned by a release that recorded no fingerprint"
RANKING = "ranking changed"   # the run's ranking is not the one the job was tuned with (`again`)


def entry_name(entry: TuneEntry) -> tuple:
    """The fingerprint's key: what the job id holds of its entry (kernel, setup), the adopted Autotuner
    and the output check (two entries of one kernel and setup may check alike or not)."""
    return entry.kernel, entry.setup, entry.autotuner, *job.check_options(entry).values()


def of_plan(root: Path, entries: tuple[TuneEntry, ...]) -> dict[tuple, dict | None]:
    """`entry_name` -> fingerprint (None where the setup cannot be imported here, or its kernel is not
    registered once it is: a kernel may register when the setup runs; if it still is not, the job fails,
    naming the kernels that are: `job.unknown_kernels`)."""
    from ..runtime import identity
    from ..runtime.serving import registry
    from ..runtime.searching import session

    with session.importable(root):
        setups = {e.setup: _load(e.setup) for e in entries}
        adopted = {e.autotuner: _load(e.autotuner) for e in entries if e.autotuner}
        registered = registry.kernels()
        out = {}
        for e in entries:
            setup = setups[e.setup]
            if e.autotuner:
                kernel = adopted[e.autotuner]
                tuner = None if kernel is None else _autotuner(kernel)
                configs = None if tuner is None else [Config.coerce(c) for c in tuner.configs]
                fn = None if tuner is None else tuner.fn
            else:
                kernel = registered.get(e.kernel)
                configs = None if kernel is None else kernel.configs
                fn = None if kernel is None else getattr(kernel, "base_fn", None) or getattr(kernel, "fn", None) \
                    or getattr(getattr(kernel, "tuner", None), "fn", None)  # an adopted Autotuner's kernel
            reference = _reference(root, e)
            if setup is None or configs is None or fn is None or reference is None:
                out[entry_name(e)] = None
                continue
            tools = identity.toolchain(_function(fn))
            out[entry_name(e)] = Fingerprint({
                "space": space_hash(configs)[:16],
                "source": _digest(_code(fn)),
                "setup": _digest(_code(setup)),
                "check": _digest(codec.canonical(list(job.check_options(e).values()) + reference).decode()),
                "toolchain": _digest(codec.canonical({k: v for k, v in tools.items()
                                                      if k not in ("flytune", "source")}).decode()),
            }, earlier={"source": tools["source"][:16], "setup": _digest(_text(setup))})
        return out


class Fingerprint(dict):
    """A job's fingerprint (what a state records), and `earlier`: the same parts as a release that
    digested them otherwise wrote them, read here from the same code (until 711a3eb a kernel's source was
    Triton's source hash and a setup's its source text, comments and decorators included). A recorded part
    equal to either holds, so a state an earlier release wrote resumes where nothing changed."""

    def __init__(self, parts: dict, earlier: dict):
        super().__init__(parts)
        self.earlier = earlier


def changed(recorded: dict | None, current: dict | None) -> str | None:
    """Why a finished job must run again (None: it holds): the parts that moved, or that either side
    has no fingerprint."""
    if recorded is None:
        return UNKNOWN
    if current is None:
        return "its setup cannot be loaded to check it"
    earlier = getattr(current, "earlier", {})
    moved = [why for part, why in PARTS.items()
             if recorded.get(part) != current.get(part) and (part not in earlier or recorded.get(part) != earlier[part])]
    return ", ".join(moved) or None


def again(record: dict, ranking: str | None, fingerprints: dict | None, entry: TuneEntry) -> str | None:
    """Why a finished job (its `.flytune-tune-state` record) of `entry` runs again (None: it holds): its
    fingerprint moved (`changed`, where the run has `fingerprints`), or it was ranked otherwise than the
    run ranks (`ranking`, else the settings'). A synthetic rank is not a time: a measured run never
    resumes a synthetic winner, nor the other way round (the shipped winner of the other ranking is then
    no finalist, and is replaced)."""
    why = None if fingerprints is None else changed(record.get("depends"), fingerprints.get(entry_name(entry)))
    if why == UNKNOWN:
        return why
    was, now = record.get("ranking"), ranking or settings.current().ranking
    if was is not None and was != now:   # a record without one (written by hand) holds by its fingerprint
        why = ", ".join(w for w in (why, f"{RANKING} ({was} -> {now})") if w)
    return why


def _load(spec: str):
    try:
        return job.load_setup(spec, Path("pyproject.toml"))
    except ProjectError:
        return None
    except Exception:  # noqa: BLE001 - a setup module that raises on import: its jobs fail with the error
        return None


def _reference(root: Path, entry: TuneEntry) -> list | None:
    """What the check part holds of the entry's reference function: its code (nothing where the entry
    names none, so such an entry's part is what it always was); None where it cannot be loaded."""
    if entry.reference is None:
        return []
    try:
        return [_module_code(job.load_reference(root, entry))]
    except Exception:  # noqa: BLE001 - `tune` refused it before the run; a Driver built directly fails its jobs
        return None


def _module_code(obj) -> str:
    """The code of the module that defines `obj`, as its syntax tree: a reference function's helpers
    are part of what it computes, so an edit anywhere in its module re-tunes. A callable without
    source (a builtin, an object from a C extension) counts by its qualified name."""
    module = inspect.getmodule(obj) or inspect.getmodule(type(obj))
    try:
        src = inspect.getsource(module)
        return ast.dump(ast.parse(src), annotate_fields=False, include_attributes=False)
    except (OSError, TypeError, SyntaxError, ValueError):
        kind = obj if callable(obj) and hasattr(obj, "__qualname__") else type(obj)
        return f"{getattr(kind, '__module__', '?')}:{getattr(kind, '__qualname__', '?')}"


def _autotuner(kernel):
    from ..runtime.adapters.triton_keys import autotuner_of

    try:
        return autotuner_of(kernel)
    except Exception:  # noqa: BLE001 - not an Autotuner: its job says so
        return None


def _function(fn):
    """The Python function under Triton's wrappers (JITFunction, Heuristics, ...)."""
    for _ in range(16):
        if inspect.isfunction(fn):
            break
        fn = getattr(fn, "fn", fn)
    return fn


def _code(obj) -> str:
    """A function's code as its syntax tree, decorators left out: an edited comment or layout is no
    change, and a kernel's configs (in its decorator) are the config space's part, not the source's."""
    try:
        src = inspect.getsource(_function(obj))
    except (OSError, TypeError):
        return getattr(obj, "__qualname__", repr(obj))
    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:
        return src
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.decorator_list = []
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def _text(obj) -> str:
    """A function's source text, as releases until 711a3eb digested a setup."""
    try:
        return inspect.getsource(_function(obj))
    except (OSError, TypeError):
        return getattr(obj, "__qualname__", repr(obj))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
