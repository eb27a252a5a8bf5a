"""Pre-tuned Triton kernels that use config pre_hooks, `@triton.heuristics` over `@triton.autotune` and
`prune_configs_by`, shipped by flytune-build (see `kernels`)."""
from .kernels import add_bias, matmul, scale_rows

__all__ = ["add_bias", "matmul", "scale_rows"]
