"""The sample package, built by our backend into a wheel, installed into a fresh venv, run for real."""
import json
import shutil
import subprocess
import sys

import pytest
import tomllib
from buildkit import ROOT, child_install, child_venv, run_child
from test_build import only_wheel

PLAN = tomllib.loads((ROOT / "sample_pkg" / "tune" / "interpreter.toml").read_text())["entries"]

RUN = """
import json, sys, warnings, torch, sample_pkg, flytune_build as ft
warnings.simplefilter("always")
shapes = json.loads(sys.argv[1])
out = []
for kernel, shape in shapes:
    g = torch.Generator().manual_seed(1)
    if kernel == "sample_pkg.matmul":
        a = torch.randn(shape["M"], shape["K"], generator=g).half(); b = torch.randn(shape["K"], shape["N"], generator=g).half()
        ok = torch.allclose(sample_pkg.matmul(a, b).float(), a.float() @ b.float(), atol=0.1, rtol=1e-2)
    elif kernel == "sample_pkg.rmsnorm":
        x = torch.randn(shape["M"], shape["N"], generator=g).half(); w = torch.randn(shape["N"], generator=g).half()
        ref = x.float() * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6) * w.float()
        ok = torch.allclose(sample_pkg.rmsnorm(x, w).float(), ref, atol=2e-2, rtol=2e-2)
    else:
        x = torch.randn(shape["M"], shape["N"], generator=g).half()
        ok = torch.allclose(sample_pkg.softmax(x).float(), torch.softmax(x.float(), -1), atol=2e-3, rtol=1e-2)
    out.append(ok)
print(json.dumps({"ok": out, "stats": ft.stats()}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory, flytune_wheel):  # noqa: F811
    tmp = tmp_path_factory.mktemp("sample")
    # built from a copy: the build is in-tree (build/, *.egg-info), and parallel test workers may each build it
    src = shutil.copytree(ROOT / "sample_pkg", tmp / "sample_pkg", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        str(src), "-w", str(tmp / "dist")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    py = child_venv(tmp / "venv")
    r = child_install(py, flytune_wheel, only_wheel(tmp / "dist"))
    assert r.returncode == 0, r.stderr
    return py, only_wheel(tmp / "dist"), tmp


def run(py, tmp, shapes, **env):
    r = run_child(py, RUN.replace("sys.argv[1]", repr(json.dumps(shapes))), TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0,
                  FLYTUNE_CACHE_DIR=tmp / "cache", **env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_sample_wheel_verifies(installed):
    from flytune_build.audit import source as audit
    from flytune_build.cli import render

    src = audit.verify(str(installed[1]))
    assert src.ok, render.render_verify(src)
    assert {a.device.arch for a in src.artifacts} == {"sm_90", "interpreter"}


def test_tuned_shapes_served_offline_with_zero_searches(installed):
    py, _, tmp = installed
    shapes = [(e["kernel"], s) for e in PLAN for s in e["shapes"]]
    res, _ = run(py, tmp, shapes)
    assert all(res["ok"])
    for kernel in {k for k, _ in shapes}:
        s = res["stats"][kernel]
        assert s["searches"] == 0
        assert s["calls"]["offline"] == sum(1 for k, _ in shapes if k == kernel)
        assert s["calls"]["heuristic"] == 0 and s["offline_levels"] == {"exact": s["calls"]["offline"]}


def test_untuned_shapes_served_by_heuristic(installed):
    py, _, tmp = installed
    shapes = [("sample_pkg.rmsnorm", {"M": 3, "N": 200}), ("sample_pkg.softmax", {"M": 5, "N": 300}),
              ("sample_pkg.matmul", {"M": 48, "N": 40, "K": 24})]
    res, err = run(py, tmp, shapes)
    assert all(res["ok"]) and "FlytuneWarning" not in err
    for kernel, _ in shapes:
        assert res["stats"][kernel]["calls"]["heuristic"] == 1 and res["stats"][kernel]["searches"] == 0


def test_mismatched_device_falls_back_to_heuristic_with_one_warning(installed):
    py, _, tmp = installed
    shapes = [("sample_pkg.rmsnorm", s) for s in PLAN[0]["shapes"]]
    res, err = run(py, tmp, shapes, FLYTUNE_DEVICE="hip:gfx942:304:AMD Instinct MI300X")
    assert all(res["ok"])
    s = res["stats"]["sample_pkg.rmsnorm"]
    assert s["calls"]["heuristic"] == len(shapes) and s["calls"]["offline"] == 0 and s["searches"] == 0
    assert err.count("no artifact matches this device") == 1
