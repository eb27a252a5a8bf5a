"""Pre-tuned torch.compile and AOTInductor: the public path of flytune's Inductor support.

    import flytune_build.inductor as fti
    with fti.serve():                       # the installed bundles' Inductor winners for this device
        compiled = torch.compile(model)
        compiled(x)                          # compiled with the shipped configs: no autotune benchmarking

`serve()` changes only the compiles made while it is open; a `Serving` may be entered again (it serves
until its last exit) and from any number of threads (runtime.inductor's docstring: what is per process,
what per thread). Under max-autotune it also serves the bundle's GEMM template choices (torch 2.10+), so
`select_algorithm` benchmarks none it holds. `missing()` names the private PyTorch hooks this torch
lacks (then `serve()` changes nothing and says so once); `missing_gemm()` those of the GEMM template
lookup (then `serve()` serves the kernels and says once that GEMM choices are not served). Winners are
harvested on the target GPU with `flytune harvest` (`flytune_build.harvest(...)`).
"""
from __future__ import annotations

from .runtime.inductor import GEMM_SUPPORTED, SUPPORTED, Serving, missing, missing_gemm, serve
from .runtime.inductor.recording import recording

__all__ = ["GEMM_SUPPORTED", "SUPPORTED", "Serving", "missing", "missing_gemm", "recording", "serve"]
