"""Driving Triton's compiler for the warm-up: each unit's (runtime.warming.warmup.Unit) kernel into Triton's disk
cache (in forked processes, else on threads), its launcher built, and readied in this process's own JIT
cache.

The units are planned by runtime.warming.warmup; how a recorded specialization becomes compile inputs and
stand-in arguments is runtime.warming.binder's.
"""
from __future__ import annotations

import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from ...core.device import DeviceIdentity
from ...core.errors import one_line
from .. import warning
from . import binder

CHILD_TIMEOUT = 60.0  # seconds (and 2 s a unit) for the forked compiles; past it the rest compile on threads here


def threads(n: int, workers: int | None) -> int:
    """How many threads or processes compile `n` units: `workers`, else one per CPU core, at most n."""
    import os

    return max(1, min(n, workers or os.cpu_count() or 4))


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

    def compile_all(self, todo: list[tuple], workers: int | None, processes: bool | None) -> None:
        """Every unit into Triton's disk cache: those not cached yet in processes forked from this one
        (Triton's front end holds the GIL, so threads serialize), else, or for what the processes left,
        on threads."""
        pending, signatures = [], []
        for u, jit in todo:
            try:
                src, _, u.cache_key = binder.cache_hash(u.spec, binder.compilable(jit), u.config, self.backend)
            except Exception as e:  # noqa: BLE001 - the runtime would fail on it too: report it, warm the rest
                u.status, u.note = "failed", one_line(e)
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
            with ThreadPoolExecutor(max_workers=threads(len(pending), workers),
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

    def _fork_compile(self, pending: list[tuple], builders: int, workers: int | None) -> list:
        """Compile `pending` in forked processes (they inherit the imported kernels; no CUDA call is made
        in them), the first `builders` with their launchers; returns the units they did not finish (a fork
        refused, a child timed out or died)."""
        import multiprocessing

        token = id(pending)
        _FORKED[token] = (self, pending, builders)
        pool = None
        try:
            pool = multiprocessing.get_context("fork").Pool(threads(len(pending), workers))
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

    def compile(self, unit, jit, launcher: bool = False) -> None:
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
            unit.status, unit.note = "failed", one_line(e)
        else:
            if launcher and self.launcher_cls is not None:
                try:
                    self.launcher_cls(kernel.src, kernel.metadata)  # lands in Triton's cache, as `kernel.run` would
                except Exception:  # noqa: BLE001 - `load` builds it again and says why it fails
                    pass
        unit.seconds = time.perf_counter() - start

    def load(self, unit, jit) -> None:
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
            named = binder.stand_ins(unit.spec, unit.config, exclude=set(unit.config.kwargs))
            keys = []
            for options in binder.launch_options(unit.config):  # as flytune's launch, and Triton's Autotuner's, pass them
                options["debug"] = options.get("debug", jit.debug) or knobs.runtime.debug  # as JITFunction.run
                options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
                _, specialization, extra = bind(**named, **options)
                binder.check_specialization(unit.spec, jit, specialization, backend)
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
            unit.note = (unit.note + "; " if unit.note else "") + f"not readied in this process: {one_line(e)}"
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
