"""Where each device's artifacts go: the output template and its placeholders.

`{arch}` (sm_90), `{backend}` (cuda) and `{device}` (the whole identity as a file-name-safe slug,
`cuda-sm_90-132-NVIDIA_H200`) expand per device; any other text is kept as written. A fleet whose
workers report several identities runs only when the template gives each identity its own directory.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ..core.device import DeviceIdentity
from ..core.errors import DeviceError

PLACEHOLDERS = ("{arch}", "{backend}", "{device}")


def slug(dev: DeviceIdentity) -> str:
    """The identity as one path component: `interpreter`, `cuda-sm_90-132-NVIDIA_H200`."""
    if dev.backend == "interpreter":
        return "interpreter"
    name = re.sub(r"[^A-Za-z0-9_.+-]+", "_", dev.name).strip("._") or "unnamed"
    return f"{dev.backend}-{dev.arch}-{dev.units}-{name}"


def expand(template: str | Path, dev: DeviceIdentity) -> Path:
    text = str(template)
    for placeholder, value in (("{arch}", dev.arch), ("{backend}", dev.backend), ("{device}", slug(dev))):
        text = text.replace(placeholder, value)
    return Path(text)


def check_separates(template: str | Path, devices: Iterable[DeviceIdentity]) -> dict[DeviceIdentity, Path]:
    """Each device's output directory; a `FlytuneError` when two identities would share one."""
    out: dict[DeviceIdentity, Path] = {}
    for dev in sorted(set(devices)):
        path = expand(template, dev)
        other = next((d for d, p in out.items() if p == path), None)
        if other is not None:
            raise DeviceError(f"workers report different devices ({other.spec()!r} and {dev.spec()!r}) but the "
                               f"output template {str(template)!r} writes both to {path}; put {{device}} "
                               f"(or {{arch}}, where the archs differ) in --output or tool.flytune.tune.output")
        out[dev] = path
    return out

