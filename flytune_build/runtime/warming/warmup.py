"""`flytune warmup` and `flytune_build.warmup()`: every bundled config for this device compiled before its first call.

For the installed bundles (or those of the named distributions), every artifact that this device is
served at an accepted level and that records its specialization (`provenance.specialization`) is
compiled by `triton.compile` exactly as `JITFunction.run` would compile it, with the alignment
variants its key's buckets need (`variants`), in parallel processes forked from this one where the
platform forks (else threads); with a GPU, Triton's launcher (a host C module per kernel signature) is
built as well. Both land in Triton's own caches (TRITON_CACHE_DIR, default ~/.triton/cache), where a
later first call, in any process, finds them.

With a GPU, the warm-up then readies this process (`Toolchain.load`): each compiled kernel, its
launcher built and its module loaded onto the device, goes into its `@triton.jit` function's
in-process cache under the key that function's own launch computes, and each tuned key of a
`flytune_build.autotune` kernel is decided ahead (`Autotuned.prime`), as is each of an adopted
`@triton.autotune` kernel's (`Adopted.prime_key`: its config put in the Autotuner's cache), so the first
call of a tuned shape is a hit in both: it costs what a later call costs.

Invariants (tests/test_warmup.py, tests/test_warmup_inprocess.py):
- only modules under a bundle's own package (its manifest's `package`) are imported, and only for the
  `module:qualname` an artifact records, after that package's own import has finished; nothing else
  read from a bundle is executed;
- a kernel goes into a JIT cache only once its launcher is built and its module loaded, under the key
  the binder gives stand-ins that specialise exactly as recorded (else it is not put there), and only
  if that key is free: a call made meanwhile never sees a half-ready kernel, never waits on a lock, and
  a key its own call filled is left alone (Triton writes its cache files atomically);
- a decision is taken ahead only from the scratch and offline tiers, never from a heuristic (which
  would see stand-ins): a key they do not serve is decided by its first call, as without a warm-up;
- under the interpreter nothing compiles: each config is reported "interpreter: nothing to compile"
  (tuned keys are still decided ahead);
- artifacts without a specialization (tuned before it was recorded) are skipped with a note; so are
  Inductor artifacts (core.inductor), which torch.compile compiles under `flytune_build.inductor.serve()`
  (re-tuning them would not help: Inductor generates their kernels, not the package).
"""
from __future__ import annotations

import copy
import importlib
import itertools
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ...core import arguments, bundle, codec, inductor, installed, serving, settings
from ...core import specialization as spec_format
from ...core.artifact import Artifact
from ...core.codec import Fields
from ...core.config import Config
from ...core.device import DeviceIdentity
from ...core.errors import BundleError, FlytuneError, foreign_failure
from .. import device, warning
from ..serving import registry
from . import binder, compiler, forks  # noqa: F401 - forks: a fork waits for a warm-up thread's import
from ..wrapping import chain, heuristic_names

STATUSES = ("compiled", "cached", "interpreter", "skipped", "failed")
MAX_VARIANT_AXES = 3   # bucketed axes whose alignment variants are warmed (2**3 - 1 variants at most)
# Triton's pointer element types -> torch dtype names, for the stand-ins of tensor arguments


@dataclass
class Unit:
    """One compile: a kernel's config under one specialization, for every tuned key that shares it."""
    kernel: str
    origin: str                  # "<dist> bundle"
    package: str                 # the bundle's package: the only one imported from
    config: Config
    spec: dict | None
    keys: list[dict] = field(default_factory=list)
    status: str = "pending"      # one of STATUSES
    note: str = ""
    seconds: float = 0.0
    cache_key: str | None = None  # the hash naming Triton's cache directory of the compiled kernel
    variant: tuple[str, ...] = ()  # an alignment variant: these bucketed axes unaligned (not a multiple of 16)
    where: str = ""              # "process" or "thread": where it was compiled
    loaded: bool = False         # ready in this process's JIT cache (launcher built, module loaded)
    load_seconds: float = 0.0
    primed: int = 0              # tuned keys decided ahead: their first call is a hit
    tuned: Any = field(default=None, repr=False, compare=False)  # the @autotune kernel, or an adopted one's Adopted

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "origin": self.origin, "config": self.config.to_json(), "keys": self.keys,
                "status": self.status, "note": self.note, "seconds": round(self.seconds, 4),
                "cache_key": self.cache_key, "variant": list(self.variant), "where": self.where,
                "loaded": self.loaded, "load_seconds": round(self.load_seconds, 4), "primed": self.primed}


@dataclass
class Report:
    """What a warm-up compiled, found cached, skipped (and why) or failed on, and what it readied here."""
    units: list[Unit]
    notes: list[str]
    target: str
    cache_dir: str | None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(u.status == "failed" for u in self.units)

    def counts(self) -> dict[str, int]:
        return {s: sum(u.status == s for u in self.units) for s in STATUSES}

    def to_json(self) -> dict:
        return {"ok": self.ok, "target": self.target, "cache_dir": self.cache_dir, "seconds": round(self.seconds, 3),
                "counts": self.counts(), "loaded": sum(u.loaded for u in self.units),
                "primed": sum(u.primed for u in self.units), "notes": self.notes,
                "units": [u.to_json() for u in self.units]}


def warmup(*distributions: str, background: bool = False, workers: int | None = None,
           processes: bool | None = None, align_variants: bool = True, reserve_mib: int | None = None):
    """Compile every bundled config for this device into Triton's caches and ready this process for
    its tuned shapes (see the module docstring).

    `distributions`: the installed distributions to warm (default: every installed bundle). Returns the
    `Report`; with `background=True`, a started daemon `Background` thread whose `result()` is the
    report, so a server can warm at import time while calls that arrive first compile as they would.
    `processes`: compile in forked processes (default: where the platform forks) or, False, on threads.
    `align_variants`: also compile the alignment variants the tuned keys' buckets need (`variants`).
    `reserve_mib`: taken and ignored, with one warning (a release grew torch's caching allocator by it:
    measured, first calls were no shorter, and the reserve was removed).
    """
    if reserve_mib is not None:
        warning.once("reserve_mib", "flytune: warmup(reserve_mib=...) no longer does anything (growing torch's "
                                    "caching allocator ahead made first calls no shorter): remove it")
    distributions = arguments.names(distributions, "distributions")  # warmup(["a", "b"]): one list, no name
    workers = arguments.count(workers, "workers")
    processes = processes if processes is None else arguments.flag(processes, "processes")
    background, align_variants = arguments.flag(background, "background"), arguments.flag(align_variants,
                                                                                        "align_variants")
    if background:
        worker = Background(distributions, workers, processes, align_variants)
        worker.start()
        return worker
    return run(*plan(distributions), workers=workers, processes=processes, align_variants=align_variants)


class Background(threading.Thread):
    """A warm-up on a daemon thread; `result(timeout)` waits for its `Report` (or re-raises its error).
    It readies the CUDA device that was current where it was started."""

    def __init__(self, distributions, workers, processes=None, align_variants=True):
        super().__init__(name="flytune-warmup", daemon=True)
        self.distributions, self.workers, self.processes = tuple(distributions), workers, processes
        self.align_variants = align_variants
        self.cuda_device = _current_cuda_device()
        self.report: Report | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            if self.cuda_device is not None:
                sys.modules["torch"].cuda.set_device(self.cuda_device)
            self.report = warmup(*self.distributions, workers=self.workers, processes=self.processes,
                                 align_variants=self.align_variants)
        except BaseException as e:  # noqa: BLE001 - kept for result(); a server must not die of a warm-up
            self.error = e
            warning.once(("warmup", "error"), f"flytune: background warm-up stopped: {type(e).__name__}: {e}")
            return
        if not self.report.ok:
            failed = [f"{u.kernel} {u.config}" for u in self.report.units if u.status == "failed"]
            warning.once(("warmup", "failed"), f"flytune: background warm-up could not compile {', '.join(failed)}")

    def result(self, timeout: float | None = None) -> Report | None:
        self.join(timeout)
        if self.error is not None:
            raise self.error
        return self.report


def _current_cuda_device() -> int | None:
    """The calling thread's CUDA device, where torch has started CUDA (never starting it here)."""
    torch = sys.modules.get("torch")
    try:
        return torch.cuda.current_device() if torch is not None and torch.cuda.is_initialized() else None
    except Exception:  # noqa: BLE001 - no usable CUDA: the thread's default device
        return None


class Auto(threading.Thread):
    """FLYTUNE_WARMUP=background: the warm-up of each installed bundle that lists a kernel registered in
    this process, started by that kernel's registration (`Kernel.enroll`), once per bundle."""

    def __init__(self):
        super().__init__(name="flytune-warmup-auto", daemon=True)
        self.cuda_device = _current_cuda_device()
        self.names: list[str] = []
        self.warmed: set[str] = set()
        self.reports: dict[str, Report] = {}
        self.errors: dict[str, BaseException] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.idle = threading.Event()

    def add(self, name: str) -> None:
        with self.lock:
            self.names.append(name)
            self.idle.clear()
        self.wake.set()

    def run(self) -> None:
        if self.cuda_device is not None:
            sys.modules["torch"].cuda.set_device(self.cuda_device)
        seen = 0
        while True:
            self.wake.wait()
            self.wake.clear()
            with self.lock:
                batch, seen = self.names[seen:], len(self.names)
            for dist in sorted(_bundles_listing(set(batch)) - self.warmed):
                self.warmed.add(dist)
                try:
                    self.reports[dist] = report = warmup(dist)
                except BaseException as e:  # noqa: BLE001 - a program must not die of its warm-up
                    self.errors[dist] = e
                    warning.once(("warmup", "auto", dist), f"flytune: FLYTUNE_WARMUP: the warm-up of {dist} "
                                 f"stopped: {type(e).__name__}: {e}")
                    continue
                if not report.ok:
                    failed = [f"{u.kernel} {u.config}" for u in report.units if u.status == "failed"]
                    warning.once(("warmup", "auto-failed", dist),
                                 f"flytune: FLYTUNE_WARMUP: could not compile {', '.join(failed)}")
            with self.lock:
                if seen == len(self.names):
                    self.idle.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Whether every warm-up started so far has finished (waiting up to `timeout` seconds)."""
        return self.idle.wait(timeout)


_auto: Auto | None = None         # this process's background warm-up thread, once started
_auto_lock = threading.Lock()


def _forked() -> None:
    """In a forked child: the parent's warm-up thread is not running here (a child's registration starts
    its own); what the parent warmed is in the disk cache the child shares."""
    global _auto, _auto_lock
    _auto, _auto_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def on_register(name: str) -> None:
    """`Kernel.enroll`'s hook under FLYTUNE_WARMUP=background: warm the bundle listing `name`."""
    global _auto
    with _auto_lock:
        if _auto is None:
            _auto = Auto()
            _auto.start()
        _auto.add(name)


def auto() -> Auto | None:
    """The FLYTUNE_WARMUP=background warm-up of this process, once a kernel has started it."""
    return _auto


def _bundles_listing(names: set[str]) -> set[str]:
    """The installed distributions whose bundle lists one of the kernels `names`."""
    out = set()
    for dist_name, ep in installed.entry_points(warning.once):
        src = installed.locate(ep, dist_name, warning.once)
        if src is not None and names & set(src.manifest.kernels):
            out.add(dist_name)
    return out


def plan(distributions=(), dev: DeviceIdentity | None = None) -> tuple[list[Unit], list[str]]:
    """The units to compile for `dev` (default: this device) from the named distributions' bundles
    (default: every installed bundle), and notes on what is not warmed."""
    wanted = {_normal(d): d for d in distributions}
    bundles = sorted(installed.entry_points(warning.once), key=lambda t: _normal(t[0]))
    listed = {_normal(d) for d, _ in bundles}
    missing = [name for key, name in wanted.items() if key not in listed]
    if missing:   # said first: a name mistyped is the error, whatever the device
        raise BundleError("is not an installed distribution with a flytune bundle", file=", ".join(missing))
    dev = dev or device.current()
    units: dict[tuple, Unit] = {}
    notes: list[str] = []
    found = set()
    for dist_name, ep in bundles:
        if wanted and _normal(dist_name) not in wanted:
            continue
        src = installed.locate(ep, dist_name, warning.once)
        found.add(_normal(dist_name))
        if src is None:
            notes.append(f"{dist_name}: its bundle cannot be read (see the warning); not warmed")
            continue
        value = ep.value.split(":")[0].strip()
        if value != serving.bundle_value(src.manifest.package):  # the manifest is data; the entry point names
            notes.append(f"{src.label}: its entry point {ep.value!r} is not {src.manifest.package}.{bundle.DIRNAME}, "
                         f"the package its manifest names (an editable install, or an altered bundle): nothing is "
                         f"imported for it; not warmed")  # the package the distribution installs
            continue
        if src.package is None:  # a bundle in a package its distribution does not own: nothing imported for it
            notes.append(f"{src.label}: its distribution does not own package {src.manifest.package} (see the "
                         f"warning): nothing is imported for it; not warmed")
            continue
        for kernel, info in sorted(src.manifest.kernels.items()):
            try:
                _add_units(units, src, info, dev, notes)
            except (OSError, FlytuneError) as e:
                notes.append(f"{src.label}: {kernel}: {getattr(e, 'strerror', None) or e}; not warmed")
    if not found:
        notes.append("no installed distribution has a flytune bundle")
    if settings.current().artifact_dirs:
        notes.append("FLYTUNE_ARTIFACT_DIR: artifact directories are not warmed (no package to import kernels from)")
    for u in units.values():
        if u.spec is None:
            u.status = "skipped"
            u.note = (f"{len(u.keys)} Inductor artifact(s): Inductor's lookup table serves them to torch.compile "
                      f"under `flytune_build.inductor.serve()`, which compiles them; not warmed here"
                      if inductor.is_inductor(u.keys[0]) else
                      f"{len(u.keys)} artifact(s) record no specialization (tuned before flytune recorded it): "
                      f"re-tune to warm them")
    return sorted(units.values(), key=lambda u: (u.kernel, u.spec is not None, u.config.canonical())), notes


def _add_units(units: dict, src: installed.Source, info: bundle.ShardInfo, dev: DeviceIdentity,
               notes: list[str]) -> None:
    """One unit per (kernel, config, specialization) among `info`'s artifacts that `dev` is served. An
    artifact whose specialization may not reach the compiler (an earlier release recorded an option
    outside the closed set) is left out, with a note naming it; the kernel's other artifacts are warmed."""
    shard, provenance = src.shard(info.kernel), src.provenance(info.kernel)  # capped reads (docs/security.md)
    prov_path = src.root / info.provenance
    accepted = {}
    for row in shard.rows:
        doc = shard.doc(row)
        key_dev = codec.canonical(doc["device"])
        if key_dev not in accepted:
            art_dev = DeviceIdentity.from_json(doc["device"], Fields(src.root / info.shard, BundleError))
            accepted[key_dev] = src.served_level(art_dev, dev) is not None
        if not accepted[key_dev]:
            continue
        art = Artifact.from_json(doc, file=src.root / info.shard)
        entry = provenance.get(art.address)
        spec = entry.get("specialization") if isinstance(entry, dict) else None
        if spec is not None:  # checked before it names anything to import (a bundle's bytes are data)
            try:
                spec_format.check(spec, Fields(prov_path, BundleError), f"{art.address}.specialization",
                                  art.config.kwargs)
            except BundleError as e:
                notes.append(f"{src.label}: {info.kernel}: {e}; that artifact not warmed (its config is served)")
                continue
        group = (art.kernel, art.config.canonical(), codec.canonical(spec) if spec is not None else None)
        unit = units.get(group)
        if unit is None:
            unit = units[group] = Unit(art.kernel, src.label, src.manifest.package, art.config, spec)
        unit.keys.append(dict(art.key))


def run(units: list[Unit], notes: list[str], *, workers: int | None = None, processes: bool | None = None,
        align_variants: bool = True) -> Report:
    """Compile `units` (from `plan`, with the alignment variants their keys' buckets need) into Triton's
    caches, ready them in this process, and decide their tuned keys ahead; each unit says what happened."""
    start = time.perf_counter()
    todo = [(u, _resolve(u)) for u in units if u.status == "pending"]
    todo = [(u, jit) for u, jit in todo if jit is not None]
    for variant in variants(todo) if align_variants else ():
        units.append(variant[0])
        todo.append(variant)
    tools = compiler.Toolchain.for_device(device.current(), notes)
    if tools is None:
        for u, _ in todo:
            u.status, u.note = "interpreter", "interpreter: nothing to compile"
    elif todo:
        tools.compile_all(todo, workers, processes)
        if tools.launcher_cls is not None:
            with ThreadPoolExecutor(max_workers=compiler.threads(len(todo), workers), thread_name_prefix="flytune-load") as pool:
                list(pool.map(lambda item: tools.load(*item), todo))
    for u, _ in todo:
        if not u.variant and u.status in ("compiled", "cached", "interpreter"):
            _prime(u, notes)
    cache_dir = tools.cache_dir() if tools is not None else None
    return Report(units, notes, tools.label if tools else "interpreter", cache_dir, time.perf_counter() - start)


def _resolve(unit: Unit):
    """The unit's @triton.jit function, imported from its bundle's own package; None (skipped) else."""
    path = unit.spec["kernel"]
    module = path.partition(":")[0]
    try:
        if module != unit.package and not module.startswith(unit.package + "."):
            raise binder.Mismatch(f"records kernel {path}, outside package {unit.package}: not imported")
        # the package first: one being imported on another thread (FLYTUNE_WARMUP, a background warm-up
        # started at import) is waited for, so none of its modules is run here halfway through its import
        importlib.import_module(unit.package)
        module_object = importlib.import_module(module)
        jit = binder.resolve(path, module_object)
        binder.compile_inputs(unit.spec, jit, unit.config)  # the kernel as it is now must fit
        unit.tuned = _tuned(unit, jit)
        return jit
    except binder.Mismatch as e:
        unit.status, unit.note = "skipped", str(e)
    except BaseException as e:  # the package's own import failed (sys.exit too): report it, warm the rest
        if not foreign_failure(e):
            raise
        unit.status, unit.note = "skipped", f"importing {unit.package} or {module} failed: {type(e).__name__}: {e}"
    return None


def _tuned(unit: Unit, jit):
    """The registered kernel named `unit.kernel` whose launch reaches `jit` (through `@triton.heuristics`
    and an Autotuner): a `flytune_build.autotune` kernel, or an adopted `@triton.autotune` kernel's
    `Adopted`, whichever attribute the recorded path names; None where none does."""
    k = registry.kernel(unit.kernel)
    launched = getattr(k, "tuner", None) or getattr(k, "fn", None)
    return k if k is not None and any(o is jit for o in chain(launched)) else None


def variants(todo: list[tuple[Unit, object]]) -> list[tuple[Unit, object]]:
    """The alignment variants the tuned keys' buckets need: a call whose bucketed (pow2, nearest) integer
    axis is not a multiple of 16 shares its tuned key's config but not its specialization, so Triton
    compiles it apart. For each unit, every non-empty subset of its bucketed axes recorded as aligned
    (at most MAX_VARIANT_AXES of them), with those axes' alignment dropped; one unit per distinct
    (kernel, config, specialization) not already planned."""
    have = {(u.kernel, u.config.canonical(), codec.canonical(u.spec)) for u, _ in todo}
    out = []
    for u, jit in todo:
        axes = [a.name for a in getattr(u.tuned, "axes", ()) if a.mode in ("pow2", "nearest")]
        aligned = [a for a in axes if isinstance(u.spec["signature"].get(a), str)
                   and re.fullmatch(r"[iu](32|64)", u.spec["signature"][a])
                   and ["tt.divisibility", 16] in u.spec["attrs"].get(a, [])][:MAX_VARIANT_AXES]
        for n in range(1, len(aligned) + 1):
            for subset in itertools.combinations(aligned, n):
                spec = copy.deepcopy(u.spec)
                for a in subset:
                    spec["attrs"][a] = [attr for attr in spec["attrs"][a] if attr != ["tt.divisibility", 16]]
                group = (u.kernel, u.config.canonical(), codec.canonical(spec))
                if group in have:
                    continue
                have.add(group)
                out.append((Unit(u.kernel, u.origin, u.package, u.config, spec, list(u.keys), variant=subset,
                                 tuned=u.tuned), jit))
    return out


def _prime(unit: Unit, notes: list[str]) -> None:
    """Decide each of the unit's tuned keys ahead, so that key's first call is a hit: a
    `flytune_build.autotune` kernel's from stand-ins carrying the key's values (`Autotuned.prime`), an
    adopted `@triton.autotune` kernel's from the key itself, its config put into the Autotuner's cache
    (`Adopted.prime_key`)."""
    k = unit.tuned
    if k is None:
        return
    for key in unit.keys:
        try:
            if hasattr(k, "prime_key"):
                decided = k.prime_key(key)
            else:
                exclude = set(k.tuned_kwargs) | heuristic_names(k.fn)
                decided = k.prime(**binder.stand_ins(unit.spec, unit.config, key, exclude=exclude))
            if decided is None:
                notes.append(f"{unit.kernel} {key}: compiled, but its config is chosen at its first call, not "
                             f"now (choosing it needs the call's own arguments: the kernel's early_config_prune "
                             f"reads more than the key's scalar arguments, or the key is served from this "
                             f"machine's scratch cache)")
                return
            unit.primed += 1
        except (binder.Mismatch, FlytuneError) as e:
            notes.append(f"{unit.kernel} {key}: not decided ahead ({e}); decided on its first call")
            return


_normal = serving.normalize
