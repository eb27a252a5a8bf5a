"""Every reach into PyTorch's private Inductor code, and the one patch flytune makes to it.

`HOOKS` names each private name used (tests pin them; `missing()` says which this torch lacks). The
patch (`install()`, once per process): `CachingAutotuner`'s parent-side `precompile`,
`benchmark_all_configs` and `coordinate_descent_tuning` ask which serving or recording is innermost
in the calling context (`current()`) and hand the call to it; with none, Inductor's own method runs
as if unpatched. Each serving or recording has the three methods the patch calls: `precompile(original,
autotuner, ...)`, `benchmark(original, autotuner, ...)` and `coordesc(autotuner, start, found, args,
kwargs)`, and `depth`, how many times it is open.

Which one is innermost is per context (a `ContextVar`, each thread and each asyncio task its own):
a thread that opened nothing compiles as Inductor does, whatever other threads have open. Inductor's
own helper threads start with no context of the compile that started them, so what they do is not
handed to any serving or recording: on an H100 (torch 2.11, max-autotune) the GEMM template choices'
precompiles ran on a ThreadPoolExecutor's threads, while every benchmark, coordinate descent and the
compiled graph's own kernels' precompiles ran on the compiling thread.

GEMM template choices (max-autotune's `select_algorithm`, torch 2.10+; `GEMM_HOOKS`, `missing_gemm()`):
the patch of `InductorChoices._finalize_template_configs` (`install_gemm()`), where a matmul's templates
become its choices (one lowering may make several such calls), and of `AlgorithmSelectorCache.__call__`,
where Inductor selects among all of a lowering's choices, hand each call to `current()`'s
`finalize(original, handler, ...)` and `select(original, cache, name, choices, ...)` the same way, and
`MultiTemplateBuffer.finalize_as_triton_caller`, where the scheduler builds a deferred select (max-autotune's
epilogue benchmark) as one Triton choice, tells it `built_as(choice)`; a
user's own `LookupTableChoices` answers first (its table, its handler, never changed), and only its
misses reach the patch. Inductor's own lookup over a serving's table (`lookup_choices`), its own key
(`inductor_gemm_key`) and a feedback saver put in and taken out again (`add_feedback_saver`,
`remove_feedback_saver`) are what runtime.inductor.templates builds on.

Also here: Inductor's lookup table (`lookup_table()`, `set_lookup_table()`, and `table_scope()`: whether
torch keeps it once per process or once per context) and the harvest's compile (`compile_once()`).
"""
from __future__ import annotations

import contextvars
import functools
import importlib
import os
import sys
import threading

from ...core import inductor
from ...core.errors import DeviceError

# (module, attribute path) of every private PyTorch name used here; torch 2.9 and later hold them all
HOOKS = (
    ("torch._inductor.config", "autotune_lookup_table"),
    ("torch._inductor.runtime.triton_heuristics", "generate_lookup_hash_from_source_code"),
    ("torch._inductor.runtime.triton_heuristics", "lookup_autotune_config"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.precompile"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.benchmark_all_configs"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.coordinate_descent_tuning"),
    ("torch._inductor.runtime.triton_heuristics", "CachingAutotuner.bench"),
)
_DECLARED = HOOKS
SUPPORTED = "torch 2.9 or later (torch._inductor.config.autotune_lookup_table appeared in 2.9)"
GPU_ONLY = ("Inductor generates Triton kernels, which flytune serves and harvests, only for a CUDA or ROCm GPU "
            "(for a CPU it generates C++, which it does not autotune)")


# GEMM template choices (max-autotune's select_algorithm, runtime.inductor.templates); torch 2.10 and later
GEMM_HOOKS = (
    ("torch._inductor.choices", "InductorChoices._finalize_template_configs"),
    ("torch._inductor.choices", "InductorChoices.get_ktc"),
    ("torch._inductor.lookup_table", "LookupTableChoices.lookup_template_configs"),
    ("torch._inductor.lookup_table", "LookupTableChoices._create_lookup_choices"),
    ("torch._inductor.lookup_table", "LookupTableChoices._get_lookup_table"),
    ("torch._inductor.lookup_table", "LookupTableChoices.make_lookup_key"),
    ("torch._inductor.kernel_inputs", "KernelInputs.dtypes"),
    ("torch._inductor.kernel_inputs", "KernelInputs.shapes_hinted"),
    ("torch._inductor.kernel_inputs", "KernelInputs.strides_hinted"),
    ("torch._inductor.select_algorithm", "AlgorithmSelectorCache.__call__"),
    ("torch._inductor.ir", "MultiTemplateBuffer.finalize_as_triton_caller"),
    ("torch._inductor.select_algorithm", "add_feedback_saver"),
    ("torch._inductor.select_algorithm", "get_algorithm_selector_cache"),
    ("torch._inductor.config", "lookup_table.check_src_hash"),
)
_DECLARED_GEMM = GEMM_HOOKS
GEMM_SUPPORTED = "torch 2.10 or later (torch._inductor.lookup_table appeared in 2.10)"


def missing() -> list[str]:
    """The hooks (`HOOKS`) the installed torch lacks; [] where every one is there."""
    return _lacking("HOOKS", HOOKS, _DECLARED)


def missing_gemm() -> list[str]:
    """The GEMM template hooks (`GEMM_HOOKS`) the installed torch lacks (all of them before torch 2.10)."""
    return _lacking("GEMM_HOOKS", GEMM_HOOKS, _DECLARED_GEMM)


def _lacking(name: str, here: tuple, declared: tuple) -> list[str]:
    # the package re-exports the tuple: whichever of the two names a caller (a test) replaced is the one read
    package = sys.modules.get(__name__.rpartition(".")[0])
    hooks = here if getattr(package, name, declared) is declared else getattr(package, name)
    out = []
    for module, path in hooks:
        try:  # each module the code above names (torch's own, never a name read from data), read in sys.modules
            if module.startswith("torch."):
                importlib.import_module(module)
        except ImportError:
            pass
        obj = sys.modules.get(module)
        for part in path.split(".") if obj is not None else ():
            obj = getattr(obj, part, None)
        if obj is None:
            out.append(f"{module}.{path}")
    return out


def kernel_key(autotuner) -> str:
    """The lookup hash of a `CachingAutotuner`'s kernel, as Inductor computes it (core.inductor.lookup_key)."""
    return inductor.lookup_key(str(autotuner.size_hints), autotuner.fn.src)


def kernel_name(autotuner) -> str:
    return str((autotuner.inductor_meta or {}).get("kernel_name") or autotuner.fn.__name__)


# -- which serving or recording a call belongs to: the innermost open in the calling context ---------------
_open: contextvars.ContextVar[tuple] = contextvars.ContextVar("flytune_inductor_open", default=())


def current():
    """The innermost serving or recording open in this context, or None."""
    for obj in reversed(_open.get()):
        if obj.depth > 0:  # one closed from another context stays listed here until this context moves
            return obj
    return None


def entered(obj) -> None:
    """`obj` was opened in this context (its `depth` already counts it): the innermost here until it closes."""
    _open.set(tuple(o for o in _open.get() if o.depth > 0) + (obj,))


def opened_here() -> list:
    """The servings and recordings open in this context, each once, the first opened first."""
    out: list = []
    for obj in _open.get():
        if obj.depth > 0 and not any(o is obj for o in out):
            out.append(obj)
    return out


def left(obj) -> None:
    """`obj` was closed once in this context: its innermost entry here goes (none where another opened it)."""
    stack = _open.get()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is obj:
            _open.set(stack[:i] + stack[i + 1:])
            return


# -- the one patch ---------------------------------------------------------------------------------------------
_install_lock = threading.Lock()


def install() -> None:
    """Patch CachingAutotuner's parent-side methods, once per process (a forked child inherits them)."""
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner

    patch(CachingAutotuner, "precompile", _precompile)
    patch(CachingAutotuner, "benchmark_all_configs", _benchmark_all_configs)
    patch(CachingAutotuner, "coordinate_descent_tuning", _coordinate_descent_tuning)


def patch(owner: type, name: str, wrapper) -> None:
    """Install `wrapper(original, self, *args, **kwargs)` as `owner.<name>`, once (runtime.inductor.templates
    patches Inductor's GEMM choices through this too)."""
    with _install_lock:
        original = getattr(owner, name)
        if getattr(original, "__flytune__", False):
            return

        @functools.wraps(original)
        def method(self, *args, **kwargs):
            return wrapper(original, self, *args, **kwargs)

        method.__flytune__ = True
        setattr(owner, name, method)


def _precompile(original, self, warm_cache_only=False, *args, **kwargs):
    ctx = None if warm_cache_only else current()  # warm_cache_only: a compile worker's, never counted
    if ctx is None:
        return original(self, warm_cache_only, *args, **kwargs)
    return ctx.precompile(original, self, warm_cache_only, *args, **kwargs)


def _benchmark_all_configs(original, self, *args, **kwargs):
    ctx = current()
    return original(self, *args, **kwargs) if ctx is None else ctx.benchmark(original, self, *args, **kwargs)


def _coordinate_descent_tuning(original, self, launcher, *args, **kwargs):
    found = original(self, launcher, *args, **kwargs)
    ctx = current()
    return found if ctx is None else ctx.coordesc(self, launcher, found, args, kwargs)


def install_gemm() -> None:
    """Patch InductorChoices' finalize step, where a matmul's templates become its choices,
    select_algorithm's select among a lowering's choices, and the scheduler's building of a deferred
    select as one choice, once per process: handed to `current()`'s `finalize(original, handler, ...)`,
    `select(original, cache, name, choices, ...)` and `built_as(choice)` (runtime.inductor.templates)."""
    from torch._inductor.choices import InductorChoices
    from torch._inductor.ir import MultiTemplateBuffer
    from torch._inductor.select_algorithm import AlgorithmSelectorCache

    patch(InductorChoices, "_finalize_template_configs", _finalize_template_configs)
    patch(AlgorithmSelectorCache, "__call__", _select)
    patch(MultiTemplateBuffer, "finalize_as_triton_caller", _built_as)


def _finalize_template_configs(original, self, *args, **kwargs):
    ctx = current()
    return original(self, *args, **kwargs) if ctx is None else ctx.finalize(original, self, *args, **kwargs)


def _select(original, self, name, choices, *args, **kwargs):
    ctx = current()
    return original(self, name, choices, *args, **kwargs) if ctx is None else \
        ctx.select(original, self, name, choices, *args, **kwargs)


def _built_as(original, self, caller, *args, **kwargs):
    original(self, caller, *args, **kwargs)
    ctx = current()
    if ctx is not None:
        ctx.built_as(caller)


def _reinit_after_fork() -> None:
    global _install_lock
    _install_lock = threading.Lock()  # a thread of the parent may have held it: the child has no such thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)


# -- Inductor's lookup table -----------------------------------------------------------------------------------
def lookup_table():
    """`torch._inductor.config.autotune_lookup_table` as it is (the object itself)."""
    import torch._inductor.config as inductor_config

    return inductor_config.autotune_lookup_table


def set_lookup_table(table) -> None:
    import torch._inductor.config as inductor_config

    inductor_config.autotune_lookup_table = table


@functools.lru_cache(maxsize=1)
def table_scope() -> str:
    """Where torch keeps the lookup table a compile reads: "context" where its config keeps what a user
    set per context (torch 2.13 here: each thread, each task its own table), else "process" (one table
    for every thread). Told by reading the table from an empty context: the same object, or another."""
    import torch._inductor.config as inductor_config

    here = inductor_config.autotune_lookup_table
    elsewhere = contextvars.Context().run(lambda: inductor_config.autotune_lookup_table)
    return "process" if elsewhere is here else "context"


# -- GEMM template choices: Inductor's own key, lookup and feedback ---------------------------------------------
def gemm_inputs(kernel_inputs) -> tuple[list, dict]:
    """A matmul lowering's inputs as Inductor keys them: (dtype as torch prints it, size hints, strides)
    each, and the op's scalars (alpha, beta)."""
    rows = zip(kernel_inputs.dtypes(), kernel_inputs.shapes_hinted(), kernel_inputs.strides_hinted())
    return [(str(d), s, st) for d, s, st in rows], dict(getattr(kernel_inputs, "_scalars", None) or {})


def inductor_gemm_key(kernel_inputs, op_name: str) -> str | None:
    """Inductor's own device-agnostic key of a lowering; None where Inductor looks nothing up (off CUDA)."""
    from torch._inductor.lookup_table import LookupTableChoices

    return LookupTableChoices().make_lookup_key(kernel_inputs, op_name, include_device=False)


def lookup_choices(table, kernel_inputs, templates: list, op_name: str) -> list | None:
    """The choices Inductor's own lookup makes from `table` ({key: [entry]}) for a lowering, or None where
    it finds none (no entry under Inductor's key, a template the lowering does not offer, a template hash
    that is not this torch's, where `config.lookup_table.check_src_hash` is on): Inductor's key, hash check
    and choice building, as for a user's table, with neither the user's table nor handler touched."""
    from torch._inductor.lookup_table import LookupTableChoices

    class Served(LookupTableChoices):
        def _get_lookup_table(self):
            return table

        def choose(self) -> list | None:
            hashes = {t.uid: getattr(t, "src_hash", None) for t in templates}
            found = self.lookup_template_configs(kernel_inputs, op_name, [t.uid for t in templates], hashes)
            return (self._create_lookup_choices(found, templates, kernel_inputs, op_name) or None) if found else None

    return Served().choose()


def add_feedback_saver(fn) -> None:
    """`fn(timings, name, input_nodes, choices, profiler_bench_fn, precompile_times)` called once Inductor has
    timed a select's choices; until `remove_feedback_saver(fn)`."""
    from torch._inductor.select_algorithm import add_feedback_saver as add

    add(fn)


def remove_feedback_saver(fn) -> None:
    """Take `fn` (the very object added) out of Inductor's savers; every other stays (Inductor's own
    `clear_feedback_savers` would drop the user's too)."""
    from torch._inductor.select_algorithm import get_algorithm_selector_cache

    savers = get_algorithm_selector_cache().feedback_saver_fns
    for i in range(len(savers) - 1, -1, -1):
        if savers[i] is fn:
            del savers[i]


# -- the harvest's compile -------------------------------------------------------------------------------------
def gpu_visible() -> bool:
    """Whether torch sees a CUDA or ROCm GPU (ROCm answers through torch.cuda too)."""
    import torch

    return bool(torch.cuda.is_available())


def compile_once(model, inputs: tuple, mode: str, dynamic: bool = False) -> None:
    """Compile `model` for `inputs` as `mode` asks (a torch.compile mode, or "aoti"), with Inductor's
    caches off, so every kernel is autotuned here and none is read from an earlier compile. A
    DeviceError where torch sees no GPU: Inductor would generate C++ and autotune nothing."""
    import tempfile
    from pathlib import Path

    import torch
    import torch._dynamo as dynamo
    import torch._inductor.config as inductor_config
    from torch._inductor import aoti_compile_and_package

    if not gpu_visible():
        raise DeviceError(f"no GPU is visible: {GPU_ONLY}; harvest on the target GPU")
    with inductor_config.patch(force_disable_caches=True):
        if mode == "aoti":
            exported = torch.export.export(model, tuple(inputs))
            with tempfile.TemporaryDirectory() as d:
                aoti_compile_and_package(exported, package_path=str(Path(d) / "model.pt2"))
        else:
            dynamo.reset()
            torch.compile(model, mode=mode, dynamic=dynamic)(*inputs)  # Inductor autotunes on the first call
            torch.cuda.synchronize()
