"""examples/compiled_model: the Inductor winners harvested on an H200 (torch 2.11, triton 3.6) ship in its
wheel, verify at package time with no torch, and are what serve() hands Inductor on a matching device.

The artifacts are the real output of `benchmarks/inductor_compile.py` step H on an H200 (docs/benchmarks.md);
tests/data/inductor/h200-ma/ holds part of the max-autotune harvest of the same model (pointwise,
persistent-reduction and GEMM-template kernels, the last with no size hints and no block sizes)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import flytune_build as ft
from flytune_build.core import inductor
from flytune_build.core.artifact import Artifact
from flytune_build.core.device import DeviceIdentity
from buildkit import install
from test_build import BLOCKER

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "compiled_model"
SHIPPED = EXAMPLE / "artifacts" / "sm_90"
MA = Path(__file__).parent / "data" / "inductor" / "h200-ma"
H200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
A100 = DeviceIdentity("cuda", "sm_80", "NVIDIA A100-SXM4-80GB", 108)


def harvested(directory: Path) -> dict[str, Artifact]:
    docs = [Artifact.from_json(json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]
    return {a.key[inductor.AXIS]: a for a in docs}


def test_the_example_ships_winners_measured_on_an_h200():
    arts = harvested(SHIPPED)
    assert len(arts) == 5
    for a in arts.values():
        assert (a.kernel, a.device) == ("compiled_model.block", H200)
        assert a.provenance["ranking"] == "measured" and len(a.provenance["candidates"]) >= 2
        assert a.provenance["torch"].startswith("2.11") and a.provenance["inductor"]["mode"] == "default"
        assert inductor.problems(a.key, a.config) == []


@pytest.mark.parametrize("directory", [SHIPPED, MA], ids=["torch.compile", "max-autotune"])
def test_real_harvests_verify_clean(directory):
    src = ft.verify(str(directory))
    assert not src.errors, src.errors


def test_the_example_wheel_builds_without_torch_and_verifies(tmp_path):
    proj = tmp_path / "compiled_model"
    shutil.copytree(EXAMPLE, proj, ignore=shutil.ignore_patterns("build", "*.egg-info", "dist"))
    r = subprocess.run([sys.executable, "-c", BLOCKER, str(proj), str(tmp_path / "out")], capture_output=True,
                       text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = (tmp_path / "out").glob("*.whl")
    src = ft.verify(str(wheel))
    assert not src.errors, src.errors
    with zipfile.ZipFile(wheel) as z:
        assert any(n.startswith("compiled_model/_flytune/") for n in z.namelist())


@pytest.fixture
def installed_example(tmp_path, monkeypatch):
    """The example laid out in a site directory as its wheel installs, its package imported from there."""
    proj = tmp_path / "compiled_model"
    shutil.copytree(EXAMPLE, proj, ignore=shutil.ignore_patterns("build", "*.egg-info", "dist"))
    site = tmp_path / "site"
    install(site, proj, "compiled-model")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "compiled_model", raising=False)
    monkeypatch.delenv("FLYTUNE_ARTIFACT_DIR", raising=False)
    ft.reset_stats()
    return site


def test_on_an_h200_the_installed_winners_are_what_inductor_looks_up(installed_example, monkeypatch):
    from flytune_build import inductor as ft_inductor

    monkeypatch.setenv("FLYTUNE_DEVICE", H200.spec())
    want = {key: inductor.table_entry(a.config) for key, a in harvested(SHIPPED).items()}
    with ft_inductor.serve(("compiled_model",)):
        assert torch._inductor.config.autotune_lookup_table == want
    assert torch._inductor.config.autotune_lookup_table == {}


def test_on_another_gpu_the_installed_winners_are_not_served(installed_example, monkeypatch):
    from flytune_build import inductor as ft_inductor

    monkeypatch.setenv("FLYTUNE_DEVICE", A100.spec())
    with pytest.warns(ft.FlytuneWarning, match="holds Inductor winners for cuda:sm_90.*not for cuda:sm_80"):
        with ft_inductor.serve(("compiled_model",)):
            assert torch._inductor.config.autotune_lookup_table == {}


def test_the_report_names_each_inductor_kernel_and_the_coordinate_descent_moves():
    """5 of the max-autotune winners were moved by Inductor's coordinate descent off the benchmark's
    winner (a harvest made before such moves went through flytune's selection): said so, never taken
    for a config changed after tuning."""
    from flytune_build import review

    html = review.render(str(MA))
    assert html.count("Inductor kernel") == 12 and "triton_poi_fused_gelu_view_9 (max-autotune" in html
    assert html.count("moved the benchmark") == 5 and "changed after tuning" not in html
