"""How the compiles made under a serving were served: each decision (`Kernel`: a generated kernel or a
GEMM template choice, and its tier), the decisions counted per tier, kernels and GEMM choices apart
(`Counts`), and closed servings' counts folded into fixed totals (`Totals`, what `stats()` sums).
"""
from __future__ import annotations

from dataclasses import dataclass, field

TIERS = ("offline", "autotune", "single")
NAMES = 64  # the autotuned kernels' (and GEMM choices') names stats() keeps, at most (the counts are whole)


@dataclass
class Kernel:
    """How one generated kernel (or one GEMM template choice) of a compile was served."""
    name: str           # Inductor's name (triton_poi_fused_gelu_3; a GEMM choice's op, mm)
    key: str            # its lookup hash (a GEMM choice's lookup key, core.gemm)
    tier: str           # "offline" (the bundle's config), "autotune" (Inductor's search), "single"
    config: dict | None = None
    origin: str | None = None
    level: str | None = None
    kind: str = "kernel"  # or "gemm"


@dataclass
class Counts:
    """A serving's decisions, or the process's totals: per tier, kernels and GEMM choices apart, and the
    names of those Inductor autotuned (benchmarked)."""
    kernels: dict = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    gemm: dict = field(default_factory=lambda: dict.fromkeys(TIERS, 0))
    names: set = field(default_factory=set)
    gemm_names: set = field(default_factory=set)

    def minus(self, other: Counts) -> Counts:
        return Counts({t: n - other.kernels[t] for t, n in self.kernels.items()},
                      {t: n - other.gemm[t] for t, n in self.gemm.items()},
                      self.names - other.names, self.gemm_names - other.gemm_names)


class Totals:
    """Closed servings' counts, folded: a fixed size however many servings opened (names: at most NAMES)."""

    def __init__(self) -> None:
        self.counts = Counts()

    def add(self, c: Counts) -> None:
        for mine, theirs in ((self.counts.kernels, c.kernels), (self.counts.gemm, c.gemm)):
            for tier, n in theirs.items():
                mine[tier] += n
        for mine, theirs in ((self.counts.names, c.names), (self.counts.gemm_names, c.gemm_names)):
            for name in sorted(theirs):
                if len(mine) >= NAMES:
                    break
                mine.add(name)
