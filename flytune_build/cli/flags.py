"""argparse types for the flags that take a number, over the API's own rules (`core.arguments`): a value
they refuse is a usage error (exit 2) before anything runs, with argparse's message."""
from __future__ import annotations

import argparse

from ..core import arguments
from ..core.errors import UsageError


def seconds(text: str) -> float:
    """A time limit: a finite number of seconds above 0 (`nan`, `inf`, `0`, `-1` are refused)."""
    try:
        return arguments.seconds(float(text), "seconds")
    except (ValueError, UsageError):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds above 0, not {text!r}") from None


def count(text: str) -> int:
    """A positive integer."""
    try:
        return arguments.count(int(text), "count")
    except (ValueError, UsageError):
        raise argparse.ArgumentTypeError(f"must be an integer of at least 1, not {text!r}") from None


def text(value: str) -> str:
    """A path, a name or a spec: never empty (`--output ""` would name the current directory)."""
    if not value.strip():
        raise argparse.ArgumentTypeError(f"must not be empty, not {value!r}")
    return value
