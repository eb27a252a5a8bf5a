"""`flytune_build.flydsl`: the public path of the FlyDSL adapter (`expose`, `to_flydsl`, `from_flydsl`).

FlyDSL's format lives in `flytune_build.interop.flydsl`, the run-time part in
`flytune_build.runtime.adapters.flydsl`; this module joins them and imports no FlyDSL.
"""
from __future__ import annotations

from pathlib import Path

from .interop.flydsl import export, from_flydsl, to_flydsl
from .runtime.adapters import flydsl as adapter

__all__ = ["export", "expose", "from_flydsl", "to_flydsl"]


def expose() -> Path | None:
    """Make the installed bundles' hip artifacts visible to FlyDSL.

    With FLYDSL_AUTOTUNE_CONFIG_DIR unset, their union is written in FlyDSL's format into a cache
    directory and the variable points there; set, the user's directory wins (said once). Returns the
    directory in use.
    """
    return adapter.expose(export)
