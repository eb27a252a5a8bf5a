"""The winners a tune's output directory already holds, and what a re-tune did to each.

`flytune tune` searches inside `selection.keeping(winners.lookup)`: a search whose kernel and key have
an artifact in the output keeps that artifact's config unless its own winner, timed in the same rounds,
is faster by more than `--min-improvement` (`runtime.selection`). Each result is then one of

    new                  no artifact for this identity was there: written
    kept (+1.2%)         the shipped config stays (this search's own winner was 1.2% faster: within the
                         margin); the file is left as it was, byte for byte (re-written only when the
                         toolchain or the config space changed, so its provenance says what it was last
                         measured with)
    replaced (+4.2%)     another config was faster by more than the margin: written
"""
from __future__ import annotations

from pathlib import Path

from ..core.artifact import Artifact
from ..core.config import Config
from ..core.errors import FlytuneError
from ..runtime import device, selection

MIN_IMPROVEMENT_PCT = 3.0
TOOLCHAIN = ("triton", "torch", "cuda", "hip", "space_hash")  # what re-writes a kept artifact's provenance


class OutputWinners:
    """The artifacts of one output directory, read when a search asks for one."""

    def __init__(self, directory: Path, min_improvement_pct: float = MIN_IMPROVEMENT_PCT):
        self.directory, self.margin = Path(directory), min_improvement_pct / 100.0
        self.found: dict[str, Artifact | None] = {}   # file name -> the artifact there (None: none, unreadable)

    def _read(self, name: str) -> Artifact | None:
        if name not in self.found:
            path = self.directory / name
            try:
                self.found[name] = Artifact.load(path) if path.is_file() else None
            except FlytuneError:
                self.found[name] = None  # an unreadable file is replaced, as if none were there
        return self.found[name]

    def lookup(self, kernel: str, key: dict) -> selection.Shipped | None:
        """The winner shipped for `kernel` at `key` on this device, for `selection.keeping`."""
        name = Artifact(kernel, key, device.current(), Config({})).filename
        old = self._read(name)
        return None if old is None else selection.Shipped(old.config, self.margin)

    def change(self, art: Artifact) -> tuple[str, bool]:
        """(new | kept | replaced (+gain%), whether to write `art`) for a search's artifact."""
        old = self._read(art.filename)
        if old is None:
            return "new", True
        prov = art.provenance or {}
        gain = ((prov.get("selection") or {}).get("shipped") or {}).get("gain")
        if art.config == old.config:
            was = old.provenance or {}
            return ("kept" if not gain else f"kept ({gain:+.1%})"), any(was.get(k) != prov.get(k) for k in TOOLCHAIN)
        return ("replaced" if gain is None else f"replaced (+{gain:.1%})"), True

    def saved(self, art: Artifact) -> None:
        """`art` is now the output's artifact for its identity (a later search of it compares to it)."""
        self.found[art.filename] = art
