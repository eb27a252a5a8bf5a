"""FlyDSL interop, GPU-free against the real `flydsl` package, in the manner of its own unit tests:
a plain callable stands in for the kernel and the device descriptor is faked."""
import importlib
import io
import json
import os
import subprocess
import sys

import pytest

from flytune_build import flydsl as fly
from flytune_build import pipeline
from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import DeviceIdentity
from flytune_build.core.errors import ArtifactError

flyat = pytest.importorskip("flydsl.autotune") and importlib.import_module("flydsl.autotune")

MI300X = DeviceIdentity("hip", "gfx942", "AMD Instinct MI300X", 304)
DESCRIPTOR = {"name": "AMD Instinct MI300X", "arch": "gfx942", "compute_units": 304}


def hip_artifact(n=1024, block=256, warps=4):
    return Artifact("sample.add", {"n": n, "x": "float16"}, MI300X, Config({"BLOCK": block}, num_warps=warps),
                    {"triton": "3.6.0", "ranking": "measured"})


class FakeTensor:
    def __init__(self, dtype):
        self.dtype = dtype


def make_flydsl_kernel(bench_calls, launched):
    def add(x, n, BLOCK=None, num_warps=None):
        launched.append({"BLOCK": BLOCK, "num_warps": num_warps})

    def do_bench(fn, warmup=None, rep=None, quantiles=None):
        bench_calls.append(fn)
        return 1.0

    return flyat.autotune(configs=[flyat.Config(BLOCK=b, num_warps=w) for b in (128, 256) for w in (4, 8)],
                          key=["n", "x"], artifact_name="sample.add", do_bench=do_bench)(add)


@pytest.fixture
def fake_device(monkeypatch, tmp_path):
    monkeypatch.setattr(flyat, "_device_descriptor", lambda device=None: dict(DESCRIPTOR))
    monkeypatch.setenv("FLYDSL_AUTOTUNE_CACHE_DIR", str(tmp_path / "flydsl-cache"))
    monkeypatch.delenv("FLYDSL_AUTOTUNE", raising=False)


def test_export_matches_flydsl_identity_and_flydsl_picks_it_without_search(tmp_path, monkeypatch, fake_device):
    written, skipped = fly.export([hip_artifact()], tmp_path / "cfg")
    assert len(written) == 1 and not skipped
    monkeypatch.setenv("FLYDSL_AUTOTUNE_CONFIG_DIR", str(tmp_path / "cfg"))
    bench, launched = [], []
    k = make_flydsl_kernel(bench, launched)
    ref, ident = k._artifact_ref((FakeTensor("torch.float16"), 1024), {}, required=True)
    assert ref == written[0]  # same file name: FlyDSL's own hash of the identity
    k(FakeTensor("torch.float16"), 1024)
    assert bench == [] and launched == [{"BLOCK": 256, "num_warps": 4}]


def test_untuned_key_makes_flydsl_search_as_before(tmp_path, monkeypatch, fake_device):
    fly.export([hip_artifact()], tmp_path / "cfg")
    monkeypatch.setenv("FLYDSL_AUTOTUNE_CONFIG_DIR", str(tmp_path / "cfg"))
    bench, launched = [], []
    make_flydsl_kernel(bench, launched)(FakeTensor("torch.float16"), 2048)
    assert len(bench) == 4


def test_import_round_trip(tmp_path):
    art = hip_artifact()
    (written,), _ = fly.export([art], tmp_path)
    back = fly.from_flydsl(written)
    assert back.address == art.address and back.config == art.config
    assert back.provenance == {"ranking": "imported", "source": f"flydsl:{written.name}"}


def test_waves_per_eu_round_trips_among_the_kwargs_and_a_wrong_hash_is_refused(tmp_path):
    (written,), _ = fly.export([hip_artifact()], tmp_path)
    doc = json.loads(written.read_text())
    doc["config"]["waves_per_eu"] = 2
    written.write_text(json.dumps(doc))
    art = fly.from_flydsl(written)
    assert art.config.kwargs["waves_per_eu"] == 2  # Triton's HIP backend takes it as a launch keyword
    (again,), _ = fly.export([art], tmp_path / "again")
    assert json.loads(again.read_text())["config"] == doc["config"]
    renamed = written.with_name("sample.add-" + "0" * 64 + ".json")
    written.rename(renamed)
    with pytest.raises(ArtifactError, match="identity's hash"):
        fly.from_flydsl(renamed)


def test_export_skips_non_hip_and_maxnreg(tmp_path):
    cuda = Artifact("sample.add", {"n": 1}, DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132), Config({"BLOCK": 1}))
    reg = Artifact("sample.add", {"n": 2}, MI300X, Config({"BLOCK": 1}, maxnreg=128))
    written, skipped = fly.export([cuda, reg], tmp_path)
    assert not written and any("ROCm" in s for s in skipped) and any("maxnreg" in s for s in skipped)


def test_installed_bundle_is_materialised_for_flydsl(tmp_path, monkeypatch, fake_device):
    from buildkit import make_project
    from buildkit import install_fake_dist

    proj = make_project(tmp_path / "p", extra='coverage = "none"', artifacts=[hip_artifact()])
    text = (proj / "pyproject.toml").read_text().replace('targets = ["interpreter", ', 'targets = ["gfx942", ')
    (proj / "pyproject.toml").write_text(text)
    state = pipeline.run(proj, out=io.StringIO())
    install_fake_dist(tmp_path, monkeypatch, state)
    monkeypatch.setenv("FLYTUNE_PACKS", "fixpkg")  # fixpkg's bundle holds sample.add: a config pack, opted into
    monkeypatch.delenv("FLYDSL_AUTOTUNE_CONFIG_DIR", raising=False)
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "ft-cache" / "scratch"))
    where = fly.expose()
    assert where is not None and os.environ["FLYDSL_AUTOTUNE_CONFIG_DIR"] == str(where)
    bench, launched = [], []
    make_flydsl_kernel(bench, launched)(FakeTensor("torch.float16"), 1024)
    assert bench == [] and launched == [{"BLOCK": 256, "num_warps": 4}]
    monkeypatch.setenv("FLYDSL_AUTOTUNE_CONFIG_DIR", str(tmp_path / "mine"))
    with pytest.warns(Warning, match="user's directory"):
        assert fly.expose() == tmp_path / "mine"


def test_cli_export_and_import(tmp_path):
    from conftest import python_env

    src = tmp_path / "arts"
    hip_artifact().save(src)
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "export", "--format", "flydsl", str(src),
                        "--output", str(tmp_path / "fly")], capture_output=True, text=True, env=python_env())
    assert r.returncode == 0 and "wrote 1 FlyDSL config" in r.stdout
    (f,) = (tmp_path / "fly").iterdir()
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "import", "--format", "flydsl", str(f),
                        "--output", str(tmp_path / "back")], capture_output=True, text=True, env=python_env())
    assert r.returncode == 0 and [p.name for p in (tmp_path / "back").iterdir()] == [hip_artifact().filename]


def test_rocm_options_of_an_artifact_are_exported_to_flydsl_and_read_back(tmp_path):
    dev = DeviceIdentity("hip", "gfx942", "AMD Instinct MI300X", 304)
    art = Artifact("sample.add", {"n": 1024}, dev,
                   Config({"BLOCK": 64, "waves_per_eu": 2, "matrix_instr_nonkdim": 16, "kpack": 2}, num_warps=8))
    (written,), skipped = fly.export([art], tmp_path)
    assert not skipped
    assert json.loads(written.read_text())["config"] == {"BLOCK": 64, "waves_per_eu": 2, "matrix_instr_nonkdim": 16,
                                                         "kpack": 2, "num_warps": 8}
    assert fly.from_flydsl(written).config == art.config


@pytest.mark.parametrize("option, value, rule", [("waves_per_eu", 99, "integer 0..16"), ("kpack", 4, "1 or 2"),
                                                 ("launch_pdl", True, "cuda backend"),
                                                 ("num_warps", 12, "power of two")])
def test_import_refuses_a_backend_option_verify_would_refuse_and_writes_nothing(tmp_path, option, value, rule):
    """Every importer checks a config's backend compiler options as `verify` does (core.options.config_problems):
    a FlyDSL file whose `waves_per_eu` no ROCm Triton takes, or holding a CUDA-only option, is refused naming it."""
    (written,), _ = fly.export([hip_artifact()], tmp_path / "in")
    doc = json.loads(written.read_text())
    doc["config"][option] = value
    written.write_text(json.dumps(doc))
    with pytest.raises(ArtifactError, match=rf"config\.{option}.*{rule}"):
        fly.from_flydsl(written)
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "import", "--format", "flydsl",
                        "--output", str(tmp_path / "out"), str(written)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr and option in r.stderr
    assert not (tmp_path / "out").exists()


def export_cli(*args):
    from conftest import python_env

    return subprocess.run([sys.executable, "-m", "flytune_build.cli", "export", "--format", "flydsl", *map(str, args)],
                          capture_output=True, text=True, env=python_env())


def test_export_never_writes_into_what_it_reads(tmp_path):
    """`export hip3 --output hip3` would put FlyDSL files among the artifacts (hip3 no longer verifies):
    an output that is, lies inside or holds the source is refused, nothing written; a project's output
    only has to stay apart from its pyproject.toml and the folders its sources walk; the folder that holds
    the source folder may take the output."""
    from buildkit import make_project

    src = tmp_path / "hip3"
    hip_artifact().save(src)
    for output in (src, src / "fly"):
        r = export_cli(src, "--output", output)
        assert r.returncode == 2 and r.stderr.count("flytune: error:") == 1, r.stdout + r.stderr
        assert f"the input {src}" in r.stderr and "apart from every input" in r.stderr, r.stderr
        assert [p.name for p in tmp_path.rglob("*")] == ["hip3", hip_artifact().filename]
    r = export_cli(src, "--output", tmp_path)   # beside the source, not in it: what it writes mixes with nothing
    assert r.returncode == 0 and "wrote 1 FlyDSL config(s)" in r.stdout, r.stdout + r.stderr
    proj = make_project(tmp_path / "p")   # interpreter artifacts: exported as none, skipped with why
    for output in (proj / "artifacts" / "fly", proj, proj / "pyproject.toml"):
        r = export_cli(proj, "--output", output)
        assert r.returncode == 2 and "apart from every input" in r.stderr, r.stderr
    r = export_cli(proj, "--output", proj / "flydsl")   # in the project, where no source walks: fine
    assert r.returncode == 0 and "wrote 0 FlyDSL config(s)" in r.stdout and (proj / "flydsl").is_dir(), r.stderr


def test_export_into_a_file_is_refused_even_with_nothing_to_export(tmp_path):
    (tmp_path / "afile").write_text("mine")
    empty = tmp_path / "cuda"
    Artifact("sample.add", {"n": 1}, DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132), Config({"BLOCK": 1})).save(empty)
    for src in (empty, tmp_path / "hip"):
        hip_artifact().save(tmp_path / "hip")
        r = export_cli(src, "--output", tmp_path / "afile")
        assert r.returncode == 1 and r.stderr.count("flytune: error:") == 1, r.stdout + r.stderr
        assert "cannot be an output directory: it is a file" in r.stderr and "wrote" not in r.stdout, r.stderr
    assert (tmp_path / "afile").read_text() == "mine"


def test_export_that_fails_part_way_leaves_the_output_as_it_was(tmp_path, request):
    """All or nothing, as import and merge: the files written are removed, and a file replaced (the
    identity's earlier winner) is put back byte for byte."""
    from flytune_build.core.errors import OutputError

    out = tmp_path / "fly"
    (earlier,), _ = fly.export([hip_artifact(n=1, block=128)], out)
    before = earlier.read_bytes()
    request.getfixturevalue("third_write_fails")   # from here on: the earlier export wrote for real
    arts = [hip_artifact(n=1, block=256), hip_artifact(n=2), hip_artifact(n=3)]
    with pytest.raises(OutputError, match="No space left on device"):
        fly.export(arts, out)
    assert list(out.iterdir()) == [earlier] and earlier.read_bytes() == before
