"""Shipped winners served to torch.compile and AOTInductor compiles (`serve()`).

A `Serving` holds the installed bundles' Inductor artifacts for one device (core.inductor, read
through the offline tier). While servings are open, Inductor's lookup table
(`torch._inductor.config.autotune_lookup_table`, which Inductor forwards to its compile worker
processes) is the user's own table over the union of the open servings' winners (every one's where
torch keeps one table per process, this context's where it keeps one per context: the package's
"State"): a served kernel is compiled with its shipped config alone. Where Inductor benchmarks in this process
(`CachingAutotuner.precompile`, parent side), the serving innermost in the compiling context counts
each kernel (served, autotuned by Inductor, or single) and, for a served one, drops every other
candidate and marks it final so coordinate descent leaves it; under FLYTUNE_AUTOTUNE=strict a kernel
that would be autotuned raises `TierMissError`. A serving's last close says once what missed.

GEMM template choices (max-autotune's `select_algorithm`, torch 2.10+): where Inductor turns a matmul's
templates into choices (runtime.inductor.templates), the serving innermost in the compiling context
looks the choice up through Inductor's own `LookupTableChoices` over the GEMM winners of the servings open
in that context: a hit is one choice, so Inductor benchmarks nothing; a miss is Inductor's own list,
counted as benchmarked (strict: `TierMissError`). Neither `config.lookup_table.table` nor the choices
handler is touched: a user's `LookupTableChoices` answers first, and only its misses reach a serving.

A `Serving` is re-entrant: entered N times (`with s: with s:`, or `.open()` twice), it serves until
its N-th close. Each close pairs with an open, from any thread.
"""
from __future__ import annotations

import contextvars
import os
import threading
from dataclasses import dataclass
from typing import Any

from ...core import gemm, inductor, settings
from ...core.codec import Fields
from ...core.config import Config
from ...core.device import INTERPRETER, DeviceIdentity
from ...core.errors import ArgumentTypeError, ArtifactError, DeviceError, FlytuneError, TierMissError, within
from .. import device as running_device
from .. import warning
from ..serving.kernel import must_hit
from ..serving.offline import TIER, Index
from . import hooks, templates
from .counts import Counts, Kernel, Totals

STATS_NAME = "torch.compile"  # the name flytune_build.stats() and on_decision give Inductor's kernels


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
                 problems: list[str], unsupported: list[str], gemm_winners: dict[str, Shipped] | None = None,
                 gemm_served: bool = False):
        self.shipped = shipped
        self.gemm = gemm_winners or {}          # GEMM lookup key -> the choice served (core.gemm)
        self.gemm_served = gemm_served          # whether this torch serves GEMM choices (runtime.inductor.templates)
        self.device = device
        self.other_devices = other_devices
        self.problems = problems
        self.unsupported = unsupported    # the hooks this torch lacks, or why no device: then nothing changes
        self.kernels: dict[str, Kernel] = {}
        self.undescended: dict[str, str] = {}   # served kernel -> the mode it was harvested in, without the
        self.depth = 0                          # coordinate descent this compile runs; depth: times open
        self.folded = Counts()                  # the counts already in the process's totals (stats())

    # a context, or a handle closed by hand
    def __enter__(self) -> Serving:
        return self.open()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
        miss = within(exc, TierMissError)
        if miss is not None and miss is not exc:  # Inductor wrapped it (InductorError: LoweringException: ...)
            raise miss from exc

    def open(self) -> Serving:
        """Serve (again: each open needs its close) until the last close."""
        if self.unsupported:
            return self
        hooks.install()
        if self.gemm_served:
            hooks.install_gemm()
        with _state.lock:
            self.depth += 1
            if self.depth == 1:
                _state.opened(self)
            hooks.entered(self)
            _state.set_table()
        return self

    def close(self) -> None:
        with _state.lock:
            if self.depth == 0:
                return
            self.depth -= 1
            last = self.depth == 0
            if last:
                _state.closed(self)
            hooks.left(self)
            _state.set_table()
        if last:
            self.tell()

    # what the patched CachingAutotuner methods call (runtime.inductor.hooks)
    def precompile(self, original, autotuner, *args, **kwargs):
        self.before_precompile(autotuner)
        out = original(autotuner, *args, **kwargs)
        self.after_precompile(autotuner)
        return out

    def benchmark(self, original, autotuner, *args, **kwargs):
        return original(autotuner, *args, **kwargs)

    def coordesc(self, autotuner, start, found, args: tuple, kwargs: dict):
        return found

    def finalize(self, original, handler, *args, **kwargs):
        """A matmul's choices (runtime.inductor.templates): the shipped one, else Inductor's own, counted."""
        if not self.gemm_served:  # this torch serves no GEMM choice: Inductor's own, uncounted
            return original(handler, *args, **kwargs)
        here = [o for o in hooks.opened_here() if isinstance(o, Serving)]
        return templates.serve(self, here, original, handler, *args, **kwargs)

    def select(self, original, cache, name, choices, *args, **kwargs):
        """Inductor's select among a matmul's choices (runtime.inductor.templates): the shipped one, counted."""
        if not self.gemm_served:
            return original(cache, name, choices, *args, **kwargs)
        return templates.select(self, original, cache, name, choices, *args, **kwargs)

    def built_as(self, choice) -> None:
        """The scheduler built a deferred select as `choice`: a served lowering has one choice, none to defer."""

    def before_precompile(self, autotuner) -> None:
        key = hooks.kernel_key(autotuner)
        name = hooks.kernel_name(autotuner)
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
            self.decided(Kernel(name, key, "offline", shipped.entry, shipped.origin, shipped.level))
            harvest = _harvest_mode(shipped.provenance)
            if (getattr(autotuner, "inductor_meta", None) or {}).get("coordinate_descent_tuning") and \
                    harvest is not None and not harvest[1]:
                self.undescended[name] = harvest[0]
            return
        candidates = len(results) or len(configs)
        if candidates > 1:
            mode = settings.current().autotune
            if must_hit(mode):
                raise TierMissError(
                    f"FLYTUNE_AUTOTUNE={mode}: Inductor kernel {name} (lookup hash {key[:16]}) is not in any "
                    f"installed bundle for {self.device.spec()}: it would be autotuned over {candidates} "
                    f"configs; harvest it on this device (`flytune harvest`) or unset {mode}",
                    field="FLYTUNE_AUTOTUNE")
            self.decided(Kernel(name, key, "autotune"))
        else:
            self.decided(Kernel(name, key, "single"))

    def after_precompile(self, autotuner) -> None:
        shipped = self.shipped.get(hooks.kernel_key(autotuner))
        if shipped is None:
            return
        launchers = [launcher for launcher in autotuner.launchers if _same(launcher.config, shipped.entry)]
        autotuner.launchers = launchers[:1] or autotuner.launchers[:1]
        for launcher in autotuner.launchers:
            launcher.config.found_by_coordesc = True  # the shipped config is final: no coordinate descent

    def decided(self, k: Kernel) -> None:
        from ..events import tell

        self.kernels[k.key] = k
        tell({"kernel": STATS_NAME, "key": {inductor.AXIS: k.key, "name": k.name}, "tier": k.tier,
              "config": k.config, "level": k.level, "origin": k.origin, "kind": k.kind})

    def counts(self) -> Counts:
        """The decisions of the compiles made while open, per tier, kernels and GEMM choices apart."""
        out = Counts()
        for k in list(self.kernels.values()):  # a copy: another thread's compile may add one meanwhile
            if k.kind == "gemm":
                out.gemm[k.tier] += 1
                if k.tier == "autotune":
                    out.gemm_names.add(gemm.describe(k.key))
            else:
                out.kernels[k.tier] += 1
                if k.tier == "autotune":
                    out.names.add(k.name)
        return out

    def stats(self) -> dict:
        """Hits and misses of the compiles made while open: what `flytune_build.stats()` shows."""
        c = self.counts()
        return {"kernels": c.kernels, "shipped": len(self.shipped), "device": self.device and self.device.spec(),
                "other_devices": sorted(self.other_devices), "autotuned": sorted(c.names),
                "gemm": c.gemm, "gemm_shipped": len(self.gemm), "gemm_autotuned": sorted(c.gemm_names)}

    def tell(self) -> None:
        """One warning when a compile autotuned a kernel or benchmarked a GEMM choice, or nothing was
        shipped for this device; one when served winners were harvested without the coordinate descent
        the compile runs."""
        s = self.stats()
        hits, tuned = s["kernels"]["offline"], s["kernels"]["autotune"]
        g_hits, g_tuned = s["gemm"]["offline"], s["gemm"]["autotune"]
        if self.undescended:
            modes = ", ".join(sorted(set(self.undescended.values())))
            names = ", ".join(sorted(self.undescended)[:3]) + (", ..." if len(self.undescended) > 3 else "")
            message = (f"torch.compile: {len(self.undescended)} kernel(s) served from the bundle ({names}) were "
                       f"harvested in mode {modes}, without coordinate descent, and this compile runs it "
                       f"(max-autotune): they keep the harvested config, which Inductor would tune further. "
                       f"Inductor's lookup has no mode in its key: harvest the mode you compile with")
            warning.once(("inductor-mode", message), message)  # by its text: one per cause, not per serving
        shipped_any = self.shipped or self.gemm
        if tuned == 0 and g_tuned == 0 and (shipped_any or not self.other_devices):
            return
        where = (f"; the bundle holds Inductor winners for {', '.join(sorted(self.other_devices))}, not for "
                 f"{self.device.spec()}" if self.other_devices and not shipped_any else "")
        drift = _toolchain_drift([*self.shipped.values(), *self.gemm.values()])
        names = ", ".join(s["autotuned"][:3]) + (", ..." if tuned > 3 else "")
        message = (f"torch.compile: {hits} generated kernel(s) served from the bundle, {tuned} autotuned by "
                   f"Inductor (not in the bundle{': ' + names if names else ''})")
        if g_hits or g_tuned:
            g_names = "; ".join(s["gemm_autotuned"][:3]) + ("; ..." if g_tuned > 3 else "")
            message += (f"; {g_hits} GEMM choice(s) served, {g_tuned} benchmarked by Inductor (not served from the "
                        f"bundle{': ' + g_names if g_names else ''})")
        message += where + drift
        warning.once(("inductor", message), message)


class _Process:
    """What every serving of the process shares, under one lock: the open servings (in the order
    opened), the user's own lookup table while any is open (where torch keeps one table per process),
    and the closed servings' totals."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.open: dict[Serving, None] = {}
        self.saved: Any = _NONE            # the user's table object, as it was before the first opened
        self.totals: Totals | None = None  # None: no serving opened since the last reset

    def opened(self, s: Serving) -> None:
        self.open[s] = None
        if self.totals is None:
            self.totals = Totals()

    def closed(self, s: Serving) -> None:
        del self.open[s]
        self.totals.add(self.unfolded(s))
        s.folded = s.counts()

    @staticmethod
    def unfolded(s: Serving) -> Counts:
        return s.counts().minus(s.folded)

    def set_table(self) -> None:
        """Inductor's lookup table as the open servings make it: where torch keeps one per process, every
        open serving's winners; where it keeps one per context, this context's open servings' (the
        table a compile here reads). Each over the user's own table, which comes back, the object itself,
        when the last of them closes."""
        if hooks.table_scope() == "process":
            self.saved = _write_table(list(self.open), self.saved)
        else:
            here = [o for o in hooks.opened_here() if isinstance(o, Serving)]
            _context_saved.set(_write_table(here, _context_saved.get()))

    def stats(self) -> dict | None:
        with self.lock:
            if self.totals is None and not self.open:
                return None
            out = Totals()
            if self.totals is not None:
                out.add(self.totals.counts)
            for s in self.open:
                out.add(self.unfolded(s))
            c = out.counts
            got = {"kernels": c.kernels, "autotuned": sorted(c.names)}
            if any(c.gemm.values()):  # once a compile under a serving lowered a matmul
                got.update(gemm=c.gemm, gemm_autotuned=sorted(c.gemm_names))
            return got

    def reset(self) -> None:
        with self.lock:
            self.totals = Totals() if self.open else None
            for s in self.open:
                s.kernels.clear()
                s.folded = Counts()


_NONE = object()
_state = _Process()
# where torch keeps one table per context: this context's own table, as it was before its first serving opened
_context_saved: contextvars.ContextVar[Any] = contextvars.ContextVar("flytune_inductor_user_table", default=_NONE)


def _write_table(servings: list[Serving], saved: Any) -> Any:
    """Set the lookup table to the user's `saved` entries over `servings`' winners (the first opened
    first), or back to `saved` itself where no serving is open; returns what stays saved (_NONE: nothing)."""
    if not servings:
        if saved is not _NONE:
            hooks.set_lookup_table(saved)
        return _NONE
    if saved is _NONE:
        saved = hooks.lookup_table()
    table: dict = {}
    for s in servings:
        for key, shipped in s.shipped.items():
            table.setdefault(key, shipped.entry)
    table.update(saved or {})  # the user's own entries stay theirs
    hooks.set_lookup_table(table)
    return saved


def _reinit_after_fork() -> None:
    _state.lock = threading.RLock()  # a parent's thread may have held it; that thread is not in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)


def _blocks(kwargs: dict) -> set:
    return {k for k in kwargs if "BLOCK" in k}


def _same(triton_config, entry: dict) -> bool:
    """Whether a triton.Config is the lookup-table entry `entry` (block sizes, warps, stages)."""
    blocks, want = ({k: v for k, v in d.items() if "BLOCK" in k} for d in (triton_config.kwargs, entry))
    return (blocks == want and triton_config.num_warps == entry["num_warps"]
            and triton_config.num_stages == entry["num_stages"])


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
    from ..identity import versions

    here = versions()
    seen = {(p.get("torch"), p.get("triton")) for s in shipped if isinstance(p := s.provenance, dict)}
    other = sorted(f"torch {t} / triton {tr}" for t, tr in seen if (t, tr) != (here["torch"], here["triton"]))
    if not other:
        return ""
    return (f"; the bundle was harvested with {', '.join(other)}, this is torch {here['torch']} / triton "
            f"{here['triton']}: Inductor generates other kernels")


def target_device(dev: DeviceIdentity | None = None) -> DeviceIdentity:
    """The device whose Inductor winners are served or harvested here: `dev`, else this process's. A
    DeviceError saying why there is none: no GPU is visible (Inductor generates C++ for a CPU), or
    TRITON_INTERPRET=1 made the device Triton's interpreter, which Inductor does not use."""
    if dev is not None:
        return dev
    try:
        found = running_device.current()
    except DeviceError:
        found = None
    if found is not None and found != INTERPRETER:
        return found
    if found is not None and hooks.gpu_visible():
        raise DeviceError("TRITON_INTERPRET=1 makes this process's device Triton's interpreter, which Inductor "
                          "does not use: unset TRITON_INTERPRET to serve or harvest this GPU's Inductor winners")
    raise DeviceError(f"no GPU is visible: {hooks.GPU_ONLY}")


def serve(kernels: tuple[str, ...] = (), dev: DeviceIdentity | None = None) -> Serving:
    """The installed bundles' Inductor winners for this device (or `dev`), of the compile entries
    `kernels` (default: every one installed), served to torch.compile and AOTInductor compiles made
    while the returned `Serving` is open (`with serve(): ...`, or `serve().open()` ... `.close()`).

    The bundles' GEMM template choices (max-autotune) are served where torch has a template lookup
    (2.10+); a torch without it (`hooks.missing_gemm()`) gets one warning and its kernels served.
    A torch without the hooks (`missing()`) gets one warning and an unchanged compile; under
    FLYTUNE_AUTOTUNE=strict that is a `TierMissError`. Where no GPU is visible (or TRITON_INTERPRET=1
    makes the device Triton's interpreter) nothing is served, and one warning says why; a malformed
    FLYTUNE_DEVICE is a `DeviceError`, as in a kernel call."""
    from ...core import arguments

    kernels = (kernels,) if isinstance(kernels, str) else tuple(arguments.names(kernels, "kernels"))
    if dev is not None and not isinstance(dev, DeviceIdentity):
        raise ArgumentTypeError(f"must be a DeviceIdentity (or None: this device), not {type(dev).__name__}",
                                field="dev")
    lacking = hooks.missing()
    if lacking:
        message = (f"this torch lacks {', '.join(lacking)} (flytune serves Inductor winners with "
                   f"{hooks.SUPPORTED}): compiles autotune as Inductor does")
        if must_hit(settings.current().autotune):
            raise TierMissError(f"FLYTUNE_AUTOTUNE={settings.current().autotune}: {message}", field="FLYTUNE_AUTOTUNE")
        warning.once(("inductor-hooks",), message)
        return Serving({}, dev, set(), [], lacking)
    if dev is None and settings.current().device:
        running_device.current()  # a malformed FLYTUNE_DEVICE is the user's error: raised, as a kernel call raises it
    try:
        dev = target_device(dev)
    except DeviceError as e:
        warning.once(("inductor-device", str(e)), f"torch.compile: {e}: nothing is served to torch.compile, "
                                                  f"which compiles as usual")
        return Serving({}, None, set(), [], [str(e)])
    shipped, gemm_winners, other, problems = _shipped(kernels, dev)
    for p in problems:
        warning.once(("inductor-problem", p), f"{p}; not served to torch.compile")
    lacking = hooks.missing_gemm()
    if lacking:  # torch 2.9: no template lookup; the kernels are served all the same
        held = f"the bundle's {len(gemm_winners)} GEMM choice(s) for this device are" if gemm_winners else \
            "GEMM template choices are"
        warning.once(("inductor-gemm-hooks",), (
            f"this torch lacks {', '.join(lacking)}: {held} not served (flytune serves them with "
            f"{hooks.GEMM_SUPPORTED}); max-autotune benchmarks them as Inductor does, and the generated "
            f"kernels are served"))
        gemm_winners = {}
    return Serving(shipped, dev, other, problems, [], gemm_winners, gemm_served=not lacking)


def _shipped(kernels: tuple[str, ...], dev: DeviceIdentity
             ) -> tuple[dict[str, Shipped], dict[str, Shipped], set[str], list[str]]:
    """(lookup hash -> the kernel winner served, GEMM lookup key -> the choice served, the other devices
    the bundles hold winners for, problems)."""
    shipped: dict[str, Shipped] = {}
    choices: dict[str, Shipped] = {}
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
            into, entry = (choices, gemm.table_entry(config)) if gemm.is_key(key) else \
                (shipped, inductor.table_entry(config))
            if key not in into:
                into[key] = Shipped(entry, name, hit.origin, hit.level, hit.document().get("provenance"))
            elif gemm.is_key(key) and into[key].entry != entry and into[key].kernel != name:   # one matmul, two entries
                problems.append(f"{hit.origin}: its choice for {gemm.describe(key)} differs from {into[key].origin}'s "
                                f"({into[key].kernel}, the first compile entry by name, which is served)")
    return shipped, choices, other, problems


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
    """Every serving's counts summed (closed ones folded into fixed totals), or None where no serving
    was opened in this process since the last reset."""
    return _state.stats()


def reset() -> None:
    """Forget every closed serving's counts, and the open ones' so far (`flytune_build.reset_stats()`)."""
    _state.reset()
