"""The declared key: which kernel parameters are tuning axes, and how a numeric axis is bucketed.

`key=["x", "N", pow2("M"), nearest("B")]`: a tensor parameter contributes its dtype, a scalar its value;
`pow2` rounds up to the next power of two, `nearest` snaps to the nearest tuned value (ties go down).
"""
from __future__ import annotations

import numbers
import re

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import DeclarationError


@dataclass(frozen=True)
class Axis:
    name: str
    mode: str = "value"

    def __str__(self):
        return self.name if self.mode == "value" else f"{self.mode}({self.name})"


def pow2(name: str) -> Axis:
    """A numeric axis bucketed to the next power of two (1, 2, 4, ...)."""
    return Axis(name, "pow2")


def nearest(name: str) -> Axis:
    """A numeric axis snapped to the nearest tuned value."""
    return Axis(name, "nearest")


def parse_axes(key: Sequence[Any], arg_names: Sequence[str], kernel: str) -> tuple[Axis, ...]:
    if isinstance(key, (str, Axis)):
        key = [key]
    axes = []
    for i, entry in enumerate(key):
        axis = Axis(entry) if isinstance(entry, str) else entry
        if not isinstance(axis, Axis):
            raise DeclarationError(f"must be a parameter name, pow2(name) or nearest(name), not "
                                   f"{type(entry).__name__}", file=kernel, field=f"key[{i}]")
        if axis.name not in arg_names:
            from .codec import did_you_mean
            raise DeclarationError(f"names {axis.name!r}, which is not a parameter of the kernel "
                                   f"({', '.join(arg_names)})" + did_you_mean(axis.name, arg_names),
                                   file=kernel, field=f"key[{i}]")
        if axis.name in (a.name for a in axes):
            raise DeclarationError(f"repeats {axis.name!r}", file=kernel, field=f"key[{i}]")
        axes.append(axis)
    return tuple(axes)


def getter(positions: Sequence[int]) -> Callable[[tuple], tuple]:
    """A function from positional args to the raw key tuple; a tensor contributes its dtype.

    Precomputed once, so a cache hit costs one tuple build. Raw values are hashable: ints, floats,
    strings and torch dtypes.
    """
    if len(positions) == 1:
        (p0,) = positions
        return lambda a: (getattr(a[p0], "dtype", a[p0]),)
    if len(positions) == 2:
        p0, p1 = positions
        return lambda a: (getattr(a[p0], "dtype", a[p0]), getattr(a[p1], "dtype", a[p1]))
    if len(positions) == 3:
        p0, p1, p2 = positions
        return lambda a: (getattr(a[p0], "dtype", a[p0]), getattr(a[p1], "dtype", a[p1]),
                          getattr(a[p2], "dtype", a[p2]))
    if len(positions) == 4:  # a tensor's three dtypes and a size: 1.43 -> 1.07-1.14 us a hit (dispatch_overhead.py)
        p0, p1, p2, p3 = positions
        return lambda a: (getattr(a[p0], "dtype", a[p0]), getattr(a[p1], "dtype", a[p1]),
                          getattr(a[p2], "dtype", a[p2]), getattr(a[p3], "dtype", a[p3]))
    return lambda a: tuple([getattr(a[p], "dtype", a[p]) for p in positions])


def raw(value: Any) -> Any:
    """What one key argument contributes to a call's key off the hot path: a tensor its dtype, a numpy
    scalar (`numpy.float64(0.5)`: it has a dtype too, and Triton launches it as the number) the number it
    holds, anything else itself. `getter`'s keys read the dtype of both: a numpy scalar's call is never
    a hit, it is decided (by this key) every call, and every value of it keys as itself."""
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        return value
    numpy_scalar = isinstance(value, numbers.Number) or (type(value).__module__ == "numpy" and value.shape == ())
    return value.item() if numpy_scalar else dtype   # (numpy.bool_ is no numbers.Number)


def raw_key(bound: dict, names: Sequence[str]) -> tuple:
    """A call's key off the hot path: `raw` of each of the arguments `names` (`bound`: the call's arguments by
    name); KeyError where one was not passed."""
    return tuple([raw(bound[n]) for n in names])


def scalar(value: Any) -> Any:
    """The JSON scalar an axis value is stored as: dtypes become their short name (`float16`)."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    return dtype_name(value)


def dtype_name(dtype: Any) -> str:
    """A dtype's name as artifacts store it: `torch.float16` (a dtype or its text) -> `float16`."""
    text = str(dtype)
    return text.removeprefix("torch.")


# the names `dtype_name` gives torch's and Triton's dtypes (`float16`, `bfloat16`, `int32`, `uint8`,
# `float8_e4m3fn`, `bool`, `fp8e4nv`, `bf16`): what a tensor parameter contributes to a key
DTYPE_NAME = re.compile(r"(?:b?float|u?int|complex|fp|bf)\d+(?:_?[a-z0-9]+)*|bool")


def is_dtype_name(value: Any) -> bool:
    """Whether a stored axis value is a tensor's dtype (so the parameter is a tensor, which may be None)."""
    return type(value) is str and DTYPE_NAME.fullmatch(value) is not None


def bucket(value: Any, axis: Axis, tuned: Sequence[Any] | None = None) -> Any:
    if axis.mode == "pow2" and isinstance(value, int) and not isinstance(value, bool):
        return 1 if value <= 1 else 1 << (value - 1).bit_length()
    if axis.mode == "nearest" and tuned and isinstance(value, (int, float)) and not isinstance(value, bool):
        nums = [t for t in tuned if isinstance(t, (int, float)) and not isinstance(t, bool)]
        if nums and value == value:   # NaN is near no value: it keys as itself (a miss)
            if value >= max(nums) or value <= min(nums):   # past the ends (inf, 1e300: every distance rounds alike)
                return max(nums) if value >= max(nums) else min(nums)
            return min(nums, key=lambda t: (abs(t - value), t))
    return value
