import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from buildkit import (
    H200,
    ROOT,
    artifact,
    child_install,
    child_venv,
    make_project,
    pip_wheel,
    run_child,
    spoil_num_warps,
)
from conftest import python_env

from flytune_build import pipeline
from flytune_build.audit import source as audit
from flytune_build.core import bundle, codec
from flytune_build.pipeline import BuildFailure


def only_wheel(d: Path) -> Path:
    (w,) = d.glob("*.whl")
    return w


def test_wheel_carries_bundle_manifest_shards_and_entry_point(tmp_path):
    proj = make_project(tmp_path / "p")
    r = pip_wheel(proj, tmp_path / "dist")
    assert r.returncode == 0, r.stderr
    whl = only_wheel(tmp_path / "dist")
    with zipfile.ZipFile(whl) as zf:
        names = zf.namelist()
        assert "fixpkg/_flytune/manifest.json" in names and "fixpkg/_flytune/fixpkg.add.json" in names
        manifest = bundle.Manifest.from_bytes(zf.read("fixpkg/_flytune/manifest.json"), file="m")
        assert manifest.package == "fixpkg" and manifest.kernels["fixpkg.add"].artifacts == 2
        assert [t.label() for t in manifest.targets] == ["interpreter", "sm_90/132/NVIDIA H200"]
        assert manifest.tuned_with == {"triton": ["3.6.0"]}
        eps = zf.read("fixpkg-1.0.dist-info/entry_points.txt").decode()
        assert "[flytune.bundles]\nfixpkg = fixpkg._flytune" in eps
    assert audit.verify(str(whl)).ok


def test_build_prints_one_report(tmp_path):
    proj = make_project(tmp_path / "p", artifacts=[artifact(100, 32), artifact(100, 64, dev=H200),
                                                   artifact(100, 64, dev=H200.__class__("cuda", "sm_80", "A100", 108))])
    out = io.StringIO()
    cwd = os.getcwd()
    state = pipeline.run(proj, out=out)
    report = out.getvalue()
    assert "fixpkg.add" in report and "kept 2, excluded 1 (other devices), rejected 0" in report
    assert "tuned on cuda:sm_80:108:A100" in report and "tuned with triton 3.6.0" in report
    assert len(state.artifacts) == 2 and os.getcwd() == cwd


def test_project_without_table_builds_exactly_as_setuptools(tmp_path):
    ours = make_project(tmp_path / "ours", tool=False, artifacts=[])
    plain = make_project(tmp_path / "plain", tool=False, artifacts=[], backend="setuptools.build_meta")
    r = subprocess.run([sys.executable, "-c", "import sys, flytune_build.backend as b; b.build_wheel(sys.argv[1])",
                        str(tmp_path / "d1")], capture_output=True, text=True, cwd=ours, env=python_env())
    assert r.returncode == 0 and "has no [tool.flytune] table, so this wheel carries no tuned configs" in r.stderr, \
        r.stderr[-2000:]   # said, then built as setuptools builds it
    assert pip_wheel(plain, tmp_path / "d2").returncode == 0
    with zipfile.ZipFile(only_wheel(tmp_path / "d1")) as a, zipfile.ZipFile(only_wheel(tmp_path / "d2")) as b:
        assert a.namelist() == b.namelist()
        for n in a.namelist():
            assert a.read(n) == b.read(n), n


def test_two_builds_are_byte_identical(tmp_path):
    a = make_project(tmp_path / "one" / "p")
    b = tmp_path / "two" / "deeper" / "p"
    shutil.copytree(a, b)
    os.utime(b / "fixpkg" / "__init__.py", (1e9, 1e9))
    env = {k: v for k, v in os.environ.items() if k != "SOURCE_DATE_EPOCH"}
    r1 = subprocess.run(f"umask 022 && {sys.executable} -m pip wheel -q --no-deps --no-build-isolation . -w {tmp_path}/d1",
                        shell=True, cwd=a, env=env, capture_output=True, text=True)
    r2 = subprocess.run(f"umask 077 && {sys.executable} -m pip wheel -q --no-deps --no-build-isolation . -w {tmp_path}/d2",
                        shell=True, cwd=b, env=env, capture_output=True, text=True)
    assert r1.returncode == 0 and r2.returncode == 0, r1.stderr + r2.stderr
    assert only_wheel(tmp_path / "d1").read_bytes() == only_wheel(tmp_path / "d2").read_bytes()


def test_source_date_epoch_is_honoured(tmp_path):
    proj = make_project(tmp_path / "p")
    r = pip_wheel(proj, tmp_path / "d", env=dict(os.environ, SOURCE_DATE_EPOCH="1700000000"))
    assert r.returncode == 0
    with zipfile.ZipFile(only_wheel(tmp_path / "d")) as zf:
        assert {i.date_time for i in zf.infolist()} == {(2023, 11, 14, 22, 13, 20)}
        assert {i.external_attr >> 16 for i in zf.infolist()} == {0o100644}


def test_failing_build_writes_no_wheel_and_names_every_problem(tmp_path):
    bad = artifact(100, 32)
    proj = make_project(tmp_path / "p", artifacts=[bad, artifact(100, 64, dev=H200)])
    path = proj / "artifacts" / bad.filename
    doc = json.loads(path.read_text())
    doc["config"]["num_warps"] = "4"
    path.write_bytes(codec.canonical(doc) + b"\n")
    r = pip_wheel(proj, tmp_path / "dist")
    assert r.returncode != 0
    assert not list((tmp_path / "dist").glob("*.whl")) if (tmp_path / "dist").exists() else True
    out = r.stdout + r.stderr
    assert f"artifacts/{bad.filename}: Field `config.num_warps` must be an integer" in out
    assert "Traceback" not in out


def test_non_strict_drops_bad_artifact_with_warning(tmp_path):
    proj = make_project(tmp_path / "p", extra="strict = false\ncoverage = \"none\"",
                        artifacts=[artifact(100, 32), artifact(100, 64, dev=H200)])
    (proj / "artifacts" / "junk.json").write_text("{")
    out = io.StringIO()
    state = pipeline.run(proj, out=out)
    assert len(state.artifacts) == 2 and "warning: dropped: artifacts/junk.json" in out.getvalue()


def test_sdist_carries_sources_and_isolated_build_gives_same_bundle(tmp_path, flytune_wheel):
    proj = make_project(tmp_path / "p")
    env = dict(os.environ, PIP_FIND_LINKS=str(flytune_wheel.parent))
    r = subprocess.run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "dist"), str(proj)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
    assert "fixpkg-1.0/pyproject.toml" in names
    assert all(f"fixpkg-1.0/artifacts/{p.name}" in names for p in (proj / "artifacts").glob("*.json"))
    assert audit.verify(str(sdist)).ok
    direct = tmp_path / "direct"
    assert pip_wheel(proj, direct).returncode == 0
    with zipfile.ZipFile(only_wheel(tmp_path / "dist")) as a, zipfile.ZipFile(only_wheel(direct)) as b:
        bundle_names = sorted(n for n in a.namelist() if "/_flytune/" in n)
        assert bundle_names == sorted(n for n in b.namelist() if "/_flytune/" in n)
        assert all(a.read(n) == b.read(n) for n in bundle_names)


def test_installed_wheel_serves_from_bundle_and_refuses_tampered_shard(tmp_path, flytune_wheel):
    proj = make_project(tmp_path / "p")
    assert pip_wheel(proj, tmp_path / "dist").returncode == 0
    py = child_venv(tmp_path / "venv")
    r = child_install(py, flytune_wheel, only_wheel(tmp_path / "dist"))
    assert r.returncode == 0, r.stderr
    code = """
        import sys, warnings, torch, fixpkg, flytune_build as ft
        x = torch.arange(100.0); y = torch.ones(100)
        warnings.simplefilter("always")
        assert "flytune_build" not in sys.modules or "fixpkg" in sys.modules
        assert torch.equal(fixpkg.add(x, y), x + y)
        d = fixpkg.add_kernel.decision(x, y, None, 100)
        print(ft.stats()["fixpkg.add"]["calls"], d.level, d.config.kwargs["BLOCK"], d.origin)
    """
    r = run_child(py, code, TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "'offline': 1" in r.stdout and "exact 32 " in r.stdout and "fixpkg bundle" in r.stdout
    site = Path(run_child(py, "import fixpkg, os; print(os.path.dirname(fixpkg.__file__))").stdout.strip())
    shard = site / "_flytune" / "fixpkg.add.json"
    shard.write_bytes(shard.read_bytes().replace(b'"BLOCK":32', b'"BLOCK":64'))
    r = run_child(py, code, TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "c2")
    assert r.returncode == 0, r.stderr
    assert "'heuristic': 1" in r.stdout and "does not match the manifest" in r.stderr
    assert r.stderr.count("FlytuneWarning") == 1


def test_editable_install_sees_bundle_and_retuned_artifacts_after_rebuild(tmp_path, flytune_wheel):
    proj = make_project(tmp_path / "p", extra='coverage = "none"', artifacts=[artifact(100, 32)])
    py = child_venv(tmp_path / "venv")
    assert child_install(py, flytune_wheel).returncode == 0
    r = child_install(py, editable=proj)
    assert r.returncode == 0, r.stderr
    code = """
        import torch, fixpkg
        x = torch.arange(100.0); y = torch.ones(100)
        fixpkg.add(x, y)
        d = fixpkg.add_kernel.decision(x, y, None, 100)
        print(d.tier, d.config.kwargs["BLOCK"])
    """
    env = dict(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert run_child(py, code, **env).stdout.split() == ["offline", "32"]
    (proj / "artifacts" / artifact(100, 32).filename).unlink()
    artifact(100, 64).save(proj / "artifacts")
    assert child_install(py, editable=proj).returncode == 0
    assert run_child(py, code, **env).stdout.split() == ["offline", "64"]


BLOCKER = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton"):
            raise ImportError("the build path imported " + name)
sys.meta_path.insert(0, Block())
import os, flytune_build.backend as b
os.chdir(sys.argv[1])
print(b.build_wheel(sys.argv[2]))
print(b.build_sdist(sys.argv[2]))
"""


def test_build_path_never_imports_torch_or_triton(tmp_path):
    proj = make_project(tmp_path / "p")
    r = subprocess.run([sys.executable, "-c", BLOCKER, str(proj), str(tmp_path / "out")], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fixpkg-1.0-py3-none-any.whl" in r.stdout and "fixpkg-1.0.tar.gz" in r.stdout


def test_prepare_metadata_declares_the_entry_point(tmp_path):
    proj = make_project(tmp_path / "p")
    code = ("import os, sys, flytune_build.backend as b; os.chdir(sys.argv[1]); "
            "print(b.prepare_metadata_for_build_wheel(sys.argv[2]))")
    (tmp_path / "meta").mkdir()
    r = subprocess.run([sys.executable, "-c", code, str(proj), str(tmp_path / "meta")], capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, r.stderr
    eps = (tmp_path / "meta" / r.stdout.strip().splitlines()[-1] / "entry_points.txt").read_text()
    assert "fixpkg = fixpkg._flytune" in eps


def test_every_pep517_and_pep660_hook_is_present():
    from flytune_build import backend

    for hook in ("build_wheel", "build_sdist", "build_editable", "get_requires_for_build_wheel",
                 "get_requires_for_build_sdist", "get_requires_for_build_editable",
                 "prepare_metadata_for_build_wheel", "prepare_metadata_for_build_editable"):
        assert callable(getattr(backend, hook)), hook


def test_symlink_escaping_root_is_an_error(tmp_path):
    outside = tmp_path / "outside"
    artifact(100, 32).save(outside)
    proj = make_project(tmp_path / "p")
    (proj / "artifacts" / "evil").symlink_to(outside)
    with pytest.raises(BuildFailure, match="resolves outside the project root"):
        pipeline.run(proj, out=io.StringIO())


def test_glob_sources(tmp_path):
    proj = make_project(tmp_path / "p", extra="", artifacts=[])
    artifact(100, 32).save(proj / "tuned" / "cpu")
    artifact(100, 64, dev=H200).save(proj / "tuned" / "h200")
    text = (proj / "pyproject.toml").read_text().replace('sources = ["artifacts"]', 'sources = ["tuned/*"]')
    (proj / "pyproject.toml").write_text(text)
    state = pipeline.run(proj, out=io.StringIO())
    assert len(state.artifacts) == 2


# -- the shard table ---------------------------------------------------------------------------------------
def _shard_of(arts):
    import hashlib

    data = bundle.shard_bytes("fixpkg.add", arts)
    info = bundle.ShardInfo("fixpkg.add", "fixpkg.add.json", hashlib.sha256(data).hexdigest(), len(arts),
                            tuple(sorted(arts[0].key)), "p.json", "0" * 64)
    return data, info


def test_shard_table_round_trips_every_artifact():
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.config import Config

    arts = [artifact(n, b, dev=d) for n in (1, 2, 3) for b in (16, 32) for d in (H200, artifact().device)]
    arts = list({a.address: a for a in arts}.values())
    # configs that compare equal in Python but not in JSON stay apart
    arts += [Artifact("fixpkg.add", {"x": "f", "n": 7}, H200, Config({"BLOCK": 1, "EVEN": True})),
             Artifact("fixpkg.add", {"x": "f", "n": 8}, H200, Config({"BLOCK": 1, "EVEN": 1}))]
    data, info = _shard_of(arts)
    shard = bundle.parse_shard(info, data, file="s.json")
    assert len(shard.devices) == 2 and len(shard.rows) == len(arts)
    back = bundle.parse_shard(info, data, file="s.json", full=True)
    assert sorted(a.to_bytes() for a in back) == sorted(
        Artifact(a.kernel, a.key, a.device, a.config).to_bytes() for a in arts)


SHARD_CASES = [  # (edit of the shard document, field named, rule)
    ("format", lambda d: d.update(format=1), "format", "reads format 2"),
    ("kernel", lambda d: d.update(kernel="fixpkg.other"), "kernel", "the kernel the manifest names"),
    ("axes-differ", lambda d: d.update(axes=["n"]), "axes", "manifest's axes"),
    ("device-index", lambda d: d["artifacts"][0].__setitem__(0, 9), "artifacts[0]", "device index"),
    ("config-index-bool", lambda d: d["artifacts"][0].__setitem__(1, True), "artifacts[0]", "config index"),
    ("row-width", lambda d: d["artifacts"][0].append(1), "artifacts[0]", "one JSON scalar per axis"),
    ("key-not-scalar", lambda d: d["artifacts"][0].__setitem__(2, [1]), "artifacts[0]", "one JSON scalar"),
    ("device-not-object", lambda d: d["devices"].__setitem__(0, "sm_90"), "devices[0]", "must be an object"),
    ("unknown-field", lambda d: d.update(extra=1), "extra", "not a known field"),
]


@pytest.mark.parametrize("case,edit,field,rule", SHARD_CASES, ids=[c[0] for c in SHARD_CASES])
def test_malformed_shard_is_refused_naming_the_field(case, edit, field, rule):
    import hashlib

    from flytune_build.core.errors import BundleError

    data, info = _shard_of([artifact(1, 16), artifact(2, 32)])
    doc = json.loads(data)
    edit(doc)
    data = codec.canonical(doc) + b"\n"
    info = info._replace(sha256=hashlib.sha256(data).hexdigest())
    with pytest.raises(BundleError) as e:
        bundle.parse_shard(info, data, file="s.json")
    assert e.value.field == field and rule in e.value.rule, e.value


MODES = """
import os, sys, threading, flytune_build.backend as b
mode = sys.argv[3]
if mode == "thread":  # a thread running: no fork, the bundle is made in this process first
    threading.Thread(target=threading.Event().wait, daemon=True).start()
elif mode == "child-dies":  # the forked child answers nothing: the parent makes the bundle itself
    b._bundle_in_child = lambda send: os._exit(3)
os.chdir(sys.argv[1])
print(b.build_wheel(sys.argv[2]))
"""


def test_bundle_is_the_same_made_beside_setuptools_or_in_line(tmp_path):
    proj = make_project(tmp_path / "p")
    wheels = []
    for mode in ("fork", "thread", "child-dies"):
        out = tmp_path / mode
        r = subprocess.run([sys.executable, "-c", MODES, str(proj), str(out), mode], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "kept 2, excluded 0" in r.stderr  # one report, whichever process made the bundle
        assert sorted(p.name for p in out.iterdir()) == ["fixpkg-1.0-py3-none-any.whl"]  # no leftovers
        wheels.append((out / "fixpkg-1.0-py3-none-any.whl").read_bytes())
    assert wheels[0] == wheels[1] == wheels[2]


@pytest.mark.parametrize("mode", ["fork", "thread"])
def test_failed_verification_leaves_nothing_in_the_wheel_directory(tmp_path, mode):
    bad = artifact(100, 32)
    proj = make_project(tmp_path / "p", artifacts=[bad])
    spoil_num_warps(proj, bad)
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-c", MODES, str(proj), str(out), mode], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "flytune: error:" in r.stderr and "config.num_warps" in r.stderr
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("rows", [
    [[0, 0, 1, "f"], [True, 0, 2, "f"]], [[0, 0, 1, "f"], [0, 1, 2, "f"]], [[0, 0, 1, "f"], [-1, 0, 2, "f"]],
    [[0, 0, 1, "f"], [0, 0, [2], "f"]], [[0, 0, 1, "f"], [0, 0, 2]], [[0, 0, 1, "f"], "row"], [[0, 0.0, 1, "f"]],
    [[0, 0, 1, {"a": 1}]],
])
def test_bulk_row_check_refuses_what_the_row_check_refuses(rows):
    from flytune_build.core.bundle import _good_rows

    assert not _good_rows(rows, 4, 1, 1)
    assert _good_rows([[0, 0, 1, "f"], [0, 0, 2.5, None], [0, 0, True, "g"]], 4, 1, 1)
