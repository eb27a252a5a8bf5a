"""Aligned plain-text tables: the build report, `flytune inspect` and the `flytune tune` summary."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from .errors import printable


def render(rows: Iterable[Sequence[object]], *, align: str = "", indent: str = "", gap: str = "  ") -> str:
    """`rows` (the first one usually a header) as lines of aligned columns: column i is right-aligned
    where `align[i]` is ">", left-aligned otherwise; trailing spaces are dropped. Every cell is made
    printable (`errors.printable`): cells often hold data (a shape, a winner read from a state file)."""
    cells = [[printable(str(c)) for c in row] for row in rows]
    if not cells:
        return ""
    widths = [max(len(row[i]) for row in cells if i < len(row)) for i in range(max(map(len, cells)))]
    lines = []
    for row in cells:
        line = gap.join(c.rjust(w) if align[i:i + 1] == ">" else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths)))
        lines.append((indent + line).rstrip())
    return "\n".join(lines)
