"""How Triton specialised a tuned kernel: what `flytune warmup` needs to compile it without the caller's tensors.

An artifact may carry it as `provenance.specialization` (artifacts made before it have none, and are
not warmed). It is recorded when a search picks the winner, from Triton's own binder on the winning
launch, and is data only:

    {"format": 1,
     "kernel": "mylib.kernels:rmsnorm_kernel",      module:qualname of the @triton.jit function
     "signature": {"x": "*fp16", "M": "i32", "BLOCK": "constexpr", ...},   every parameter's Triton type
     "constexprs": {"BLOCK": 1024, "one": 1},       the constexpr values (the config's, ==1 ints, ...);
                                                    a tl.dtype is {"dtype": "fp16"}
     "attrs": {"x": [["tt.divisibility", 16]]},     the attributes Triton derived (16-byte alignment)
     "options": {}}                                 compile options the caller passed beyond the config:
                                                    only names in `options.SPECIALIZATION_OPTIONS`, never
                                                    the config's own (num_warps...), a path or a command line

A path in `constexprs` and `attrs` names a parameter, then `[i]` per level for an element of a tuple
argument. Nothing here is executed: the warm-up imports `kernel` only from the bundle's own package.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import options
from .codec import Fields

FORMAT = 1
FIELDS = ("format", "kernel", "signature", "constexprs", "attrs", "options")
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
IMPORT_PATH = re.compile(f"(?P<module>{_DOTTED}):(?P<qualname>{_DOTTED})")
PATH = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<index>(?:\[[0-9]{1,4}\])*)")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ATTRIBUTE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
TYPE = re.compile(r"[\x21-\x7e][\x20-\x7e]{0,127}")  # Triton's type strings: *fp16, i32, constexpr, tensordesc<...>
MAX_PARAMETERS = 1024


def check(value: Any, f: Fields, path: str = "provenance.specialization",
          config_kwargs: Mapping[str, Any] | None = None, closed: bool = True) -> dict:
    """Raise unless `value` is a specialization of the format above and (`closed`) its options a closed
    set (`options.SPECIALIZATION_OPTIONS`), none of them contradicting `config_kwargs` (the artifact's
    config, where known); returns it. An artifact is read with `closed` False: releases before the closed
    set recorded any scalar launch keyword, and such an artifact's config still serves; what reaches the
    compiler (the warm-up) is checked closed, and the build warns of it (`option_problems`)."""
    f.table(value, path, FIELDS)
    if type(value["format"]) is not int or value["format"] != FORMAT:
        f.fail(f"{path}.format", f"must be {FORMAT} (this flytune reads specialization format {FORMAT}), "
                                 f"not {value['format']!r}")
    f.string(value["kernel"], f"{path}.kernel", IMPORT_PATH, "module:qualname of a @triton.jit function", 300)
    signature = _mapping(value["signature"], f, f"{path}.signature")
    for name, ty in signature.items():
        f.string(name, f"{path}.signature", IDENTIFIER, f"a parameter name (not {name!r})", 128)
        _type(ty, f, f"{path}.signature.{name}", 0)
    for name, v in _mapping(value["constexprs"], f, f"{path}.constexprs").items():
        where = f"{path}.constexprs.{name}"
        _path(name, signature, f, where)
        if isinstance(v, dict):
            f.table(v, where, ("dtype",))
            f.string(v["dtype"], f"{where}.dtype", IDENTIFIER, "a Triton dtype name such as fp16", 32)
        else:
            f.scalar(v, where)
    for name, attrs in _mapping(value["attrs"], f, f"{path}.attrs").items():
        where = f"{path}.attrs.{name}"
        _path(name, signature, f, where)
        f.array(attrs, where, lambda a, p: _attr(a, f, p), max_items=16)
    for name, v in _mapping(value["options"], f, f"{path}.options").items():
        f.string(name, f"{path}.options", IDENTIFIER, f"a compile option name (not {name!r})", 64)
        f.scalar(v, f"{path}.options.{name}")
    for name, problem in option_problems(value, config_kwargs) if closed else ():
        f.fail(f"{path}.options.{name}", problem)
    return value


def option_problems(value: Mapping[str, Any], config_kwargs: Mapping[str, Any] | None = None) -> list[tuple[str, str]]:
    """(option, the rule it breaks) for each option of a structurally checked specialization that may not
    reach the compiler: not in the closed set (`options.specialization_option_problem`), or contradicting
    the config (`config_kwargs`)."""
    out = []
    for name, v in value["options"].items():
        problem = options.specialization_option_problem(name, v)
        if problem is None and name in (config_kwargs or {}) and not _same(v, config_kwargs[name]):
            problem = f"is {v!r}, but the config sets {name} to {config_kwargs[name]!r}: the config decides"
        if problem is not None:
            out.append((name, problem))
    return out


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def split_path(path: str) -> tuple[str, tuple[int, ...]]:
    """"x[1][0]" -> ("x", (1, 0))."""
    m = PATH.fullmatch(path)
    if m is None:
        raise ValueError(f"not a parameter path: {path!r}")
    return m["name"], tuple(int(i) for i in re.findall(r"[0-9]+", m["index"]))


def join_path(name: str, index: tuple[int, ...]) -> str:
    """("x", (1, 0)) -> "x[1][0]"."""
    return name + "".join(f"[{i}]" for i in index)


def _mapping(value: Any, f: Fields, path: str) -> dict:
    value = f.mapping(value, path)
    if len(value) > MAX_PARAMETERS:
        f.fail(path, f"must hold at most {MAX_PARAMETERS} entries")
    return value


def _type(ty: Any, f: Fields, path: str, depth: int) -> None:
    if isinstance(ty, list):  # a tuple argument: one type per element
        if depth >= 8:
            f.fail(path, "nests tuples more than 8 deep")
        f.array(ty, path, lambda t, p: _type(t, f, p, depth + 1), max_items=MAX_PARAMETERS)
    else:
        f.string(ty, path, TYPE, "a Triton type string such as *fp16, i32 or constexpr", 128)


def _path(name: str, signature: dict, f: Fields, where: str) -> None:
    m = PATH.fullmatch(name) if isinstance(name, str) and len(name) <= 160 else None
    if m is None:
        f.fail(where, "must name a parameter, then [i] per tuple level (e.g. x or t[1])")
    if m["name"] not in signature:
        f.fail(where, f"names parameter {m['name']!r}, which the signature does not list")


def _attr(a: Any, f: Fields, path: str) -> None:
    if not (isinstance(a, list) and len(a) == 2):
        f.fail(path, "must be an attribute [name, value]")
    f.string(a[0], f"{path}[0]", ATTRIBUTE, "an attribute name such as tt.divisibility", 64)
    f.scalar(a[1], f"{path}[1]")
