"""Triton's specialization of one launch, as data (`core.specialization`), and back into compile inputs.

`capture` runs the kernel's own binder (the one `JITFunction.run` uses) on the winning launch's
arguments; `compile_inputs` turns the recorded data into what `JITFunction.run` hands to
`triton.compile` (signature, constexprs, attrs, options), so `cache_hash` is the key Triton itself
computes. On a GPU `capture` proves it: the winner's compiled kernel, already in the JIT's cache, must
have that key, else nothing is recorded. Under the interpreter Triton's generic specialization rules
stand in for the backend's (they are the same for CUDA).
"""
from __future__ import annotations

import hashlib
import math
import re
import sys
import weakref
from typing import Any

from ...core import settings
from ...core import specialization as spec_format
from ...core.codec import Fields
from ...core.config import COMPILER_OPTIONS, Config
from ...core.errors import ArtifactError
from ...core.options import BACKEND_KWARGS, specialization_option_problem
from .. import warning
from ..wrapping import chain

_RUNTIME_OPTIONS = ("instrumentation_mode",)  # JITFunction.run sets it itself, whatever the caller passed


class Mismatch(Exception):
    """The recorded specialization does not fit the kernel as it is now (or cannot be recorded)."""


def is_jit(obj: Any) -> bool:
    """Whether `obj` is a `@triton.jit` function (compiled, or run by the interpreter)."""
    return type(obj).__name__ in ("JITFunction", "InterpretedFunction") and hasattr(obj, "arg_names")


def import_path(jit) -> str:
    """module:qualname of the Python function under `jit`."""
    return f"{jit.fn.__module__}:{jit.fn.__qualname__}"


def resolve(path: str, module_object) -> Any:
    """The @triton.jit function that `module_object`'s attribute `qualname` is or wraps (through
    `@autotune`, `@triton.autotune` and `@triton.heuristics`, each holding the next as `.fn`), else
    raise Mismatch."""
    obj = module_object
    for part in spec_format.IMPORT_PATH.fullmatch(path)["qualname"].split("."):
        obj = getattr(obj, part, None)
    jit = next((o for o in chain(obj) if is_jit(o)), None)
    if not is_jit(jit) or import_path(jit) != path:
        raise Mismatch(f"{path} is not a @triton.jit function (or one under @autotune)")
    return jit


def capture(fn, args: tuple, kwargs: dict, config: Config) -> dict:
    """The specialization Triton applies when `fn` (the launched @triton.jit function) runs with `args`,
    `kwargs` and `config`; raise Mismatch when it cannot be recorded exactly."""
    if not is_jit(fn):
        raise Mismatch(f"the launched function is a {type(fn).__name__}, not a @triton.jit function")
    path = import_path(fn)
    if not spec_format.IMPORT_PATH.fullmatch(path):
        raise Mismatch(f"{path} cannot be imported by name")
    module = sys.modules.get(fn.fn.__module__)
    if module is None or resolve(path, module) is not fn:
        raise Mismatch(f"{path} does not name the launched function")
    jit, backend, binder, compiled = _binder(fn)
    bound, spec, extra = binder(*args, **kwargs, **config.launch_kwargs())
    names, values = list(bound), list(bound.values())
    types, codes = [s[0] for s in spec], [s[1] for s in spec]  # Triton's (type, attribute code) per parameter
    doc = {"format": spec_format.FORMAT, "kernel": path,
           "signature": {n: _json_type(t) for n, t in zip(names, types)},
           "constexprs": {_path(names, p): _json_value(_at(values, p)) for p in _paths(types, _is_constexpr)},
           "attrs": {_path(names, p): backend.parse_attr(_at(codes, p))
                     for p in _paths(codes, lambda v: isinstance(v, str))},
           "options": {}}
    for name, value in extra.items():
        if name not in COMPILER_OPTIONS and name not in _RUNTIME_OPTIONS:
            doc["options"][name] = value
    try:
        spec_format.check(doc, Fields(path, ArtifactError))
    except ArtifactError as e:
        raise Mismatch(f"cannot be written as data: {e.field} {e.rule}") from None
    if compiled is not None:  # a GPU: the winner is compiled; its key must be the one we would rebuild
        if cache_hash(doc, jit, config, backend)[2] not in compiled():
            raise Mismatch("the rebuilt specialization does not give the compiled kernel's cache key")
    return doc


def record(kernel: str, fn, args: tuple, kwargs: dict, config: Config) -> dict | None:
    """`capture` of what `fn` launches (`launched`), or None with one warning per kernel when artifacts
    are being made (`flytune tune`, FLYTUNE_AUTOTUNE=1): a search never fails for want of it."""
    try:
        return capture(*launched(fn, args, kwargs, config), config)
    except Exception as e:  # noqa: BLE001 - Mismatch, or a Triton that binds differently
        if settings.current().autotune == "search":
            reason = str(e) if isinstance(e, Mismatch) else f"{type(e).__name__}: {e}"
            warning.once(("specialization", kernel), f"flytune: kernel {kernel}: its specialization is not "
                         f"recorded ({reason}); `flytune warmup` will skip its artifacts")
        return None


def launched(fn, args: tuple, kwargs: dict, config: Config) -> tuple[Any, tuple, dict]:
    """(the @triton.jit function `fn` launches, its args, its kwargs): through `@triton.heuristics`
    wrappers (each `.fn` the next), adding each one's values as `Heuristics.run` does, in order, each
    seeing the config and the ones before it; the launch's own `grid` and `warmup` left out."""
    launch = {k: v for k, v in kwargs.items() if k not in ("grid", "warmup")}
    for o in chain(fn):
        if is_jit(o):
            return o, args, launch
        values = getattr(o, "values", None)
        if isinstance(values, dict):
            named = {**dict(zip(o.arg_names, args)), **launch, **config.launch_kwargs()}
            for name, heuristic in values.items():
                named[name] = launch[name] = heuristic(named)
    return None, args, launch


def compile_inputs(doc: dict, jit, config: Config) -> tuple[dict, dict, dict, dict]:
    """(signature, constexprs, attrs, option kwargs) as `JITFunction.run` passes them to `triton.compile`."""
    names = list(jit.arg_names)
    if sorted(doc["signature"]) != sorted(names):
        raise Mismatch(f"recorded for parameters ({', '.join(doc['signature'])}), the kernel has "
                       f"({', '.join(names)}): re-tune it")
    signature = {n: _triton_type(doc["signature"][n]) for n in names}
    constexprs = dict(sorted((_index(names, p), _triton_value(v)) for p, v in doc["constexprs"].items()))
    attrs = dict(sorted((_index(names, p), [list(a) for a in v]) for p, v in doc["attrs"].items()))
    wanted = set(_paths(list(signature.values()), _is_constexpr))
    if set(constexprs) != wanted:
        raise Mismatch("its constexprs do not match the constexpr entries of its signature")
    for name, value in config.kwargs.items():  # a tuned constexpr must hold the config's value
        if name in BACKEND_KWARGS and name not in names:
            continue  # a backend's launch-keyword option (waves_per_eu): recorded among the options
        if name not in names:
            raise Mismatch(f"the config sets {name}, which is not a parameter of the kernel")
        got = constexprs.get((names.index(name),), value)
        if got != value or type(got) is not type(value):
            raise Mismatch(f"its constexpr {name} is {got!r}, the config's is {value!r}")
    # the config's options and backend launch keywords, then only what the closed set lets a
    # specialization add (checked again here: `doc` may come from anywhere), never overriding the config
    options = {k: v for k, v in config.launch_kwargs().items()
               if k in COMPILER_OPTIONS or (k in BACKEND_KWARGS and k not in names)}
    for name, value in doc["options"].items():
        problem = specialization_option_problem(name, value)
        if problem is None and name in options and (type(options[name]) is not type(value) or options[name] != value):
            problem = f"is {value!r}, but the config sets {name} to {options[name]!r}"
        if problem is not None:
            raise Mismatch(f"its compile option {name} {problem}")
        options.setdefault(name, value)
    return signature, constexprs, attrs, options


def cache_hash(doc: dict, jit, config: Config, backend) -> tuple[Any, Any, str]:
    """(ASTSource, parsed options, the hash of Triton's cache key) for one recorded specialization."""
    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler import ASTSource
    from triton.runtime.cache import get_cache_key

    signature, constexprs, attrs, options = compile_inputs(doc, jit, config)
    options = dict(options)
    options["debug"] = options.get("debug", jit.debug) or knobs.runtime.debug  # as JITFunction.run does
    options["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    src = ASTSource(jit, signature, constexprs, attrs)
    parsed = backend.parse_options(options)
    key = get_cache_key(src, backend, parsed, get_cache_invalidating_env_vars())
    return src, parsed, hashlib.sha256(key.encode("utf-8")).hexdigest()


def compilable(fn):
    """A `JITFunction` for `fn`: itself, or one made from the interpreter's function (for compiling
    under TRITON_INTERPRET, which never compiles)."""
    if type(fn).__name__ == "JITFunction":
        return fn
    try:
        return _MADE[fn]
    except KeyError:
        pass
    from triton.runtime.jit import JITFunction

    keep = {k: v for k, v in getattr(fn, "kwargs", {}).items()
            if k in ("do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline")}
    made = _MADE[fn] = JITFunction(fn.fn, **keep)
    return made


# the JITFunction made for each interpreted function: it lives as long as the function (a weak key)
_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _binder(fn):
    """(JITFunction, backend, binder, hashes of compiled kernels or None) for the running device."""
    jit = compilable(fn)
    if jit is fn:
        from triton.runtime.driver import driver

        kernel_cache, _, _, backend, binder = jit.device_caches[driver.active.get_current_device()]

        def compiled():
            return {getattr(k, "hash", None) or getattr(getattr(k, "kernel", None), "hash", None)
                    for k in list(kernel_cache.values())}
        return jit, backend, binder, compiled
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    return jit, BaseBackend, create_function_from_signature(jit.signature, jit.params, BaseBackend), None


def _is_constexpr(v) -> bool:
    return v == "constexpr"


def _paths(values: list, pred) -> list[tuple[int, ...]]:
    """Index paths of the leaves of nested tuples for which `pred` holds (Triton's find_paths_if)."""
    out = []

    def walk(v, at):
        if isinstance(v, (tuple, list)):
            for i, x in enumerate(v):
                walk(x, at + (i,))
        elif pred(v):
            out.append(at)
    for i, v in enumerate(values):
        walk(v, (i,))
    return out


def _at(values: list, path: tuple[int, ...]):
    for i in path:
        values = values[i]
    return values


def _path(names: list[str], path: tuple[int, ...]) -> str:
    return spec_format.join_path(names[path[0]], path[1:])


def _index(names: list[str], path: str) -> tuple[int, ...]:
    name, rest = spec_format.split_path(path)
    if name not in names:
        raise Mismatch(f"names parameter {name}, which the kernel does not have")
    return (names.index(name),) + rest


def _json_type(t):
    return [_json_type(x) for x in t] if isinstance(t, (tuple, list)) else t


def _triton_type(t):
    return tuple(_triton_type(x) for x in t) if isinstance(t, list) else t


def _json_value(v):
    if v is None or type(v) in (bool, int, float, str):
        return v
    if type(v).__name__ == "dtype" and type(v).__module__.startswith("triton"):
        return {"dtype": str(v)}
    raise Mismatch(f"a constexpr of type {type(v).__name__} cannot be written as data")


def _triton_value(v):
    if isinstance(v, dict):
        import triton.language as tl

        return tl.dtype(v["dtype"])
    return v


# -- stand-ins: arguments Triton specialises as a recorded launch did (the warm-up's) --------------------
TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "fp64": "float64", "i8": "int8",
                 "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32",
                 "u64": "uint64", "u1": "bool", "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2",
                 "fp8e4b8": "float8_e4m3fnuz", "fp8e5b16": "float8_e5m2fnuz"}


class Pointer:
    """A tensor's stand-in for Triton's binder (as Triton's `MockTensor`): a dtype and an address that is,
    or is not, a multiple of 16; no shape or strides (so no scratch-cache layout)."""

    def __init__(self, dtype, aligned: bool):
        self.dtype, self._address = dtype, 0 if aligned else 8

    def data_ptr(self) -> int:
        return self._address

    @staticmethod
    def ptr_range() -> int:
        return 0

    def element_size(self) -> int:   # what a pruner may read of a tensor besides its dtype (search.prunes_by)
        return self.dtype.itemsize


DESCRIPTOR = re.compile(r"tensordesc<([a-z0-9]+)\[([1-9][0-9]*(?:, [1-9][0-9]*)*)\]>")


def descriptor(name: str, ty: str):
    """A host-side tensor descriptor's stand-in: what Triton specialises it on (`tensordesc<fp16[32, 64]>`:
    the base's dtype and the block shape; Triton 3.x) over a `Pointer`; its shape is the block's and its
    strides any 16-byte-aligned ones (neither enters the specialization). Mismatch for any other form (a
    layout, an im2col descriptor) or where this Triton has no host-side descriptor."""
    import torch

    m = DESCRIPTOR.fullmatch(ty)
    dtype = getattr(torch, TORCH_DTYPES.get(m[1], ""), None) if m else None
    if dtype is None:
        raise Mismatch(f"{name} is a {ty} descriptor: no stand-in")
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError as e:
        raise Mismatch(f"{name} is a {ty} descriptor: this Triton has no host-side descriptor") from e
    block = [int(b) for b in m[2].split(", ")]
    strides = [16 * math.prod(block[i + 1:]) for i in range(len(block) - 1)] + [1]
    try:
        return TensorDescriptor(Pointer(dtype, True), list(block), strides, block)
    except (AssertionError, ValueError, TypeError) as e:   # a block shape this Triton refuses
        raise Mismatch(f"{name} is a {ty} descriptor: {e}") from e


def stand_ins(spec: dict, config: Config, key: dict | None = None, exclude: set = frozenset()) -> dict:
    """One value per parameter (but `exclude`) that Triton specialises as `spec` records; with `key`,
    its axes take the key's values (a tensor axis: a stand-in of that dtype). Mismatch where a recorded
    type has no stand-in (a tuple, a descriptor of another form than `descriptor` takes, a low-precision
    scalar)."""
    import torch

    key = key or {}
    out = {}
    for name, ty in spec["signature"].items():
        if name in exclude:
            continue
        attrs = spec["attrs"].get(name, [])
        if not isinstance(ty, str):
            raise Mismatch(f"{name} is a tuple argument: no stand-in")
        if ty == "constexpr":
            value = spec["constexprs"].get(name, key.get(name))
            out[name] = constexpr_value(value)
            continue
        aligned = ["tt.divisibility", 16] in attrs
        if ty.startswith("*"):
            element = ty[2:] if ty.startswith("*k") else ty[1:]
            dtype_name = key.get(name, TORCH_DTYPES.get(element))
            dtype = getattr(torch, str(dtype_name), None) if dtype_name is not None else None
            if dtype is None:
                raise Mismatch(f"{name} is a {ty} tensor: no torch dtype stands in for it")
            out[name] = Pointer(dtype, aligned)
        elif ty.startswith("tensordesc<"):
            out[name] = descriptor(name, ty)
        elif name in key:
            out[name] = key[name]
        elif ty in ("i32", "i64", "u64"):
            base = {"i32": 0, "i64": 1 << 32, "u64": 1 << 63}[ty]
            out[name] = base + (16 if aligned else 17)
        elif ty == "i1":
            out[name] = True
        elif ty == "fp32":
            out[name] = 1.5
        else:
            raise Mismatch(f"{name} is a {ty} scalar: no stand-in")
    return out


def constexpr_value(value):
    if isinstance(value, dict):
        import triton.language as tl

        return tl.dtype(value["dtype"])
    return value


def launch_options(config: Config) -> list[dict]:
    """The compile options a launch of `config` passes, in the orders that make Triton's in-process key:
    flytune's (`Config.launch_kwargs`) and `triton.Config.all_kwargs`'s (an adopted kernel's)."""
    ours = dict(config.launch_kwargs())
    tritons = dict(config.kwargs, num_warps=config.num_warps, num_ctas=config.num_ctas, num_stages=config.num_stages)
    if config.maxnreg is not None:
        tritons["maxnreg"] = config.maxnreg
    return [ours, tritons]


def check_specialization(spec: dict, jit, specialization, backend) -> None:
    """Raise Mismatch unless the binder's `specialization` of the stand-ins is the recorded one."""
    for name, (ty, code) in zip(jit.arg_names, specialization):
        want = spec["signature"].get(name)
        if ty != want:
            raise Mismatch(f"stand-ins specialise {name} as {ty}, recorded {want}")
        if ty == "constexpr":
            if code != constexpr_value(spec["constexprs"].get(name)):
                raise Mismatch(f"stand-ins give constexpr {name} = {code!r}")
            continue
        got = [list(a) for a in backend.parse_attr(code)] if isinstance(code, str) else []
        if got != [list(a) for a in spec["attrs"].get(name, [])]:
            raise Mismatch(f"stand-ins give {name} the attributes {got}")
