"""The compiler options a config carries, in one table.

`Config`, the config check of an artifact, the quick check of a candidate and the build's fast
reader's grammar all read their names, ranges and defaults from `OPTIONS`.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .codec import Fields


@dataclass(frozen=True)
class Option:
    name: str
    minimum: int
    maximum: int
    default: int | None
    nullable: bool = False  # null means "the backend decides"

    def accepts(self, value: Any) -> bool:
        """The check without error paths, for the common valid case read thousands of times."""
        if value is None:
            return self.nullable
        return type(value) is int and self.minimum <= value <= self.maximum

    def check(self, value: Any, f: Fields, path: str) -> int | None:
        return f.integer(value, path, self.minimum, self.maximum, nullable=self.nullable)

    def pattern(self) -> str:
        """A regex matching exactly this option's values as canonical JSON writes them."""
        values = integer_pattern(self.minimum, self.maximum)
        return f"null|{values}" if self.nullable else values


OPTIONS = (
    Option("num_warps", 1, 64, 4),
    Option("num_stages", 0, 16, 3),
    Option("num_ctas", 1, 16, 1),
    Option("maxnreg", 1, 1024, None, nullable=True),
)
NAMES = tuple(o.name for o in OPTIONS)
BY_NAME = {o.name: o for o in OPTIONS}
DEFAULTS = {o.name: o.default for o in OPTIONS}


# Compiler options a Triton backend takes as launch keywords, which tuned kernels carry in a config's
# kwargs (`triton.Config({"BLOCK_M": 128, "waves_per_eu": 2})`, vLLM's ROCm JSON files): they bind to
# no kernel parameter, and the backends not named refuse them at launch ("Keyword argument waves_per_eu
# was specified but unrecognised"); the interpreter ignores them. Names and backends: Triton's
# `HIPOptions` / `CUDAOptions`; the values are Triton's to check.
BACKEND_KWARGS = {
    "waves_per_eu": ("hip",),
    "matrix_instr_nonkdim": ("hip",),
    "kpack": ("hip",),
    "schedule_hint": ("hip",),
    "launch_pdl": ("cuda",),
    "enable_fp_fusion": ("cuda", "hip"),
    "launch_cooperative_grid": ("cuda", "hip"),
}


_HINTS = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}(?:,[A-Za-z][A-Za-z0-9_-]{0,63}){0,7}")

# The values each of them takes (Triton's `HIPOptions` / `CUDAOptions` and the AMDGPU backend): a
# value outside them fails at compile time on the device, so an artifact holding one is refused first.
BACKEND_VALUES = {
    "waves_per_eu": ("an integer 0..16 (0: the compiler decides)", lambda v: type(v) is int and 0 <= v <= 16),
    "matrix_instr_nonkdim": ("0, 4, 16 or 32 (0: the compiler decides)", lambda v: type(v) is int and v in (0, 4, 16, 32)),
    "kpack": ("1 or 2", lambda v: type(v) is int and v in (1, 2)),
    # variant names the AMD backend splits on "," and hands to a pass: names, never free text
    "schedule_hint": ("comma-separated hint names (e.g. \"none\", \"attention,memory-bound-attention\")",
                      lambda v: type(v) is str and _HINTS.fullmatch(v) is not None),
    "launch_pdl": ("true or false", lambda v: type(v) is bool),
    "enable_fp_fusion": ("true or false", lambda v: type(v) is bool),
    "launch_cooperative_grid": ("true or false", lambda v: type(v) is bool),
}


# The compile options a recorded specialization (`provenance.specialization.options`) may carry: the
# backend options above (which a config may also set: then the two must agree) and the few code-generation
# switches a caller passes to a launch. A closed set: the config's own options (num_warps, num_stages,
# num_ctas, maxnreg) come from the config alone, and a path or a command line (ptx_options, ir_override,
# extern_libs, arch) or any name not here is refused, so an artifact reaches the compiler only through
# values a launch keyword could take.
_BOOLEAN = ("true or false", lambda v: type(v) is bool)
SPECIALIZATION_OPTIONS = {
    **BACKEND_VALUES,
    "debug": _BOOLEAN,
    "sanitize_overflow": _BOOLEAN,
    "enable_reflect_ftz": _BOOLEAN,
    "allow_flush_denorm": _BOOLEAN,
    "default_dot_input_precision": ("one of tf32, tf32x3, ieee, bf16x3, bf16x6",
                                    lambda v: type(v) is str and v in ("tf32", "tf32x3", "ieee", "bf16x3", "bf16x6")),
}


def specialization_option_problem(name: str, value: Any) -> str | None:
    """The rule that `name: value` in a recorded specialization's options breaks; None when it may be
    handed to the compiler (`SPECIALIZATION_OPTIONS`)."""
    if name in BY_NAME:
        return f"is the config's compiler option {name}: it comes from the config, never from a specialization"
    rule = SPECIALIZATION_OPTIONS.get(name)
    if rule is None:
        return (f"is not a compile option a specialization may record (one of "
                f"{', '.join(sorted(SPECIALIZATION_OPTIONS))})")
    return None if rule[1](value) else f"is {value!r}, but {name} takes {rule[0]}"


def bad_backend_value(name: str, value: Any) -> str | None:
    """What `value` of the backend compiler option `name` must be, when it is not that; else None."""
    rule = BACKEND_VALUES.get(name)
    return None if rule is None or rule[1](value) else rule[0]


def foreign_kwarg(kwargs: Mapping[str, Any], backend: str) -> tuple[str, tuple[str, ...]] | None:
    """The first kwarg that is another backend's compiler option, with the backends that take it; None
    when every kwarg can launch on `backend` (the interpreter: any)."""
    if backend == "interpreter":
        return None
    for name in kwargs:
        backends = BACKEND_KWARGS.get(name)
        if backends is not None and backend not in backends:
            return name, backends
    return None


def backend_problems(kwargs: Mapping[str, Any], backend: str) -> list[tuple[str, str]]:
    """(kwarg name, the rule it breaks) for each backend compiler option among `kwargs` that holds a value
    the option does not take (`BACKEND_VALUES`: `kpack: 4`), then for the first that `backend` refuses at
    launch (`foreign_kwarg`: an MI300X's `waves_per_eu` on an H200); part of `config_problems`."""
    out = []
    for name in sorted(BACKEND_VALUES.keys() & kwargs.keys()):
        must = bad_backend_value(name, kwargs[name])
        if must is not None:
            out.append((name, f"is {kwargs[name]!r}, but Triton's {name} compiler option takes {must}"))
    foreign = foreign_kwarg(kwargs, backend)
    if foreign is not None:
        name, backends = foreign
        out.append((name, f"is a compiler option of Triton's {' and '.join(backends)} backend, which Triton's "
                          f"{backend} backend refuses at launch (a config tuned for another device?)"))
    return out


def device_problems(num_warps: int, backend: str) -> list[tuple[str, str]]:
    """(option, the rule it breaks) for the config's own options on a device of `backend`: a GPU backend
    compiles only a power-of-two `num_warps` (Triton's `CUDAOptions` and `HIPOptions` assert it); the
    interpreter ignores it. A rule of the device, not of the file: an artifact for the interpreter, a
    declared config and a search's record of its candidates (where such a config failed) keep any
    `num_warps` in range, as every release wrote them."""
    if backend != "interpreter" and num_warps & (num_warps - 1):
        return [("num_warps", f"is {num_warps}, but Triton's {backend} backend compiles only a power of two")]
    return []


def config_problems(kwargs: Mapping[str, Any], num_warps: int, backend: str) -> list[tuple[str, str]]:
    """(name, the rule it breaks) for a config's kwargs (`backend_problems`) and its own options
    (`device_problems`) on a device of `backend`: the one check every reader of a device's config applies,
    the build and `verify` (core.verification) and every importer (vLLM, SGLang, FlyDSL) alike. No kwarg
    shares an option's name (`Config` refuses it), so a name says which it is."""
    return backend_problems(kwargs, backend) + device_problems(num_warps, backend)


def check(values: Mapping[str, Any], f: Fields, path: str = "") -> tuple:
    """Every option's value (its default when absent), checked, in table order."""
    out = []
    for o in OPTIONS:  # every artifact read checks its config: the valid case builds no error path
        value = values.get(o.name, o.default)
        if not o.accepts(value):
            o.check(value, f, f"{path}.{o.name}" if path else o.name)
        out.append(value)
    return tuple(out)


def integer_pattern(lo: int, hi: int) -> str:
    """A regex alternation matching exactly the decimal integers lo..hi, without leading zeros."""
    if not 0 <= lo <= hi:
        raise ValueError(f"need 0 <= lo <= hi, not {lo}..{hi}")
    parts = []
    while lo <= hi:  # one run per number of digits
        top = min(hi, 10 ** len(str(lo)) - 1)
        parts += _same_length(str(lo), str(top))
        lo = top + 1
    return "|".join(parts)


def _same_length(lo: str, hi: str) -> list[str]:
    """Alternatives matching lo..hi, two numerals of the same length."""
    if lo == hi:
        return [lo]
    if lo[0] == hi[0]:
        return [lo[0] + p for p in _same_length(lo[1:], hi[1:])]
    rest = len(lo) - 1
    tail = f"[0-9]{{{rest}}}" if rest > 1 else "[0-9]" * rest
    out = []
    first, last = int(lo[0]), int(hi[0])
    if lo[1:] != "0" * rest:  # a partial run below the first full leading digit
        out += _same_length(lo, lo[0] + "9" * rest)
        first += 1
    partial_top = hi[1:] != "9" * rest
    if partial_top:
        last -= 1
    if first <= last:
        out.append((str(first) if first == last else f"[{first}-{last}]") + tail)
    if partial_top:
        out += _same_length(hi[0] + "0" * rest, hi)
    return out
