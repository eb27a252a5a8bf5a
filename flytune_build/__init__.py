"""flytune-build: pre-tuned kernel configs as a packaging feature.

Importing this package imports neither torch, triton nor setuptools: the decorator and everything
it needs load on first use.
"""
from __future__ import annotations

from .core.errors import (
    ArgumentTypeError,
    ArtifactError,
    ArtifactExecutionError,
    BuildFailure,
    BundleError,
    DeclarationError,
    DeviceError,
    FlytuneError,
    FlytuneWarning,
    InputError,
    NoProject,
    NoTable,
    OutputError,
    PlanError,
    ProjectError,
    ScratchError,
    SearchError,
    SettingsError,
    TierMissError,
    TuneError,
    UsageError,
)
from .core.version import VERSION as __version__

__all__ = [
    "ArgumentTypeError",
    "ArtifactError",
    "ArtifactExecutionError",
    "BuildFailure",
    "BundleError",
    "Config",
    "DeclarationError",
    "DeviceError",
    "FlytuneError",
    "FlytuneWarning",
    "InputError",
    "NoProject",
    "NoTable",
    "OutputError",
    "PlanError",
    "ProjectError",
    "ScratchError",
    "SearchError",
    "SettingsError",
    "TierMissError",
    "TuneError",
    "UsageError",
    "__version__",
    "autotune",
    "nearest",
    "on_decision",
    "pow2",
    "reset_stats",
    "stats",
    "warmup",
    "tune",
    "harvest",
    "verify",
    "inspect",
    "diff",
    "merge",
    "fmt",
    "review",
]


def __getattr__(name):  # loaded on first use: `import flytune_build` (and the build backend) stays light
    if name == "Config":
        from .core.config import Config
        return Config
    if name in ("pow2", "nearest"):
        from .core import key
        return getattr(key, name)
    if name in ("autotune", "stats", "reset_stats"):
        from .runtime.serving import autotuner
        return getattr(autotuner, name)
    if name == "on_decision":
        from .runtime.events import on_decision
        return on_decision
    if name == "warmup":
        from .runtime.warming.warmup import warmup
        return warmup
    if name == "tune":
        from .tuning import tune
        return tune
    if name == "harvest":
        from .tuning.harvest import harvest
        return harvest
    if name in ("verify", "inspect", "diff"):
        from . import audit
        return getattr(audit, name)
    if name == "merge":
        from .store.merge import merge
        return merge
    if name == "fmt":
        from .store.canonical import fmt
        return fmt
    if name == "review":  # a subpackage: `flytune_build.review.render(...)` works without importing it first
        import flytune_build.review as review  # not `from . import`: its hasattr would come back here
        return review
    raise AttributeError(f"module 'flytune_build' has no attribute {name!r}")
