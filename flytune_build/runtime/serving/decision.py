"""How a key is served (`Decision`) and what each kernel counts (`Stats`, behind `flytune_build.stats()`).

A decision is made once per distinct key; the hot path only bumps its `calls`. Calls per tier are
rendered from the decisions: a decision's first call counts for the tier that chose it (a searched
key's first call is "search"), every later call for the tier that serves it ("scratch"). Calls an
adopted `@triton.autotune` kernel serves from Triton's own cache, which are not known per key, are
counted per tier in `Stats.served`.

`failure`, `miss` and `unbundled` are the errors a decision can end in: an accepted artifact that fails
to launch (never retried with a default), FLYTUNE_AUTOTUNE=strict with no tuned config for a call, and
FLYTUNE_AUTOTUNE=bundle with no installed bundle serving it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...core.config import Config
from ...core.errors import ArtifactExecutionError, TierMissError

if TYPE_CHECKING:
    from ...core.artifact import Artifact
    from ..searching.search import SearchResult

TIERS = ("scratch", "offline", "heuristic", "search")


@dataclass(slots=True)
class Decision:
    """How one key is served: the launch kwargs and which tier chose them."""
    config: Config
    tier: str
    key: dict
    level: str | None = None
    origin: str | None = None
    first_tier: str | None = None   # "search" when this winner was searched on first call
    calls: int = 0
    search: SearchResult | None = None  # what the search that chose it found
    artifact: Artifact | None = None    # the searched winner as an artifact, with provenance
    hook: Callable[[tuple, dict], None] | None = None  # the config's pre_hook (`hooks.ConfigHooks.bind`)
    pack: str | None = None             # offline: the config pack (distribution) it came from; None: the owner's
    first: bool = False                 # heuristic tier: the first config (no `default` callback chose it)
    launch: dict = field(init=False)
    run: Callable | None = field(init=False, default=None)  # a ported kernel's launcher, its pre_hook first

    def __post_init__(self):
        self.launch = {**self.config.launch_kwargs(), "warmup": False}
        self.first_tier = self.first_tier or self.tier


@dataclass
class Stats:
    """One kernel's decisions and counters since its last reset."""
    decisions: list[Decision] = field(default_factory=list)
    searches: int = 0
    search_seconds: float = 0.0
    fallbacks: dict[str, int] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))  # calls known per tier only

    def fallback(self, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    def searched(self, seconds: float) -> None:
        self.searches += 1
        self.search_seconds += seconds

    def to_json(self) -> dict:
        """Calls per tier, offline calls per match level, the heuristic tier's calls the first config served
        (no `default` callback: `first_config`), searches, seconds searching, fallback reasons."""
        calls = dict(self.served)
        levels: dict[str, int] = {}
        first = 0
        for d in self.decisions:
            if d.calls:
                calls[d.first_tier] += 1
                calls[d.tier] += d.calls - 1
                if d.tier == "offline":
                    levels[d.level] = levels.get(d.level, 0) + d.calls
                if d.first:
                    first += d.calls
        return {"calls": calls, "offline_levels": levels, "first_config": first, "searches": self.searches,
                "search_seconds": self.search_seconds, "fallbacks": dict(self.fallbacks)}


def failure(d: Decision, e: Exception) -> ArtifactExecutionError:
    """An accepted artifact failed to compile or launch: the error names it."""
    return ArtifactExecutionError(f"failed to compile or launch with the accepted artifact {d.origin} "
                                  f"({d.config}): {type(e).__name__}: {e}", file=d.origin, field="config")


def miss(kernel: str, key: Any, device: Any, fallback: str) -> TierMissError:
    """FLYTUNE_AUTOTUNE=strict: no tuned config serves `key` on `device`; `fallback` names what would have."""
    return TierMissError(f"has no tuned config for key {key} on device {device}: FLYTUNE_AUTOTUNE=strict forbids "
                         f"falling back to {fallback}", file=f"kernel {kernel}", field="key")


def unbundled(kernel: str, key: Any, device: Any, why: str) -> TierMissError:
    """FLYTUNE_AUTOTUNE=bundle: no installed bundle serves `key` on `device`; `why` says what is installed."""
    return TierMissError(f"is not served by an installed bundle for key {key} on device {device}: {why} "
                         f"(FLYTUNE_AUTOTUNE=bundle: only installed bundles serve; the scratch cache, "
                         f"FLYTUNE_ARTIFACT_DIR, the heuristic and a search are skipped)", file=f"kernel {kernel}",
                         field="key")
