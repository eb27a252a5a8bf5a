"""`flytune_build.triton`: the public path of the `@triton.autotune` adapter (`adopt`, `recording`).

The code lives in `flytune_build.runtime.adapters.triton_autotune`; this module imports no Triton.
"""
from .runtime.adapters.triton_autotune import adopt, recording

__all__ = ["adopt", "recording"]
