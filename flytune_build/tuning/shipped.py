"""The winners a tune's output directory already holds (its shipped winners), and what a re-tune did to each.

One term throughout: a *shipped winner* is the config an output (or a bundle) already holds for an
identity; `provenance.selection.shipped` records a search against it. Its margin (a fraction) is the
`--min-improvement` percent a winner must beat it by.

A job searches inside `session.opened(shipped=winners.lookup)`: a search whose kernel and key have an
artifact in the output keeps that artifact's config unless its own winner, timed in the same rounds,
is faster by more than `min_improvement` (`runtime.searching.selection`). Each result is then one of

    new                  no artifact for this identity was there: written
    kept (+1.2%)         the shipped config stays (this search's own winner was 1.2% faster: within the
                         margin); the file is left as it was, byte for byte (re-written only when the
                         toolchain or the config space changed, so its provenance says what it was last
                         measured with)
    replaced (+4.2%)     another config was faster by more than the margin: written
    replaced (synthetic -> measured)
                         the shipped winner was ranked the other way (a synthetic rank against a measured
                         time, or back): rankings never mix, so it is never a finalist and always
                         replaced

The rule runs where the job runs, on every executor alike: the driver reads the output once and sends
each job the shipped winners of its kernel as file name -> bytes (a Ray node shares no disk with the driver);
they are parsed only when a search asks for one.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..core import artifactdir
from ..core.artifact import TOOLS, Artifact
from ..core.config import Config
from ..core.errors import FlytuneError
from ..runtime.searching import bench, selection
from ..runtime import device

MIN_IMPROVEMENT_PCT = 3.0
TOOLCHAIN = (*TOOLS, "space_hash")  # what re-writes a kept artifact's provenance


class ShippedWinners:
    """One kernel's artifacts of one output directory (file name -> bytes), read when a search asks."""

    def __init__(self, files: Mapping[str, bytes], min_improvement_pct: float = MIN_IMPROVEMENT_PCT):
        self.files, self.margin = dict(files), min_improvement_pct / 100.0
        self.found: dict[str, Artifact | None] = {}   # file name -> the artifact there (None: none, unreadable)

    def _read(self, name: str) -> Artifact | None:
        if name not in self.found:
            data = self.files.get(name)
            try:
                self.found[name] = None if data is None else Artifact.from_bytes(data, file=name)
            except FlytuneError:
                self.found[name] = None  # an unreadable file is replaced, as if none were there
        return self.found[name]

    def _find(self, kernel: str, key: dict) -> tuple[str, Artifact] | tuple[None, None]:
        """(file name, artifact) the output holds for `kernel` at `key` on this device. An earlier
        release wrote an adopted kernel's None arguments as no axis at all (`core.verification`'s one
        key-axes rule reads both forms as one identity): that file is the shipped winner too."""
        names = [Artifact(kernel, key, device.current(), Config({})).filename]
        legacy = {k: v for k, v in key.items() if v is not None}
        if legacy != dict(key):
            names.append(Artifact(kernel, legacy, device.current(), Config({})).filename)
        for name in names:
            found = self._read(name)
            if found is not None:
                return name, found
        return None, None

    def lookup(self, kernel: str, key: dict) -> selection.Shipped | None:
        """The winner the output holds for `kernel` at `key` on this device, for the job's tuning session
        (`session.opened(shipped=...)`); none where it was ranked another way than this search ranks (`mixes`)."""
        _, old = self._find(kernel, key)
        if old is None or mixes(ranking_of(old), bench.ranking()):
            return None
        return selection.Shipped(old.config, self.margin)

    def change(self, art: Artifact) -> tuple[str, Artifact | None]:
        """(new | kept | replaced (+gain%), the artifact to write or None) for a search's artifact. A
        shipped winner in an earlier release's key form is replaced in that form, under its own file name,
        so that the directory never holds one identity twice."""
        name, old = self._find(art.kernel, dict(art.key))
        if old is None:
            return "new", art
        if name != art.filename:
            art = Artifact(art.kernel, dict(old.key), art.device, art.config, art.provenance)
        prov = art.provenance or {}
        was, now = ranking_of(old), ranking_of(art)
        if mixes(was, now):
            return f"replaced ({was} -> {now})", art
        gain = ((prov.get("selection") or {}).get("shipped") or {}).get("gain")
        if art.config == old.config:
            was = old.provenance or {}
            rewrite = any(was.get(k) != prov.get(k) for k in TOOLCHAIN)
            return ("kept" if not gain else f"kept ({gain:+.1%})"), art if rewrite else None
        return ("replaced" if gain is None else f"replaced (+{gain:.1%})"), art

    def saved(self, art: Artifact) -> None:
        """`art` is now the output's artifact for its identity (a later search of it compares to it)."""
        self.found[art.filename] = art


def ranking_of(art: Artifact) -> str | None:
    """`provenance.ranking` (measured, synthetic, imported), or None where it records none."""
    value = (art.provenance or {}).get("ranking")
    return value if isinstance(value, str) else None


def mixes(a: str | None, b: str | None) -> bool:
    """Whether two rankings cannot be compared: a synthetic rank against anything else (a measured time,
    an imported one). One whose ranking is not recorded is taken as measured."""
    return (a == "synthetic") != (b == "synthetic")


def read_output(directory: Path) -> dict[str, dict[str, bytes]]:
    """kernel -> {file name: bytes} of every artifact file in an output directory (capped reads; a file
    that cannot be read is left out, as if it were not there: the re-tune replaces it)."""
    out: dict[str, dict[str, bytes]] = {}
    if not Path(directory).is_dir():
        return out
    for path, data in artifactdir.read_all(directory).files:
        out.setdefault(path.name.rsplit("-", 1)[0], {})[path.name] = data
    return out
