"""Existing tuned-config corpora as flytune artifacts: vLLM's and SGLang's fused-MoE config files.

Both tools write one JSON file per (E, N, device, dtype, block shape), named as their loaders look
it up (vLLM `vllm/model_executor/layers/fused_moe/fused_moe.py: get_config_file_name`; SGLang
`python/sglang/srt/layers/moe/fused_moe_triton/fused_moe_triton_config.py`, which keeps them under
`configs/triton_<major>_<minor>_<patch>/`):

    E=<experts>,N=<intermediate size>,device_name=<device name, spaces as _>[,dtype=<d>][,block_shape=[n,k]].json

vLLM writes `block_shape=[128,128]` and may add a top-level `"triton_version"`; SGLang writes
`block_shape=[128, 128]`, may add `,per_channel_quant=True`, and suffixes the down projection's
configs with `_down`. Each file maps a batch size M (a string key) to the config the kernel is
launched with, e.g. `{"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8,
"num_warps": 4, "num_stages": 4}`.

One artifact per (file, M). Key axes, the same for every artifact of a format (a kernel's artifacts
must share them): `E`, `N`, `M` (integers), `dtype` (the file's dtype field, or null),
`block_shape` (`"[n,k]"`, or null); SGLang adds `per_channel_quant` and `down` (booleans). The
device comes from `device_name` through KNOWN_DEVICES, or from `--device`. `num_warps` and
`num_stages` become compiler options (absent: Triton's default for the device's backend, as the tools
launch it); ROCm's `waves_per_eu`, `matrix_instr_nonkdim` and `kpack` are dropped when they hold
Triton's default and otherwise kept among the kwargs, where Triton's HIP backend takes them at launch
(`core.options.BACKEND_KWARGS`; refused for a device of another backend); every other entry is a
constexpr kwarg.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..core import codec, fsutil
from ..core import options as compiler_options
from ..core.artifact import Artifact, read_capped
from ..core.codec import Fields
from ..core.config import Config
from ..core.device import DeviceIdentity
from ..core.errors import ArtifactError, InputError

FORMATS = ("vllm", "sglang")

# device_name as the tools spell it (torch.cuda.get_device_name(), spaces as _) -> the identity the
# runtime detects: the driver's product name and its SM / CU count (vendor specifications).
KNOWN_DEVICES = {
    "NVIDIA_H200": DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132),  # vLLM files every H200 under this
    "NVIDIA_H100_80GB_HBM3": DeviceIdentity("cuda", "sm_90", "NVIDIA H100 80GB HBM3", 132),
    "NVIDIA_H100_PCIe": DeviceIdentity("cuda", "sm_90", "NVIDIA H100 PCIe", 114),
    "NVIDIA_H100_NVL": DeviceIdentity("cuda", "sm_90", "NVIDIA H100 NVL", 132),
    "NVIDIA_H800": DeviceIdentity("cuda", "sm_90", "NVIDIA H800", 132),
    "NVIDIA_H20": DeviceIdentity("cuda", "sm_90", "NVIDIA H20", 78),
    "NVIDIA_H20-3e": DeviceIdentity("cuda", "sm_90", "NVIDIA H20-3e", 78),
    "NVIDIA_B200": DeviceIdentity("cuda", "sm_100", "NVIDIA B200", 148),
    "NVIDIA_A100-SXM4-80GB": DeviceIdentity("cuda", "sm_80", "NVIDIA A100-SXM4-80GB", 108),
    "NVIDIA_A100-SXM4-40GB": DeviceIdentity("cuda", "sm_80", "NVIDIA A100-SXM4-40GB", 108),
    "NVIDIA_A100-PCIE-40GB": DeviceIdentity("cuda", "sm_80", "NVIDIA A100-PCIE-40GB", 108),
    "NVIDIA_A100_80GB_PCIe": DeviceIdentity("cuda", "sm_80", "NVIDIA A100 80GB PCIe", 108),
    "NVIDIA_A800-SXM4-80GB": DeviceIdentity("cuda", "sm_80", "NVIDIA A800-SXM4-80GB", 108),
    "NVIDIA_L40S": DeviceIdentity("cuda", "sm_89", "NVIDIA L40S", 142),
    "NVIDIA_L40": DeviceIdentity("cuda", "sm_89", "NVIDIA L40", 142),
    "NVIDIA_L4": DeviceIdentity("cuda", "sm_89", "NVIDIA L4", 58),
    "NVIDIA_GeForce_RTX_4090": DeviceIdentity("cuda", "sm_89", "NVIDIA GeForce RTX 4090", 128),
    "AMD_Instinct_MI300X": DeviceIdentity("hip", "gfx942", "AMD Instinct MI300X", 304),
    "AMD_Instinct_MI300A": DeviceIdentity("hip", "gfx942", "AMD Instinct MI300A", 228),
    "AMD_Instinct_MI325X": DeviceIdentity("hip", "gfx942", "AMD Instinct MI325X", 304),
    "AMD_Instinct_MI308X": DeviceIdentity("hip", "gfx942", "AMD Instinct MI308X", 80),
    "AMD_Instinct_MI350X": DeviceIdentity("hip", "gfx950", "AMD Instinct MI350X", 256),
    "AMD_Instinct_MI355X": DeviceIdentity("hip", "gfx950", "AMD Instinct MI355X", 256),
}
ROCM_OPTIONS = {"waves_per_eu": 0, "matrix_instr_nonkdim": 0, "kpack": 1}  # Triton's HIP defaults
DEFAULT_STAGES = {"cuda": 3, "hip": 2, "interpreter": 3}                  # Triton's, per backend
OPTIONS = {"num_warps": (1, 64), "num_stages": (0, 16), "num_ctas": (1, 16), "maxnreg": (1, 1024)}
FIELD = re.compile(r"(?P<name>[A-Za-z_]+)=(?P<value>\[[^\]]*\]|[^,]*)")
BLOCK_SHAPE = re.compile(r"\[\s*([0-9]+)\s*,\s*([0-9]+)\s*\]")
TRITON_DIR = re.compile(r"triton_([0-9]+)_([0-9]+)_([0-9]+)")
NAME_FIELDS = {"vllm": ("E", "N", "device_name", "dtype", "block_shape"),
               "sglang": ("E", "N", "device_name", "dtype", "block_shape", "per_channel_quant")}


def import_files(paths, fmt: str, kernel: str, device: DeviceIdentity | None = None) -> list[Artifact]:
    """Every (file, M) entry as an artifact; all or nothing: the first bad file or entry raises,
    naming it. Two entries of one identity with different configs are refused."""
    seen: dict[str, tuple[Artifact, Path, str]] = {}
    out = []
    for path in map(Path, paths):
        for m, art in read_file(path, fmt, kernel, device):
            if art.address in seen:
                other, other_path, other_m = seen[art.address]
                if other.config != art.config:
                    raise ArtifactError(f"conflicts with {other_path} entry {other_m} (same kernel, key and device, "
                                        f"another config): import one Triton version's configs at a time",
                                        file=path, field=m)
                continue
            seen[art.address] = (art, path, m)
            out.append(art)
    return out


def read_file(path: Path, fmt: str, kernel: str, device: DeviceIdentity | None = None) -> list[tuple[str, Artifact]]:
    """(M as written, artifact) for each entry of one config file."""
    f = Fields(path, ArtifactError)
    key = parse_name(path, fmt)
    name = key.pop("device_name")
    if device is None:
        device = KNOWN_DEVICES.get(name)
        if device is None:
            f.fail("<file name>", f"names device_name={name}, which is not a known product: pass "
                                  f"--device <backend>:<arch>:<units>:<name> (e.g. cuda:sm_90:132:NVIDIA H200)")
    doc = f.mapping(codec.loads(read_capped(path, ArtifactError), file=path, error=ArtifactError), "")
    provenance = {"ranking": "imported"}
    triton = doc.get("triton_version") or triton_of_directory(path)
    if triton is not None:
        provenance["triton"] = f.string(triton, "triton_version", max_len=128)
    entries = []
    for m, body in doc.items():
        if m == "triton_version":
            continue
        if not re.fullmatch(r"[0-9]{1,12}", m):
            f.fail(m, "must be a batch size M (a decimal integer), as every key of a fused-MoE config file")
        config = config_of(f.mapping(body, m), f, m, device.backend)
        origin = f"{fmt}:{path.name}#{m}"[:1024]  # the file's name and the entry: where the config came from
        entries.append((int(m), m, Artifact(kernel, {**key, "M": int(m)}, device, config,
                                            {**provenance, "source": origin})))
    if not entries:
        f.fail("", "holds no batch size: nothing to import")
    return [(m, art) for _, m, art in sorted(entries, key=lambda e: e[0])]


def parse_name(path: Path, fmt: str) -> dict:
    """The key fields (and device_name) of a config file's name; anything else in it is refused."""
    f = Fields(path, ArtifactError)
    if codec.lone_surrogate(path.name) is not None:  # bytes no UTF-8 decodes: nothing of it can become data
        f.fail("<file name>", "is not valid UTF-8 (it holds a byte no text encodes): rename the file")
    shape = f"E=..,N=..,device_name=..[,{'=..][,'.join(NAME_FIELDS[fmt][3:])}=..]"
    shape += "[_down].json" if fmt == "sglang" else ".json"
    if not path.name.endswith(".json"):
        f.fail("<file name>", f"must read {shape}, as {fmt} names its fused-MoE configs")
    stem = path.name[:-len(".json")]
    down = stem.endswith("_down")
    if down and fmt != "sglang":
        f.fail("<file name>", "ends in _down, as SGLang names a down projection's configs: import it with "
                              "--format sglang")
    stem = stem[:-len("_down")] if down else stem
    fields, pos = {}, 0
    while pos <= len(stem):
        match = FIELD.match(stem, pos)
        if (match is None or match["name"] in fields or match["name"] not in NAME_FIELDS[fmt] or not match["value"]
                or stem[match.end():match.end() + 1] not in ("", ",")):
            part = stem[pos:].split(",")[0] or "(nothing)"
            f.fail("<file name>", f"must read {shape}, as {fmt} names its fused-MoE configs; "
                                  f"{part!r} is unknown, repeated, empty or malformed")
        fields[match["name"]] = match["value"]
        pos = match.end() + 1
    for required in ("E", "N", "device_name"):
        if required not in fields:
            f.fail("<file name>", f"has no {required}= field (must read {shape})")
    for axis in ("E", "N"):
        if not re.fullmatch(r"[0-9]{1,12}", fields[axis]):
            f.fail("<file name>", f"has {axis}={fields[axis]}, which is not a whole number")
    key = {"E": int(fields["E"]), "N": int(fields["N"]), "device_name": fields["device_name"],
           "dtype": fields.get("dtype") or None, "block_shape": None}
    if "block_shape" in fields:
        block = BLOCK_SHAPE.fullmatch(fields["block_shape"])
        if block is None:
            f.fail("<file name>", f"has block_shape={fields['block_shape']}, not [<block n>,<block k>]")
        key["block_shape"] = f"[{int(block[1])},{int(block[2])}]"
    if fmt == "sglang":
        if fields.get("per_channel_quant", "True") != "True":
            f.fail("<file name>", "has per_channel_quant= other than True (SGLang writes the field only when set)")
        key["per_channel_quant"] = "per_channel_quant" in fields
        key["down"] = down
    return key


def config_of(body: dict, f: Fields, m: str, backend: str) -> Config:
    kwargs, options = {}, {}
    for name, value in body.items():
        path = f"{m}.{name}"
        if name in OPTIONS:
            options[name] = f.integer(value, path, *OPTIONS[name])
        elif name in ROCM_OPTIONS and value == ROCM_OPTIONS[name] and not isinstance(value, bool):
            continue  # Triton's default: the same launch without it
        elif not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            f.fail(path, "must be a kernel parameter name (a Python identifier)")
        else:
            kwargs[name] = f.scalar(value, path)
    options.setdefault("num_stages", DEFAULT_STAGES[backend])
    config = Config(kwargs, **options)
    for name, rule in compiler_options.config_problems(kwargs, config.num_warps, backend):
        fix = name not in kwargs or compiler_options.bad_backend_value(name, kwargs[name])
        f.fail(f"{m}.{name}", rule if fix else f"{rule}: pass the device the file was tuned on with --device")
    return config


def triton_of_directory(path: Path) -> str | None:
    """SGLang's `configs/triton_3_4_0/` names the Triton version the configs were tuned with."""
    match = TRITON_DIR.fullmatch(path.resolve().parent.name)
    return ".".join(match.groups()) if match else None


def save_all(arts: list[Artifact], output: str | Path) -> tuple[int, int]:
    """Write every artifact into `output`, or none: each target is checked first (a file of the same
    name holding other bytes is another config of that identity, a conflict; a non-file there is an
    error); then all are written atomically, or (one failing) none. Returns (written, already there)."""
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise InputError("is not a directory", file=out)
    todo, batch = [], {}
    for art in arts:
        first = batch.setdefault(art.filename, art)
        if first is not art:
            if first.to_bytes() != art.to_bytes():
                raise ArtifactError(f"is imported twice with different configs ({first.config} and {art.config}): "
                                    f"import one of them at a time", file=art.filename)
            continue
        target = out / art.filename
        if os.path.lexists(target):
            if target.is_symlink() or not target.is_file():
                raise InputError("is in the way: not a regular file", file=target)
            if read_capped(target, ArtifactError) != art.to_bytes():
                raise ArtifactError("already holds this identity with other bytes (another config?): import into a "
                                    "new directory and reconcile with `flytune merge`", file=target)
            continue
        todo.append(art)
    fsutil.write_all([(out / art.filename, art.to_bytes()) for art in todo])  # all or none
    return len(todo), len(batch) - len(todo)
