"""One warning per cause: the runtime must not flood a serving process."""
from __future__ import annotations

import warnings

from ..core.errors import FlytuneWarning

_seen: set = set()


def once(cause, message: str, stacklevel: int = 3) -> bool:
    if cause in _seen:
        return False
    _seen.add(cause)
    warnings.warn(message, FlytuneWarning, stacklevel=stacklevel)
    return True


def reset() -> None:
    _seen.clear()
