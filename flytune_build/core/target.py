"""Device targets and match levels.

The same product name can hide different hardware (MIG slices, MI300X/A/308 all gfx942), so a match
is graded: `exact` (arch, units and name), `arch_units` (arch and units), `arch` (arch alone).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .codec import Fields
from .device import ARCH, NAME, DeviceIdentity, backend_of

LEVELS = ("exact", "arch_units", "arch")  # best first
DEFAULT_ACCEPT = ("exact", "arch_units")


def match_level(tuned: DeviceIdentity, running: DeviceIdentity) -> str | None:
    """How well an artifact tuned on `tuned` fits `running`; None when the arch differs."""
    if tuned.backend != running.backend or tuned.arch != running.arch:
        return None
    if tuned.units != running.units:
        return "arch"
    return "exact" if tuned.name == running.name else "arch_units"


@dataclass(frozen=True)
class Target:
    """A device family a bundle is built for; `name`/`units` narrow it, `accept` grades the runtime match."""

    arch: str
    name: str | None = None
    units: int | None = None
    accept: tuple[str, ...] = DEFAULT_ACCEPT

    @property
    def backend(self) -> str:
        return backend_of(self.arch)

    def covers(self, device: DeviceIdentity) -> bool:
        """Whether an artifact tuned on `device` belongs to this target."""
        return (device.arch == self.arch
                and (self.units is None or device.units == self.units)
                and (self.name is None or device.name == self.name))

    def label(self) -> str:
        out = self.arch
        if self.units is not None:
            out += f"/{self.units}"
        if self.name is not None:
            out += f"/{self.name}"
        return out

    def to_json(self) -> dict:
        return {"arch": self.arch, "name": self.name, "units": self.units, "accept": list(self.accept)}

    @classmethod
    def from_json(cls, value: Any, f: Fields, path: str) -> Target:
        """Short form `"sm_90"` or full form `{arch, name?, units?, accept?}`."""
        if isinstance(value, str):
            return cls(f.string(value, path, ARCH, "an arch such as sm_90, gfx942 or interpreter"))
        f.table(value, path, ("arch",), ("name", "units", "accept"))
        arch = f.string(value["arch"], f"{path}.arch", ARCH, "an arch such as sm_90, gfx942 or interpreter")
        name = value.get("name")
        if name is not None:
            f.string(name, f"{path}.name", NAME, "printable ASCII, 1-128 characters")
        units = f.integer(value.get("units"), f"{path}.units", 0, 100_000, nullable=True)
        accept = value.get("accept", list(DEFAULT_ACCEPT))
        levels = f.array(accept, f"{path}.accept", lambda v, p: f.string(v, p))
        for i, level in enumerate(levels):
            if level not in LEVELS:
                f.fail(f"{path}.accept[{i}]", f"must be one of {', '.join(LEVELS)}, not {level!r}")
        if not levels:
            f.fail(f"{path}.accept", "must name at least one match level")
        return cls(arch, name, units, tuple(sorted(set(levels), key=LEVELS.index)))


def parse_targets(values: Any, f: Fields, path: str) -> tuple[Target, ...]:
    targets = tuple(f.array(values, path, lambda v, p: Target.from_json(v, f, p)))
    seen = {}
    for i, t in enumerate(targets):
        if t.label() in seen:
            f.fail(f"{path}[{i}]", f"repeats target {t.label()!r} (first at [{seen[t.label()]}])")
        seen[t.label()] = i
    return targets

