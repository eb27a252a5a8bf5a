"""FLYTUNE_AUTOTUNE=bundle, the one-step proof that the installed bundle serves a shape: only the offline
tier answers, from installed bundles only (the scratch cache, which holds every winner `flytune tune`
found, and FLYTUNE_ARTIFACT_DIR are skipped), and anything else is a TierMissError naming the kernel,
the key, the device and why (`runtime.serving.kernel.ORDER`, ported and adopted kernels alike). And Inductor
artifacts in the tools that cannot compile them: `verify --deep` checks them by the build's rules, and
`warmup` says torch.compile compiles them under `flytune_build.inductor.serve()`. Real wheels laid out
in site directories, real kernels on the interpreter."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from buildkit import H200, KERNEL, artifact, install
from conftest import ROOT, python_env
from test_ownership import (
    ADOPTED_SOURCE,
    KERNEL_NAME,
    PKG,
    adopted_key,
    owner_project,
    pack_project,
    project,
    served,
)

import flytune_build as ft
from flytune_build import FlytuneWarning
from flytune_build.core import settings
from flytune_build.core.errors import SettingsError, TierMissError
from flytune_build.runtime.serving import kernel, registry

EXAMPLE = ROOT / "examples" / "compiled_model"


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A site directory first on sys.path, `ownpkg` not imported yet (as tests/test_ownership.py's)."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    sys.modules.pop(PKG, None)
    importlib.invalidate_caches()
    yield site
    sys.modules.pop(PKG, None)


def call(n: int):
    """ownpkg.add on n elements, as the process's tiers serve it now (no reset)."""
    x = torch.randn(n)
    assert torch.allclose(importlib.import_module(PKG).add(x, x), 2 * x)


def calls() -> dict:
    return ft.stats()[KERNEL_NAME]["calls"]


def searched_into_scratch(monkeypatch, *shapes: int) -> None:
    """What `flytune tune` leaves behind: each shape's winner searched here, in the scratch cache."""
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "1")
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    ft.reset_stats()
    for n in shapes:
        call(n)
    assert ft.stats()[KERNEL_NAME]["searches"] == len(shapes)
    monkeypatch.delenv("FLYTUNE_RANKING")


def test_bundle_mode_is_one_tier_order_of_the_table():
    assert kernel.ORDER["bundle"] == ("offline", "miss")
    assert settings.read({"FLYTUNE_AUTOTUNE": " Bundle "}).autotune == "bundle"
    with pytest.raises(SettingsError, match="strict, bundle"):
        settings.read({"FLYTUNE_AUTOTUNE": "bundles"})


def test_strict_passes_on_the_scratch_cache_and_bundle_mode_tells_the_bundle_from_it(tmp_path, site, monkeypatch):
    """The guide's trap: after a tune, strict mode passes with `scratch: 2, offline: 0` whether or not
    the bundle holds the shapes. Under FLYTUNE_AUTOTUNE=bundle the bundled shape is served by the bundle
    and the other raises, naming kernel, key, device and why."""
    install(site, owner_project(tmp_path), "ownpkg")   # bundles n=100 only
    searched_into_scratch(monkeypatch, 100, 200)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "strict")
    ft.reset_stats()
    call(100)
    call(200)
    assert (calls()["scratch"], calls()["offline"]) == (2, 0)   # proves zero search, not the bundle
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "bundle")
    ft.reset_stats()
    call(100)
    assert (calls()["scratch"], calls()["offline"]) == (0, 1)
    with pytest.raises(TierMissError) as e:
        call(200)
    text = str(e.value)
    assert text.startswith(f"kernel {KERNEL_NAME}: Field `key` is not served by an installed bundle for key ")
    assert "'n': 200" in text and "on device interpreter" in text
    assert "ownpkg bundle serves 1 tuned key(s) of it on interpreter, not this one" in text
    assert "the scratch cache" in text and ft.stats()[KERNEL_NAME]["searches"] == 0


def test_bundle_mode_serves_an_adopted_kernel_alike(tmp_path, site, monkeypatch):
    install(site, project(tmp_path / "owner", "ownpkg", PKG, [artifact(100, 32, kernel=KERNEL_NAME,
                                                                       key=adopted_key(100))], "", ADOPTED_SOURCE),
            "ownpkg")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "bundle")
    ft.reset_stats()
    call(100)
    call(100)
    assert calls()["offline"] == 2 and importlib.import_module(PKG).add_kernel.best_config.kwargs == {"BLOCK": 32}
    with pytest.raises(TierMissError, match=r"is not served by an installed bundle for key \{.*'n': 200.*\} on device "
                                            r"interpreter: ownpkg bundle serves 1 tuned key\(s\)"):
        call(200)
    assert registry.kernel(KERNEL_NAME).stats()["searches"] == 0


@pytest.mark.parametrize("kind", ["ported", "adopted"])
def test_bundle_mode_never_reads_flytune_artifact_dir(tmp_path, site, monkeypatch, kind):
    """A key only the user's artifact directory holds is no proof of the bundle: a miss, saying so."""
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.config import Config
    from flytune_build.core.device import INTERPRETER

    code = ADOPTED_SOURCE if kind == "adopted" else KERNEL.replace("fixpkg.add", KERNEL_NAME)
    key = adopted_key if kind == "adopted" else (lambda n: {"x": "float32", "n": n})
    install(site, project(tmp_path / "owner", "ownpkg", PKG, [artifact(100, 32, kernel=KERNEL_NAME, key=key(100))],
                          "", code), "ownpkg")
    Artifact(KERNEL_NAME, key(200), INTERPRETER, Config({"BLOCK": 32})).save(tmp_path / "mine")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "mine"))
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "bundle")
    ft.reset_stats()
    with pytest.warns(FlytuneWarning, match="not read under FLYTUNE_AUTOTUNE=bundle"):
        call(100)
    with pytest.raises(TierMissError, match="FLYTUNE_ARTIFACT_DIR is not read under FLYTUNE_AUTOTUNE=bundle"):
        call(200)
    assert calls()["offline"] == 1


def test_bundle_mode_says_a_bundle_for_another_device_serves_nothing_here(tmp_path, site, monkeypatch):
    root = project(tmp_path / "owner", "ownpkg", PKG, [artifact(100, 32, dev=H200, kernel=KERNEL_NAME)], "",
                   KERNEL.replace("fixpkg.add", KERNEL_NAME))
    text = (root / "pyproject.toml").read_text()
    (root / "pyproject.toml").write_text(text.replace('targets = ["interpreter"]', 'targets = ["interpreter", '
                                                      '{ arch = "sm_90", name = "NVIDIA H200", units = 132 }]'))
    install(site, root, "ownpkg")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "bundle")
    ft.reset_stats()
    with pytest.warns(FlytuneWarning, match="no artifact matches"), \
            pytest.raises(TierMissError, match=r"no artifact matches this device \(interpreter\); bundled for: "
                                               r"cuda:sm_90:132:NVIDIA H200"):
        call(100)


def test_bundle_mode_names_a_bundle_that_does_not_own_its_package_and_why(tmp_path, site, monkeypatch):
    """The installed package shadowed by another copy imported first: the miss says which bundle holds the
    kernel and why it does not serve it, both paths named."""
    install(site, owner_project(tmp_path), "ownpkg")
    other = tmp_path / "elsewhere"
    (other / PKG).mkdir(parents=True)
    (other / PKG / "__init__.py").write_text(KERNEL.replace("fixpkg.add", KERNEL_NAME))
    monkeypatch.syspath_prepend(str(other))
    sys.modules.pop(PKG, None)
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "bundle")
    ft.reset_stats()
    with pytest.warns(FlytuneWarning, match="does not own"), pytest.raises(TierMissError) as e:
        call(100)
    assert "ownpkg bundle holds it but serves none of it: the distribution does not own package ownpkg" in str(e.value)
    assert str(other / PKG) in str(e.value) and str(site / PKG) in str(e.value)


def test_bundle_mode_with_no_bundle_installed_says_so(monkeypatch):
    import kernels as kk

    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "bundle")
    k = kk.make_add("proof.lonely")
    x = torch.randn(40)
    with pytest.raises(TierMissError, match="proof.lonely: .* no installed bundle holds artifacts for it"):
        k[kk.grid(40)](x, x, torch.empty(40), 40)


def test_bundle_mode_serves_an_accepted_pack(tmp_path, site, monkeypatch):
    install(site, owner_project(tmp_path, 'packs = ["vendor-configs"]'), "ownpkg")
    install(site, pack_project(tmp_path), "Vendor_Configs")
    monkeypatch.setenv("FLYTUNE_AUTOTUNE", "bundle")
    assert served(200) == ("offline", 64, "Vendor_Configs")


# -- Inductor artifacts: verify --deep and warmup ------------------------------------------------------------
@pytest.fixture(scope="module")
def example_wheel(tmp_path_factory) -> Path:
    from test_build import BLOCKER

    tmp = tmp_path_factory.mktemp("compiled_model")
    proj = tmp / "compiled_model"
    shutil.copytree(EXAMPLE, proj, ignore=shutil.ignore_patterns("build", "*.egg-info", "dist"))
    r = subprocess.run([sys.executable, "-c", BLOCKER, str(proj), str(tmp / "out")], capture_output=True,
                       text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    (whl,) = (tmp / "out").glob("*.whl")
    return whl


def flytune(*args, site: Path, **env):
    return subprocess.run([sys.executable, "-m", "flytune_build.cli", *map(str, args)], capture_output=True,
                          text=True, env=python_env(PYTHONPATH=f"{site}{os.pathsep}{ROOT}", TRITON_INTERPRET=1,
                                                    **env), check=False)


def test_verify_deep_of_the_compiled_model_example_wheel_passes(example_wheel, tmp_path):
    site = tmp_path / "site"
    with zipfile.ZipFile(example_wheel) as zf:
        zf.extractall(site)
    r = flytune("verify", "--deep", "--json", example_wheel, site=site)
    assert r.returncode == 0, r.stdout + r.stderr
    (report,) = json.loads(r.stdout)["reports"]
    assert report["errors"] == [] and "neither defines nor adopts" not in r.stdout
    assert any("5 Inductor artifact(s) checked by the build's rules only" in w and "inductor.serve()" in w
               for w in report["warnings"])


@pytest.mark.parametrize("example", ["compiled_model", "triton_features"])
def test_the_projects_own_examples_pass_verify_deep(example, tmp_path):
    proj = ROOT / "examples" / example
    r = flytune("verify", "--deep", proj, site=proj, FLYTUNE_CACHE_DIR=tmp_path / "cache")
    assert r.returncode == 0, r.stdout + r.stderr


def test_verify_deep_checks_an_inductor_artifact_by_the_builds_rules_and_execute_skips_it(tmp_path):
    """Beside a kernel the package defines: the Inductor artifact is no violation for not being one;
    --execute runs the package's own and records the Inductor one as skipped, and why."""
    from buildkit import make_project

    from flytune_build.audit import execution
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.config import Config
    from flytune_build.core.device import INTERPRETER

    proj = make_project(tmp_path / "p", artifacts=[artifact(100, 32)], extra='coverage = "none"')
    good = Artifact("fixpkg.block", {"inductor_source": "a" * 64}, INTERPRETER, Config({"XBLOCK": 64}, num_warps=4),
                    {"triton": "3.6.0"})
    good.save(proj / "artifacts")
    init = proj / "fixpkg" / "__init__.py"
    init.write_text(init.read_text().replace('name="fixpkg.add")', 'name="fixpkg.add", validate=lambda key: None)'))
    r = flytune("verify", "--deep", "--execute", "--json", proj, site=proj, FLYTUNE_CACHE_DIR=tmp_path / "cache")
    (report,) = json.loads(r.stdout)["reports"]
    assert r.returncode == 0, r.stdout + r.stderr
    skipped = {x["artifact"]: x["skipped"] for x in report["execution"]}
    assert skipped[artifact(100, 32).filename] is None  # the package's own kernel: executed
    assert skipped[good.filename] == execution.INDUCTOR_SKIPPED, report
    assert not any("neither defines nor adopts" in e["rule"] for e in report["errors"]), report
    # what the build's rules refuse, --deep refuses too (it is handed the artifacts the build would see)
    from flytune_build.audit.source import Source

    bad = Artifact("compiledonly.block", {"inductor_source": "a" * 64}, INTERPRETER,
                   Config({"XBLOCK": 48, "BAD": 1}))
    (tmp_path / "lib" / "compiledonly").mkdir(parents=True)  # a package whose only artifacts are Inductor's
    (tmp_path / "lib" / "compiledonly" / "__init__.py").write_text("")
    src = Source(str(tmp_path / "lib"), "project")
    src.package, src.modules, src.artifacts = "compiledonly", {"compiledonly"}, [bad]
    sys.path.insert(0, str(tmp_path / "lib"))
    try:
        execution.check(src)
    finally:
        sys.path.remove(str(tmp_path / "lib"))
        sys.modules.pop("compiledonly", None)
    assert sorted(e.field for e in src.errors) == ["config.kwargs.BAD", "config.kwargs.XBLOCK"], src.errors


def test_warmup_says_inductor_artifacts_are_compiled_by_torch_compile_not_to_retune(tmp_path, monkeypatch):
    from flytune_build.runtime.warming import warmup

    proj = tmp_path / "compiled_model"
    shutil.copytree(EXAMPLE, proj, ignore=shutil.ignore_patterns("build", "*.egg-info", "dist"))
    site = tmp_path / "site"
    install(site, proj, "compiled-model")
    monkeypatch.syspath_prepend(str(site))
    units, _ = warmup.plan(("compiled-model",), dev=H200)
    assert units and all(u.status == "skipped" for u in units)
    for u in units:
        assert "flytune_build.inductor.serve()" in u.note and "torch.compile" in u.note and "re-tune" not in u.note
    r = flytune("warmup", "compiled-model", site=site, FLYTUNE_DEVICE=H200.spec())
    assert r.returncode == 0 and "re-tune" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "flytune_build.inductor.serve()" in r.stdout
