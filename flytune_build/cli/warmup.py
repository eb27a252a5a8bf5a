"""`flytune warmup [DIST...]`: compile the installed bundles' configs for this device into Triton's caches.

Run it where the kernels will run (a container build step with the GPU's toolchain, a service's start),
so that a first call in any later process finds its kernel compiled. See `runtime.warmup`.
"""
from __future__ import annotations

from .output import EXIT_OK, EXIT_VIOLATIONS, dump


def add_command(command) -> None:
    w = command("warmup", "compile the installed bundles' configs for this device into Triton's caches",
                "0 warmed (skipped configs are noted), 1 a config failed to compile or a DIST has no bundle, "
                "2 usage error")
    w.add_argument("distributions", nargs="*", metavar="DIST",
                   help="installed distributions to warm (default: every installed bundle)")
    w.add_argument("--workers", type=int, default=None, metavar="N",
                   help="compile in N processes (or threads) at once (default: one per CPU core)")
    w.add_argument("--threads", action="store_true",
                   help="compile on threads of this process instead of forked processes")
    w.add_argument("--json", action="store_true", help="machine-readable report")


def command(args) -> int:
    from ..runtime.warmup import warmup

    report = warmup(*args.distributions, workers=args.workers, processes=False if args.threads else None)
    print(dump(report.to_json()) if args.json else report.render())
    return EXIT_OK if report.ok else EXIT_VIOLATIONS
