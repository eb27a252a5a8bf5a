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
`flytune_build.autotune` kernel is decided ahead (`Autotuned.prime`), so the first call of a tuned
shape is a hit in both: it costs what a later call costs.

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
- artifacts without a specialization (tuned before it was recorded) are skipped with a note.
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

from ..core import arguments, bundle, codec, installed, serving, settings, table
from ..core import specialization as spec_format
from ..core.artifact import Artifact
from ..core.codec import Fields
from ..core.config import Config
from ..core.device import DeviceIdentity
from ..core.errors import BundleError, FlytuneError, foreign_failure
from . import binder, device, warning
from .wrapping import chain

STATUSES = ("compiled", "cached", "interpreter", "skipped", "failed")
CHILD_TIMEOUT = 60.0  # seconds (and 2 s a unit) for the forked compiles; past it the rest compile on threads here
MAX_VARIANT_AXES = 3   # bucketed axes whose alignment variants are warmed (2**3 - 1 variants at most)
# Triton's pointer element types -> torch dtype names, for the stand-ins of tensor arguments
_TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64", "i8": "int8",
                 "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32",
                 "u64": "uint64", "u1": "bool", "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2",
                 "fp8e4b8": "float8_e4m3fnuz", "fp8e5b16": "float8_e5m2fnuz"}


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
    tuned: Any = field(default=None, repr=False, compare=False)  # the @autotune kernel (None: adopted)

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

    def render(self) -> str:
        rows = [("kernel", "config", "tuned keys", "status", "seconds", "here", "note")]
        for u in self.units:
            keys = ",".join(f"{k}={v}" for k, v in u.keys[0].items()) if u.keys else ""
            keys += f" (+{len(u.keys) - 1})" if len(u.keys) > 1 else ""
            keys += f" [{','.join(u.variant)} unaligned]" if u.variant else ""
            here = "ready" if u.loaded else "-"
            here += f", {u.primed} decided" if u.primed else ""
            rows.append((u.kernel, str(u.config), keys, u.status + (f" ({u.where})" if u.where else ""),
                         f"{u.seconds:.2f}", here, u.note))
        c = self.counts()
        lines = [table.render(rows, align="    >")] if self.units else []
        lines += [f"note: {n}" for n in self.notes]
        ready = sum(u.loaded for u in self.units)
        lines.append(f"flytune: warm-up for {self.target}: {c['compiled']} compiled, {c['cached']} already cached, "
                     f"{c['interpreter']} on the interpreter, {c['skipped']} skipped, {c['failed']} failed, "
                     f"{ready} ready in this process, {sum(u.primed for u in self.units)} tuned keys decided, "
                     f"in {self.seconds:.1f} s" + (f"; Triton cache: {self.cache_dir}" if self.cache_dir else ""))
        return "\n".join(lines)


def warmup(*distributions: str, background: bool = False, workers: int | None = None,
           processes: bool | None = None, align_variants: bool = True):
    """Compile every bundled config for this device into Triton's caches and ready this process for
    its tuned shapes (see the module docstring).

    `distributions`: the installed distributions to warm (default: every installed bundle). Returns the
    `Report`; with `background=True`, a started daemon `Background` thread whose `result()` is the
    report, so a server can warm at import time while calls that arrive first compile as they would.
    `processes`: compile in forked processes (default: where the platform forks) or, False, on threads.
    `align_variants`: also compile the alignment variants the tuned keys' buckets need (`variants`).
    """
    distributions = arguments.names(distributions, "distributions")  # warmup(["a", "b"]): one list, no name
    workers = arguments.count(workers, "workers")
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
    this process, started by that kernel's registration (`registry.register`), once per bundle."""

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


_auto: Auto | None = None
_auto_lock = threading.Lock()


def on_register(name: str) -> None:
    """`registry.register`'s hook under FLYTUNE_WARMUP=background: warm the bundle listing `name`."""
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
    dev = dev or device.current()
    wanted = {_normal(d): d for d in distributions}
    units: dict[tuple, Unit] = {}
    notes: list[str] = []
    found = set()
    for dist_name, ep in sorted(installed.entry_points(warning.once), key=lambda t: _normal(t[0])):
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
                _add_units(units, src, info, dev)
            except (OSError, FlytuneError) as e:
                notes.append(f"{src.label}: {kernel}: {getattr(e, 'strerror', None) or e}; not warmed")
    missing = [name for key, name in wanted.items() if key not in found]
    if missing:
        raise BundleError("is not an installed distribution with a flytune bundle", file=", ".join(missing))
    if not found:
        notes.append("no installed distribution has a flytune bundle")
    if settings.current().artifact_dirs:
        notes.append("FLYTUNE_ARTIFACT_DIR: artifact directories are not warmed (no package to import kernels from)")
    for u in units.values():
        if u.spec is None:
            u.status = "skipped"
            u.note = (f"{len(u.keys)} artifact(s) record no specialization (tuned before flytune recorded it): "
                      f"re-tune to warm them")
    return sorted(units.values(), key=lambda u: (u.kernel, u.spec is not None, u.config.canonical())), notes


def _add_units(units: dict, src: installed.Source, info: bundle.ShardInfo, dev: DeviceIdentity) -> None:
    """One unit per (kernel, config, specialization) among `info`'s artifacts that `dev` is served."""
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
            spec_format.check(spec, Fields(prov_path, BundleError), f"{art.address}.specialization", art.config.kwargs)
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
    tools = Toolchain.for_device(device.current(), notes)
    if tools is None:
        for u, _ in todo:
            u.status, u.note = "interpreter", "interpreter: nothing to compile"
    elif todo:
        tools.compile_all(todo, workers, processes)
        if tools.launcher_cls is not None:
            with ThreadPoolExecutor(max_workers=_threads(len(todo), workers), thread_name_prefix="flytune-load") as pool:
                list(pool.map(lambda item: tools.load(*item), todo))
    for u, _ in todo:
        if not u.variant and u.status in ("compiled", "cached", "interpreter"):
            _prime(u, notes)
    cache_dir = tools.cache_dir() if tools is not None else None
    return Report(units, notes, tools.label if tools else "interpreter", cache_dir, time.perf_counter() - start)


def _threads(n: int, workers: int | None) -> int:
    return max(1, min(n, workers or os.cpu_count() or 4))


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
        unit.tuned = _tuned(unit, path, module_object)
        return jit
    except binder.Mismatch as e:
        unit.status, unit.note = "skipped", str(e)
    except BaseException as e:  # the package's own import failed (sys.exit too): report it, warm the rest
        if not foreign_failure(e):
            raise
        unit.status, unit.note = "skipped", f"importing {unit.package} or {module} failed: {type(e).__name__}: {e}"
    return None


def _tuned(unit: Unit, path: str, module_object):
    """The `flytune_build.autotune` kernel named `unit.kernel` that the recorded attribute is or wraps
    (through `@triton.heuristics`); None for an adopted `@triton.autotune` kernel."""
    obj = module_object
    for part in spec_format.IMPORT_PATH.fullmatch(path)["qualname"].split("."):
        obj = getattr(obj, part, None)
    for o in chain(obj):
        if binder.is_jit(o):
            return None
        if getattr(o, "name", None) == unit.kernel and callable(getattr(o, "prime", None)):
            return o
    return None


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
    """Decide each of the unit's tuned keys ahead (`Autotuned.prime`), from stand-ins carrying the key's
    values: that key's first call is a dict hit. Kernels without the seam (adopted ones) decide on their
    first call, as before."""
    k = unit.tuned
    if k is None:
        return
    for key in unit.keys:
        try:
            named = stand_ins(unit.spec, unit.config, key, exclude=set(k.tuned_kwargs) | _heuristic_names(k.fn))
            if k.prime(**named) is None:
                notes.append(f"{unit.kernel} {key}: not decided ahead (no scratch or offline decision without "
                             f"the call's own tensors: a scratch cache for it, or an early_config_prune); "
                             f"decided on its first call")
                return
            unit.primed += 1
        except (binder.Mismatch, FlytuneError) as e:
            notes.append(f"{unit.kernel} {key}: not decided ahead ({e}); decided on its first call")
            return


def _heuristic_names(fn) -> set[str]:
    """The parameters `@triton.heuristics` wrappers around `fn` set (the caller never passes them)."""
    out = set()
    for o in chain(fn):
        if o is not fn and binder.is_jit(o):
            break
        values = getattr(o, "values", None)
        if isinstance(values, dict):
            out |= set(values)
    return out


class Pointer:
    """A tensor's stand-in for Triton's binder (as Triton's `MockTensor`): a dtype and an address that is,
    or is not, a multiple of 16; no shape or strides (so no scratch-cache layout)."""

    def __init__(self, dtype, aligned: bool):
        self.dtype, self._address = dtype, 0 if aligned else 8

    def data_ptr(self) -> int:
        return self._address

    @staticmethod
    def ptr_range() -> int:
        return 0


def stand_ins(spec: dict, config: Config, key: dict | None = None, exclude: set = frozenset()) -> dict:
    """One value per parameter (but `exclude`) that Triton specialises as `spec` records; with `key`,
    its axes take the key's values (a tensor axis: a stand-in of that dtype). Mismatch where a recorded
    type has no stand-in (a tuple, a tensor descriptor, a low-precision scalar)."""
    import torch

    key = key or {}
    out = {}
    for name, ty in spec["signature"].items():
        if name in exclude:
            continue
        attrs = spec["attrs"].get(name, [])
        if not isinstance(ty, str):
            raise binder.Mismatch(f"{name} is a tuple argument: no stand-in")
        if ty == "constexpr":
            value = spec["constexprs"].get(name, key.get(name))
            out[name] = _constexpr(value)
            continue
        aligned = ["tt.divisibility", 16] in attrs
        if ty.startswith("*"):
            element = ty[2:] if ty.startswith("*k") else ty[1:]
            dtype_name = key.get(name, _TORCH_DTYPES.get(element))
            dtype = getattr(torch, str(dtype_name), None) if dtype_name is not None else None
            if dtype is None:
                raise binder.Mismatch(f"{name} is a {ty} tensor: no torch dtype stands in for it")
            out[name] = Pointer(dtype, aligned)
        elif name in key:
            out[name] = key[name]
        elif ty in ("i32", "i64", "u64"):
            base = {"i32": 0, "i64": 1 << 32, "u64": 1 << 63}[ty]
            out[name] = base + (16 if aligned else 17)
        elif ty == "i1":
            out[name] = True
        elif ty == "fp32":
            out[name] = 1.5
        else:
            raise binder.Mismatch(f"{name} is a {ty} scalar: no stand-in")
    return out


def _constexpr(value):
    if isinstance(value, dict):
        import triton.language as tl

        return tl.dtype(value["dtype"])
    return value


class Toolchain:
    """Triton's target, backend and launcher for the device being warmed."""

    def __init__(self, target, launcher_cls, label: str):
        from triton.compiler.compiler import make_backend

        self.target, self.backend, self.launcher_cls, self.label = target, make_backend(target), launcher_cls, label
        self._launchers: dict[str, threading.Lock] = {}
        self._locks = threading.Lock()

    @classmethod
    def for_device(cls, dev: DeviceIdentity, notes: list[str]) -> Toolchain | None:
        """None under the interpreter; the GPU's own target when one is visible; else (a build machine
        without a GPU, FLYTUNE_DEVICE naming the target) kernels only, the launcher left to the first call."""
        if dev.backend == "interpreter":
            return None
        try:
            from triton.runtime.driver import driver

            active = driver.active  # builds Triton's driver utilities on first use: part of the warm-up
            target = active.get_current_target()
            return cls(target, active.launcher_cls, f"{dev} ({target.backend} {target.arch})")
        except Exception:  # noqa: BLE001 - no GPU driver here: compile for the named device only
            from triton.backends.compiler import GPUTarget

            m = re.fullmatch(r"sm_([0-9]+)[a-z]?", dev.arch)
            target = (GPUTarget("cuda", int(m[1]), 32) if m else
                      GPUTarget("hip", dev.arch, 64 if dev.arch.startswith("gfx9") else 32))
            notes.append(f"no GPU driver here: kernels compiled for {target.backend} {target.arch}; each kernel "
                         f"signature's launcher is built on its first call")
            return cls(target, None, f"{dev} (no GPU: kernels only)")

    def compile_all(self, todo: list[tuple[Unit, object]], workers: int | None, processes: bool | None) -> None:
        """Every unit into Triton's disk cache: those not cached yet in processes forked from this one
        (Triton's front end holds the GIL, so threads serialize), else, or for what the processes left,
        on threads."""
        pending, signatures = [], []
        for u, jit in todo:
            try:
                src, _, u.cache_key = binder.cache_hash(u.spec, binder.compilable(jit), u.config, self.backend)
            except Exception as e:  # noqa: BLE001 - the runtime would fail on it too: report it, warm the rest
                u.status, u.note = "failed", _first_line(e)
                continue
            if self._cached(u.cache_key, src.name):
                u.status, u.where = "cached", ""
            else:
                pending.append((u, jit))
                signatures.append(_signature(src))
        if processes is None:
            processes = sys.platform.startswith("linux") and len(pending) > 1
        if processes and pending:
            pending = self._fork_compile(*self._builders_first(pending, signatures), workers)
        if pending:
            with ThreadPoolExecutor(max_workers=_threads(len(pending), workers),
                                    thread_name_prefix="flytune-warmup") as pool:
                list(pool.map(lambda item: self.compile(*item), pending))

    def _builders_first(self, pending: list, signatures: list[str]) -> tuple[list, int]:
        """`pending` reordered, and n: its first n units are one per kernel signature, and the child that
        compiles each also builds that signature's launcher (a C compile, about 0.5 s on the H200's host),
        so those builds overlap the other units' compiles instead of all following them in `load`."""
        if self.launcher_cls is None:
            return pending, 0
        first, rest, seen = [], [], set()
        for item, signature in zip(pending, signatures):
            (rest if signature in seen else first).append(item)
            seen.add(signature)
        return first + rest, len(first)

    def _fork_compile(self, pending: list[tuple[Unit, object]], builders: int, workers: int | None) -> list:
        """Compile `pending` in forked processes (they inherit the imported kernels; no CUDA call is made
        in them), the first `builders` with their launchers; returns the units they did not finish (a fork
        refused, a child timed out or died)."""
        import multiprocessing

        token = id(pending)
        _FORKED[token] = (self, pending, builders)
        pool = None
        try:
            pool = multiprocessing.get_context("fork").Pool(_threads(len(pending), workers))
            results = pool.map_async(_compile_forked, [(token, i) for i in range(len(pending))])
            done = results.get(CHILD_TIMEOUT + 2.0 * len(pending))
        except Exception as e:  # noqa: BLE001 - no fork here, or a child hung or died: threads take over
            warning.once(("warmup", "fork"), f"flytune: warm-up: compiling in forked processes failed "
                         f"({type(e).__name__}: {e}); compiling on threads")
            return pending
        finally:
            _FORKED.pop(token, None)
            if pool is not None:
                pool.terminate()
        left = []
        for (u, jit), (status, note, seconds) in zip(pending, done):
            if status == "compiled":
                u.status, u.note, u.seconds, u.where = status, note, seconds, "process"
            else:  # compiled again here, where the error is the one a first call would meet
                left.append((u, jit))
        return left

    def compile(self, unit: Unit, jit, launcher: bool = False) -> None:
        """One unit into Triton's disk cache on this thread; with `launcher` (and a GPU's launcher class),
        its signature's launcher too. Building a launcher makes no CUDA call: a forked child may."""
        import triton

        start = time.perf_counter()
        try:
            jit = binder.compilable(jit)
            src, options, digest = binder.cache_hash(unit.spec, jit, unit.config, self.backend)
            unit.cache_key = digest
            cached = self._cached(digest, src.name)
            kernel = triton.compile(src, target=self.target, options=options.__dict__)
            unit.status, unit.where = ("cached", "") if cached else ("compiled", "thread")
        except Exception as e:  # noqa: BLE001 - the runtime would fail on it too: report it, warm the rest
            unit.status, unit.note = "failed", _first_line(e)
        else:
            if launcher and self.launcher_cls is not None:
                try:
                    self.launcher_cls(kernel.src, kernel.metadata)  # lands in Triton's cache, as `kernel.run` would
                except Exception:  # noqa: BLE001 - `load` builds it again and says why it fails
                    pass
        unit.seconds = time.perf_counter() - start

    def load(self, unit: Unit, jit) -> None:
        """Ready the unit in this process: its kernel (from the disk cache), launcher built and module
        loaded onto the current device, put into `jit`'s own cache under the key `JITFunction.run`
        computes for a call specialised as recorded, if that key is free (see the module docstring)."""
        if unit.status not in ("compiled", "cached") or type(jit).__name__ != "JITFunction":
            return
        import triton
        from triton import knobs
        from triton.runtime.driver import driver
        from triton.runtime.jit import compute_cache_key

        start = time.perf_counter()
        try:
            kernel_cache, key_cache, _, backend, bind = jit.device_caches[driver.active.get_current_device()]
            named = stand_ins(unit.spec, unit.config, exclude=set(unit.config.kwargs))
            keys = []
            for options in _launch_options(unit.config):  # as flytune's launch, and Triton's Autotuner's, pass them
                options["debug"] = options.get("debug", jit.debug) or knobs.runtime.debug  # as JITFunction.run
                options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
                _, specialization, extra = bind(**named, **options)
                _check_specialization(unit.spec, jit, specialization, backend)
                keys.append(compute_cache_key(key_cache, specialization, extra))
            free = [k for k in dict.fromkeys(keys) if k not in kernel_cache]
            if free:
                src, parsed, digest = binder.cache_hash(unit.spec, jit, unit.config, backend)
                kernel = triton.compile(src, target=self.target, options=parsed.__dict__)
                if kernel.hash != digest:
                    raise binder.Mismatch("the kernel compiled here does not have the recorded cache key")
                with self._launcher_lock(src):
                    kernel.run  # noqa: B018 - builds the launcher and loads the module onto the device
                for k in free:
                    kernel_cache.setdefault(k, kernel)
            unit.loaded = True
        except binder.Mismatch as e:
            unit.note = (unit.note + "; " if unit.note else "") + f"not readied in this process: {e}"
        except Exception as e:  # noqa: BLE001 - the first call compiles it as it would have; say why
            unit.note = (unit.note + "; " if unit.note else "") + f"not readied in this process: {_first_line(e)}"
        unit.load_seconds = time.perf_counter() - start

    def _launcher_lock(self, src) -> threading.Lock:
        """One launcher build per kernel signature at a time (a C compile)."""
        signature = _signature(src)
        with self._locks:
            return self._launchers.setdefault(signature, threading.Lock())

    @staticmethod
    def _cached(digest: str, name: str) -> bool:
        from triton.runtime.cache import get_cache_manager

        return bool((get_cache_manager(digest).get_group(f"{name[:150]}.json") or {}).get(f"{name[:150]}.json"))

    @staticmethod
    def cache_dir() -> str | None:
        from triton import knobs

        return knobs.cache.dir or None


def _signature(src) -> str:
    """What a Triton launcher's C source is made from: the kernel's argument types, constexpr ones skipped
    (Triton 3.x `make_launcher`; a constexpr's value does not enter it, tensor descriptors' metadata may)."""
    return repr(list(src.signature.items()))


_FORKED: dict[int, tuple[Toolchain, list, int]] = {}


def _compile_forked(job: tuple[int, int]) -> tuple[str, str, float]:
    """In a forked child: compile one pending unit into the disk cache; (status, note, seconds)."""
    toolchain, pending, builders = _FORKED[job[0]]
    unit, jit = pending[job[1]]
    unit.where = ""
    toolchain.compile(unit, jit, launcher=job[1] < builders)
    return unit.status, unit.note, unit.seconds


def _launch_options(config: Config) -> list[dict]:
    """The compile options a launch of `config` passes, in the orders that make Triton's in-process key:
    flytune's (`Config.launch_kwargs`) and `triton.Config.all_kwargs`'s (an adopted kernel's)."""
    ours = dict(config.launch_kwargs())
    tritons = dict(config.kwargs, num_warps=config.num_warps, num_ctas=config.num_ctas, num_stages=config.num_stages)
    if config.maxnreg is not None:
        tritons["maxnreg"] = config.maxnreg
    return [ours, tritons]


def _check_specialization(spec: dict, jit, specialization, backend) -> None:
    """Raise Mismatch unless the binder's `specialization` of the stand-ins is the recorded one."""
    for name, (ty, code) in zip(jit.arg_names, specialization):
        want = spec["signature"].get(name)
        if ty != want:
            raise binder.Mismatch(f"stand-ins specialise {name} as {ty}, recorded {want}")
        if ty == "constexpr":
            if code != _constexpr(spec["constexprs"].get(name)):
                raise binder.Mismatch(f"stand-ins give constexpr {name} = {code!r}")
            continue
        got = [list(a) for a in backend.parse_attr(code)] if isinstance(code, str) else []
        if got != [list(a) for a in spec["attrs"].get(name, [])]:
            raise binder.Mismatch(f"stand-ins give {name} the attributes {got}")


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"


_normal = serving.normalize
