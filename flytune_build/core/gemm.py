"""Inductor GEMM template choices as flytune artifacts: the key Inductor's lookup table looks a choice up
by, what a table entry holds, and the rules an entry must meet to be served as written.

Under max-autotune Inductor lowers each matmul (`mm`, `addmm`, `bmm`, ...) to a list of choices, one per
template and config (`triton::mm` with block sizes, warps and stages; `aten::mm`; `decompose_k`), and
benchmarks them (`select_algorithm`). Inductor's lookup table (torch 2.10+, `torch._inductor.lookup_table`)
chooses by table instead: one entry for a key means one choice and no benchmark. The key
(`lookup_key`) is the device-agnostic form `LookupTableChoices.make_lookup_key` computes: each input's
dtype, size hints and strides as Python prints the tuple, the scalars (`alpha=1&beta=1`, sorted), and
the op, joined by `+`. A GEMM artifact's key is that text under the one axis of every Inductor artifact
(core.inductor.AXIS), so every reader treats it as an Inductor artifact; the device is the artifact's
own identity, never part of the key.

The config is the table entry: `template_id` (and `template_hash`, the template source's hash, where
Inductor has one) and the template's kwargs in `kwargs`, a Triton template's `num_warps` and
`num_stages` as the config's own options. `problems` names what Inductor would not look up or would
not take: a key of another form, an unknown template, a kwarg the template does not take.

Pure: no torch, no triton.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .config import Config
from .options import DEFAULTS

# the ops whose lowering asks Inductor's choices for templates (torch 2.10 - 2.14: kernel/mm.py, bmm.py,
# mm_plus_mm.py); "mm-ah" is the autoheuristic's extra ask for mm
OPS = ("mm", "addmm", "bmm", "baddbmm", "mm_plus_mm", "int_mm", "scaled_mm", "mm-ah")
# every template Inductor's template heuristics register for those ops (torch 2.10 - 2.14), by uid
TRITON = ("triton::mm", "triton::bmm", "triton::mm_plus_mm", "triton::mm_persistent_tma", "triton::mm_persistent",
          "triton::blackwell_ws_persistent_device_tma", "triton::scaled_mm_device_tma_epilogue_scaling",
          "triton::scaled_mm_device_tma_main_loop_scaling")
ATEN = ("aten::mm", "aten::mm_dtype", "aten::addmm", "aten::bias_addmm", "aten::bmm", "aten::bmm_dtype",
        "aten::baddbmm", "aten::_int_mm", "aten::_scaled_mm", "aten::_mm_plus_mm", "aten::_fp8_mm")
SUBGRAPH = {"decompose_k": ("k_split",), "contiguous_mm": (), "contiguous_addmm": ()}
TEMPLATES = (*TRITON, *ATEN, *SUBGRAPH)
ENTRY_FIELDS = ("template_id", "template_hash")   # a table entry's own fields, beside the template's kwargs
# a Triton GEMM template takes its constexprs (upper case) and these launch and heuristic kwargs
TRITON_KWARGS = ("hint_override", "kpack", "matrix_instr_nonkdim", "waves_per_eu", "num_consumer_groups",
                 "num_buffers_warp_spec", "tma_store", "tma_load_for_template_epilogue",  # persistent TMA's two
                 "transpose_discontiguous_tensor_descriptors_override")
# kwargs Inductor passes a template itself (an entry holding one fails Inductor's lowering: "multiple values")
INDUCTOR_OWN = ("ALLOW_TF32",)
# the accumulator Inductor derives from the inputs' dtype (its `acc_type`): an entry's ACC_TYPE must be it
ACC_TYPES = {"torch.float16": "tl.float32", "torch.bfloat16": "tl.float32", "torch.float32": "tl.float32",
             "torch.float64": "tl.float64"}
_CONSTEXPR = re.compile(r"[A-Z][A-Z0-9_]*")
_POW2 = ("BLOCK_M", "BLOCK_N", "BLOCK_K")
MAX_BLOCK = 1 << 20  # Triton's largest tensor (TRITON_MAX_TENSOR_NUMEL): no block size is larger
MAX_INT = 2**31 - 1  # a template kwarg's whole number: a 32-bit constexpr
# Inductor writes a Triton template's kwargs into the kernel's source (`NAME : tl.constexpr = VALUE`): a
# value is a boolean, a whole number, null, or a constexpr's Triton type, never other text
_TRITON_TYPE = re.compile(r"tl\.[a-z][a-z0-9_]*")
# which input's last size is K, by op (EVEN_K: K a multiple of BLOCK_K, Inductor's own rule)
K_INPUT = {"mm": 0, "int_mm": 0, "bmm": 0, "scaled_mm": 0, "addmm": 1, "baddbmm": 1}
MAX_KEY = 256   # an artifact's key value holds at most this many characters (core.artifact)

_INT = r"[0-9]+"
_LIST = rf"\[(?:{_INT}(?:, {_INT})*)?\]"
_INPUT = rf"\((?P<dtype>torch\.[a-z0-9_]+), {_LIST}, {_LIST}\)"
_ONE = _INPUT.replace("(?P<dtype>", "(?:")
_SCALAR = r"[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.-]+"
KEY = re.compile(rf"(?P<inputs>\((?:{_ONE},|{_ONE}(?:, {_ONE})+)\))(?:\+(?P<scalars>{_SCALAR}(?:&{_SCALAR})*))?"
                 rf"\+(?P<op>[A-Za-z_][A-Za-z0-9_-]*)")
_INPUTS = re.compile(r"\((torch\.[a-z0-9_]+), \[([0-9, ]*)\], \[([0-9, ]*)\]\)")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def lookup_key(inputs: Sequence[tuple[str, Sequence[int], Sequence[int]]], scalars: Mapping[str, Any],
               op: str) -> str:
    """The device-agnostic key Inductor looks a GEMM choice up by: `inputs` as (dtype as torch prints it,
    `torch.bfloat16`; size hints; strides), the op's scalars (`alpha`, `beta`) and the op's name."""
    parts = [f"({dtype}, {[int(s) for s in sizes]!r}, {[int(s) for s in strides]!r})"
             for dtype, sizes, strides in inputs]
    text = f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"  # as Python prints a tuple
    if scalars:
        text += "+" + "&".join(f"{k}={v}" for k, v in sorted(scalars.items()))
    return f"{text}+{op}"


def is_key(value: Any) -> bool:
    """Whether an Inductor artifact's key value is (meant as) a GEMM choice's: its inputs' tuple, `((...`,
    first, or after a device; else it is a generated kernel's lookup hash."""
    return isinstance(value, str) and (value.startswith("((") or "+((" in value)


def op_of(key: str) -> str:
    return key.rpartition("+")[2]


def describe(key: str) -> str:
    """A short name for people: `addmm bfloat16 [3072] [8192, 1024] [1024, 3072]`."""
    m = KEY.fullmatch(key)
    if m is None:
        return key[:80]
    shapes = [f"[{sizes}]" for _, sizes, _ in _INPUTS.findall(m["inputs"])]
    dtypes = sorted({d.removeprefix("torch.") for d, _, _ in _INPUTS.findall(m["inputs"])})
    return f"{m['op']} {'/'.join(dtypes)} {' '.join(shapes)}"


def table_entry(config: Config) -> dict:
    """`config` as one entry of `torch._inductor.config.lookup_table.table[key]`."""
    entry = dict(config.kwargs)
    if str(entry.get("template_id", "")).startswith("triton::"):
        entry.update(num_warps=config.num_warps, num_stages=config.num_stages)
    return entry


def config_of(template_id: str, kwargs: Mapping[str, Any], template_hash: str | None = None) -> Config:
    """The flytune config of one Inductor template choice: its template, the template's kwargs (a Triton
    template's num_warps and num_stages as the config's options)."""
    kw = {k: v for k, v in kwargs.items() if k not in ("num_warps", "num_stages")}
    head = {"template_id": template_id, **({"template_hash": template_hash} if template_hash else {})}
    opts = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs} if template_id.startswith("triton::") \
        else {}
    return Config({**head, **kw}, **opts)


def _value_problem(name: str, value: Any) -> str | None:
    """Why a Triton template's kwarg value is not one Inductor may write into the kernel's source."""
    if name in _POW2:
        ok = type(value) is int and 1 <= value <= MAX_BLOCK and not value & (value - 1)
        return None if ok else f"must be a power of two of at most {MAX_BLOCK}, not {value!r}"
    if value is None or type(value) is bool or (type(value) is int and 0 <= value <= MAX_INT):
        return None
    if isinstance(value, str) and _CONSTEXPR.fullmatch(name) and _TRITON_TYPE.fullmatch(value):
        return None
    return (f"must be true, false, null, a whole number from 0 to {MAX_INT} or a Triton type (`tl.float32`), "
            f"not {value!r}: Inductor writes it into the kernel's source")


def _derived_problems(key_value: Any, own: dict) -> list[tuple[str, str]]:
    """What a Triton template's entry sets that Inductor derives from the call itself, set otherwise: its
    lookup merges an entry over its own first config, so a kwarg the entry leaves out is that config's."""
    out = []
    for name in INDUCTOR_OWN:
        if name in own:
            out.append((f"config.kwargs.{name}", "is passed by Inductor itself (from torch's settings): an entry "
                                                 "holding it fails Inductor's lowering; remove it"))
    even = own.get("EVEN_K")
    if "EVEN_K" in own and type(even) is not bool:
        out.append(("config.kwargs.EVEN_K", f"must be true or false, not {even!r} (Triton reads any number but 0 "
                                            f"as true)"))
    elif even is not False and (k := _k_of(key_value)) is not None and k % own.get("BLOCK_K", 1):
        what = "is true" if even else "is not set (Inductor's lookup then takes its own config's, true where K is)"
        out.append(("config.kwargs.EVEN_K", f"{what}, but the key's K ({k}) is not a multiple of BLOCK_K "
                                            f"({own.get('BLOCK_K')}): the kernel would read past K unmasked; "
                                            f"set it false"))
    acc, dtype = own.get("ACC_TYPE"), _dtype_of(key_value)
    if acc is not None and dtype in ACC_TYPES and acc != ACC_TYPES[dtype]:
        out.append(("config.kwargs.ACC_TYPE", f"is {acc!r}, but Inductor accumulates {dtype} inputs in "
                                              f"{ACC_TYPES[dtype]}"))
    return out


def _dtype_of(key: Any) -> str | None:
    """The dtype of a GEMM key's first input."""
    _, inputs = _inputs_of(key)
    return inputs[0][0] if inputs else None


def _k_of(key: Any) -> int | None:
    """The K of a GEMM key (the last size of the op's first matrix), where its op has one K."""
    op, inputs = _inputs_of(key)
    at = K_INPUT.get(op)
    sizes = inputs[at][1].split(", ") if at is not None and at < len(inputs) and inputs[at][1] else []
    return int(sizes[-1]) if sizes else None


def _inputs_of(key: Any) -> tuple[str | None, list]:
    """(op, [(dtype, sizes, strides)] of its inputs) of a GEMM key; (None, []) where it is none."""
    m = KEY.fullmatch(key) if isinstance(key, str) else None
    return (m["op"], _INPUTS.findall(m["inputs"])) if m else (None, [])


def key_problems(value: Any, field: str) -> list[tuple[str, str]]:
    """(`field`, rule) where `value` is not a key Inductor's lookup would look up."""
    if not isinstance(value, str):
        return [(field, "must be a string")]
    m = KEY.fullmatch(value)
    if m is None:
        at = value.find("+((")
        if at > 0:
            return [(field, f"holds a device ({value[:at]!r}): write the device-agnostic key (from the first "
                            f"'((' on); the device is the artifact's own identity")]
        return [(field, "must be the key Inductor looks a GEMM choice up by, `((torch.bfloat16, [M, K], [K, 1]), "
                        "...)+op` (each input's dtype, size hints and strides, the scalars, the op)")]
    out = []
    for dtype, sizes, strides in _INPUTS.findall(m["inputs"]):
        if sizes.count(",") != strides.count(",") or (sizes == "") != (strides == ""):
            out.append((field, f"an input of {dtype} has {sizes.count(',') + bool(sizes)} size(s) but "
                               f"{strides.count(',') + bool(strides)} stride(s)"))
    if m["scalars"]:
        names = [s.partition("=")[0] for s in m["scalars"].split("&")]
        if names != sorted(names):
            out.append((field, f"lists its scalars {names} unsorted: Inductor sorts them by name"))
    if m["op"] not in OPS:
        out.append((field, f"names op {m['op']!r}, which Inductor does not look up templates for "
                           f"(one of {', '.join(OPS)})"))
    return out


def problems(key_value: Any, config: Config, key_field: str) -> list[tuple[str, str]]:
    """(field, rule) for each thing a GEMM artifact holds that Inductor's lookup would not serve as written
    (`key_field`: where the key's value is, `key.inductor_source`)."""
    out = key_problems(key_value, key_field)
    kw = config.kwargs
    template = kw.get("template_id")
    if template not in TEMPLATES:
        what = "is required" if template is None else f"is {template!r}, not a template Inductor looks up"
        return out + [("config.kwargs.template_id", f"{what} (one of {', '.join(TEMPLATES)})")]
    if "template_hash" in kw and not (isinstance(kw["template_hash"], str) and _SHA256.fullmatch(kw["template_hash"])):
        out.append(("config.kwargs.template_hash", "must be the sha256 hex digest of the template's source"))
    own = {k: v for k, v in kw.items() if k not in ENTRY_FIELDS}
    if template in TRITON:
        for name, value in own.items():
            if not (_CONSTEXPR.fullmatch(name) or name in TRITON_KWARGS):
                out.append((f"config.kwargs.{name}", f"is not a kwarg of {template} (its constexprs, upper case, "
                                                     f"and {', '.join(TRITON_KWARGS)})"))
            elif (why := _value_problem(name, value)) is not None:
                out.append((f"config.kwargs.{name}", why))
        out += _derived_problems(key_value, own) if not out else []
    else:
        takes = SUBGRAPH.get(template, ())
        for name, value in own.items():
            if name not in takes:
                out.append((f"config.kwargs.{name}", f"is not a kwarg of {template} (it takes "
                                                     f"{', '.join(takes) or 'none'})"))
            elif type(value) is not int or not 1 <= value <= MAX_INT:
                out.append((f"config.kwargs.{name}", f"must be a whole number from 1 to {MAX_INT}, not {value!r}"))
            elif name == "k_split" and (k := _k_of(key_value)) is not None and k % value:
                out.append((f"config.kwargs.{name}", f"is {value}, which does not divide the key's K ({k}): "
                                                     f"Inductor splits K only into equal parts"))
        if (config.num_warps, config.num_stages) != (DEFAULTS["num_warps"], DEFAULTS["num_stages"]):
            out.append(("config", f"sets num_warps or num_stages, which {template} (not a Triton template) "
                                  f"does not take"))
    if config.num_ctas != 1 or config.maxnreg is not None:
        out.append(("config", "sets num_ctas or maxnreg, which Inductor's template lookup does not carry"))
    return out
