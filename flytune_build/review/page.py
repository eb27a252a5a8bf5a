"""The report page: one self-contained HTML document from one source, or two to compare.

Self-contained: the style is inline, the charts are inline SVG, there is no script, no image, no
font and no URL, and a Content-Security-Policy of `default-src 'none'` keeps it so even if a string
slipped through. Every string from data goes through `markup.escape`. The page holds no timestamp:
the same sources give the same bytes.

Sections, top to bottom: the sources (kind, counts, violations), the winners that changed (two
sources), coverage (kernels x targets, match levels), devices and toolchain, then each kernel with a
chart per tuned shape. With two sources the charts are the second's (the new one), each changed
shape marked and its previous winner drawn in its chart where the new run timed it.
"""
from __future__ import annotations

import string
from typing import Any

from ..audit.source import Source
from ..core.artifact import Artifact
from ..core.version import VERSION
from . import chart, comparison, coverage, shape, toolchain
from .markup import Markup, element, escape, void

MARK = '<meta name="generator" content="flytune '   # in the head of every page written: what `report` may replace
TEMPLATE = string.Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="flytune $version">
<title>$title</title>
<style>$style</style>
</head>
<body>
$body
</body>
</html>
""")

STYLE = """
:root { --ink: #1d2330; --mute: #5c6475; --line: #d8dce6; --bar: #a9b8e8; --fin: #5b76d6; --win: #e8590c;
        --prev: #8e44ad; --band: rgba(47, 158, 68, .18); --bad: #c92a2a; --ok: #2b8a3e; --bg: #f6f7fb; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
       color: var(--ink); background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 32px 0 8px; border-bottom: 2px solid var(--line);
padding-bottom: 4px; } h3 { font-size: 14px; margin: 0 0 6px; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: 12.5px; }
.sub { color: var(--mute); margin: 0 0 16px; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 10px 14px; background: var(--bg);
        min-width: 280px; }
.ok { color: var(--ok); font-weight: 600; } .bad { color: var(--bad); font-weight: 600; }
.errors li { color: var(--bad); } .warnings li { color: #8a6d00; }
.cell-none { background: #fff0f0; color: var(--bad); } .cell-some { background: #effaf1; }
.level { display: inline-block; border-radius: 3px; padding: 0 5px; margin: 1px 2px 1px 0; font-size: 12px; }
.level.served { background: #d3f9d8; color: #1b5e20; } .level.refused { background: #ffe3e3; color: #862e2e;
text-decoration: line-through; }
nav ul { columns: 3; margin: 4px 0; }
.shape { border: 1px solid var(--line); border-radius: 6px; padding: 12px 14px; margin: 12px 0; }
.shape.changed { border-color: var(--prev); border-width: 2px; }
.badge { display: inline-block; background: var(--prev); color: #fff; border-radius: 3px; padding: 0 6px;
         font-size: 12px; margin-left: 6px; }
dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: 2px 12px; margin: 8px 0; font-size: 13px; }
dl.facts dt { color: var(--mute); } dl.facts dd { margin: 0; }
.note { color: var(--mute); font-style: italic; }
svg.chart { display: block; max-width: 100%; height: auto; font-size: 11px; }
svg .label { font-family: ui-monospace, Menlo, Consolas, monospace; fill: var(--ink); }
svg .label.winner, svg .value.winner { fill: var(--win); font-weight: 700; }
svg .label.previous { fill: var(--prev); font-weight: 700; }
svg .axis, svg .tick { fill: var(--mute); } svg .value { fill: var(--ink); }
svg .bar { fill: var(--bar); } svg .bar.finalist { fill: var(--fin); } svg .bar.winner { fill: var(--win); }
svg .bar.previous { fill: #fff; stroke: var(--prev); stroke-width: 2; stroke-dasharray: 4 2; }
svg .band { fill: var(--band); } svg .failed { fill: var(--bad); } svg .clip { fill: var(--ink); font-weight: 700; }
svg .round { fill: var(--fin); opacity: .75; } svg .round.winner { fill: var(--win); }
svg .median { fill: var(--ink); } svg .median.winner { fill: var(--win); }
svg .whisker { stroke: var(--mute); stroke-width: 1.5; } svg .whisker.winner { stroke: var(--win); }
.legend > span { margin-right: 16px; } .swatch.win { background: var(--win); } .swatch.fin { background: var(--fin); }
.swatch.bar { background: var(--bar); } .swatch.band { background: rgba(47, 158, 68, .35); }
.swatch.prev { border: 2px dashed var(--prev); }
.swatch { display: inline-block; width: 12px; height: 12px; vertical-align: -1px;
margin-right: 4px; border-radius: 2px; }
footer { margin-top: 40px; color: var(--mute); font-size: 12px; }
"""

LEGEND = (("win", "winner"), ("fin", "finalist"), ("bar", "screened"), ("band", "tie band"),
          ("prev", "previous winner"))


def page(sources: list[Source], title: str | None = None) -> str:
    """The whole document for one source, or an old and a new one."""
    new = sources[-1]
    diff = comparison.compare(sources[0], new) if len(sources) == 2 else None
    title = title or "flytune report: " + " → ".join(s.path for s in sources)
    body = [element("h1", title),
            element("p", f"{len({a.kernel for a in new.artifacts})} kernel(s), {len(new.artifacts)} tuned shape(s)"
                    + (f"; compared with {sources[0].path}" if diff else ""), class_="sub"),
            _sources(sources)]
    if diff is not None:
        body.append(_changes(diff))
    body += [_coverage(new), _toolchain(sources), _kernels(new, diff.previous if diff else {})]
    body.append(element("footer", f"flytune {VERSION} · flytune report · one file, no network references"))
    return TEMPLATE.substitute(version=escape(VERSION), title=escape(title), style=STYLE, body=Markup("\n".join(body)))


def _sources(sources: list[Source]) -> Markup:
    cards, notes = [], []
    for role, s in zip(("old", "new") if len(sources) == 2 else ("source",), sources):
        state = element("span", "ok", class_="ok") if s.ok else element("span", f"{len(s.errors)} violation(s)",
                                                                         class_="bad")
        facts = [element("div", element("strong", role), ": ", element("code", s.path), f" ({s.kind})"),
                 element("div", f"{len(s.artifacts)} artifact(s), {len({a.kernel for a in s.artifacts})} kernel(s) · ",
                         state)]
        if s.package:
            facts.append(element("div", "package ", element("code", s.package)))
        if s.manifest is not None:
            facts.append(element("div", "declared Triton: ", element("code", s.manifest.triton or "(any)")))
        cards.append(element("div", *facts, class_="card", data_source=role))
        if s.errors or s.warnings or s.drift or s.mixed:
            errs = [element("li", str(e)) for e in s.errors]
            warns = [element("li", w) for w in s.warnings] + [element("li", f"toolchain drift: {d}") for d in s.drift
                                                              if str(d) not in s.warnings]
            warns += [element("li", f"rankings mixed: {d}") for d in s.mixed if str(d) not in s.warnings]
            notes.append(element("details", element("summary", f"{role} {s.path}: {len(errs)} error(s), "
                                                    f"{len(warns)} warning(s)"),
                                 element("ul", *errs, class_="errors") if errs else None,
                                 element("ul", *warns, class_="warnings") if warns else None,
                                 open=bool(errs)))
    return Markup(element("section", element("h2", "Sources"), element("div", *cards, class_="cards"), *notes,
                          id="sources"))


def _changes(d: comparison.Comparison) -> Markup:
    head = element("p", f"{len(d.changed)} changed winner(s), {len(d.added)} added, {len(d.removed)} removed, "
                        f"{d.unchanged} unchanged.")
    rows = [element("tr", *(element("th", h) for h in ("kernel", "shape", "device", "old winner", "new winner",
                                                        "old winner in the new run", "winners' own times")))]
    for c in d.changed:
        if c.margin is None:
            margin = "not timed in the new run" if c.ranks not in ("new", "both") else "not ranked in the new run"
        elif c.ranks in ("new", "both"):  # a ratio of synthetic ranks: no time, no speed-up
            margin = f"ranked {'behind' if c.margin >= 0 else 'ahead'} (synthetic rank {c.margin * 100:+.1f}%, not a time)"
        else:
            margin = f"{c.margin * 100:.1f}% slower" if c.margin >= 0 else f"{-c.margin * 100:.1f}% faster"
        if c.ranks is not None:
            cross = f"none: the {'runs rank' if c.ranks == 'both' else c.ranks + ' run ranks'} synthetically, not in time"
        else:
            cross = "?" if c.cross_run is None else f"{c.cross_run * 100:+.1f}% (new vs old run)"
        rows.append(element("tr", element("td", element("a", c.kernel, href=f"#shape-{c.address[:16]}")),
                            element("td", element("code", c.key)), element("td", c.device),
                            element("td", element("code", c.old)), element("td", element("code", c.new)),
                            element("td", margin, class_="num"), element("td", cross, class_="num"),
                            data_role="changed"))
    parts = [element("h2", "Winners that changed"), head,
             element("p", "The margin is measured in the new run's own candidates (same process, same "
                          "placements); the winners' own times come from two runs and move with the machine as well.",
                     class_="note")]
    if d.changed:
        parts.append(element("table", *rows, class_="changes"))
    for name, items in (("added", d.added), ("removed", d.removed)):
        if items:
            parts.append(element("details", element("summary", f"{len(items)} shape(s) {name}"),
                                 element("ul", *(element("li", element("code", i)) for i in items))))
    return element("section", *parts, id="changes")


def _coverage(src: Source) -> Markup:
    g = coverage.grid(src.artifacts, src.targets)
    if not g.kernels:
        return element("section", element("h2", "Coverage"), element("p", "no artifacts", class_="note"),
                       id="coverage")
    heads = [element("th", "kernel")]
    for col in g.columns:
        levels = [element("span", lv, class_="level served", title="served") for lv in col.served]
        levels += [element("span", lv, class_="level refused", title="not accepted") for lv in col.refused]
        heads.append(element("th", element("code", col.target.label()), void("br"), *levels))
    if g.outside:
        heads.append(element("th", "no target"))
    rows = [element("tr", *heads)]
    for k in g.kernels:
        cells = [element("th", element("code", k))]
        for col in g.columns:
            c = g.cells[k, col.target.label()]
            cells.append(element("td", f"{c.shapes} shape(s)", *(element("div", d, class_="note") for d in c.devices),
                                 class_="cell-some" if c.shapes else "cell-none"))
        if g.outside:
            cells.append(element("td", f"{g.outside.get(k, 0)} shape(s)", class_="cell-none" if k in g.outside else ""))
        rows.append(element("tr", *cells))
    return element("section", element("h2", "Coverage"),
                   element("p", "Shapes per kernel and target. Under each target, the match levels a device of it can "
                                "reach: green is served from the bundle, struck through is refused (that device falls "
                                "back to the heuristic or a search)."
                                + ("" if src.targets else " A directory declares no targets: the columns are its "
                                   "artifacts' archs, with the default accept list."), class_="note"),
                   element("table", *rows, class_="coverage"), id="coverage")


def _toolchain(sources: list[Source]) -> Markup:
    parts = [element("h2", "Devices and toolchain")]
    for s in sources:
        gs = toolchain.groups(s.artifacts)
        if len(sources) == 2:
            parts.append(element("h3", s.path))
        if not gs:
            parts.append(element("p", "no artifacts", class_="note"))
            continue
        names = [n for i, (n, _) in enumerate(gs[0].fields) if any(g.fields[i][1] != "?" for g in gs)]
        hosts = any(g.hosts for g in gs)
        rows = [element("tr", *(element("th", h) for h in ("device", *names, "artifacts", "kernels", "tuned",
                                                             *(["hosts"] if hosts else []))))]
        for grp in gs:
            when = "?" if grp.created is None else grp.created[0] if grp.created[0] == grp.created[1] \
                else f"{grp.created[0]} to {grp.created[1]}"
            rows.append(element("tr", element("td", element("code", grp.device)),
                                *(element("td", v) for n, v in grp.fields if n in names),
                                element("td", grp.artifacts, class_="num"),
                                element("td", ", ".join(grp.kernels)), element("td", when),
                                element("td", ", ".join(grp.hosts)) if hosts else None))
        parts.append(element("table", *rows, class_="toolchain"))
    return element("section", *parts, id="toolchain")


def _kernels(src: Source, previous: dict) -> Markup:
    kernels = sorted({a.kernel for a in src.artifacts})
    parts = [element("h2", "Kernels"),
             element("p", *(element("span", element("span", class_=f"swatch {cls}"), name) for cls, name in LEGEND),
                     class_="legend")]
    if not kernels:
        parts.append(element("p", "no artifacts to show", class_="note"))
    parts.append(element("nav", element("ul", *(element("li", element("a", k, href=f"#kernel-{i}"))
                                                 for i, k in enumerate(kernels)))))
    for i, k in enumerate(kernels):
        arts = sorted((a for a in src.artifacts if a.kernel == k), key=_order)
        shapes = [_shape(a, previous.get(a.address)) for a in arts]
        parts.append(element("section", element("h2", element("code", k)),
                             element("p", f"{len(arts)} tuned shape(s)", class_="sub"), *shapes,
                             class_="kernel", id=f"kernel-{i}", data_kernel=k))
    return element("section", *parts, id="kernels")


def _shape(art: Artifact, previous) -> Markup:
    s = shape.read(art, previous)
    head = [element("code", shape.key_text(art.key)), " on ", art.device.spec()]
    if s.previous is not None:
        head.append(element("span", "winner changed", class_="badge"))
    facts = [element("dt", "winner"), element("dd", element("code", shape.label(art.config)))]
    if s.previous is not None:
        timed = any(c.previous for c in s.candidates)
        facts += [element("dt", "previous winner"), element("dd", element("code", shape.label(s.previous)),
                                                            None if timed else " (not among this run's candidates)")]
    if s.why:
        facts += [element("dt", "why"), element("dd", s.why)]
    for name, value in s.facts:
        facts += [element("dt", name), element("dd", value)]
    return element("article", element("h3", *head), chart.svg(s), element("dl", *facts, class_="facts"),
                   _table(s), class_="shape" + (" changed" if s.previous is not None else ""),
                   id=f"shape-{art.address[:16]}", data_changed="yes" if s.previous is not None else None)


def _table(s: shape.Shape) -> Markup:
    if not s.candidates:
        return Markup("")
    fastest = min((c.time_ms for c in s.candidates if c.time_ms is not None), default=None)
    ranks = s.unit == "rank"   # a ratio of two ranks is no speed-up: none is shown
    time = "synthetic rank (no time)" if ranks else "time (ms)"
    rows = [element("tr", *(element("th", h) for h in ("#", "config", time, "" if ranks else "vs fastest", "")))]
    for c in s.candidates:
        pct = None if ranks else shape.slower_pct(c.time_ms, fastest)
        rel = "" if pct is None else f"{pct:+.1f}%"
        mark = "winner" if c.winner else "previous winner" if c.previous else (c.error or "")
        rows.append(element("tr", element("td", c.index, class_="num"), element("td", element("code", c.label)),
                            element("td", "failed" if c.time_ms is None else f"{c.time_ms:.6g}", class_="num"),
                            element("td", rel, class_="num"), element("td", mark)))
    return element("details", element("summary", f"{len(s.candidates)} candidates as a table"),
                   element("table", *rows))


def _order(a: Artifact) -> tuple:
    return a.device.spec(), tuple((k, _sortable(v)) for k, v in sorted(a.key.items()))


def _sortable(v: Any) -> tuple:
    return (0, v, "") if type(v) in (int, float) else (1, 0, str(v))
