"""flytune-build: pre-tuned kernel configs as a packaging feature.

Importing this package imports neither torch, triton nor setuptools.
"""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import (ArtifactError, ArtifactExecutionError, BundleError, DeclarationError, DeviceError,
                     FlytuneError, ProjectError, SearchError)

__all__ = ["Config", "autotune", "stats", "pow2", "nearest", "FlytuneError", "ArtifactError",
           "ArtifactExecutionError", "BundleError", "DeclarationError", "DeviceError", "ProjectError",
           "SearchError", "__version__"]


def __getattr__(name):  # loaded on first use: `import flytune_build` (and the build backend) stays light
    if name == "Config":
        from .config import Config
        return Config
    if name in ("autotune", "stats", "reset_stats"):
        from . import autotuner
        return getattr(autotuner, name)
    if name in ("pow2", "nearest"):
        from . import key
        return getattr(key, name)
    raise AttributeError(f"module 'flytune_build' has no attribute {name!r}")
