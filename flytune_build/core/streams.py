"""Where `print` goes while flytune runs user code whose output must not reach stdout.

A tuning job's setup, its kernels' hooks and its reference function may print; stdout is the
report's (`flytune tune --json`) in the CLI and the pipe protocol's in a local worker, so what they
print goes to stderr instead (`to_stderr()`).

State: `sys.stdout` is the process's, and threads share it, so no block swaps it for stderr (two
threads each saving and restoring it would leave it pointing at stderr). While any block of any
thread is open, `sys.stdout` is one `Router` (counted; the stream it replaced comes back when the
last block closes, unless someone replaced the router meanwhile); each write goes to stderr where
the writing context is inside a block (a `ContextVar`), else to the stream it replaced. A forked
child inherits the router and the count of the thread that forked: the block that thread is in
closes in the child as in the parent.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Iterator

_diverted: contextvars.ContextVar[bool] = contextvars.ContextVar("flytune_stdout_diverted", default=False)
_lock = threading.Lock()


class Router:
    """`sys.stdout` while a block is open: each write goes to stderr inside a block, else to `target`."""

    def __init__(self, target) -> None:
        self.target = target
        self.blocks = 0

    def stream(self):
        return sys.stderr if _diverted.get() else self.target

    def write(self, text: str) -> int:
        return self.stream().write(text)

    def writelines(self, lines) -> None:
        self.stream().writelines(lines)

    def flush(self) -> None:
        self.stream().flush()

    def __getattr__(self, name: str):
        return getattr(self.stream(), name)


_router: Router | None = None


def _forked() -> None:
    global _lock
    _lock = threading.Lock()  # a thread opening or closing a block in the parent is not in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


@contextlib.contextmanager
def to_stderr() -> Iterator[None]:
    """A block in which what this context prints to stdout goes to stderr; other threads' output is
    left where it goes. `sys.stdout` is as it was once every thread's block is closed."""
    global _router
    with _lock:
        if _router is None:
            _router = Router(sys.stdout)
            sys.stdout = _router
        _router.blocks += 1
        router = _router
    token = _diverted.set(True)
    try:
        yield
    finally:
        _diverted.reset(token)
        with _lock:
            router.blocks -= 1
            if router.blocks == 0 and _router is router:
                if sys.stdout is router:
                    sys.stdout = router.target
                _router = None
