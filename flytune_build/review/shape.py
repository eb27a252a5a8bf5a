"""One tuned shape as the report shows it: its candidates, the winner, the finalists and the tie band,
and how it was timed, read from an artifact's provenance (core.artifact, core.choice).

Artifacts from older releases may lack any field (no provenance at all, no candidates, no
measurement or selection): every field here is optional, and a missing one leaves its part of the
page out. Indices in `provenance.selection` that name no candidate are ignored, never trusted, and so
is a number past LIMIT (a JSON integer too large for a float, or 1e308, whose differences overflow
the chart's arithmetic into inf and nan coordinates): it is read as missing.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core import codec
from ..core.artifact import Artifact
from ..core.codec import Fields
from ..core.config import Config
from ..core.errors import ArtifactError, FlytuneError

LIMIT = 1e15  # ms (31,000 years), or a relative band or gain: past it a number is no measurement


@dataclass(frozen=True)
class Candidate:
    index: int
    label: str                 # a config, compactly: BM=64 BN=128 · w4 s3
    time_ms: float | None      # None: failed or never timed
    error: str | None = None
    winner: bool = False
    previous: bool = False     # the winner of the other (older) source, for a changed winner


@dataclass(frozen=True)
class Finalist:
    index: int
    label: str
    median_ms: float
    dispersion_ms: float | None
    rounds_ms: tuple[float, ...]
    winner: bool = False


@dataclass
class Shape:
    artifact: Artifact
    candidates: list[Candidate] = field(default_factory=list)
    finalists: list[Finalist] = field(default_factory=list)
    fastest_ms: float | None = None     # the fastest finalist's median: the band's lower edge
    band_ms: float | None = None        # the band's upper edge
    band: float | None = None           # its width, relative
    why: str | None = None
    facts: list[tuple[str, str]] = field(default_factory=list)   # how it was timed and chosen
    previous: Config | None = None      # the other source's winner, when it differs

    @property
    def unit(self) -> str:
        """What the recorded times are: milliseconds, or a synthetic ranking's pseudo-times (a rank)."""
        return "rank" if synthetic(self.artifact) else "ms"

    @property
    def winner(self) -> Candidate | None:
        return next((c for c in self.candidates if c.winner), None)


def synthetic(art: Artifact) -> bool:
    """Whether `art`'s candidates were ranked synthetically: its numbers are ranks, never times, and a
    ratio of two of them is no speed-up (`provenance.ranking`, or the timer that ranked them)."""
    prov = art.provenance or {}
    m = prov.get("measurement")
    return prov.get("ranking") == "synthetic" or (isinstance(m, Mapping) and m.get("timer") == "synthetic")


# the words of a selection's `why` (runtime.searching.selection) that speak of time, as a synthetic ranking means them
_RANK_WORDS = {"fastest": "best-ranked", "faster": "ranked better", "slower": "ranked worse", "ms": "rank"}
_TIME_WORD = re.compile(r"\b(" + "|".join(_RANK_WORDS) + r")\b")


def as_ranks(why: str) -> str:
    """A selection's `why` under a synthetic ranking, its words of time said as ranks: the gaps it
    names are between ranks, never a speed-up."""
    return "by synthetic rank, not time: " + _TIME_WORD.sub(lambda m: _RANK_WORDS[m.group(1)], why)


def label(config: Config) -> str:
    """A config in one short line: its kwargs, then warps and stages (ctas, maxnreg when set)."""
    kw = " ".join(f"{k}={v}" for k, v in config.kwargs.items())
    opts = f"w{config.num_warps} s{config.num_stages}"
    if config.num_ctas != 1:
        opts += f" c{config.num_ctas}"
    if config.maxnreg is not None:
        opts += f" r{config.maxnreg}"
    return f"{kw} · {opts}" if kw else opts


def slower_pct(time_ms: float | None, fastest: float | None) -> float | None:
    """How much slower than `fastest`, in percent; None where either is unknown or zero, or where the
    ratio overflows (a fastest time that is a subnormal float)."""
    if not time_ms or not fastest:
        return None
    pct = (time_ms / fastest - 1) * 100
    return pct if -LIMIT <= pct <= LIMIT else None


def key_text(key: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(key.items()))


def read(art: Artifact, previous: Config | None = None) -> Shape:
    """The shape an artifact records; `previous` is the config the other source shipped for it."""
    prov = art.provenance or {}
    shape = Shape(art, previous=previous if previous is not None and previous != art.config else None)
    winner_doc = codec.canonical(art.config.to_json())
    prev_doc = codec.canonical(shape.previous.to_json()) if shape.previous is not None else None
    configs: dict[int, str] = {}
    for i, c in enumerate(_list(prov.get("candidates"))):
        if not isinstance(c, Mapping):
            continue
        config = _config(c.get("config"))
        doc = codec.canonical(config.to_json()) if config is not None else None
        t = c.get("time_ms")
        t = float(t) if _finite(t) and t >= 0 else None
        err = c.get("error")
        shape.candidates.append(Candidate(i, label(config) if config is not None else "(unreadable config)", t,
                                          err if isinstance(err, str) else None,
                                          winner=doc == winner_doc, previous=doc is not None and doc == prev_doc))
        configs[i] = shape.candidates[-1].label
    _one_winner(shape)
    ind = prov.get("inductor")
    coordesc = isinstance(ind, Mapping) and ind.get("coordesc") is True
    _selection(shape, prov.get("selection"), configs, coordesc)
    if coordesc and shape.candidates and shape.winner is None:
        shape.facts.append(("coordinate descent", "Inductor's coordinate descent moved the benchmark's winner to "
                                                  "the shipped config, which is not among the timed candidates"))
    _facts(shape, prov, synthetic(art))
    return shape


def _one_winner(shape: Shape) -> None:
    """Mark one candidate at most: a config listed twice is the winner at its first listing."""
    seen = False
    for i, c in enumerate(shape.candidates):
        if c.winner and seen:
            shape.candidates[i] = Candidate(c.index, c.label, c.time_ms, c.error, False, c.previous)
        seen = seen or c.winner


def _selection(shape: Shape, sel: Any, configs: dict[int, str], coordesc: bool = False) -> None:
    if not isinstance(sel, Mapping):
        return
    win = shape.winner.index if shape.winner else sel.get("winner")
    for f in _list(sel.get("finalists")):
        if not isinstance(f, Mapping) or f.get("index") not in configs or not _finite(f.get("median_ms")):
            continue
        rounds = tuple(float(r) for r in _list(f.get("rounds_ms")) if _finite(r))
        disp = f.get("dispersion_ms")
        shape.finalists.append(Finalist(f["index"], configs[f["index"]], float(f["median_ms"]),
                                        float(disp) if _finite(disp) else None, rounds, f["index"] == win))
    if shape.finalists:
        fastest = next((f for f in shape.finalists if f.index == sel.get("fastest")), None)
        shape.fastest_ms = (fastest or min(shape.finalists, key=lambda f: f.median_ms)).median_ms
    band = sel.get("band")
    shape.band = float(band) if _finite(band) and band >= 0 else None
    band_ms = sel.get("band_ms")
    if _finite(band_ms):
        shape.band_ms = float(band_ms)
    elif shape.band is not None and shape.fastest_ms is not None:
        shape.band_ms = shape.fastest_ms * (1 + shape.band)
    if shape.band_ms is not None and (shape.fastest_ms is None or shape.band_ms < shape.fastest_ms):
        shape.band_ms = None  # a band that ends below its own start is not drawn
    why = sel.get("why")
    shape.why = (as_ranks(why) if shape.unit == "rank" else why) if isinstance(why, str) else None
    named = sel.get("winner")
    if shape.winner is not None and isinstance(named, int) and named != shape.winner.index:
        if coordesc:  # an Inductor harvest from before coordinate-descent moves were chosen by the selection
            shape.facts.append(("coordinate descent", f"Inductor's coordinate descent moved the benchmark's "
                                                      f"#{named} to the shipped config"))
        else:
            shape.facts.append(("mismatch", (f"provenance.selection chose #{named}, but the artifact ships "
                                             f"#{shape.winner.index}: its config was changed after tuning")))


def _facts(shape: Shape, prov: Mapping, ranks: bool = False) -> None:
    """How it was timed and chosen; under a synthetic ranking (`ranks`) no number reads as a time or a
    speed-up: the ranking says so, the budget (never spent) and the gains (ratios of ranks) are left out."""
    out = shape.facts
    ind = prov.get("inductor")
    if isinstance(ind, Mapping) and isinstance(ind.get("name"), str):
        out.append(("Inductor kernel", f"{ind['name']} ({ind.get('mode')}"
                    + (", coordinate descent)" if ind.get("coordesc") is True else ")")))
    ranking = prov.get("ranking")
    if ranks:
        out.append(("ranking", "synthetic: a deterministic rank per config, not a time; the winner was not "
                               "measured faster than any other config"))
    elif isinstance(ranking, str):
        out.append(("ranking", ranking))
    checked = _checked(prov.get("outputs"))
    if checked is not None:
        out.append(("outputs", checked))
    m = prov.get("measurement")
    if isinstance(m, Mapping):
        if isinstance(m.get("timer"), str):
            out.append(("timer", m["timer"]))
        if isinstance(m.get("l2_flush"), bool):
            out.append(("L2 flushed", "yes" if m["l2_flush"] else "no"))
        if not ranks and (_finite(m.get("warmup_ms")) or _finite(m.get("rep_ms"))):
            out.append(("budget", f"warm-up {_ms(m.get('warmup_ms'))}, timing {_ms(m.get('rep_ms'))}"))
        if isinstance(m.get("screen_fraction"), int):
            passes = m.get("screen_passes")
            out.append(("screening", f"1/{m['screen_fraction']} of the budget"
                        + (f", {passes} passes" if isinstance(passes, int) else "")))
        if _finite(m.get("estimate_ms")):
            out.append(("first estimate", _ms(m["estimate_ms"])))
        if isinstance(m.get("placements"), int):
            out.append(("placements", str(m["placements"])))
        for name in ("placement_note", "note"):
            if isinstance(m.get(name), str):
                out.append((name.replace("_", " "), m[name]))
    sel = prov.get("selection")
    if isinstance(sel, Mapping):
        if shape.band is not None:
            out.append(("tie band", f"{shape.band * 100:.2f}% of the fastest finalist"))
        rule = sel.get("rule")
        if isinstance(rule, Mapping):
            out.append(("rule", ", ".join(f"{k}={rule[k]}" for k in sorted(rule))))
        shipped = sel.get("shipped")
        if isinstance(shipped, Mapping) and isinstance(shipped.get("outcome"), str):
            gain = shipped.get("gain")
            out.append(("shipped winner", shipped["outcome"] + (" (by synthetic rank)" if ranks else
                        f" (another config {gain * 100:+.1f}%)" if _finite(gain) else "")))
        default = sel.get("default")
        if isinstance(default, Mapping) and isinstance(default.get("outcome"), str):
            gain = default.get("gain")
            out.append(("against the default", ("the default config kept" if default["outcome"] == "kept" else
                                                "the winner replaces the default")
                        + (" (by synthetic rank: no speed-up measured)" if ranks else
                           f" (winner {gain * 100:+.1f}% faster)" if _finite(gain) else "")))
        stab = sel.get("stability")
        if isinstance(stab, Mapping) and isinstance(stab.get("runs"), int):
            out.append(("repeat runs", f"{stab.get('agreed')} of {stab['runs']} agreed"))
    for name in ("created", "host", "worker", "source"):
        if isinstance(prov.get(name), str):
            out.append((name, prov[name]))


def _checked(record: Any) -> str | None:
    """`provenance.outputs` in words: what the candidates were checked against, and the note (why not,
    or which tensors were left out of the comparison)."""
    if not isinstance(record, Mapping):
        return None
    note = record.get("note") if isinstance(record.get("note"), str) else None
    if isinstance(record.get("function"), str) or isinstance(record.get("reference"), Mapping):
        against = (f"the reference function {record['function']}" if isinstance(record.get("function"), str)
                   else "the reference config")
        rejected = record.get("rejected")
        return (f"checked against {against}" + (f"; {rejected} candidate(s) rejected" if isinstance(rejected, int)
                                                else "") + (f"; {note}" if note else ""))
    return note


def _config(doc: Any) -> Config | None:
    try:
        return Config.from_json(doc, Fields(None, ArtifactError))
    except FlytuneError:
        return None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _finite(value: Any) -> bool:
    """A number the page can use: an int or a float within +-LIMIT (never NaN or inf). Compared, not
    converted: float() of a JSON integer of 400 digits raises OverflowError."""
    return type(value) in (int, float) and -LIMIT <= value <= LIMIT


def _ms(value: Any) -> str:
    return f"{value:g} ms" if _finite(value) else "?"
