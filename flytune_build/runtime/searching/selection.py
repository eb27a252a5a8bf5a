"""How a search chooses its winner from timed candidates, so that two tunes of one kernel agree.

Every candidate is first screened on a tenth of the timing budget, in three interleaved passes whose
least time it keeps (`bench`, `search`); on a GPU each pass and each round below times a config on the
next of five placements of its inputs (`placement`), so the times sample where the data lies too. Then:

1. finalists: the candidates within `screen_band` (20%) of the best screened time, at most
   `max_finalists` (12): the fastest, then the earliest declared (screening cannot order near-equal
   configs, so the tie rule's order chooses which are re-timed), plus the shipped winner when
   `flytune tune` re-tunes into an output that already holds one. They are re-timed in blocks of
   `rounds` (5) interleaved rounds (the order rotates each round, so drift hits every finalist alike;
   a block visits every placement once, so round r of every finalist ran on the same placement); the
   first block takes FINALIST_BUDGET times the kernel's timing budget, however many finalists there are;
2. the test: F is the finalist of least median time, or the one faster than it round for round (a
   negative paired gap). Each other finalist i has its gap g, the median of
   its paired ratios t_i,r / t_F,r - 1 over the rounds both ran, and the gap's standard error from the
   run's own noise,
   se = 1.2533 x s / sqrt(n),   s = max(dispersion of its paired log ratios log(t_i,r / t_F,r) over the
   n rounds both ran, the finalists' paired dispersions pooled by degrees of freedom, `noise_floor`)
   (interquartile range / 1.349: a standard deviation robust to a stray round; 1.2533: a median's
   error). Against the tolerance `cap` (2%) it is `tied` when g + z x se <= cap, `apart` when
   g - z x se > cap, `edge` otherwise (z = 2). F ties with itself;
3. sequential testing: walking the finalists in declared order, the first tied one is the winner-to-be;
   each `edge` finalist declared before it decides whether it wins. While there is one, another block
   of rounds times those finalists and F only, until every decisive test is resolved, `max_rounds`
   rounds are reached, or the extra rounds have taken EDGE_BUDGET times the first block's time. A test
   still at the edge then is decided on the cap (g <= EDGE_TIE x cap: tied), and the selection is not
   `resolved`. Such a test's gap lies within two standard errors of the cap, so a config truly about
   2% behind can be chosen in one run and not in the next; but calling no edge a tie (or only one under
   half the cap) hands an exact tie in a noisy run (g near 0, se over 1%) to whichever finalist was
   fastest by noise. Under the interpreter, where num_warps ties exactly, two cold tunes of 12 shapes
   agreed on 9-12 deciding on the cap, 8-10 with half the cap and 5 with no edge a tie
   (tests/test_determinism.py's plan at rep=100, on the 2-core development machine); over the rounds
   recorded by six cold H200 runs of two plans in three sessions (`benchmarks/determinism.py replay`), every pair
   of runs agreed on 516 of 555 shape-pairs deciding on the cap, 511 with either other rule;
4. the tie rule: the earliest declared tied finalist wins. It depends on no timing, so two tunes whose
   tests resolve alike choose the same config; no winner's paired gap to F is ever over `cap` in its
   own run (the guarantee is on paired rounds, as the tests are: see `decide`);
5. hysteresis: with a shipped winner I, timed in the same rounds, the winner W replaces I only
   when its paired gain (the median of t_I,r / t_W,r, less 1) less z standard errors of that median
   is over the margin (`flytune tune --min-improvement`, 3% by default); otherwise I stays. The error
   term keeps a busy machine's noise from replacing what ships: a re-tune beside three other test
   processes on two cores once replaced an exact tie on medians alone. (A band rule has no noise:
   there the medians' ratio decides.)

How sure the choice is goes into the artifact's `provenance.selection`: `resolved` (every decisive test
resolved) and `confidence`, the least over the decisive tests of Phi(|g - cap| / se), the chance under
normal noise that another run of the same length decides that test alike (1 when the only finalist or
the fastest wins with no earlier finalist near the edge); each finalist's `gap`, `gap_se` and `verdict`;
the run's `noise` (the pooled relative dispersion of the paired rounds); and `why`. A bias between
processes is not in `confidence`: every round of a run runs in one process. Under the interpreter
(`CPU_TIME`) the screening band is 100% (every candidate a finalist, up to six) and the noise floor
1%: a loaded machine's CPU times move 3-8% from one round to the next. A synthetic ranking
(`SYNTHETIC`) has no noise and keeps the fixed 3% band of the committed interpreter artifacts (`Band`).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

from ...core.config import Config
from ...core.errors import SearchError
from . import session
from .bench import Candidate

FINALIST_BUDGET = 3    # the first block of all finalists' rounds takes 3x the kernel's timing budget
EDGE_BUDGET = 3        # the extra blocks take at most 3x the first block's time
IQR_SIGMA = 1.349      # interquartile range / 1.349 -> standard deviation, for normal noise
MEDIAN_SE = 1.2533     # a median's standard error over a mean's, for normal noise
TIE_RULE = "declared order"
DEFAULT_MARGIN = 0.03  # a tuned config replaces the kernel's default only when faster by more than this
EDGE_TIE = 1.0         # a test still at the edge when the rounds are spent is a tie where g <= EDGE_TIE x cap


@dataclass(frozen=True)
class Rule:
    """The sequential test's parameters (see the module docstring)."""
    cap: float = 0.02
    z: float = 2.0
    noise_floor: float = 0.005
    rounds: int = 5
    max_rounds: int = 60
    max_finalists: int = 12
    screen_band: float = 0.20
    prefer: str = "declared"   # which near-best candidates become finalists past the fastest: declared | fastest

    def to_json(self) -> dict:
        return {"test": "sequential", "cap": self.cap, "z": self.z, "noise_floor": self.noise_floor,
                "rounds": self.rounds, "max_rounds": self.max_rounds, "max_finalists": self.max_finalists,
                "screen_band": self.screen_band, "prefer": self.prefer, "tie": TIE_RULE}


@dataclass(frozen=True)
class BandRule:
    """A fixed band over one round of noiseless times: `SYNTHETIC`'s, as the committed artifacts record it."""
    k: float = 0.0
    floor: float = 0.03
    cap: float = 0.03
    rounds: int = 1
    max_finalists: int = 3
    screen_band: float = 0.10
    prefer: str = "fastest"

    def to_json(self) -> dict:
        return {"k": self.k, "floor": self.floor, "cap": self.cap, "rounds": self.rounds,
                "max_finalists": self.max_finalists, "screen_band": self.screen_band, "prefer": self.prefer,
                "tie": TIE_RULE}


MEASURED = Rule()   # a GPU's device events or CUDA graphs, or the kernel's own do_bench
CPU_TIME = Rule(noise_floor=0.01, max_finalists=6, screen_band=1.0)   # the interpreter
# A synthetic ranking has no noise: it keeps the fixed 3% band and the three fastest finalists that the
# committed interpreter artifacts were ranked with, so re-making them gives the same bytes.
SYNTHETIC = BandRule()


def rule_for(timer: str) -> Rule | BandRule:
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


@dataclass(frozen=True)
class Test:
    """One finalist against the fastest: its gap, the gap's standard error, and the verdict."""
    gap: float
    se: float
    verdict: str             # one of core.choice.VERDICTS: tied | apart | edge

    def confidence(self, cap: float) -> float:
        """The chance, under normal noise, that a run of the same length decides this test alike."""
        if self.se <= 0:
            return 1.0
        return 0.5 * (1 + math.erf(abs(self.gap - cap) / self.se / math.sqrt(2)))


@dataclass(frozen=True)
class Verdict:
    """The sequential test's outcome over the rounds so far (how a key is served is runtime.serving.decision's)."""
    fastest: int
    noise: float                  # the pooled relative dispersion of the paired rounds
    tests: dict[int, Test]        # every finalist but the fastest
    winner: int
    decisive: tuple[int, ...]     # the finalists whose tests decided the winner: those declared before it, and it

    def edge(self) -> list[int]:
        return [i for i in self.decisive if self.tests[i].verdict == "edge"]


def dispersion(times: Sequence[float]) -> float:
    """Interquartile range / 1.349 of one finalist's round times (0 for fewer than two)."""
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4, method="inclusive")
    return (q3 - q1) / IQR_SIGMA


def band(samples: dict[int, Sequence[float]], rule: BandRule) -> Band:
    """The fixed tie band over finalists' round times ({candidate index: times}, every time finite)."""
    stats = {i: (statistics.median(t), dispersion(t)) for i, t in samples.items()}
    fastest = min(stats, key=lambda i: (stats[i][0], i))
    m_f = stats[fastest][0]
    rel = [s / m if m > 0 else 0.0 for m, s in stats.values()]
    pooled = math.sqrt(sum(r * r for r in rel) / len(rel))
    width = min(max(rule.k * math.sqrt(2.0) * pooled, rule.floor), rule.cap)
    limit = m_f * (1 + width)
    return Band(fastest, width, limit, tuple(sorted(i for i, (m, _) in stats.items() if m <= limit)))


def decide(samples: dict[int, dict[int, float]], rule: Rule, final: bool = False) -> Verdict:
    """The tests over finalists' round times ({candidate index: {round: time}}, every time finite) and
    the winner: the earliest declared `tied` finalist before F, else F; `final` (the rounds are spent):
    an `edge` test is a tie where its gap is at most EDGE_TIE x cap (the cap itself).

    Every comparison is paired by round (round r of every finalist ran on the same placement): F is the
    finalist no other beats by its paired gap, and the guarantee (no winner more than `cap` behind F) is
    on those gaps. A median over unpaired rounds is not: where placements time two ways, it follows
    whichever mode holds more rounds, and a 1.2% gap read as 2.7% in one run and 1.4% in the next."""
    medians = {i: statistics.median(t.values()) for i, t in samples.items()}
    fastest = min(medians, key=lambda i: (medians[i], i))
    paired = _paired(samples, fastest)
    seen = {fastest}
    while paired:   # a finalist faster, round for round, than F becomes F (medians over unlike rounds can hide it)
        ahead = min(paired, key=lambda i: (_gap(paired[i]), i))
        if _gap(paired[ahead]) >= 0 or ahead in seen:   # none ahead, or paired gaps in a cycle: F stays
            break
        fastest = ahead
        seen.add(fastest)
        paired = _paired(samples, fastest)
    dof = [(len(d) - 1, dispersion(d)) for d in paired.values() if len(d) > 1]
    # pooled by degrees of freedom: five rounds of a finalist left behind cannot outweigh sixty of one at the
    # edge (an even pool let one such finalist's 2.5% double the se of a 1.2% test and leave it unresolved)
    noise = math.sqrt(sum(k * s * s for k, s in dof) / sum(k for k, _ in dof)) if dof else 0.0
    tests = {}
    for i, d in paired.items():
        gap = _gap(d)
        se = MEDIAN_SE * max(dispersion(d), noise, rule.noise_floor) / math.sqrt(max(len(d), 1))
        verdict = "apart" if gap - rule.z * se > rule.cap else "tied" if gap + rule.z * se <= rule.cap else "edge"
        tests[i] = Test(gap, se, verdict)
    decisive = []
    winner = fastest
    for i in sorted(samples):
        if i == fastest:
            break
        decisive.append(i)
        t = tests[i]
        if t.verdict == "tied" or (final and t.verdict == "edge" and t.gap <= EDGE_TIE * rule.cap):
            winner = i
            break
    return Verdict(fastest, noise, tests, winner, tuple(decisive))


def _paired(samples: dict[int, dict[int, float]], ref: int) -> dict[int, list[float]]:
    """Each other finalist's log time ratios to `ref`'s, over the rounds both ran."""
    base = samples[ref]
    return {i: [math.log(t[r] / base[r]) for r in sorted(t.keys() & base.keys()) if t[r] > 0 and base[r] > 0]
            for i, t in samples.items() if i != ref}


def _gap(logs: list[float]) -> float:
    """The median paired ratio - 1 (infinite with no shared round)."""
    return math.expm1(statistics.median(logs)) if logs else math.inf


def pick(candidates: Sequence[Candidate], retime: Callable[[Candidate, float], float],
         rule: Rule | BandRule = MEASURED, shipped: Shipped | None = None,
         clock: Callable[[], float] = time.perf_counter, default: Config | None = None) -> Selection:
    """The winner among `candidates` (in declared order, each with its screening time).

    `retime(candidate, fraction)` times one candidate on 1/fraction of the kernel's budget. Finalists'
    times become their round medians. With no shipped winner, `default` (the config the kernel runs
    with no tuned one) is a finalist and stays the winner unless beaten by more than DEFAULT_MARGIN:
    a tuned config never ships slower than no bundle (`provenance.selection.default`)."""
    ok = [i for i, c in enumerate(candidates) if math.isfinite(c.time_ms)]
    if not ok:
        errors = "; ".join(f"{c.config}: {c.error or 'failed'}" for c in candidates)
        raise SearchError(f"every candidate failed: {errors}", field="configs")
    held, note = _held(candidates, shipped)
    guard = None if shipped is not None or default is None else next(
        (i for i in ok if candidates[i].config == default), None)
    chosen = finalists(candidates, ok, rule, held if held is not None else guard)
    fraction = max(len(chosen) * rule.rounds / FINALIST_BUDGET, 1.0)
    if len(chosen) == 1:
        samples = {chosen[0]: {0: candidates[chosen[0]].time_ms}}
    else:
        start = clock()
        samples = _rounds(candidates, chosen, retime, range(rule.rounds), fraction, {})
        first_block = clock() - start
    if not samples:
        raise SearchError("every finalist failed when re-timed: " + "; ".join(
            f"{candidates[i].config}: {candidates[i].error}" for i in chosen), field="configs")
    if isinstance(rule, BandRule):
        record, winner, why = _banded(samples, rule, fraction)
    else:
        done = rule.rounds
        deadline = clock() + EDGE_BUDGET * first_block if len(chosen) > 1 else 0.0
        d = decide(samples, rule)
        while len(samples) > 1 and d.edge() and done < rule.max_rounds and clock() <= deadline:
            block = range(done, min(done + rule.rounds, rule.max_rounds))
            _rounds(candidates, sorted({d.fastest, *d.edge()}), retime, block, fraction, samples)
            done = block.stop
            if samples:   # a finalist that fails here drops out; the tests are taken again without it
                d = decide(samples, rule)
        if not samples:
            raise SearchError("every finalist failed when re-timed: " + "; ".join(
                f"{candidates[i].config}: {candidates[i].error}" for i in chosen), field="configs")
        unresolved = d.edge() if len(samples) > 1 else []
        if unresolved:
            d = decide(samples, rule, final=True)
        record, winner, why = _tested(candidates, samples, rule, d, unresolved, fraction)
    for i, times in samples.items():
        candidates[i].time_ms = statistics.median(times.values())
    if held is not None and held not in samples:
        held, note = None, f"the shipped winner {shipped.config} failed when re-timed"
    outcome = None
    if shipped is not None:
        winner, why, record["shipped"], outcome = _against(candidates, winner, why, held, note, shipped.margin,
                                                           paired=_paired_gain(samples, held, winner, rule))
        record["winner"] = winner
    elif guard is not None and guard in samples:
        winner, why, record["default"], _ = _against(candidates, winner, why, guard, None, DEFAULT_MARGIN,
                                                     "default", _paired_gain(samples, guard, winner, rule))
        record["winner"] = winner
    record["why"] = why
    return Selection(candidates[winner], record, outcome)


def _banded(samples, rule: BandRule, fraction: float) -> tuple[dict, int, str]:
    """provenance.selection of a fixed band, the winner and why."""
    times = {i: list(t.values()) for i, t in samples.items()}
    b = band(times, rule)
    record = {"rule": rule.to_json(), "round_fraction": round(fraction, 3),
              "fastest": b.fastest, "band": round(b.width, 6), "band_ms": _ms(b.limit_ms), "winner": b.members[0],
              "finalists": [_finalist(i, times[i]) for i in sorted(times)]}
    if len(times) == 1:
        why = f"the only finalist within {rule.screen_band:.0%} of the fastest screened time"
    elif len(b.members) > 1:
        why = f"the earliest declared of {len(b.members)} finalists within {b.width:.1%} of the fastest (#{b.fastest})"
    else:
        m = {i: statistics.median(t) for i, t in times.items()}
        ahead = min(m[i] for i in m if i != b.fastest) / m[b.fastest] - 1
        why = f"the fastest, {ahead:.1%} ahead of the next finalist (band {b.width:.1%})"
    return record, b.members[0], why


def _tested(candidates, samples, rule: Rule, d: Verdict, unresolved: list[int], fraction: float):
    """provenance.selection of a sequential test, the winner and why."""
    m_f = statistics.median(samples[d.fastest].values())
    confidence = min((d.tests[i].confidence(rule.cap) for i in d.decisive), default=1.0)
    record = {"rule": rule.to_json(), "round_fraction": round(fraction, 3), "fastest": d.fastest,
              "band": rule.cap, "band_ms": _ms(m_f * (1 + rule.cap)), "winner": d.winner,
              "resolved": not unresolved, "confidence": round(confidence, 4), "noise": round(d.noise, 6),
              "finalists": [_finalist(i, list(samples[i].values()), d.tests.get(i)) for i in sorted(samples)]}
    if len(samples) == 1:
        why = f"the only finalist within {rule.screen_band:.0%} of the fastest screened time"
    elif d.winner == d.fastest:
        runner = min((t.gap for i, t in d.tests.items()), default=math.inf)
        why = f"the fastest; no finalist declared before it within {rule.cap:.0%}, the next {runner:.1%} behind"
    else:
        why = f"the earliest declared finalist within {rule.cap:.0%} of the fastest (#{d.fastest}): " \
              f"{d.tests[d.winner].gap:+.2%} +- {d.tests[d.winner].se:.2%}"
    n = max(len(t) for t in samples.values())
    if unresolved:
        why += f"; unresolved after {n} rounds: " + ", ".join(
            f"#{i} {d.tests[i].gap:+.2%} +- {d.tests[i].se:.2%}" for i in unresolved)
    elif n > rule.rounds:
        why += f"; resolved in {n} rounds"
    return record, d.winner, why


def finalists(candidates: Sequence[Candidate], ok: Sequence[int], rule: Rule | BandRule, held: int | None) -> list[int]:
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


def _rounds(candidates, chosen: list[int], retime, rounds: range, fraction: float,
            samples: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
    """Add each finalist's times over `rounds` interleaved rounds to `samples` ({index: {round: time}});
    a finalist that fails drops out."""
    for i in chosen:
        samples.setdefault(i, {})
    for r in rounds:
        for i in chosen[r % len(chosen):] + chosen[:r % len(chosen)]:
            if i not in samples:
                continue
            try:
                t = float(retime(candidates[i], fraction))
            except Exception as e:  # noqa: BLE001 - a candidate failing here fails, as in screening
                t, candidates[i].error = math.inf, f"{type(e).__name__}: {e}"
            if math.isfinite(t):
                samples[i][r] = t
            else:
                del samples[i]
                candidates[i].time_ms = math.inf
    return samples


def _paired_gain(samples: dict, held: int | None, winner: int, rule) -> tuple[float, float] | None:
    """How much slower `held` ran than `winner`, round for round (the median paired ratio - 1), less z
    standard errors of that median: a gain the run's own noise could have made is no gain. None where
    the two share fewer than two rounds, or under a band rule (no noise)."""
    if isinstance(rule, BandRule) or held is None or held == winner or held not in samples or winner not in samples:
        return None
    logs = _paired({held: samples[held], winner: samples[winner]}, winner)[held]
    if len(logs) < 2:
        return None
    se = MEDIAN_SE * max(dispersion(logs), rule.noise_floor) / math.sqrt(len(logs))
    return _gap(logs), rule.z * se


def _against(candidates, winner: int, why: str, held: int | None, note: str | None, margin: float,
             what: str = "shipped", paired: tuple[float, float] | None = None):
    """Hysteresis against the shipped winner (or the kernel's `default`): (winner, why, the record,
    kept | replaced). With `paired` (the paired gain and z standard errors of it, `_paired_gain`), the
    winner replaces the held one only where the gain less its error is over the margin: on a busy
    machine, noise alone does not replace what ships."""
    if held is None:
        return winner, f"{why}; replaced: {note}", {"index": None, "margin": margin, "outcome": "replaced"}, "replaced"
    if held == winner:
        return winner, f"{why}; the {what} winner", {"index": held, "margin": margin, "gain": 0.0,
                                                      "outcome": "kept"}, "kept"
    gain = candidates[held].time_ms / candidates[winner].time_ms - 1
    record = {"index": held, "margin": margin, "gain": round(gain, 6)}
    sure = gain
    if paired is not None:
        gain, error = paired
        sure = gain - error
        record["gain"] = round(gain, 6)   # the paired gain; its error is in `why`
    if sure > margin:
        why = f"{why}; replaced the {what} #{held}: +{gain:.1%} faster, over the {margin:.1%} margin"
        return winner, why, {**record, "outcome": "replaced"}, "replaced"
    within = f"within the {margin:.1%} margin" if gain <= margin else \
        f"not surely over the {margin:.1%} margin (+-{gain - sure:.1%} in this run's noise)"
    why = f"kept the {what} #{held}: this search's winner #{winner} is {gain:+.1%} faster, {within}"
    return held, why, {**record, "outcome": "kept"}, "kept"


def _finalist(i: int, times: Sequence[float], test: Test | None = None) -> dict:
    out = {"index": i, "median_ms": _ms(statistics.median(times)), "dispersion_ms": _ms(dispersion(times)),
           "rounds_ms": [_ms(t) for t in times]}
    if test is not None:
        out.update(gap=_ms(test.gap), gap_se=_ms(test.se), verdict=test.verdict)
    return out


def _ms(t: float) -> float:
    return float(f"{t:.6g}")


# -- the shipped winners a re-tune must beat ---------------------------------------------------------------
def shipped(kernel: str, key: dict) -> Shipped | None:
    """The winner a search of `kernel` at `key` must beat: the current tuning session's
    (`session.opened(shipped=...)`, as `flytune tune` keeps the output's winners); else None."""
    lookup = session.current().shipped
    return None if lookup is None else lookup(kernel, key)
