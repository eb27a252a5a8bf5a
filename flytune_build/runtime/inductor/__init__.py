"""Inductor at compile time: shipped winners served to torch.compile and AOTInductor (`serve()`), and
winners recorded on the target GPU (`Recording`, for `flytune harvest`).

    hooks      every reach into PyTorch's private Inductor code (HOOKS and GEMM_HOOKS, pinned by tests):
               the patches of CachingAutotuner and of InductorChoices' finalize step, which hand each call
               to the serving or recording innermost in the calling context; the lookup tables; Inductor's
               feedback saver; the harvest's compile
    serving    `serve()`, `Serving`: the installed bundles' winners in Inductor's lookup table, each
               generated kernel counted and, under FLYTUNE_AUTOTUNE=strict, enforced
    recording  `Recording`: flytune's selection decides Inductor's benchmarks and coordinate-descent
               moves, and the GEMM template choices; records into artifacts
    counts     how a serving's compiles were served: each decision, counted per tier (kernels and GEMM
               choices apart), closed servings folded into fixed totals
    templates  GEMM template choices (max-autotune's select_algorithm): a serving's lookup of the shipped
               choice, a recording's keys and selection; a choice as a table entry (core.gemm)

Nothing here changes a compile outside an open serving or recording.

State: per process (under one lock in `serving`): the open servings, each with how many times it is
open (a serving entered N times serves until its N-th close, whichever thread closes it), and the
closed servings' counts folded into fixed totals (`stats()`); the CachingAutotuner patch and the
InductorChoices finalize patch, each installed once; a recording's feedback saver in Inductor's list
while that recording is open. Per context (a `ContextVar`: each thread, each asyncio task; a thread run with
`contextvars.copy_context().run` shares its starter's): which serving or recording is innermost, and
so which one counts, enforces, fixes or records a compile made there; a thread that opened none
compiles as Inductor does, and Inductor's own helper threads start outside every one. Inductor's
lookup table is where torch keeps it (`hooks.table_scope()`): a torch whose config is one per
process (2.11 is) has one table, the user's own under the union of every open serving's winners,
read by a compile on any thread; a torch that keeps config per context (2.13 is) has one per
context, each its own table under the winners of the servings open in that context, so a thread
that opened none is served nothing. Either way the user's table object itself
comes back when the last serving over it closes (per context: close where it was opened). GEMM
template choices are served per context on every torch: a matmul lowered in a context is looked up
among the GEMM winners of the servings open there (none where none is); Inductor's own
`config.lookup_table.table` and choices handler are never written. A forked
child gets the parent's state as it was at the fork, with fresh locks: the servings the forking
thread had open are open in the child and close there as usual; those other threads had open stay
open in the child for good (fork before opening, or open in the child).
"""
from __future__ import annotations

from . import recording, templates
from .counts import Counts, Kernel
from .hooks import (GEMM_HOOKS, GEMM_SUPPORTED, GPU_ONLY, HOOKS, SUPPORTED, compile_once, current, gpu_visible,
                    install, kernel_key, kernel_name, missing, missing_gemm, table_scope)
from .recording import Record, Recording, artifacts
from .serving import STATS_NAME, Serving, Shipped, compile_entries, reset, serve, stats, target_device

install_hooks = install  # the name of earlier releases

__all__ = ["GEMM_HOOKS", "GEMM_SUPPORTED", "GPU_ONLY", "HOOKS", "STATS_NAME", "SUPPORTED", "Counts", "Kernel", "Record",
           "Recording", "Serving", "Shipped", "artifacts", "compile_entries", "compile_once", "current", "gpu_visible",
           "install", "install_hooks", "kernel_key", "kernel_name", "missing", "missing_gemm", "recording", "reset",
           "serve", "stats", "table_scope", "target_device", "templates"]
