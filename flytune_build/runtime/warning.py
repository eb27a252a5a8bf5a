"""One warning per cause: the runtime must not flood a serving process.

A warning points at the caller's code: the first frame outside flytune_build and triton (a kernel
launch goes through both), however deep inside them it was raised.
"""
from __future__ import annotations

import inspect
import os
import threading
import warnings

from ..core.errors import FlytuneWarning, printable

_seen: set = set()          # the causes warned of in this process (a forked child inherits them: said once)
_lock = threading.Lock()    # two threads meeting one cause: one warning
_INSIDE = ("flytune_build", "triton")


def once(cause, message: str) -> bool:
    """Warn `message` the first time `cause` is seen; True when it did. The message is made printable
    (core.errors.printable): what it quotes from data (a distribution's name, a file name) cannot move
    the cursor or recolour a terminal."""
    with _lock:
        if cause in _seen:
            return False
        _seen.add(cause)
    warnings.warn(printable(message), FlytuneWarning, stacklevel=_caller_level())
    return True


def reset() -> None:
    _seen.clear()


def _forked() -> None:
    global _lock
    _lock = threading.Lock()  # a thread warning in the parent is not in the child: nothing holds it


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def _caller_level() -> int:
    """The `stacklevel` of the first frame outside flytune_build and triton, as `once` passes it."""
    level, frame = 1, inspect.currentframe().f_back  # level 1: `once` itself
    while frame.f_back is not None and _inside(frame.f_globals.get("__name__") or ""):
        frame, level = frame.f_back, level + 1
    return level


def _inside(module: str) -> bool:
    return module.split(".", 1)[0] in _INSIDE
