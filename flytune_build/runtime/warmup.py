"""`flytune warmup` and `flytune_build.warmup()`: compile every bundled config for this device before its first call.

For the installed bundles (or those of the named distributions), every artifact that this device is
served at an accepted level and that records its specialization (`provenance.specialization`) is
compiled by `triton.compile` exactly as `JITFunction.run` would compile it, concurrently on a thread
pool; with a GPU, Triton's launcher (a host C module per kernel signature) is built as well. Both land
in Triton's own caches (TRITON_CACHE_DIR, default ~/.triton/cache), where a later first call, in any
process, finds them.

Invariants (tests/test_warmup.py):
- only modules under a bundle's own package (its manifest's `package`) are imported, and only for the
  `module:qualname` an artifact records; nothing else read from a bundle is executed;
- the JIT's in-process caches are never touched: a kernel call made during a warm-up compiles as it
  would without one (Triton writes its cache files atomically), so a warm-up is only ever a head start;
- under the interpreter nothing compiles: each config is reported "interpreter: nothing to compile";
- artifacts without a specialization (tuned before it was recorded) are skipped with a note.
"""
from __future__ import annotations

import importlib
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ..core import bundle, codec, settings, table
from ..core import specialization as spec_format
from ..core.artifact import Artifact
from ..core.codec import Fields
from ..core.config import Config
from ..core.device import DeviceIdentity
from ..core.errors import BundleError, FlytuneError, foreign_failure
from ..core.target import match_level
from . import device, offline, binder, warning

STATUSES = ("compiled", "cached", "interpreter", "skipped", "failed")


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

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "origin": self.origin, "config": self.config.to_json(), "keys": self.keys,
                "status": self.status, "note": self.note, "seconds": round(self.seconds, 4),
                "cache_key": self.cache_key}


@dataclass
class Report:
    """What a warm-up compiled, found cached, skipped (and why) or failed on."""
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
                "counts": self.counts(), "notes": self.notes, "units": [u.to_json() for u in self.units]}

    def render(self) -> str:
        rows = [("kernel", "config", "tuned keys", "status", "seconds", "note")]
        for u in self.units:
            keys = ",".join(f"{k}={v}" for k, v in u.keys[0].items())
            keys += f" (+{len(u.keys) - 1})" if len(u.keys) > 1 else ""
            rows.append((u.kernel, str(u.config), keys, u.status, f"{u.seconds:.2f}", u.note))
        c = self.counts()
        lines = [table.render(rows, align="    >")] if self.units else []
        lines += [f"note: {n}" for n in self.notes]
        lines.append(f"flytune: warm-up for {self.target}: {c['compiled']} compiled, {c['cached']} already cached, "
                     f"{c['interpreter']} on the interpreter, {c['skipped']} skipped, {c['failed']} failed, "
                     f"in {self.seconds:.1f} s" + (f"; Triton cache: {self.cache_dir}" if self.cache_dir else ""))
        return "\n".join(lines)


def warmup(*distributions: str, background: bool = False, workers: int | None = None):
    """Compile every bundled config for this device into Triton's caches (see the module docstring).

    `distributions`: the installed distributions to warm (default: every installed bundle). Returns the
    `Report`; with `background=True`, a started daemon `Background` thread whose `result()` is the
    report, so a server can warm at import time while calls that arrive first compile as they would.
    """
    if background:
        worker = Background(distributions, workers)
        worker.start()
        return worker
    return run(*plan(distributions), workers=workers)


class Background(threading.Thread):
    """A warm-up on a daemon thread; `result(timeout)` waits for its `Report` (or re-raises its error)."""

    def __init__(self, distributions, workers):
        super().__init__(name="flytune-warmup", daemon=True)
        self.distributions, self.workers = tuple(distributions), workers
        self.report: Report | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.report = warmup(*self.distributions, workers=self.workers)
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


def plan(distributions=(), dev: DeviceIdentity | None = None) -> tuple[list[Unit], list[str]]:
    """The units to compile for `dev` (default: this device) from the named distributions' bundles
    (default: every installed bundle), and notes on what is not warmed."""
    dev = dev or device.current()
    wanted = {_normal(d): d for d in distributions}
    units: dict[tuple, Unit] = {}
    notes: list[str] = []
    found = set()
    for dist_name, ep in sorted(offline.bundle_entry_points(), key=lambda t: _normal(t[0])):
        if wanted and _normal(dist_name) not in wanted:
            continue
        src = offline.locate(ep, dist_name)
        found.add(_normal(dist_name))
        if src is None:
            notes.append(f"{dist_name}: its bundle cannot be read (see the warning); not warmed")
            continue
        value = ep.value.split(":")[0].strip()
        if value != f"{src.manifest.package}.{bundle.DIRNAME}":  # the manifest is data; the entry point names
            notes.append(f"{src.label}: its entry point {ep.value!r} is not {src.manifest.package}.{bundle.DIRNAME}, "
                         f"the package its manifest names (an editable install, or an altered bundle): nothing is "
                         f"imported for it; not warmed")  # the package the distribution installs
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


def _add_units(units: dict, src, info: bundle.ShardInfo, dev: DeviceIdentity) -> None:
    """One unit per (kernel, config, specialization) among `info`'s artifacts that `dev` is served."""
    shard = bundle.parse_shard(info, (src.root / info.shard).read_bytes(), file=src.root / info.shard)
    prov_path = src.root / info.provenance
    provenance = bundle.parse_provenance(info, prov_path.read_bytes(), file=prov_path)
    accepted = {}
    for row in shard.rows:
        doc = shard.doc(row)
        key_dev = codec.canonical(doc["device"])
        if key_dev not in accepted:
            art_dev = DeviceIdentity.from_json(doc["device"], Fields(src.root / info.shard, BundleError))
            accept = next((t.accept for t in src.manifest.targets if t.covers(art_dev)), ())
            accepted[key_dev] = match_level(art_dev, dev) in accept
        if not accepted[key_dev]:
            continue
        art = Artifact.from_json(doc, file=src.root / info.shard)
        entry = provenance.get(art.address)
        spec = entry.get("specialization") if isinstance(entry, dict) else None
        if spec is not None:  # checked before it names anything to import (a bundle's bytes are data)
            spec_format.check(spec, Fields(prov_path, BundleError), f"{art.address}.specialization")
        group = (art.kernel, art.config.canonical(), codec.canonical(spec) if spec is not None else None)
        unit = units.get(group)
        if unit is None:
            unit = units[group] = Unit(art.kernel, src.label, src.manifest.package, art.config, spec)
        unit.keys.append(dict(art.key))


def run(units: list[Unit], notes: list[str], *, workers: int | None = None) -> Report:
    """Compile `units` (from `plan`) into Triton's caches; each unit's status says what happened."""
    start = time.perf_counter()
    todo = [(u, _resolve(u)) for u in units if u.status == "pending"]
    todo = [(u, jit) for u, jit in todo if jit is not None]
    tools = Toolchain.for_device(device.current(), notes)
    if tools is None:
        for u, _ in todo:
            u.status, u.note = "interpreter", "interpreter: nothing to compile"
    elif todo:
        with ThreadPoolExecutor(max_workers=max(1, min(len(todo), workers or os.cpu_count() or 4)),
                                thread_name_prefix="flytune-warmup") as pool:
            list(pool.map(lambda item: tools.compile(*item), todo))
    cache_dir = tools.cache_dir() if tools is not None else None
    return Report(units, notes, tools.label if tools else "interpreter", cache_dir, time.perf_counter() - start)


def _resolve(unit: Unit):
    """The unit's @triton.jit function, imported from its bundle's own package; None (skipped) else."""
    path = unit.spec["kernel"]
    module = path.partition(":")[0]
    try:
        if module != unit.package and not module.startswith(unit.package + "."):
            raise binder.Mismatch(f"records kernel {path}, outside package {unit.package}: not imported")
        jit = binder.resolve(path, importlib.import_module(module))
        binder.compile_inputs(unit.spec, jit, unit.config)  # the kernel as it is now must fit
        return jit
    except binder.Mismatch as e:
        unit.status, unit.note = "skipped", str(e)
    except BaseException as e:  # the package's own import failed (sys.exit too): report it, warm the rest
        if not foreign_failure(e):
            raise
        unit.status, unit.note = "skipped", f"importing {module} failed: {type(e).__name__}: {e}"
    return None


class Toolchain:
    """Triton's target, backend and launcher for the device being warmed."""

    def __init__(self, target, launcher_cls, label: str):
        from triton.compiler.compiler import make_backend

        self.target, self.backend, self.launcher_cls, self.label = target, make_backend(target), launcher_cls, label
        self._launchers: dict[str, threading.Lock] = {}

    @classmethod
    def for_device(cls, dev: DeviceIdentity, notes: list[str]) -> "Toolchain | None":
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

    def compile(self, unit: Unit, jit) -> None:
        import triton

        start = time.perf_counter()
        try:
            jit = binder.compilable(jit)
            src, options, digest = binder.cache_hash(unit.spec, jit, unit.config, self.backend)
            unit.cache_key = digest
            cached = self._cached(digest, src.name)
            kernel = triton.compile(src, target=self.target, options=options.__dict__)
            if self.launcher_cls is not None:
                signature = codec.canonical([repr(sorted(src.constants.items())), repr(src.signature)]).decode()
                with self._launchers.setdefault(signature, threading.Lock()):  # one C build per signature
                    self.launcher_cls(kernel.src, kernel.metadata)
            unit.status = "cached" if cached else "compiled"
        except Exception as e:  # noqa: BLE001 - the runtime would fail on it too: report it, warm the rest
            first = (str(e).strip().splitlines() or [""])[0][:300]
            unit.status, unit.note = "failed", f"{type(e).__name__}: {first}"
        unit.seconds = time.perf_counter() - start

    @staticmethod
    def _cached(digest: str, name: str) -> bool:
        from triton.runtime.cache import get_cache_manager

        return bool((get_cache_manager(digest).get_group(f"{name[:150]}.json") or {}).get(f"{name[:150]}.json"))

    @staticmethod
    def cache_dir() -> str | None:
        from triton import knobs

        return knobs.cache.dir or None


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
