"""How a key is served (`Decision`) and what each kernel counts (`Stats`, behind `flytune_build.stats()`).

A decision is made once per distinct key; the hot path only bumps its `calls`. Calls per tier are
rendered from the decisions: a decision's first call counts for the tier that chose it (a searched
key's first call is "search"), every later call for the tier that serves it ("scratch"). Calls an
adopted `@triton.autotune` kernel serves from Triton's own cache, which are not known per key, are
counted per tier in `Stats.served`.

`failure`, `miss` and `unbundled` are the errors a decision can end in: an accepted artifact that fails
to launch (never retried with a default), FLYTUNE_AUTOTUNE=strict with no tuned config for a call, and
FLYTUNE_AUTOTUNE=bundle with no installed bundle serving it.

`Flights` is what makes "once per distinct key" hold when threads meet: a ported kernel's keys being
decided, and the `forcing` blocks open on it; only a miss reads it.
"""
from __future__ import annotations

import os
import threading
import weakref
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


_deciding = threading.local()   # `depth`: the decisions this thread is making (of any kernel)
_flights: weakref.WeakSet[Flights] = weakref.WeakSet()   # every kernel's, for a forked child


class Flights:
    """One kernel's keys being decided, over its memo (raw key -> Decision), so that a key is decided once.

    The first thread to miss a key decides it; a later caller of that key waits, then is served the
    decision. A thread already making a decision (of any kernel: a `default`, a pre_hook, an
    `on_decision` callback calling a kernel) never waits, so no two threads wait on each other (but a
    `default` that hands the same key to a thread of its own and joins it deadlocks: that thread waits): it
    decides the key itself, and the decision stored first is the key's. A decider that raises stores
    nothing and releases its waiters, which then decide the key themselves (each meeting the error, if
    it stands, on its own call). `forcing` blocks are process-wide: while one is open every miss is
    served its decision, the memo set aside until the last closes. A decision begun before a block
    opened or closed, or before a reset, is not stored (`generation`): its caller decides again."""

    def __init__(self, memo: dict):
        self.memo = memo
        self.lock = threading.Lock()
        self.pending: dict[tuple, threading.Event] = {}  # raw key -> what its decider sets when done
        self.generation = 0
        self.forced: Decision | None = None               # the innermost open block's decision
        self.open: list[Decision] = []
        self.saved: dict = {}                             # the memo the blocks set aside
        _flights.add(self)

    def enter(self, raw: tuple) -> tuple[Decision | None, tuple | None]:
        """(the decision to serve, None), or (None, a flight): this thread decides `raw`, then calls `leave`."""
        while True:
            with self.lock:
                d = self.memo.get(raw) if self.forced is None else self.forced
                if d is not None:
                    return d, None
                event = self.pending.get(raw)
                depth = getattr(_deciding, "depth", 0)
                if event is None or depth:
                    mine = None
                    if event is None:
                        mine = self.pending[raw] = threading.Event()
                    _deciding.depth = depth + 1
                    return None, (raw, self.generation, mine)
            event.wait()

    def leave(self, flight: tuple, d: Decision | None, decisions: Callable[[], list]) -> tuple[Decision | None, bool]:
        """The flight ended with `d` (None: none made, or it raised): waiters released. Returns (`d`, True)
        where `d` is stored (and counted in `decisions()`, read under the lock a reset takes), (the key's
        decision, False) where one was stored meanwhile, (None, True) where forcing or a reset came
        meanwhile: decide again."""
        raw, generation, mine = flight
        _deciding.depth -= 1
        with self.lock:
            if mine is not None and self.pending.get(raw) is mine:
                del self.pending[raw]
            if d is None:
                out = None, False
            elif generation != self.generation:
                out = None, True
            elif raw in self.memo:
                out = self.memo[raw], False
            else:
                self.memo[raw] = d
                decisions().append(d)
                out = d, True
        if mine is not None:
            mine.set()
        return out

    def force(self, d: Decision) -> None:
        """A `forcing` block opens: every miss is served `d`; the memo is set aside (by the first block)."""
        with self.lock:
            self.forced, self.generation = d, self.generation + 1   # forced before the memo empties
            if not self.open:
                self.saved = dict(self.memo)
                self.memo.clear()
            self.open.append(d)

    def unforce(self, d: Decision) -> None:
        """`d`'s block closes: the block open before it serves again, or, the last closed, the memo set aside."""
        with self.lock:
            self.open = [o for o in self.open if o is not d]
            self.forced, self.generation = (self.open[-1] if self.open else None), self.generation + 1
            if not self.open:
                self.memo.clear()
                self.memo.update(self.saved)
                self.saved = {}

    def reset(self, then: Callable[[], object] | None = None) -> None:
        """Forget every decision, those set aside included; one under way is not stored. `then` runs under
        the same lock (the kernel's counters made anew: no decision lands in the old ones after it)."""
        with self.lock:
            self.generation += 1
            self.memo.clear()
            self.saved.clear()
            if then is not None:
                then()


def _forked() -> None:
    """In a forked child: no other thread is deciding, and no lock is held."""
    for f in list(_flights):
        f.lock, f.pending = threading.Lock(), {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


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
