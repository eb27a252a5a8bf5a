"""A fork made while a warm-up thread is importing a module waits for that import to end.

CPython resets its global import lock in a forked child, but not the per-module locks
(`importlib._bootstrap._ModuleLock`): a module another thread was importing at the fork stays locked
in the child by a thread the child does not have, and the child's first import of it hangs for good.
A background warm-up (`warmup(background=True)`, FLYTUNE_WARMUP=background) imports on its own threads
(Triton's compiler and backends, `importlib.metadata`, a bundle's kernel modules) while the program goes
on, and a server or a DataLoader forks its workers right after its own imports: so, before each fork
(`os.register_at_fork`), the forking thread waits while a warm-up thread owns a module lock.

Invariants: only the forking thread waits, only while a warm-up thread (its name starts with one of
`PREFIXES`) is inside an import, and never where the forking thread owns a module lock itself (the
warm-up's import may be waiting on that one); at most `WAIT_S` seconds, after which the fork goes on
as without this module, with one warning naming the module, and no later fork waits for that module
again (`_given_up`: a DataLoader's eight forks wait once, not eight times). Where the interpreter keeps
its module locks otherwise (`_module_locks`, `owner`), nothing waits.
"""
from __future__ import annotations

import importlib._bootstrap as _bootstrap  # CPython's import machinery: its per-module locks
import os
import threading
import time

from .. import warning

PREFIXES = ("flytune-warmup", "flytune-load")   # the warm-up's threads: Background, Auto, its pools
WAIT_S = 10.0
_given_up: set[str] = set()   # modules a fork waited WAIT_S for: no fork waits for them again


def importing(idents: set[int]) -> str | None:
    """The name of a module one of the threads `idents` is importing now (None: none, or unknown), less
    those given up on."""
    locks = getattr(_bootstrap, "_module_locks", None)
    if not isinstance(locks, dict):
        return None
    for name, ref in list(locks.items()):
        lock = ref() if callable(ref) else None
        if getattr(lock, "owner", None) in idents and name not in _given_up:
            return name
    return None


def before_fork() -> None:
    """`os.register_at_fork(before=...)`: wait while a warm-up thread is importing (see the module docstring)."""
    me = threading.get_ident()
    ours = {t.ident for t in threading.enumerate() if t.name.startswith(PREFIXES) and t.ident != me}
    if not ours or importing({me}) is not None:
        return
    deadline = time.monotonic() + WAIT_S
    while (name := importing(ours)) is not None:
        if time.monotonic() >= deadline:
            _given_up.add(name)
            warning.once(("fork", name), f"flytune: a fork waited {WAIT_S:g} s for the warm-up's import of {name} "
                         f"and went on (later forks do not wait for it): a child that imports {name} may hang")
            return
        time.sleep(0.001)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=before_fork)
