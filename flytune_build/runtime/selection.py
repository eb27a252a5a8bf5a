"""How a search chooses its winner from timed candidates, so that two tunes of one kernel agree.

Every candidate is first screened on a tenth of the timing budget, in three interleaved passes whose
least time it keeps (`bench`, `search`); on a GPU each pass and each round below times a config on the
next of five placements of its inputs (`placement`), so the times sample where the data lies too. Then:

1. finalists: the candidates within `screen_band` (10%) of the best screened time, at most
   `max_finalists` (6): the fastest, then the earliest declared (screening cannot order near-equal
   configs, so the tie rule's order chooses which are re-timed), plus the shipped winner when
   `flytune tune` re-tunes into an output that already holds one. They are re-timed in `rounds` (5)
   interleaved rounds (the order rotates each round, so drift hits every finalist alike); together
   the rounds take FINALIST_BUDGET times the kernel's timing budget, however many finalists there are;
2. the band: each finalist has the median m of its round times and the dispersion s, their
   interquartile range / 1.349 (a standard deviation robust to a stray round). With F the fastest
   finalist and d the finalists' pooled relative dispersion (root mean square of s/m), a finalist
   ties with F when
   m <= m_F * (1 + w),   w = min(max(k * sqrt(2) * d, floor), cap),   k = 2, floor = 1.5%, cap = 2%:
   statistically indistinguishable from the fastest, or within `floor` of it, never beyond `cap` (so a
   winner is never more than 2% slower than the fastest finalist in its own run);
3. the tie rule: the earliest declared config in the band wins. It depends on no timing, so two
   tunes that see the same band choose the same config;
4. hysteresis: with a shipped winner I, timed in the same rounds, the band's winner W replaces I only
   when m_I / m_W - 1 > margin (`flytune tune --min-improvement`, 3% by default); otherwise I stays.

The band, each finalist's median and dispersion, and why the winner won are the artifact's
`provenance.selection`. Under the interpreter (`CPU_TIME`) the floor is 1%, the screening band 100% and the cap
50%: on a loaded machine a kernel's CPU time jumps by a third from one round to the next (14 ms, then
19 ms, for one config), and those winners order configs for tests, not for speed; declare the config
you prefer first. A synthetic ranking (`SYNTHETIC`) has no noise and keeps the fixed 3% band.
"""
from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from ..core.config import Config
from ..core.errors import SearchError
from .bench import Candidate

FINALIST_BUDGET = 3    # all finalists' rounds together take 3x the kernel's timing budget
IQR_SIGMA = 1.349      # interquartile range / 1.349 -> standard deviation, for normal noise
TIE_RULE = "declared order"


@dataclass(frozen=True)
class Rule:
    """The band's parameters (see the module docstring)."""
    k: float = 2.0
    floor: float = 0.015
    cap: float = 0.02
    rounds: int = 5
    max_finalists: int = 6
    screen_band: float = 0.10
    prefer: str = "declared"   # which near-best candidates become finalists past the fastest: declared | fastest

    def to_json(self) -> dict:
        return {"k": self.k, "floor": self.floor, "cap": self.cap, "rounds": self.rounds,
                "max_finalists": self.max_finalists, "screen_band": self.screen_band, "prefer": self.prefer,
                "tie": TIE_RULE}


MEASURED = Rule()   # a GPU's device events or CUDA graphs, or the kernel's own do_bench
CPU_TIME = Rule(floor=0.01, cap=0.5, screen_band=1.0)   # the interpreter
# A synthetic ranking has no noise: it keeps the fixed 3% band and the three fastest finalists that the
# committed interpreter artifacts were ranked with, so re-making them gives the same bytes.
SYNTHETIC = Rule(k=0.0, floor=0.03, cap=0.03, rounds=1, max_finalists=3, prefer="fastest")


def rule_for(timer: str) -> Rule:
    """The rule for a search timed by `timer` (`bench.Measurement.timer`)."""
    return {"cpu-time": CPU_TIME, "synthetic": SYNTHETIC}.get(timer, MEASURED)


@dataclass(frozen=True)
class Shipped:
    """The winner an output already holds for this kernel and key, and the gain that may replace it."""
    config: Config
    margin: float


@dataclass(frozen=True)
class Selection:
    winner: Candidate
    record: dict             # provenance.selection
    outcome: str | None      # kept | replaced against a shipped winner; None when there was none


@dataclass(frozen=True)
class Band:
    fastest: int             # index of the fastest finalist (declared order on a tie)
    width: float             # w: relative to the fastest finalist's time
    limit_ms: float          # m_F * (1 + w)
    members: tuple[int, ...]  # the finalists in the band, in declared order


def dispersion(times: Sequence[float]) -> float:
    """Interquartile range / 1.349 of one finalist's round times (0 for fewer than two)."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / IQR_SIGMA


def band(samples: dict[int, Sequence[float]], rule: Rule) -> Band:
    """The tie band over finalists' round times ({candidate index: times}, every time finite)."""
    stats = {i: (statistics.median(t), dispersion(t)) for i, t in samples.items()}
    fastest = min(stats, key=lambda i: (stats[i][0], i))
    m_f = stats[fastest][0]
    rel = [s / m if m > 0 else 0.0 for m, s in stats.values()]
    pooled = math.sqrt(sum(r * r for r in rel) / len(rel))
    width = min(max(rule.k * math.sqrt(2.0) * pooled, rule.floor), rule.cap)
    limit = m_f * (1 + width)
    return Band(fastest, width, limit, tuple(sorted(i for i, (m, _) in stats.items() if m <= limit)))


def pick(candidates: Sequence[Candidate], retime: Callable[[Candidate, float], float], rule: Rule = MEASURED,
         shipped: Shipped | None = None) -> Selection:
    """The winner among `candidates` (in declared order, each with its screening time).

    `retime(candidate, fraction)` times one candidate on 1/fraction of the kernel's budget. Finalists'
    times become their round medians."""
    ok = [i for i, c in enumerate(candidates) if math.isfinite(c.time_ms)]
    if not ok:
        errors = "; ".join(f"{c.config}: {c.error or 'failed'}" for c in candidates)
        raise SearchError(f"every candidate failed: {errors}", field="configs")
    held, note = _held(candidates, shipped)
    chosen = finalists(candidates, ok, rule, held)
    fraction = max(len(chosen) * rule.rounds / FINALIST_BUDGET, 1.0)
    samples = _rounds(candidates, chosen, retime, rule.rounds, fraction) if len(chosen) > 1 else \
        {chosen[0]: [candidates[chosen[0]].time_ms]}
    if not samples:
        raise SearchError("every finalist failed when re-timed: " + "; ".join(
            f"{candidates[i].config}: {candidates[i].error}" for i in chosen), field="configs")
    for i, times in samples.items():
        candidates[i].time_ms = statistics.median(times)
    if held is not None and held not in samples:
        held, note = None, f"the shipped winner {shipped.config} failed when re-timed"
    b = band(samples, rule)
    winner = b.members[0]
    record = {"rule": rule.to_json(), "round_fraction": round(fraction, 3), "fastest": b.fastest,
              "band": round(b.width, 6), "band_ms": _ms(b.limit_ms), "winner": winner,
              "finalists": [_finalist(i, samples[i]) for i in sorted(samples)]}
    why = _why(candidates, samples, b, rule)
    outcome = None
    if shipped is not None:
        winner, why, record["shipped"], outcome = _against(candidates, winner, why, held, note, shipped.margin)
        record["winner"] = winner
    record["why"] = why
    return Selection(candidates[winner], record, outcome)


def finalists(candidates: Sequence[Candidate], ok: Sequence[int], rule: Rule, held: int | None) -> list[int]:
    """Indices re-timed in rounds, in declared order: within the screening band of the best time, at most
    `rule.max_finalists` of those (the fastest, then the earliest declared or the next fastest, as the
    rule prefers), and the shipped winner's."""
    best = min(candidates[i].time_ms for i in ok)
    near = sorted((i for i in ok if candidates[i].time_ms <= best * (1 + rule.screen_band)),
                  key=lambda i: (candidates[i].time_ms, i))
    if rule.prefer == "declared":
        near = near[:1] + sorted(near[1:])
    near = near[:rule.max_finalists]
    if held is not None and held not in near:
        near.append(held)
    return sorted(near)


def _held(candidates, shipped: Shipped | None) -> tuple[int | None, str | None]:
    """The shipped winner's index among the candidates, or why it cannot be kept."""
    if shipped is None:
        return None, None
    for i, c in enumerate(candidates):
        if c.config == shipped.config:
            if math.isfinite(c.time_ms):
                return i, None
            return None, f"the shipped winner {shipped.config} failed here ({c.error or 'no time'})"
    return None, f"the shipped winner {shipped.config} is not among this search's candidates"


def _rounds(candidates, chosen: list[int], retime, rounds: int, fraction: float) -> dict[int, list[float]]:
    """Each finalist's times over `rounds` interleaved rounds; a finalist that fails drops out."""
    samples: dict[int, list[float]] = {i: [] for i in chosen}
    for r in range(rounds):
        for i in chosen[r % len(chosen):] + chosen[:r % len(chosen)]:
            if i not in samples:
                continue
            try:
                t = float(retime(candidates[i], fraction))
            except Exception as e:  # noqa: BLE001 - a candidate failing here fails, as in screening
                t, candidates[i].error = math.inf, f"{type(e).__name__}: {e}"
            if math.isfinite(t):
                samples[i].append(t)
            else:
                del samples[i]
                candidates[i].time_ms = math.inf
    return samples


def _against(candidates, winner: int, why: str, held: int | None, note: str | None, margin: float):
    """Hysteresis: (winner, why, provenance.selection.shipped, kept | replaced)."""
    if held is None:
        return winner, f"{why}; replaced: {note}", {"index": None, "margin": margin, "outcome": "replaced"}, "replaced"
    if held == winner:
        return winner, f"{why}; the shipped winner", {"index": held, "margin": margin, "gain": 0.0,
                                                      "outcome": "kept"}, "kept"
    gain = candidates[held].time_ms / candidates[winner].time_ms - 1
    record = {"index": held, "margin": margin, "gain": round(gain, 6)}
    if gain > margin:
        why = f"{why}; replaced the shipped #{held}: +{gain:.1%} faster, over the {margin:.1%} margin"
        return winner, why, {**record, "outcome": "replaced"}, "replaced"
    why = f"kept the shipped #{held}: this search's winner #{winner} is {gain:+.1%} faster, within the " \
          f"{margin:.1%} margin"
    return held, why, {**record, "outcome": "kept"}, "kept"


def _why(candidates, samples, b: Band, rule: Rule) -> str:
    if len(samples) == 1:
        return f"the only finalist within {rule.screen_band:.0%} of the fastest screened time"
    if len(b.members) > 1:
        return f"the earliest declared of {len(b.members)} finalists within {b.width:.1%} of the fastest (#{b.fastest})"
    ahead = min(candidates[i].time_ms for i in samples if i != b.fastest) / candidates[b.fastest].time_ms - 1
    return f"the fastest, {ahead:.1%} ahead of the next finalist (band {b.width:.1%})"


def _finalist(i: int, times: Sequence[float]) -> dict:
    return {"index": i, "median_ms": _ms(statistics.median(times)), "dispersion_ms": _ms(dispersion(times)),
            "rounds_ms": [_ms(t) for t in times]}


def _ms(t: float) -> float:
    return float(f"{t:.6g}")


# -- the shipped winners a re-tune must beat ---------------------------------------------------------------
_lookups: list[Callable[[str, dict], Shipped | None]] = []


@contextlib.contextmanager
def keeping(lookup: Callable[[str, dict], Shipped | None]) -> Iterator[None]:
    """A context in which a search of kernel K at key V keeps `lookup(K, V)`, the winner already shipped,
    unless its own winner is faster by more than that `Shipped`'s margin (`flytune tune`)."""
    _lookups.append(lookup)
    try:
        yield
    finally:
        _lookups.remove(lookup)


def shipped(kernel: str, key: dict) -> Shipped | None:
    """The winner a search of `kernel` at `key` must beat, inside `keeping`; else None."""
    for lookup in reversed(_lookups):
        found = lookup(kernel, key)
        if found is not None:
            return found
    return None
