"""Coverage: for each kernel and each target, how many shapes are tuned, on which devices, and at which
match levels (core.target) a device of that target is served.

A target that pins units and name reaches only `exact`; one that pins units, `exact` or `arch_units`;
an arch alone, any level. Of those, the target's `accept` list is what the runtime serves: the rest
is refused (a device of the target that matches no better falls back to the heuristic or a search).
Targets are the bundle's (manifest or [tool.flytune]); a bare directory's are its artifacts' archs.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..core.artifact import Artifact
from ..core.target import LEVELS, Target


@dataclass(frozen=True)
class Cell:
    shapes: int
    devices: tuple[str, ...]       # "NVIDIA H200 (132 units)", each device the shapes were tuned on


@dataclass(frozen=True)
class Column:
    target: Target
    served: tuple[str, ...]        # levels the runtime serves for a device of this target
    refused: tuple[str, ...]       # levels a device of it may reach that the target does not accept


@dataclass(frozen=True)
class Grid:
    kernels: tuple[str, ...]
    columns: tuple[Column, ...]
    cells: dict                    # (kernel, target label) -> Cell
    outside: dict                  # kernel -> shapes no target covers (the build would refuse them)


def reachable(target: Target) -> tuple[str, ...]:
    """The match levels a device of `target` can reach against an artifact the target covers."""
    return tuple(level for level in LEVELS
                 if level == "exact"
                 or (level == "arch_units" and target.name is None)
                 or (level == "arch" and target.units is None))


def grid(artifacts: list[Artifact], targets: tuple[Target, ...]) -> Grid:
    targets = tuple(targets) or tuple(sorted({Target(a.device.arch) for a in artifacts}, key=lambda t: t.label()))
    kernels = tuple(sorted({a.kernel for a in artifacts}))
    cells, outside = {}, {}
    for k in kernels:
        mine = [a for a in artifacts if a.kernel == k]
        for t in targets:
            covered = [a for a in mine if t.covers(a.device)]
            devices = sorted({f"{a.device.name} ({a.device.units} units)" for a in covered})
            cells[k, t.label()] = Cell(len(covered), tuple(devices))
        rest = [a for a in mine if not any(t.covers(a.device) for t in targets)]
        if rest:
            outside[k] = len(rest)
    columns = tuple(Column(t, tuple(lv for lv in reachable(t) if lv in t.accept),
                           tuple(lv for lv in reachable(t) if lv not in t.accept)) for t in targets)
    return Grid(kernels, columns, cells, outside)

