"""Inductor artifacts: the winners of the Triton kernels PyTorch's Inductor generates, as flytune artifacts.

An Inductor artifact is an ordinary artifact whose key has exactly one axis, `inductor_source`: the
hash Inductor itself looks a generated kernel up by in `torch._inductor.config.autotune_lookup_table`
(`lookup_key`, the same text and digest as `triton_heuristics.generate_lookup_hash_from_source_code`:
sha256 of `str(size_hints)` followed by the `@triton.jit` function's source, stripped, with its name
removed). The kernel name is the compile entry's (`mylib.block`), so ownership, packs, coverage,
verify, inspect, diff and merge treat it like any other kernel. That hash covers the generated code
and its size hints, nothing of the device: the device is the artifact's own identity, matched as for
every artifact.

Inductor's lookup keeps a config's block sizes (`*BLOCK` kwargs), `num_warps` and `num_stages`, nothing
else, so an Inductor artifact may hold nothing else (`problems`): what it holds is what the compile gets.

The same axis holds a GEMM template choice's key (core.gemm: `((torch.bfloat16, [M, K], [K, 1]), ...)+mm`,
the key of Inductor's template lookup table), told apart by its form (`is_gemm`); its config is a table
entry (template and its kwargs) and core.gemm's rules apply to it. One compile entry's kernels and GEMM
choices are one flytune kernel.
Pure: no torch, no triton.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

from . import gemm
from .gemm import MAX_BLOCK
from .choice import MAX_INDEX
from .config import Config

AXIS = "inductor_source"
SHA256 = re.compile(r"[0-9a-f]{64}")
BLOCK_NAME = re.compile(r"[XYZR][0-9]*_?BLOCK")   # XBLOCK, YBLOCK, ZBLOCK, RBLOCK, R0_BLOCK, R1_BLOCK
_NAME = re.compile(r"^def [^(]+\(")               # triton_heuristics.triton_name_sub
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "aoti")
PROVENANCE_FIELDS = ("name", "size_hints", "heuristic", "mode", "coordesc",
                     "unshipped",  # a GEMM choice's: the choices no table entry can name (CUTLASS, ...), timed
                     "epilogue")   # a GEMM choice's: the candidate Inductor built with its epilogue fused



def lookup_key(size_hints: Any, source: str) -> str:
    """The key Inductor looks `source` (a `@triton.jit` function's text) up by, for `size_hints` (the
    kernel's size hints as Inductor holds them, or their `str()`)."""
    hints = size_hints if isinstance(size_hints, str) else str(size_hints)
    body = _NAME.sub("(", source.strip(), count=1)
    return hashlib.sha256((hints + body).encode("utf-8")).hexdigest()


def is_inductor(key: Mapping[str, Any]) -> bool:
    """Whether an artifact key is an Inductor kernel's or GEMM choice's."""
    return len(key) == 1 and AXIS in key


def is_gemm(key: Mapping[str, Any]) -> bool:
    """Whether an artifact key is an Inductor GEMM template choice's (core.gemm), not a generated kernel's."""
    return is_inductor(key) and gemm.is_key(key[AXIS])


def table_entry(config: Config) -> dict:
    """`config` as one value of `torch._inductor.config.autotune_lookup_table`."""
    return {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}


def config_of(kwargs: Mapping[str, Any], num_warps: int, num_stages: int) -> Config:
    """The flytune config of an Inductor (triton.Config) choice: its block sizes, warps and stages."""
    return Config({k: v for k, v in kwargs.items() if BLOCK_NAME.fullmatch(k)}, num_warps=num_warps,
                  num_stages=num_stages)


def problems(key: Mapping[str, Any], config: Config) -> list[tuple[str, str]]:
    """(field, rule) for each thing an Inductor artifact holds that Inductor's lookup would not serve as
    written; [] for an artifact that is not an Inductor one."""
    if AXIS not in key:
        return []
    out = []
    if len(key) != 1:
        out.append(("key", f"an Inductor artifact's key has the one axis {AXIS}, not {sorted(key)}"))
    if gemm.is_key(key[AXIS]):  # a GEMM template choice's: core.gemm's rules
        return out + gemm.problems(key[AXIS], config, f"key.{AXIS}")
    if not (isinstance(key[AXIS], str) and SHA256.fullmatch(key[AXIS])):
        out.append((f"key.{AXIS}", "must be the sha256 hex digest Inductor looks the kernel up by"))
    for name, value in config.kwargs.items():
        if not BLOCK_NAME.fullmatch(name):
            out.append((f"config.kwargs.{name}", "is not a block size (XBLOCK, R0_BLOCK, ...): Inductor's "
                        "lookup keeps block sizes, num_warps and num_stages only"))
        elif type(value) is not int or value < 1 or value & (value - 1) or value > MAX_BLOCK:
            out.append((f"config.kwargs.{name}", f"must be a power of two of at most {MAX_BLOCK}, not {value!r}"))
    if config.num_ctas != 1 or config.maxnreg is not None:
        out.append(("config", "sets num_ctas or maxnreg, which Inductor's lookup does not carry"))
    return out


def check_provenance(p: Any, f) -> None:
    """`provenance.inductor`: what Inductor called the kernel and how it was compiled (for people and
    reports; the identity is the key)."""
    f.table(p, "provenance.inductor", (), PROVENANCE_FIELDS)
    for name in ("name", "heuristic", "mode"):
        if p.get(name) is not None:
            f.string(p[name], f"provenance.inductor.{name}", max_len=256)
    if p.get("size_hints") is not None:
        f.string(p["size_hints"], "provenance.inductor.size_hints", max_len=1024)
    if p.get("coordesc") is not None and type(p["coordesc"]) is not bool:
        f.fail("provenance.inductor.coordesc", "must be true or false")
    if p.get("unshipped") is not None:
        def choice(v, path):
            f.table(v, path, ("name", "time_ms"))
            f.string(v["name"], f"{path}.name", max_len=1024)
            f.number(v["time_ms"], f"{path}.time_ms", nullable=True)
        f.array(p["unshipped"], "provenance.inductor.unshipped", choice, max_items=10_000)
    if p.get("epilogue") is not None:  # {winner, unfused}: candidate indices (core.choice.contradicted)
        f.table(p["epilogue"], "provenance.inductor.epilogue", ("winner", "unfused"))
        for name in ("winner", "unfused"):
            f.integer(p["epilogue"][name], f"provenance.inductor.epilogue.{name}", 0, MAX_INDEX)
