"""One warning per cause: the runtime must not flood a serving process."""
from __future__ import annotations

import warnings

_seen: set = set()


class FlytuneWarning(UserWarning):
    """A fallback or an ignored input; the next tier serves."""


def once(cause, message: str, stacklevel: int = 3) -> bool:
    if cause in _seen:
        return False
    _seen.add(cause)
    warnings.warn(message, FlytuneWarning, stacklevel=stacklevel)
    return True


def reset() -> None:
    _seen.clear()
