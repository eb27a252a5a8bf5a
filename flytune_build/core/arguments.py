"""The rules for arguments of the Python API and the CLI, one each: every public function and flag that
takes a list of paths or names, a time limit or a count goes through them.

A bare string where a list goes is refused, never iterated (`merge("AB", "OUT")` would merge `A` and
`B`); a time limit is a finite number of seconds above zero (`nan` would mean none, `-1` fail every job);
a count is a positive integer; a path or a name is never empty, and a path holds no NUL byte (no system
takes one). The errors are `ArgumentTypeError` (a TypeError) for a wrong type and
`UsageError` (a ValueError) for a value out of range: the CLI's exit code 2 either way.
"""
from __future__ import annotations

import decimal
import math
import numbers
import os
from typing import Any

from .errors import ArgumentTypeError, UsageError


def paths(value: Any, name: str) -> list:
    """`value` as a list of paths (str or os.PathLike), refusing one bare path and anything else."""
    return _items(value, name, "paths", (str, os.PathLike))


def names(value: Any, name: str) -> list[str]:
    """`value` as a list of strings, refusing one bare string, an empty name and anything else."""
    return _items(value, name, "names", (str,))


def path(value: Any, name: str) -> Any:
    """`value`, one path (str or os.PathLike); a list or anything else is refused, and so is an empty one
    (as the CLI refuses `--output ""`: it never means the current directory, which is ".")."""
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(f"must be a path (a str or os.PathLike), not {type(value).__name__}", field=name)
    text = os.fspath(value)
    if text == "":
        raise UsageError("is an empty path: it never means the current directory (pass \".\" for that)", field=name)
    if ("\0" if isinstance(text, str) else b"\0") in text:
        raise UsageError(f"holds a NUL byte ({text!r}), which no path can: pass the path without it", field=name)
    return value


def choice(value: Any, name: str, choices: tuple) -> Any:
    """`value`, one of `choices` (None: the default, where it is one of them)."""
    if value not in choices:
        raise UsageError(f"must be one of {', '.join(map(str, (c for c in choices if c is not None)))}, not "
                         f"{value!r}", field=name)
    return value


def seconds(value: Any, name: str) -> float | None:
    """`value` as a time limit in seconds: None (no limit) or a finite number above zero."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(f"must be a number of seconds, not {type(value).__name__}", field=name)
    if not (math.isfinite(value) and value > 0):
        raise UsageError(f"must be a finite number of seconds above 0, not {value!r}", field=name)
    return float(value)


def count(value: Any, name: str) -> int | None:
    """`value` as a count: None (the default) or an integer of at least 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"must be an integer, not {type(value).__name__}", field=name)
    if value < 1:
        raise UsageError(f"must be at least 1, not {value}", field=name)
    return value


def flag(value: Any, name: str) -> bool:
    """`value` as a yes/no switch: True or False only (`allow_ci="no"` is truthy: refused)."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"must be True or False, not {type(value).__name__} ({value!r})", field=name)
    return value


def percent(value: Any, name: str) -> float:
    """`value` as a percentage: a finite number from 0 to below 1000 (a numpy scalar or a Decimal too)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, decimal.Decimal)):
        raise ArgumentTypeError(f"must be a number (a percentage), not {type(value).__name__}", field=name)
    value = float(value)
    if not (math.isfinite(value) and 0 <= value < 1000):
        raise UsageError(f"must be a percentage from 0 to below 1000, not {value!r}", field=name)
    return float(value)


def _items(value: Any, name: str, what: str, types: tuple) -> list:
    if isinstance(value, (str, bytes, bytearray, os.PathLike)):
        raise ArgumentTypeError(f"must be a list of {what}, not one {type(value).__name__} ({value!r}); "
                                f"write [{value!r}] for one", field=name)
    try:
        items = list(value)
    except TypeError:
        raise ArgumentTypeError(f"must be a list of {what}, not {type(value).__name__}", field=name) from None
    for i, item in enumerate(items):
        if isinstance(item, (bytes, bytearray)) or not isinstance(item, types):
            raise ArgumentTypeError(f"must hold {what}, not {type(item).__name__} ({item!r})", field=f"{name}[{i}]")
        if what == "paths":
            path(item, f"{name}[{i}]")
        elif item == "":
            raise UsageError(f"is an empty name, which names nothing: pass a name (or leave {name} out for the default)", field=f"{name}[{i}]")
    return items
