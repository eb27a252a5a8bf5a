"""A shape's candidates as an inline SVG chart: a bar per config (time per config, declared order),
the winner highlighted, the tie band shaded; below it, where the selection was recorded, the
finalists' rounds on a zoomed axis, where a band of 1-3% is visible at all. A synthetic ranking's
numbers are ranks: the axes say so, and no bar carries a percentage (a ratio of ranks is no speed-up).

Hand-drawn rather than matplotlib's SVG backend: matplotlib with its dependencies is 172 MB installed
and takes ~500 ms to import and draw one chart (`python -c "import matplotlib; matplotlib.use('svg');
..."`, three runs, this machine), and it writes each glyph as a path (17 KB for a 20-bar chart).
The bars below are a few dozen lines, text stays text, and the report needs no dependency. Inline
SVG in HTML needs no namespace attribute, so the page holds no URL at all.
"""
from __future__ import annotations

import math

from .markup import Markup, element, number, void
from .shape import Shape, slower_pct

WIDTH = 900
LABEL_W = 300           # config labels, left of the bars
VALUE_W = 170           # each bar's time, right of it
ROW_H = 17
TOP = 22
CLIP = 4.0              # bars past 4x the fastest are clipped at the edge (their value still printed)
MAX_BARS = 48           # more candidates than this: the fastest and the winner's neighbours are drawn
LABEL_CHARS = 44        # what fits in LABEL_W at the labels' 11px monospace; longer ones are cut (full in the tooltip)


def svg(shape: Shape) -> Markup:
    """The chart of one shape, or a short note when it recorded no timed candidate."""
    timed = [c for c in shape.candidates if c.time_ms is not None]
    if not shape.candidates:
        return element("p", "no candidates recorded (provenance.candidates is absent or empty): only the winner "
                       "is known", class_="note")
    shown, hidden = _shown(shape)
    bars_w = WIDTH - LABEL_W - VALUE_W
    fastest = min((c.time_ms for c in timed), default=None)
    top = max((c.time_ms for c in timed), default=1.0) or 1.0
    scale_max = min(top, fastest * CLIP) if fastest else top
    x = (lambda t: LABEL_W + bars_w * min(t / scale_max, 1.0)) if scale_max > 0 else (lambda t: LABEL_W)
    ranks = shape.unit == "rank"
    axis = "synthetic rank per config, not a time" if ranks else "time per config, ms"
    parts = [element("text", f"{axis} (provenance.candidates; declared order)", x=LABEL_W, y=14, class_="axis")]
    height = TOP + ROW_H * len(shown)
    if shape.fastest_ms is not None and shape.band_ms is not None:
        x0, x1 = x(shape.fastest_ms), max(x(shape.band_ms), x(shape.fastest_ms) + 1.5)
        parts.append(_rect(x0, TOP - 2, x1 - x0, height - TOP + 2, "band",
                           title=f"tie band: {shape.fastest_ms:.6g} to {shape.band_ms:.6g} {shape.unit}"))
    for row, c in enumerate(shown):
        y = TOP + row * ROW_H
        role = "winner" if c.winner else ("previous" if c.previous else None)
        mark = " ★ winner" if c.winner else (" ◆ previous" if c.previous else "")
        parts.append(_label(f"#{c.index} {c.label}", y, "label" + (" winner" if c.winner else "")
                            + (" previous" if c.previous else "")))
        if c.time_ms is None:
            parts.append(element("text", element("title", c.error or "no time recorded"),
                                 "failed" if c.error else "not timed",
                                 x=LABEL_W + 4, y=number(y + 12), class_="failed"))
            continue
        cls = "bar" + (" winner" if c.winner else "") + (" previous" if c.previous else "") \
            + (" finalist" if any(f.index == c.index for f in shape.finalists) else "")
        w = x(c.time_ms) - LABEL_W
        parts.append(_rect(LABEL_W, y + 2, max(w, 1.0), ROW_H - 4, cls, role=role,
                           title=f"#{c.index} {c.label}: {c.time_ms:.6g} {shape.unit}"))
        if c.time_ms > scale_max:
            parts.append(element("text", "›", x=number(WIDTH - VALUE_W - 8), y=number(y + 12), class_="clip"))
        pct = None if ranks else slower_pct(c.time_ms, fastest)
        rel = f" +{pct:.1f}%" if pct is not None and c.time_ms > fastest else ""
        value = f"rank {c.time_ms:.4g}" if ranks else f"{c.time_ms:.4g}"
        parts.append(element("text", f"{value}{rel}{mark}", x=number(WIDTH - VALUE_W + 4),
                             y=number(y + 12), class_="value" + (" winner" if c.winner else "")))
    if hidden:
        parts.append(element("text", f"{hidden} slower candidate(s) not drawn (see the table)", x=LABEL_W,
                             y=number(height + 12), class_="axis"))
        height += ROW_H
    body, extra = _finalists(shape, height + 8)
    parts += body
    height += 8 + extra
    return element("svg", element("title", f"{len(shape.candidates)} candidates"), *parts,
                   viewBox=f"0 0 {WIDTH} {number(height + 4)}",
                   width=WIDTH, height=number(height + 4), class_="chart", role="img")


def _finalists(shape: Shape, top: float) -> tuple[list[Markup], float]:
    """The finalists' rounds (dots), medians (ticks) and dispersion (whiskers) against the band."""
    fins = shape.finalists
    if not fins:
        return [], 0.0
    values = [v for f in fins for v in (f.median_ms, *f.rounds_ms)]
    values += [v for v in (shape.fastest_ms, shape.band_ms) if v is not None]
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.01 or 1e-9
    lo, hi = lo - pad, hi + pad
    bars_w = WIDTH - LABEL_W - VALUE_W

    def x(t):
        return LABEL_W + bars_w * (t - lo) / (hi - lo)

    y0 = top + 16
    height = 16 + ROW_H * len(fins) + 18
    what = "finalists' synthetic ranks, not times" if shape.unit == "rank" else "finalists' rounds, ms"
    parts = [element("text", f"{what} (zoomed: {lo:.4g} to {hi:.4g})", x=LABEL_W, y=number(top + 10),
                     class_="axis")]
    if shape.fastest_ms is not None and shape.band_ms is not None:
        x0, x1 = x(shape.fastest_ms), x(shape.band_ms)
        parts.append(_rect(x0, y0 - 2, max(x1 - x0, 1.5), ROW_H * len(fins) + 2, "band",
                           title=f"tie band {((shape.band or 0) * 100):.2f}%: a finalist whose median lies here ties "
                                 f"with the {'best-ranked' if shape.unit == 'rank' else 'fastest'}; the earliest "
                                 f"declared of them wins"))
    for row, f in enumerate(fins):
        y = y0 + row * ROW_H
        mid = y + ROW_H / 2
        cls = " winner" if f.winner else ""
        parts.append(_label(f"#{f.index} {f.label}", y, "label" + cls))
        if f.dispersion_ms:
            parts.append(void("line", x1=number(x(f.median_ms - f.dispersion_ms)), y1=number(mid),
                              x2=number(x(f.median_ms + f.dispersion_ms)), y2=number(mid), class_="whisker" + cls))
        for r in f.rounds_ms:
            parts.append(void("circle", cx=number(x(r)), cy=number(mid), r=2.5, class_="round" + cls))
        parts.append(_rect(x(f.median_ms) - 1, y + 2, 2, ROW_H - 4, "median" + cls,
                           role="winner" if f.winner else None,
                           title=f"#{f.index}: median {f.median_ms:.6g} {shape.unit}"
                                 + (f", dispersion {f.dispersion_ms:.3g} {shape.unit}" if f.dispersion_ms is not None else "")))
        parts.append(element("text", f"{f.median_ms:.4g}" + (" ★" if f.winner else ""), x=number(WIDTH - VALUE_W + 4),
                             y=number(y + 12), class_="value" + cls))
    axis_y = y0 + ROW_H * len(fins) + 12
    for t in _ticks(lo, hi):
        parts.append(element("text", f"{t:.4g}", x=number(x(t)), y=number(axis_y), class_="tick", text_anchor="middle"))
    return parts, height


def _shown(shape: Shape):
    """The candidates to draw, in declared order: all of them, or the MAX_BARS fastest plus the winner."""
    cands = shape.candidates
    if len(cands) <= MAX_BARS:
        return cands, 0
    keep = sorted((c for c in cands if c.time_ms is not None), key=lambda c: c.time_ms)[:MAX_BARS]
    ids = {c.index for c in keep} | {c.index for c in cands if c.winner or c.previous}
    shown = [c for c in cands if c.index in ids]
    return shown, len(cands) - len(shown)


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    step = (hi - lo) / n
    if step <= 0 or not math.isfinite(step):
        return []
    mag = 10 ** math.floor(math.log10(step))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= step)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(n + 1) if first + i * step <= hi]


def _label(text: str, y: float, cls: str) -> Markup:
    short = text if len(text) <= LABEL_CHARS else text[:LABEL_CHARS - 1] + "…"
    return element("text", element("title", text) if short != text else None, short, x=LABEL_W - 6,
                   y=number(y + 12), class_=cls, text_anchor="end")


def _rect(x: float, y: float, w: float, h: float, cls: str, *, role: str | None = None, title: str | None = None):
    return element("rect", element("title", title) if title else None, x=number(x), y=number(y), width=number(w),
                   height=number(h), class_=cls, data_role=role)
