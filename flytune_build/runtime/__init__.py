"""The kernel call: imports core only; torch and triton lazily. By job: `serving/` (a tuned kernel's call,
its tiers and the process state they read), `searching/` (a search and its tuning session),
`warming/` (the warm-up), `inductor/` (torch.compile and AOTInductor), `adapters/` (`@triton.autotune`
and FlyDSL kernels); beside them what every job shares: the device, warnings, events, identity,
bindings, callbacks and Triton's wrappers.

The modules that moved into `serving/`, `searching/` and `warming/` keep their earlier import paths
(`flytune_build.runtime.autotuner` is `flytune_build.runtime.serving.autotuner`, the same module object).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import MappingProxyType

# an earlier release's module -> the sub-package it lives in now
MOVED = MappingProxyType({
    **dict.fromkeys(("autotuner", "kernel", "decision", "registry", "offline", "scratch", "misses"), "serving"),
    **dict.fromkeys(("search", "selection", "bench", "placement", "outputs", "session"), "searching"),
    **dict.fromkeys(("warmup", "compiler", "binder"), "warming")})


class _EarlierPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`flytune_build.runtime.<module>` of a moved module imports the module where it lives now."""

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.rpartition(".")
        if parent == __name__ and name in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        name = spec.name.rpartition(".")[2]
        return importlib.import_module(f"{__name__}.{MOVED[name]}.{name}")

    def exec_module(self, module) -> None:
        pass  # the module is the one its own path already ran


if not any(isinstance(f, _EarlierPaths) for f in sys.meta_path):
    sys.meta_path.append(_EarlierPaths())
