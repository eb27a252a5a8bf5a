"""Inductor at compile time: shipped winners served to torch.compile and AOTInductor, and winners recorded.

Serving (`serve()`, opt-in, a context or a handle): the installed bundles' Inductor artifacts for the
running device (core.inductor, read through the offline tier) become entries of
`torch._inductor.config.autotune_lookup_table`, Inductor's own lookup, which it forwards to its
compile worker processes: a served kernel is compiled with its shipped config alone. In this
process, where Inductor benchmarks (`CachingAutotuner.precompile`, parent side), each generated
kernel is counted: served from the bundle, autotuned by Inductor (not in the bundle), or single (one
candidate, nothing to tune). A served kernel keeps exactly its shipped config: any other candidate
the compile made for it (a worker's, or occupancy-driven R0_BLOCK variants) is dropped, and it is
marked as coordinate-descent-tuned so Inductor tunes it no further. Under FLYTUNE_AUTOTUNE=strict a
kernel that would be autotuned raises `TierMissError` naming it. Closing says once, in one warning,
how many kernels hit and missed and what differs (device, toolchain) when any missed.

Recording (runtime.recording, for `flytune harvest` on the target GPU) is called from the same
patched methods; `compile_once()` is the harvest's compile.

The hooks are private to PyTorch: `HOOKS` names each one, `missing()` says which this torch lacks, and
tests pin them. Nothing here changes a compile outside `serve()` or `recording()`.
"""
from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Any

from ..core import inductor, settings
from ..core.codec import Fields
from ..core.config import Config
from ..core.device import DeviceIdentity
from ..core.errors import ArgumentTypeError, ArtifactError, DeviceError, FlytuneError, TierMissError
from . import device as running_device
from . import warning
from .offline import TIER, Index

# (module, attribute path) of every private PyTorch name used here; torch 2.9 and later hold them all
HOOKS = (
    ("torch._inductor.config", "autotune_lookup_table"),
    ("torch._inductor.runtime.triton_heuristics", "generate_lookup_hash_from_source_code"),
    ("torch._inductor.runtime.triton_heuristics", "lookup_autotune_config"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.precompile"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.benchmark_all_configs"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.coordinate_descent_tuning"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.bench"),
)
SUPPORTED = "torch 2.9 or later (torch._inductor.config.autotune_lookup_table appeared in 2.9)"
STATS_NAME = "torch.compile"  # the name flytune_build.stats() and on_decision give Inductor's kernels


def missing() -> list[str]:
    """The hooks (`HOOKS`) the installed torch lacks; [] where every one is there."""
    out = []
    for module, path in HOOKS:
        try:
            obj = importlib.import_module(module)
            for part in path.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError):
            out.append(f"{module}.{path}")
    return out


def kernel_key(autotuner) -> str:
    """The lookup hash of a `CachingAutotuner`'s kernel, as Inductor computes it (core.inductor.lookup_key)."""
    return inductor.lookup_key(str(autotuner.size_hints), autotuner.fn.src)


def kernel_name(autotuner) -> str:
    return str((autotuner.inductor_meta or {}).get("kernel_name") or autotuner.fn.__name__)


# -- the one patch: CachingAutotuner's parent-side methods call the active serving or recording ---------------
active: list = []  # the innermost serve() or recording() is the last


def _patched(name: str, wrapper):
    """Install `wrapper(original, self, *args, **kwargs)` as CachingAutotuner.<name> once per process."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    original = getattr(CachingAutotuner, name)
    if getattr(original, "__flytune__", False):
        return

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        return wrapper(original, self, *args, **kwargs)

    method.__flytune__ = True
    setattr(CachingAutotuner, name, method)


def install_hooks() -> None:
    _patched("precompile", _precompile)
    _patched("benchmark_all_configs", _benchmark_all_configs)
    _patched("coordinate_descent_tuning", _coordinate_descent_tuning)


def _precompile(original, self, warm_cache_only=False, *args, **kwargs):
    if warm_cache_only or not active or not isinstance(active[-1], Serving):  # a worker's, or not serving
        return original(self, warm_cache_only, *args, **kwargs)
    ctx = active[-1]
    ctx.before_precompile(self)
    out = original(self, warm_cache_only, *args, **kwargs)
    ctx.after_precompile(self)
    return out


def _recording():
    """The innermost open runtime.recording.Recording, or None (a serving, or nothing, is open)."""
    return active[-1] if active and not isinstance(active[-1], Serving) else None


def _benchmark_all_configs(original, self, *args, **kwargs):
    ctx = _recording()
    return original(self, *args, **kwargs) if ctx is None else ctx.benchmark(original, self, *args, **kwargs)


def _coordinate_descent_tuning(original, self, launcher, *args, **kwargs):
    found = original(self, launcher, *args, **kwargs)
    ctx = _recording()
    return found if ctx is None else ctx.coordesc(self, launcher, found, args, kwargs)


def _blocks(kwargs: dict) -> set:
    return {k for k in kwargs if "BLOCK" in k}


def _same(triton_config, entry: dict) -> bool:
    """Whether a triton.Config is the lookup-table entry `entry` (block sizes, warps, stages)."""
    blocks, want = ({k: v for k, v in d.items() if "BLOCK" in k} for d in (triton_config.kwargs, entry))
    return (blocks == want and triton_config.num_warps == entry["num_warps"]
            and triton_config.num_stages == entry["num_stages"])


# -- serving ---------------------------------------------------------------------------------------------------
@dataclass
class Kernel:
    """How one generated kernel of a compile was served."""
    name: str           # Inductor's name (triton_poi_fused_gelu_3)
    key: str            # its lookup hash
    tier: str           # "offline" (the bundle's config), "autotune" (Inductor's search), "single"
    config: dict | None = None
    origin: str | None = None
    level: str | None = None


@dataclass
class Shipped:
    entry: dict         # the lookup-table value
    kernel: str         # the flytune kernel (compile entry) it was harvested under
    origin: str
    level: str
    provenance: Any


class Serving:
    """The installed bundles' Inductor winners served to the compiles made while it is open."""

    def __init__(self, shipped: dict[str, Shipped], device: DeviceIdentity | None, other_devices: set[str],
                 problems: list[str], unsupported: list[str]):
        self.shipped = shipped
        self.device = device
        self.other_devices = other_devices
        self.problems = problems
        self.unsupported = unsupported    # the hooks this torch lacks, or "a GPU": then nothing is changed
        self.kernels: dict[str, Kernel] = {}
        self.undescended: dict[str, str] = {}   # served kernel -> the mode it was harvested in, without the
        self._open = False                      # coordinate descent this compile runs

    # a context, or a handle closed by hand
    def __enter__(self) -> Serving:
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> Serving:
        if self._open or self.unsupported:
            return self
        install_hooks()
        active.append(self)
        if self not in _serving:
            _serving.append(self)
        self._open = True
        _set_table()
        return self

    def close(self) -> None:
        if not self._open:
            return
        active.remove(self)
        self._open = False
        _set_table()
        self.tell()

    def before_precompile(self, autotuner) -> None:
        key = kernel_key(autotuner)
        name = kernel_name(autotuner)
        shipped = self.shipped.get(key)
        results = getattr(autotuner, "compile_results", None) or []
        configs = getattr(autotuner, "configs", None) or []
        own = [r.config for r in results] or list(configs)
        if shipped is not None and own and _blocks(own[0].kwargs) != _blocks(shipped.entry):
            warning.once(("inductor-blocks", shipped.origin, key), (
                f"{shipped.origin}: Inductor kernel {name} takes block sizes {sorted(_blocks(own[0].kwargs))}, "
                f"the artifact holds {sorted(_blocks(shipped.entry))}: not served"))
            shipped = None
        if shipped is not None:
            kept = [r for r in results if _same(r.config, shipped.entry)]
            if results and not kept:  # compiled elsewhere without it: compile the shipped config here
                autotuner.compile_results = []
                autotuner.configs = [_triton_config(shipped.entry)]
            elif results:
                autotuner.compile_results = kept[:1]
            elif not any(_same(c, shipped.entry) for c in configs) or len(configs) > 1:
                autotuner.configs = [_triton_config(shipped.entry)]
            self._decided(Kernel(name, key, "offline", shipped.entry, shipped.origin, shipped.level))
            harvest = _harvest_mode(shipped.provenance)
            if (getattr(autotuner, "inductor_meta", None) or {}).get("coordinate_descent_tuning") and \
                    harvest is not None and not harvest[1]:
                self.undescended[name] = harvest[0]
            return
        candidates = len(results) or len(configs)
        if candidates > 1:
            if settings.current().autotune == "strict":
                raise TierMissError(
                    f"FLYTUNE_AUTOTUNE=strict: Inductor kernel {name} (lookup hash {key[:16]}) is not in any "
                    f"installed bundle for {self.device.spec()}: it would be autotuned over {candidates} "
                    f"configs; harvest it on this device (`flytune harvest`) or unset strict",
                    field="FLYTUNE_AUTOTUNE")
            self._decided(Kernel(name, key, "autotune"))
        else:
            self._decided(Kernel(name, key, "single"))

    def after_precompile(self, autotuner) -> None:
        shipped = self.shipped.get(kernel_key(autotuner))
        if shipped is None:
            return
        launchers = [launcher for launcher in autotuner.launchers if _same(launcher.config, shipped.entry)]
        autotuner.launchers = launchers[:1] or autotuner.launchers[:1]
        for launcher in autotuner.launchers:
            launcher.config.found_by_coordesc = True  # the shipped config is final: no coordinate descent

    def _decided(self, k: Kernel) -> None:
        from .events import tell

        self.kernels[k.key] = k
        tell({"kernel": STATS_NAME, "key": {inductor.AXIS: k.key, "name": k.name}, "tier": k.tier,
              "config": k.config, "level": k.level, "origin": k.origin})

    def stats(self) -> dict:
        """Hits and misses of the compiles made while open: what `flytune_build.stats()` shows."""
        tiers = {"offline": 0, "autotune": 0, "single": 0}
        for k in self.kernels.values():
            tiers[k.tier] += 1
        return {"kernels": tiers, "shipped": len(self.shipped), "device": self.device and self.device.spec(),
                "other_devices": sorted(self.other_devices),
                "autotuned": sorted(k.name for k in self.kernels.values() if k.tier == "autotune")}

    def tell(self) -> None:
        """One warning when a compile autotuned a kernel, or nothing was shipped for this device; one
        when served winners were harvested without the coordinate descent the compile runs."""
        s = self.stats()
        hits, tuned = s["kernels"]["offline"], s["kernels"]["autotune"]
        if self.undescended:
            modes = ", ".join(sorted(set(self.undescended.values())))
            names = ", ".join(sorted(self.undescended)[:3]) + (", ..." if len(self.undescended) > 3 else "")
            warning.once(("inductor-mode", id(self)), (
                f"torch.compile: {len(self.undescended)} kernel(s) served from the bundle ({names}) were harvested "
                f"in mode {modes}, without coordinate descent, and this compile runs it (max-autotune): they "
                f"keep the harvested config, which Inductor would tune further. Inductor's lookup has no mode "
                f"in its key: harvest the mode you compile with"))
        if tuned == 0 and (self.shipped or not self.other_devices):
            return
        where = (f"; the bundle holds Inductor winners for {', '.join(sorted(self.other_devices))}, not for "
                 f"{self.device.spec()}" if self.other_devices and not self.shipped else "")
        drift = _toolchain_drift(self.shipped.values())
        names = ", ".join(s["autotuned"][:3]) + (", ..." if tuned > 3 else "")
        warning.once(("inductor", id(self)),
                     f"torch.compile: {hits} generated kernel(s) served from the bundle, {tuned} autotuned by "
                     f"Inductor (not in the bundle{': ' + names if names else ''}){where}{drift}")


_user_table: list = []  # the user's own lookup table, saved while any serving is open


def _set_table() -> None:
    """Inductor's lookup table: the user's own entries, over every open serving's shipped winners (in
    the order opened); the user's table alone again once the last serving closes."""
    import torch._inductor.config as inductor_config

    open_ = [s for s in active if isinstance(s, Serving)]
    if not open_:
        if _user_table:
            inductor_config.autotune_lookup_table = _user_table.pop()
        return
    if not _user_table:
        _user_table.append(dict(inductor_config.autotune_lookup_table))
    table: dict = {}
    for s in open_:
        table.update({k: shipped.entry for k, shipped in s.shipped.items() if k not in table})
    table.update(_user_table[0])  # the user's own entries stay theirs
    inductor_config.autotune_lookup_table = table


def _triton_config(entry: dict):
    import triton

    return triton.Config({k: v for k, v in entry.items() if "BLOCK" in k}, num_warps=entry["num_warps"],
                         num_stages=entry["num_stages"])


def _harvest_mode(provenance) -> tuple[str, bool] | None:
    """(the compile mode an artifact was harvested in, whether that harvest ran coordinate descent), or
    None where its provenance does not say."""
    meta = provenance.get("inductor") if isinstance(provenance, dict) else None
    mode = meta.get("mode") if isinstance(meta, dict) else None
    if not isinstance(mode, str):
        return None
    return mode, mode.startswith("max-autotune") or meta.get("coordesc") is True


def _toolchain_drift(shipped) -> str:
    """What differs between the toolchain the bundle's kernels were harvested with and this one."""
    from .identity import versions

    here = versions()
    seen = {(p.get("torch"), p.get("triton")) for s in shipped if isinstance(p := s.provenance, dict)}
    other = sorted(f"torch {t} / triton {tr}" for t, tr in seen if (t, tr) != (here["torch"], here["triton"]))
    if not other:
        return ""
    return (f"; the bundle was harvested with {', '.join(other)}, this is torch {here['torch']} / triton "
            f"{here['triton']}: Inductor generates other kernels")


_serving: list[Serving] = []  # every Serving opened in this process: stats() sums them


def serve(kernels: tuple[str, ...] = (), dev: DeviceIdentity | None = None) -> Serving:
    """The installed bundles' Inductor winners for this device (or `dev`), of the compile entries
    `kernels` (default: every one installed), served to torch.compile and AOTInductor compiles made
    while the returned `Serving` is open (`with serve(): ...`, or `serve().open()` ... `.close()`).

    A torch without the hooks (`missing()`) gets one warning and an unchanged compile; under
    FLYTUNE_AUTOTUNE=strict that is a `TierMissError`."""
    from ..core import arguments

    kernels = (kernels,) if isinstance(kernels, str) else tuple(arguments.names(kernels, "kernels"))
    if dev is not None and not isinstance(dev, DeviceIdentity):
        raise ArgumentTypeError(f"must be a DeviceIdentity (or None: this device), not {type(dev).__name__}",
                                field="dev")
    lacking = missing()
    if lacking:
        message = (f"this torch lacks {', '.join(lacking)} (flytune serves Inductor winners with {SUPPORTED}): "
                   f"compiles autotune as Inductor does")
        if settings.current().autotune == "strict":
            raise TierMissError(f"FLYTUNE_AUTOTUNE=strict: {message}", field="FLYTUNE_AUTOTUNE")
        warning.once(("inductor-hooks",), message)
        return Serving({}, dev, set(), [], lacking)
    try:
        dev = dev or running_device.current()
    except DeviceError as e:  # no GPU: Inductor generates no Triton kernel to autotune, nothing to serve
        warning.once(("inductor-device",), f"{e}: nothing is served to torch.compile, which compiles as usual")
        return Serving({}, None, set(), [], ["a GPU"])
    shipped: dict[str, Shipped] = {}
    other: set[str] = set()
    problems: list[str] = []
    entries = compile_entries(TIER, problems)
    for k in kernels:
        if not any(name == k or name.startswith(k + ".") for name in entries):
            problems.append(f"no installed bundle holds Inductor winners of {k!r} (installed: "
                            f"{', '.join(entries) or 'none'})")
    for name in entries:
        if kernels and name not in kernels and not any(name.startswith(k + ".") for k in kernels):
            continue
        idx = TIER.index(name, (inductor.AXIS,), dev)
        other |= idx.other_devices
        problems += idx.problems
        for (key,), hit in idx.hits.items():
            try:
                config = Config.from_json(hit.config, Fields(hit.origin, ArtifactError))
            except FlytuneError as e:
                problems.append(str(e))
                continue
            wrong = inductor.problems({inductor.AXIS: key}, config)  # the build's rule, for files no build read
            if wrong:
                problems += [str(ArtifactError(rule, file=hit.origin, field=f)) for f, rule in wrong]
                continue
            if key not in shipped:
                prov = hit.document().get("provenance")
                shipped[key] = Shipped(inductor.table_entry(config), name, hit.origin, hit.level, prov)
    for p in problems:
        warning.once(("inductor-problem", p), f"{p}; not served to torch.compile")
    return Serving(shipped, dev, other, problems, [])


def compile_entries(tier, problems: list[str] | None = None) -> list[str]:
    """Every kernel name the offline tier's sources hold Inductor artifacts for; a directory's kernel
    none of whose files can be read is added to `problems` (it may be an Inductor kernel: say so)."""
    names = set()
    for src in tier.sources():
        if src.manifest is not None:
            names |= {k for k, info in src.manifest.kernels.items() if tuple(info.axes) == (inductor.AXIS,)}
            continue
        for kernel in tier.kernels(src):
            idx = Index()
            doc = next(tier.documents(src, kernel, idx), None)
            if doc is not None and inductor.is_inductor(doc[0]["key"]):
                names.add(kernel)
            elif doc is None and problems is not None:
                problems += idx.problems
    return sorted(names)


def stats() -> dict | None:
    """Every serving's counts summed, or None where no serving was opened in this process."""
    if not _serving:
        return None
    out = {"kernels": {"offline": 0, "autotune": 0, "single": 0}, "autotuned": []}
    for s in _serving:
        st = s.stats()
        for tier, n in st["kernels"].items():
            out["kernels"][tier] += n
        out["autotuned"] += st["autotuned"]
    return out


def reset() -> None:
    """Forget every closed serving's counts (`flytune_build.reset_stats()`)."""
    _serving[:] = [s for s in _serving if s._open]
    for s in _serving:
        s.kernels.clear()


def compile_once(model, inputs: tuple, mode: str, dynamic: bool = False) -> None:
    """Compile `model` for `inputs` as `mode` asks (a torch.compile mode, or "aoti"), with Inductor's
    caches off, so every kernel is autotuned here and none is read from an earlier compile."""
    import tempfile
    from pathlib import Path

    import torch
    import torch._dynamo as dynamo
    import torch._inductor.config as inductor_config
    from torch._inductor import aoti_compile_and_package

    with inductor_config.patch(force_disable_caches=True):
        if mode == "aoti":
            exported = torch.export.export(model, tuple(inputs))
            with tempfile.TemporaryDirectory() as d:
                aoti_compile_and_package(exported, package_path=str(Path(d) / "model.pt2"))
        else:
            dynamo.reset()
            torch.compile(model, mode=mode, dynamic=dynamic)(*inputs)  # Inductor autotunes on the first call
            if torch.cuda.is_available():
                torch.cuda.synchronize()

