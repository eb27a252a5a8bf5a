"""Device identity: what a tuned config was measured on, and what the process runs on now.

Pure: detecting the running device is `flytune_build.runtime.device`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .codec import Fields
from .errors import DeviceError

BACKENDS = ("cuda", "hip", "interpreter")
ARCH = re.compile(r"sm_[0-9]{2,3}[a-z]?|gfx[0-9a-f]{3,5}|interpreter")
NAME = re.compile(r"[\x20-\x7e]{1,128}")
INTERPRETER_NAME = "Triton interpreter"


@dataclass(frozen=True, order=True)
class DeviceIdentity:
    backend: str
    arch: str
    name: str
    units: int

    def to_json(self) -> dict:
        return {"backend": self.backend, "arch": self.arch, "name": self.name, "units": self.units}

    @classmethod
    def from_json(cls, value: Any, f: Fields, path: str = "device") -> DeviceIdentity:
        f.table(value, path, ("backend", "arch", "name", "units"))
        p = (lambda n: f"{path}.{n}") if path else (lambda n: n)
        backend = f.string(value["backend"], p("backend"))
        if backend not in BACKENDS:
            f.fail(p("backend"), f"must be one of {', '.join(BACKENDS)}, not {backend!r}")
        arch = f.string(value["arch"], p("arch"), ARCH, "an arch such as sm_90, gfx942 or interpreter")
        if backend_of(arch) != backend:
            f.fail(p("arch"), f"{arch!r} is not a {backend} arch")
        name = f.string(value["name"], p("name"), NAME, "printable ASCII, 1-128 characters")
        units = f.integer(value["units"], p("units"), 0, 100_000)
        return cls(backend, arch, name, units)

    def spec(self) -> str:
        """The FLYTUNE_DEVICE form of this identity."""
        if self == INTERPRETER:
            return "interpreter"
        return f"{self.backend}:{self.arch}:{self.units}:{self.name}"

    def __str__(self):
        return self.spec()


INTERPRETER = DeviceIdentity("interpreter", "interpreter", INTERPRETER_NAME, 0)


def backend_of(arch: str) -> str:
    if arch.startswith("sm_"):
        return "cuda"
    if arch.startswith("gfx"):
        return "hip"
    return "interpreter"


def parse_spec(spec: str, *, source: str = "FLYTUNE_DEVICE") -> DeviceIdentity:
    """Parse `interpreter` or `<backend>:<arch>:<units>:<name>`, e.g. `cuda:sm_90:132:NVIDIA H200`."""
    f = Fields(source, DeviceError)
    given, spec = spec, spec.strip()   # blanks around a spec are no part of it; the error quotes what was given
    if spec == "interpreter":
        return INTERPRETER
    parts = spec.split(":", 3)
    if len(parts) != 4:
        f.fail("", f"must be `interpreter` or `<backend>:<arch>:<units>:<name>` "
                   f"(e.g. `cuda:sm_90:132:NVIDIA H200`), not {given!r}")
    backend, arch, units, name = parts
    if not (units.isascii() and units.isdigit()):  # str.isdigit accepts '١' and '²'; int() then fails or differs
        f.fail("units", f"must be a whole number in ASCII digits, not {units!r}")
    return DeviceIdentity.from_json({"backend": backend, "arch": arch, "name": name, "units": int(units)},
                                    Fields(source, DeviceError), "")
