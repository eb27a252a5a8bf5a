"""flytune-build: pre-tuned kernel configs as a packaging feature.

Importing this package imports neither torch, triton nor setuptools: the decorator and everything
it needs load on first use.
"""
from __future__ import annotations

from .core.errors import (ArtifactError, ArtifactExecutionError, BuildFailure, BundleError, DeclarationError,
                          DeviceError, FlytuneError, FlytuneWarning, ProjectError, ScratchError, SearchError,
                          SettingsError)
from .core.version import VERSION as __version__

__all__ = ["Config", "autotune", "stats", "reset_stats", "on_decision", "pow2", "nearest", "FlytuneError",
           "ArtifactError", "ArtifactExecutionError", "BuildFailure", "BundleError", "DeclarationError",
           "DeviceError", "ProjectError", "ScratchError", "SearchError", "SettingsError", "FlytuneWarning",
           "__version__"]

_LAZY = {"Config": ("core.config", "Config"), "pow2": ("core.key", "pow2"), "nearest": ("core.key", "nearest"),
         "autotune": ("runtime.autotuner", "autotune"), "stats": ("runtime.autotuner", "stats"),
         "reset_stats": ("runtime.autotuner", "reset_stats"), "on_decision": ("runtime.events", "on_decision")}


def __getattr__(name):  # loaded on first use: `import flytune_build` (and the build backend) stays light
    if name not in _LAZY:
        raise AttributeError(f"module 'flytune_build' has no attribute {name!r}")
    import importlib

    module, attr = _LAZY[name]
    return getattr(importlib.import_module(f".{module}", __name__), attr)
