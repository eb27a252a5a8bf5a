"""How Triton keys its Autotuner's cache, and the flytune artifact key of a call to a `@triton.autotune`
kernel (the rules are in `triton_autotune`'s docstring); `autotuner_of` finds the Autotuner under what a
library exports."""
from __future__ import annotations

import functools
import inspect
from typing import Any

from ...core.errors import DeclarationError
from ..wrapping import chain
from ...core.key import dtype_name


def autotuner_of(kernel: Any) -> Any:
    """The Autotuner under `kernel`: itself, or what `@triton.heuristics` (or another wrapper) holds as `.fn`."""
    for k in chain(kernel):
        if all(hasattr(k, a) for a in ("cache", "keys", "arg_names", "configs", "fn")):
            return k
    raise DeclarationError("must be a kernel decorated with @triton.autotune (a triton Autotuner), or a "
                           "@triton.heuristics wrapper of one", field="kernel")


@functools.cache
def dtypes_in_key() -> bool:
    """Whether the installed Triton keys its cache on argument dtypes too (>= 3.0)."""
    import triton
    from packaging.version import Version

    return Version(triton.__version__).major >= 3


def optional_keys(tuner) -> frozenset:
    """The key names a call may leave out, which Triton then leaves out of its key: names that are no
    parameter of the kernel (fla's `key=[..., "BT"]` of a kernel without `BT`), and parameters with a
    default."""
    try:
        params = inspect.signature(tuner.base_fn).parameters
    except (AttributeError, TypeError, ValueError):
        params = {}
    return frozenset(k for k in tuner.keys if k not in tuner.arg_names
                     or (k in params and params[k].default is not inspect.Parameter.empty))


def _none_defaults(tuner) -> frozenset:
    try:
        params = inspect.signature(tuner.base_fn).parameters.values()
    except (AttributeError, TypeError, ValueError):
        return frozenset()
    return frozenset(p.name for p in params if p.default is None)


def artifact_key(tuner, nargs: dict, kwargs: dict) -> dict:
    """The artifact key of a call (`nargs` by position, `kwargs` as passed): the key arguments' values,
    then every other parameter that is a tensor (its dtype) or None (null)."""
    names = tuner.arg_names
    passed = {**nargs, **{k: v for k, v in kwargs.items() if k in names}}
    key = {k: passed[k] for k in tuner.keys if k in passed}
    left_out = [name for name in names if name not in passed]
    none_defaults = _none_defaults(tuner) if left_out else ()
    for name in names:
        if name in key:
            continue
        value = passed.get(name)
        if value is None and (name in passed or name in none_defaults):
            key[name] = None
        elif hasattr(value, "dtype"):
            key[name] = dtype_name(value.dtype)
    return key


def seed_key(tuner, key: dict) -> tuple:
    """The Triton cache key an artifact's key stands for: key values, then dtypes in parameter order."""
    out = tuple(key[k] for k in tuner.keys if k in key)  # a key argument the call left out: not in Triton's
    if dtypes_in_key():
        out += tuple(f"torch.{key[a]}" for a in tuner.arg_names
                     if a in key and a not in tuner.keys and key[a] is not None)
    return out


def call_key(tuner, args: tuple, kwargs: dict) -> tuple:
    """The key Triton computes for this call, as `Autotuner.run` computes it."""
    names = tuner.arg_names
    passed = dict(zip(names, args))   # then the keywords that are parameters: `{**nargs, **kwargs}`'s order
    if kwargs:
        passed.update({k: v for k, v in kwargs.items() if k in names})
    out = [passed[k] for k in tuner.keys if k in passed]
    if dtypes_in_key():
        out += [str(v.dtype) for v in passed.values() if hasattr(v, "dtype")]
    return tuple(out)
