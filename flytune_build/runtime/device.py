"""The device this process runs on: FLYTUNE_DEVICE, else the interpreter, else torch's device 0.

Detected once per process (torch is imported only here, and only when a GPU must be asked).
"""
from __future__ import annotations

from ..core import settings
from ..core.device import INTERPRETER, DeviceIdentity, parse_spec
from ..core.errors import DeviceError

_current: DeviceIdentity | None = None


def current() -> DeviceIdentity:
    global _current
    if _current is None:
        _current = detect()
    return _current


def reset() -> None:
    """Forget the detected device (tests change FLYTUNE_DEVICE)."""
    global _current
    _current = None


def detect() -> DeviceIdentity:
    s = settings.current()
    if s.device:
        return parse_spec(s.device)
    if s.interpret:
        return INTERPRETER
    import torch

    if not torch.cuda.is_available():
        raise DeviceError("cannot detect the device: no GPU is visible and TRITON_INTERPRET is not set "
                          "(set FLYTUNE_DEVICE, or TRITON_INTERPRET=1)")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if getattr(torch.version, "hip", None):
        arch = props.gcnArchName.split(":")[0]
        return DeviceIdentity("hip", arch, props.name.strip(), props.multi_processor_count)
    major, minor = props.major, props.minor
    return DeviceIdentity("cuda", f"sm_{major}{minor}", props.name.strip(), props.multi_processor_count)
