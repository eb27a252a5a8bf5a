"""`flytune_build.flydsl`: the public path of the FlyDSL adapter (`expose`, `to_flydsl`, `from_flydsl`).

The code lives in `flytune_build.runtime.adapters.flydsl`; this module imports no FlyDSL.
"""
from .runtime.adapters.flydsl import export, expose, from_flydsl, to_flydsl

__all__ = ["export", "expose", "from_flydsl", "to_flydsl"]
