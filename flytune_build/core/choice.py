"""How a tuned winner was timed and chosen: an artifact's optional `provenance.measurement` and
`provenance.selection` (written by `runtime.searching.bench` and `runtime.searching.selection`; artifacts made before them
have neither). Data only; indices name entries of `provenance.candidates`:

    "measurement": {"timer": "cuda-graph",        cuda-graph | cuda-events | cpu-time | user | synthetic
                    "l2_flush": false,            L2 flushed before each timed launch
                    "warmup_ms": 25, "rep_ms": 100,   the full budget of one timing
                    "screen_fraction": 10,        screening used 1/10 of it,
                    "screen_passes": 3,           in 3 interleaved passes (each candidate's least kept)
                    "estimate_ms": 0.0041,        the quick first estimate that chose the timer (GPU)
                    "graph_below_ms": 0.05, "note": "...",
                    "placements": 5,              the inputs' placements the passes and rounds rotated over
                    "placement_note": "..."}      why there was only one (GPU timers)
    "selection":   {"rule": {"test": "sequential", "cap": 0.02, "z": 2.0, "noise_floor": 0.005, "rounds": 5,
                             "max_rounds": 40, "max_finalists": 6, "screen_band": 0.1, "prefer": "declared",
                             "tie": "declared order"},      (a fixed band's: k, floor, cap, rounds, ...)
                    "round_fraction": 4.0,        each round of each finalist used 1/4 of the budget
                    "finalists": [{"index": 3, "median_ms": 0.0041, "dispersion_ms": 1e-05,
                                   "rounds_ms": [...],
                                   "gap": 0.012, "gap_se": 0.002, "verdict": "tied"}, ...],  tied|apart|edge
                    "fastest": 3, "band": 0.02, "band_ms": 0.00418, "winner": 2, "why": "...",
                    "resolved": true,             every test that decided the winner was resolved
                    "confidence": 0.998,          the least chance over those tests that a run decides it alike
                    "noise": 0.011,               the run's pooled relative dispersion of paired rounds
                    "shipped": {"index": 2, "margin": 0.03, "gain": 0.004, "outcome": "kept"},
                    "stability": {"runs": 3, "agreed": 3}}     `flytune tune --repeat`
                   The artifact's config is the candidate `winner` names (`contradicted`: what verify checks).
    "outputs":     {"reference": {"kwargs": {...}, ...},   the config every candidate's outputs were compared with,
                    or "function": "mylib.ref:add",       the plan entry's reference function, where it named one
                    "rtol": null, "atol": null,  the plan entry's tolerances (null: by dtype, runtime.searching.outputs)
                    "rejected": 1}               candidates whose outputs differed (each one's `error` says where)
                   or {"note": "not checked: ..."}
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .codec import FUNCTION, Fields
from .config import Config, check_json
from .errors import ArtifactError, FlytuneError

TIMERS = ("cuda-graph", "cuda-events", "cpu-time", "user", "synthetic")
OUTCOMES = ("kept", "replaced")
VERDICTS = ("tied", "apart", "edge")   # a finalist's test against the fastest
MAX_INDEX = 4095   # provenance.candidates holds at most 4096 entries


def check_measurement(value: Any, f: Fields, path: str = "provenance.measurement") -> dict:
    """Raise unless `value` is a measurement record of the form above; returns it."""
    f.table(value, path, ("timer",), ("l2_flush", "warmup_ms", "rep_ms", "screen_fraction", "screen_passes",
                                      "estimate_ms", "graph_below_ms", "note", "placements", "placement_note"))
    if value["timer"] not in TIMERS:
        f.fail(f"{path}.timer", f"must be one of {', '.join(TIMERS)}, not {value['timer']!r}")
    for name in ("warmup_ms", "rep_ms", "estimate_ms", "graph_below_ms"):
        if name in value:
            f.number(value[name], f"{path}.{name}", nullable=True)
    if "l2_flush" in value:
        f.boolean(value["l2_flush"], f"{path}.l2_flush")
    for name in ("screen_fraction", "screen_passes", "placements"):
        if name in value:
            f.integer(value[name], f"{path}.{name}", minimum=1)
    for name in ("note", "placement_note"):
        if name in value:
            f.string(value[name], f"{path}.{name}", max_len=512)
    return value


def check_selection(value: Any, f: Fields, path: str = "provenance.selection") -> dict:
    """Raise unless `value` is a selection record of the form above; returns it."""
    f.table(value, path, ("winner",), ("rule", "round_fraction", "finalists", "fastest", "band", "band_ms", "why",
                                       "shipped", "default", "stability", "resolved", "confidence", "noise"))
    for name in ("winner", "fastest"):
        if name in value:
            f.integer(value[name], f"{path}.{name}", 0, MAX_INDEX)
    for name in ("round_fraction", "band", "band_ms", "confidence", "noise"):
        if name in value:
            f.number(value[name], f"{path}.{name}")
    if "resolved" in value:
        f.boolean(value["resolved"], f"{path}.resolved")
    if "why" in value:
        f.string(value["why"], f"{path}.why", max_len=512)
    if "rule" in value:
        rule = f.table(value["rule"], f"{path}.rule", (), ("k", "floor", "cap", "rounds", "max_finalists",
                                                           "screen_band", "prefer", "tie", "test", "z",
                                                           "noise_floor", "max_rounds"))
        for name, v in rule.items():
            if name in ("prefer", "tie", "test"):
                f.string(v, f"{path}.rule.{name}", max_len=64)
            else:
                f.number(v, f"{path}.rule.{name}")
    if "finalists" in value:
        f.array(value["finalists"], f"{path}.finalists", lambda v, p: _finalist(v, f, p), max_items=MAX_INDEX + 1)
    for name in ("shipped", "default"):  # default: the guard against the kernel's own default config
        if name in value:
            _shipped(value[name], f, f"{path}.{name}")
    if "stability" in value:
        s = f.table(value["stability"], f"{path}.stability", ("runs", "agreed"))
        f.integer(s["runs"], f"{path}.stability.runs", minimum=1)
        f.integer(s["agreed"], f"{path}.stability.agreed", 0, s["runs"])
    return value


def _finalist(v: Any, f: Fields, path: str) -> None:
    f.table(v, path, ("index", "median_ms"), ("dispersion_ms", "rounds_ms", "gap", "gap_se", "verdict"))
    f.integer(v["index"], f"{path}.index", 0, MAX_INDEX)
    f.number(v["median_ms"], f"{path}.median_ms")
    for name in ("dispersion_ms", "gap", "gap_se"):
        if name in v:
            f.number(v[name], f"{path}.{name}")
    if "verdict" in v and v["verdict"] not in VERDICTS:
        f.fail(f"{path}.verdict", f"must be one of {', '.join(VERDICTS)}, not {v['verdict']!r}")
    if "rounds_ms" in v:
        f.array(v["rounds_ms"], f"{path}.rounds_ms", lambda t, p: f.number(t, p), max_items=64)


def _shipped(v: Any, f: Fields, path: str) -> None:
    f.table(v, path, ("outcome",), ("index", "margin", "gain"))
    if v["outcome"] not in OUTCOMES:
        f.fail(f"{path}.outcome", f"must be one of {', '.join(OUTCOMES)}, not {v['outcome']!r}")
    if "index" in v:
        f.integer(v["index"], f"{path}.index", 0, MAX_INDEX, nullable=True)
    for name in ("margin", "gain"):
        if name in v:
            f.number(v[name], f"{path}.{name}")


def check_outputs(value: Any, f: Fields, path: str = "provenance.outputs") -> dict:
    """Raise unless `value` is an output-check record of the form above; returns it."""
    f.table(value, path, (), ("reference", "function", "rtol", "atol", "rejected", "note"))
    if "reference" in value and "function" in value:
        f.fail(f"{path}.function", "must not be given with `reference`: the outputs were compared with one of them")
    if "reference" in value:
        check_json(value["reference"], f, f"{path}.reference")
    if "function" in value:
        f.string(value["function"], f"{path}.function", FUNCTION, "`module:function`")
    for name in ("rtol", "atol"):
        if name in value:
            f.number(value[name], f"{path}.{name}", nullable=True)
    if "rejected" in value:
        f.integer(value["rejected"], f"{path}.rejected", 0, MAX_INDEX + 1)
    if "note" in value:
        f.string(value["note"], f"{path}.note", max_len=512)
    return value


def contradicted(config: Config, provenance: Any) -> str | None:
    """Why `config` is not the winner its own `provenance` records, as an error's rule (None: it is).

    The winner is `provenance.selection.winner` (an index into `provenance.candidates`) where recorded,
    else, for releases that recorded no selection, one of the candidates. Nothing contradicts a config
    whose provenance records no search (no candidates: written by hand, imported by an earlier release),
    names a maintainer's choice (`by_hand`, which says why), is an import (`ranking: imported`), or is an
    Inductor harvest whose coordinate descent moved the benchmark's winner (`inductor.coordesc`: before
    the selection chose between such moves, the shipped config was none of the candidates). A GEMM choice
    Inductor's scheduler built with its epilogue fused (`inductor.epilogue.winner`) is that candidate."""
    p = provenance if isinstance(provenance, Mapping) else {}
    candidates = p.get("candidates")
    inductor = p.get("inductor")
    if not isinstance(candidates, list) or not candidates or isinstance(p.get("by_hand"), str) \
            or p.get("ranking") == "imported" or (isinstance(inductor, Mapping) and inductor.get("coordesc") is True):
        return None
    f = Fields(None, ArtifactError)
    searched: list[Config | None] = []
    for c in candidates:
        try:
            searched.append(Config.from_json(c.get("config"), f) if isinstance(c, Mapping) else None)
        except FlytuneError:
            searched.append(None)
    chosen = p.get("selection")
    winner = chosen.get("winner") if isinstance(chosen, Mapping) else None
    fused = inductor.get("epilogue") if isinstance(inductor, Mapping) else None
    if isinstance(fused, Mapping) and "winner" in fused:  # Inductor built another GEMM choice, its epilogue fused
        winner = fused["winner"]
    hint = "edited after the search? a config chosen by hand says why in provenance.by_hand"
    if type(winner) is int and 0 <= winner < len(searched) and searched[winner] is not None:
        if searched[winner] == config:
            return None
        return (f"is {config}, but its provenance's selection chose candidate #{winner}, {searched[winner]} "
                f"({hint})")
    if config in searched:
        return None
    return f"is {config}, none of the {len(searched)} candidates its provenance searched ({hint})"
