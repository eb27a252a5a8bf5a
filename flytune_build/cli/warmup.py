"""`flytune warmup [DIST...]`: compile the installed bundles' configs for this device into Triton's caches.

Run it where the kernels will run (a container build step with the GPU's toolchain, a service's start),
so that a first call in any later process finds its kernel compiled. See `runtime.warming.warmup`.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile

from . import flags, render
from .output import EXIT_OK, EXIT_VIOLATIONS, dump


def add_command(command) -> None:
    w = command("warmup", "compile the installed bundles' configs for this device into Triton's caches",
                "0 warmed (skipped configs are noted), 1 a config failed to compile or a DIST has no bundle, "
                "2 usage error")
    w.add_argument("distributions", nargs="*", metavar="DIST",
                   help="installed distributions to warm (default: every installed bundle)")
    w.add_argument("--workers", type=flags.count, default=None, metavar="N",
                   help="compile in N processes (or threads) at once (default: one per CPU core)")
    w.add_argument("--threads", action="store_true",
                   help="compile on threads of this process instead of forked processes")
    w.add_argument("--json", action="store_true", help="machine-readable report")


def command(args) -> int:
    from ..runtime.warming.warmup import warmup

    def run():
        return warmup(*args.distributions, workers=args.workers, processes=False if args.threads else None)

    if not args.json:
        report = run()
        print(render.render_warmup(report))
        return EXIT_OK if report.ok else EXIT_VIOLATIONS
    with stdout_captured() as captured:  # a compiler prints (Triton prints a failed kernel's PTX): not into the JSON
        report = run()
    print(dump({**report.to_json(), "output": captured[0]}))
    return EXIT_OK if report.ok else EXIT_VIOLATIONS


@contextlib.contextmanager
def stdout_captured():
    """File descriptor 1 (this process's and every child's it starts meanwhile) pointed at a temporary file
    for the block; then `captured[0]` holds what was written there, clipped (`clip`), as text."""
    captured = [""]
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with tempfile.TemporaryFile() as tmp:
            os.dup2(tmp.fileno(), 1)
            try:
                yield captured
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
                captured[0] = clip(tmp)
    finally:
        os.close(saved)


def clip(file, head: int = 4096, tail: int = 12288) -> str:
    """The text of `file` (UTF-8, bad bytes replaced), its first `head` and last `tail` bytes when longer,
    joined by a line saying how many were left out: a compiler's thousands of lines stay one bounded field."""
    size = os.fstat(file.fileno()).st_size
    file.seek(0)
    if size <= head + tail:
        data = file.read(size)
        return data.decode("utf-8", "replace")
    first = file.read(head)
    file.seek(size - tail)
    last = file.read(tail)
    return (first.decode("utf-8", "replace") + f"\n[... {size - head - tail} bytes left out ...]\n"
            + last.decode("utf-8", "replace"))
