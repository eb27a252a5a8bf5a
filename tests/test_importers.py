"""`flytune import --format vllm|sglang`: fused-MoE config files, written exactly as vLLM's and SGLang's
tuning scripts write them (json.dump(configs, f, indent=4)), become flytune artifacts."""
import json
from pathlib import Path

import pytest
from conftest import flytune

from flytune_build.interop import moe as importers
from flytune_build.core.artifact import Artifact, load_dir
from flytune_build.core.device import INTERPRETER, DeviceIdentity
from flytune_build.core.errors import ArtifactError

H200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
CONFIGS = {
    "1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
          "num_stages": 3},
    "64": {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 32, "num_warps": 8,
           "num_stages": 4},
    "4096": {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16, "num_warps": 8,
             "num_stages": 4},
}


def write(directory: Path, name: str, doc) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    with open(path, "w") as f:
        json.dump(doc, f, indent=4)
        f.write("\n")
    return path


def test_vllm_file_becomes_one_artifact_per_batch_size(tmp_path):
    path = write(tmp_path / "configs", "E=128,N=384,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json",
                 {"triton_version": "3.4.0", **CONFIGS})
    r = flytune("import", "--format", "vllm", "--kernel", "mylib.fused_moe", "--output", tmp_path / "out", path)
    assert r.returncode == 0, r.stderr
    assert "imported 3 artifact(s) of mylib.fused_moe from 1 vllm file(s)" in r.stdout
    arts = sorted(load_dir(tmp_path / "out", canonical=True), key=lambda a: a.key["M"])
    assert [dict(a.key) for a in arts] == [
        {"E": 128, "N": 384, "M": m, "dtype": "fp8_w8a8", "block_shape": "[128,128]"} for m in (1, 64, 4096)]
    assert {a.device for a in arts} == {H200}
    big = arts[-1].config
    assert big.kwargs == {"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 256, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 16}
    assert (big.num_warps, big.num_stages) == (8, 4)
    assert dict(arts[0].provenance) == {"ranking": "imported", "triton": "3.4.0",
                                        "source": f"vllm:{path.name}#1"}
    assert flytune("verify", tmp_path / "out").returncode == 0


def test_vllm_file_without_dtype_or_block_shape_has_null_axes(tmp_path):
    path = write(tmp_path, "E=8,N=14336,device_name=NVIDIA_H100_80GB_HBM3.json", {"16": CONFIGS["64"]})
    (art,) = importers.import_files([path], "vllm", "mylib.moe")
    assert dict(art.key) == {"E": 8, "N": 14336, "M": 16, "dtype": None, "block_shape": None}
    assert art.device == DeviceIdentity("cuda", "sm_90", "NVIDIA H100 80GB HBM3", 132)
    assert dict(art.provenance) == {"ranking": "imported", "source": f"vllm:{path.name}#16"}


def test_sglang_versioned_directory_spacing_per_channel_and_down_projection(tmp_path):
    d = tmp_path / "configs" / "triton_3_4_0"
    up = write(d, "E=256,N=256,device_name=NVIDIA_H20-3e,dtype=fp8_w8a8,block_shape=[128, 128].json", CONFIGS)
    down = write(d, "E=256,N=256,device_name=NVIDIA_H20-3e,dtype=fp8_w8a8,block_shape=[128, 128]_down.json",
                 {"1": CONFIGS["64"]})
    chan = write(d, "E=8,N=7168,device_name=NVIDIA_H200,dtype=int8_w8a8,per_channel_quant=True.json",
                 {"2": CONFIGS["1"]})
    r = flytune("import", "--format", "sglang", "--kernel", "mylib.fused_moe", "--output", tmp_path / "out",
                up, down, chan)
    assert r.returncode == 0, r.stderr
    arts = load_dir(tmp_path / "out", canonical=True)
    keys = sorted((dict(a.key) for a in arts), key=lambda k: (k["E"], k["M"], k["down"]))
    assert keys[0] == {"E": 8, "N": 7168, "M": 2, "dtype": "int8_w8a8", "block_shape": None,
                       "per_channel_quant": True, "down": False}
    assert {"E": 256, "N": 256, "M": 1, "dtype": "fp8_w8a8", "block_shape": "[128,128]",
            "per_channel_quant": False, "down": True} in keys
    assert len(arts) == 5 and {a.provenance["triton"] for a in arts} == {"3.4.0"}
    h20 = next(a.device for a in arts if a.key["E"] == 256)
    assert h20 == DeviceIdentity("cuda", "sm_90", "NVIDIA H20-3e", 78)
    assert flytune("verify", tmp_path / "out").returncode == 0


def test_unknown_device_names_the_file_and_is_served_by_an_explicit_device(tmp_path):
    path = write(tmp_path, "E=16,N=1024,device_name=NVIDIA_GeForce_RTX_5090.json", {"32": CONFIGS["64"]})
    r = flytune("import", "--format", "vllm", "--kernel", "mylib.moe", "--output", tmp_path / "out", path)
    assert r.returncode == 1 and not (tmp_path / "out").exists()
    assert f"{path}: Field `<file name>` names device_name=NVIDIA_GeForce_RTX_5090" in r.stderr
    assert "--device" in r.stderr and "Traceback" not in r.stderr
    r = flytune("import", "--format", "vllm", "--kernel", "mylib.moe", "--device", "interpreter",
                "--output", tmp_path / "out", path)
    assert r.returncode == 0, r.stderr
    assert [a.device for a in load_dir(tmp_path / "out")] == [INTERPRETER]


def test_rocm_options_are_dropped_at_their_default_and_num_stages_defaults_per_backend(tmp_path):
    path = write(tmp_path, "E=8,N=14336,device_name=AMD_Instinct_MI300X.json",
                 {"8": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1,
                        "num_warps": 2, "waves_per_eu": 0, "matrix_instr_nonkdim": 0, "kpack": 1}})
    (art,) = importers.import_files([path], "vllm", "mylib.moe")
    assert art.device == DeviceIdentity("hip", "gfx942", "AMD Instinct MI300X", 304)
    assert art.config.kwargs == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1}
    assert (art.config.num_warps, art.config.num_stages) == (2, 2)  # Triton's HIP default, as vLLM launches it


def test_rocm_options_away_from_their_default_stay_among_the_kwargs(tmp_path):
    body = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1, "num_warps": 8,
            "num_stages": 2, "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 1}
    path = write(tmp_path, "E=8,N=14336,device_name=AMD_Instinct_MI300X.json", {"8": body})
    (art,) = importers.import_files([path], "vllm", "mylib.moe")
    assert art.config.kwargs == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1,
                                 "waves_per_eu": 2, "matrix_instr_nonkdim": 16}  # kpack=1: the default, dropped
    assert art.config.launch_kwargs() == {k: v for k, v in body.items() if k != "kpack"}  # as Triton launches it



def test_an_mi300_config_with_every_rocm_option_imports_verifies_and_a_value_triton_refuses_is_named(tmp_path):
    from flytune_build.core import verification

    body = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1, "num_warps": 4,
            "num_stages": 2, "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2}
    path = write(tmp_path, "E=8,N=14336,device_name=AMD_Instinct_MI300X.json", {"1": body})
    arts = importers.import_files([path], "vllm", "mylib.moe")
    assert {k: arts[0].config.kwargs[k] for k in ("waves_per_eu", "matrix_instr_nonkdim", "kpack")} == \
        {"waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2}
    assert not verification.check(arts, lambda a: a.filename).errors
    bad = write(tmp_path / "bad", path.name, {"1": {**body, "kpack": 4}})
    with pytest.raises(ArtifactError, match="kpack compiler option takes 1 or 2") as e:
        importers.import_files([bad], "vllm", "mylib.moe")
    assert e.value.field == "1.kpack"
    refused = Artifact("mylib.moe", arts[0].key, arts[0].device,
                       type(arts[0].config)({**arts[0].config.kwargs, "matrix_instr_nonkdim": 8}))
    (err,) = verification.check([refused], lambda a: a.filename).errors
    assert err.field == "config.kwargs.matrix_instr_nonkdim" and "0, 4, 16 or 32" in err.rule

MALFORMED = [  # (file name, document, field named, rule fragment)
    ("E=8,N=64,device_name=NVIDIA_H200.json", {"abc": CONFIGS["1"]}, "abc", "batch size M"),
    ("E=8,N=64,device_name=NVIDIA_H200.json", {"64": {**CONFIGS["1"], "num_warps": "4"}}, "64.num_warps",
     "must be an integer"),
    ("E=8,N=64,device_name=NVIDIA_H200.json", {"64": {**CONFIGS["1"], "BLOCK_SIZE_M": [16]}}, "64.BLOCK_SIZE_M",
     "JSON scalar"),
    ("E=8,N=64,device_name=NVIDIA_H200.json", {"64": 16}, "64", "must be an object"),
    ("E=8,N=64,device_name=NVIDIA_H200.json", {"64": {**CONFIGS["1"], "matrix_instr_nonkdim": 16}},
     "64.matrix_instr_nonkdim", "compiler option of Triton's hip backend"),
    ("E=8,N=64,device_name=NVIDIA_H200.json", {"64": {**CONFIGS["1"], "num_warps": 6}}, "64.num_warps",
     "compiles only a power of two"),   # as the build refuses it (core.options.config_problems)
    ("E=8,N=64,device_name=NVIDIA_H200.json", [1, 2], "<document>", "must be an object"),
    ("E=8,N=64,device_name=NVIDIA_H200.json", {}, "<document>", "holds no batch size"),
    ("E=x,N=64,device_name=NVIDIA_H200.json", {"1": CONFIGS["1"]}, "<file name>", "E=x"),
    ("N=64,device_name=NVIDIA_H200.json", {"1": CONFIGS["1"]}, "<file name>", "no E="),
    ("E=8,N=64,device_name=NVIDIA_H200,block_shape=[128].json", {"1": CONFIGS["1"]}, "<file name>", "block_shape"),
    ("E=8,N=64,device_name=NVIDIA_H200,use_cuda=True.json", {"1": CONFIGS["1"]}, "<file name>", "use_cuda"),
    ("E=8,N=64,device_name=NVIDIA_H200_down.json", {"1": CONFIGS["1"]}, "<file name>", "--format sglang"),
    ("E=8,N=64,device_name=NVIDIA_H200.json", {"triton_version": 3, "1": CONFIGS["1"]}, "triton_version",
     "must be a string"),
]


@pytest.mark.parametrize("name,doc,field,rule", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_file_is_a_typed_error_naming_file_and_entry(tmp_path, name, doc, field, rule):
    path = write(tmp_path, name, doc)
    with pytest.raises(ArtifactError) as e:
        importers.import_files([path], "vllm", "mylib.moe")
    assert e.value.file == str(path) and e.value.field == field, e.value
    assert rule in e.value.rule, e.value


def test_import_is_all_or_nothing_and_conflicting_versions_are_refused(tmp_path):
    name = "E=8,N=64,device_name=NVIDIA_H200.json"
    a = write(tmp_path / "configs" / "triton_3_3_1", name, {"1": CONFIGS["1"]})
    b = write(tmp_path / "configs" / "triton_3_4_0", name, {"1": CONFIGS["64"]})
    r = flytune("import", "--format", "sglang", "--kernel", "mylib.moe", "--output", tmp_path / "out", a, b)
    assert r.returncode == 1 and not (tmp_path / "out").exists()
    assert f"{b}: Field `1` conflicts with {a} entry 1" in r.stderr
    r = flytune("import", "--format", "vllm", "--output", tmp_path / "out", a)
    assert r.returncode == 2 and "needs --kernel NAME" in r.stderr


def test_import_writes_all_or_nothing_and_never_replaces_another_config(tmp_path):
    path = write(tmp_path / "configs", "E=8,N=64,device_name=NVIDIA_H200.json", CONFIGS)
    out = tmp_path / "out"
    args = ("import", "--format", "vllm", "--kernel", "mylib.moe", "--output", out, path)
    assert flytune(*args).returncode == 0
    again = flytune(*args)
    assert again.returncode == 0 and "imported 0 artifact(s)" in again.stdout and "(3 already there)" in again.stdout
    first, *rest = sorted(out.iterdir())
    kept = first.read_bytes()
    first.write_bytes(kept[:-1] + b" \n")  # the same identity, other bytes
    for p in rest:
        p.unlink()
    r = flytune(*args)  # the first target holds other bytes: nothing is written, the file named
    assert r.returncode == 1 and first.name in r.stderr and "already holds this identity" in r.stderr, r.stderr
    assert sorted(out.iterdir()) == [first]
    long = "k" * 201
    r = flytune("import", "--format", "vllm", "--kernel", long, "--output", tmp_path / "o2", path)
    assert r.returncode == 2 and "at most 200 characters" in r.stderr and not (tmp_path / "o2").exists()


def test_flydsl_files_that_become_one_identity_with_two_configs_are_refused(tmp_path):
    """Two FlyDSL kernels imported under one --kernel name: one identity, two configs. Nothing is written."""
    from flytune_build.core.config import Config
    from flytune_build.core.device import DeviceIdentity
    from flytune_build.interop.flydsl import to_flydsl

    mi300x = DeviceIdentity("hip", "gfx942", "AMD Instinct MI300X", 304)
    paths = []
    for name, block in (("ka", 16), ("kb", 64)):
        fname, data = to_flydsl(Artifact(name, {"n": 100}, mi300x, Config({"BLOCK": block})))
        (tmp_path / fname).write_bytes(data)
        paths.append(tmp_path / fname)
    r = flytune("import", "--format", "flydsl", "--kernel", "k", *paths, "--output", tmp_path / "out")
    assert r.returncode == 1 and "imported twice with different configs" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_import_that_fails_part_way_leaves_nothing_written(tmp_path, third_write_fails):
    """A write failing after others succeeded (a full disk, a read-only file system) removes those
    already written: the output is as it was, and the error names the file."""
    from flytune_build.core.errors import OutputError

    path = write(tmp_path / "configs", "E=8,N=64,device_name=NVIDIA_H200.json", CONFIGS)
    arts = importers.import_files([path], "vllm", "mylib.moe")
    assert len(arts) == 3
    calls = third_write_fails
    out = tmp_path / "out"
    with pytest.raises(OutputError, match="No space left on device"):
        importers.save_all(arts, out)
    assert len(calls) == 3 and list(out.iterdir()) == []


@pytest.mark.parametrize("fmt", ["vllm", "flydsl"])
def test_import_never_writes_into_the_directory_its_files_come_from(tmp_path, fmt):
    """`import fd/*.json --output fd` would mix artifacts among another tool's files (the directory no
    longer verifies); an output that is, lies inside or holds an input is refused, nothing written."""
    from flytune_build.core.config import Config
    from flytune_build.interop.flydsl import to_flydsl

    if fmt == "vllm":
        path = write(tmp_path / "in", "E=8,N=4096,device_name=AMD_Instinct_MI300X.json", {"1": CONFIGS["1"]})
        extra = ("--kernel", "mypkg.fused_moe")
    else:
        mi300x = DeviceIdentity("hip", "gfx942", "AMD Instinct MI300X", 304)
        fname, data = to_flydsl(Artifact("ka", {"n": 100}, mi300x, Config({"BLOCK": 16})))
        (tmp_path / "in").mkdir()
        path = tmp_path / "in" / fname
        path.write_bytes(data)
        extra = ()
    for output in (tmp_path / "in", path):
        r = flytune("import", "--format", fmt, *extra, "--output", output, path)
        assert r.returncode == 2 and r.stderr.count("flytune: error:") == 1, r.stdout + r.stderr
        assert f"the input {path}" in r.stderr and "apart from every input" in r.stderr, r.stderr
        assert [p.name for p in tmp_path.rglob("*")] == ["in", path.name]
    r = flytune("import", "--format", fmt, *extra, "--output", tmp_path / "in" / "sub", path)
    assert r.returncode == 0, r.stderr   # in the folder that holds the input, not beside it: apart
    r = flytune("import", "--format", fmt, *extra, "--output", tmp_path / "out", path)
    assert r.returncode == 0, r.stderr
