"""Any build backend: hatchling through its build hook, every other one (flit_core here) through
`flytune bundle`, setuptools without naming it. Each: build, `flytune verify`, install into a fresh venv,
and a real kernel call under TRITON_INTERPRET=1 served by the offline tier."""
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from buildkit import TOOL, artifact, child_install, child_venv, make_project, run_child, spoil_num_warps
from conftest import flytune, python_env

from flytune_build import pipeline

HATCH = """
[build-system]
requires = ["hatchling", "flytune-build"]
build-backend = "hatchling.build"

[project]
name = "fixpkg"
version = "1.0"

[tool.hatch.build.hooks.flytune]

[tool.hatch.build.targets.wheel]
dev-mode-dirs = ["."]
"""

FLIT = """
[build-system]
requires = ["flit_core>=3.9"]
build-backend = "flit_core.buildapi"

[project]
name = "fixpkg"
version = "1.0"
description = "a kernel package built by flit"

[project.entry-points."flytune.bundles"]
fixpkg = "fixpkg._flytune"
"""

SERVE = """
    import torch, fixpkg
    x = torch.arange(100.0); y = torch.ones(100)
    assert torch.equal(fixpkg.add(x, y), x + y)
    d = fixpkg.add_kernel.decision(x, y, None, 100)
    print(d.tier, d.config.kwargs["BLOCK"])
"""


def project(root: Path, build_system: str, **kw) -> Path:
    make_project(root, **kw)
    (root / "pyproject.toml").write_text(build_system + TOOL.format(extra=""))
    return root


def build(proj: Path, out: Path, *args, isolation=False, env=None):
    cmd = [sys.executable, "-m", "build", *args, "--outdir", str(out), str(proj)]
    if not isolation:
        cmd.insert(3, "--no-isolation")
    return subprocess.run(cmd, capture_output=True, text=True, cwd=proj, env=env or dict(os.environ))


def bundle_of(whl: Path) -> dict:
    with zipfile.ZipFile(whl) as zf:
        return {n: zf.read(n) for n in zf.namelist() if "/_flytune/" in n}


def serves_offline(tmp: Path, flytune_wheel: Path, whl: Path) -> list:
    py = child_venv(tmp / "venv")
    r = child_install(py, flytune_wheel, whl)
    assert r.returncode == 0, r.stderr
    r = run_child(py, SERVE, TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp / "cache")
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_hatchling_hook_bundles_verifies_and_the_installed_wheel_serves_offline(tmp_path, flytune_wheel):
    proj = project(tmp_path / "p", HATCH)
    r = build(proj, tmp_path / "dist")  # sdist, then the wheel from the unpacked sdist
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "kept 2, excluded 0" in r.stdout + r.stderr  # the build report, as with setuptools
    (whl,) = (tmp_path / "dist").glob("*.whl")
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    expected = pipeline.run(proj, out=io.StringIO()).files
    assert bundle_of(whl) == expected  # the setuptools backend's bundle, byte for byte
    with zipfile.ZipFile(whl) as zf:
        assert "[flytune.bundles]\nfixpkg = fixpkg._flytune" in zf.read("fixpkg-1.0.dist-info/entry_points.txt").decode()
    import tarfile

    with tarfile.open(sdist) as tf:
        assert {f"fixpkg-1.0/artifacts/{p.name}" for p in (proj / "artifacts").iterdir()} <= set(tf.getnames())
    r = flytune("verify", whl)
    assert r.returncode == 0 and "ok; 2 artifact(s), 1 kernel(s)" in r.stdout, r.stdout + r.stderr
    again = build(proj, tmp_path / "again", "--wheel")
    assert again.returncode == 0 and (tmp_path / "again" / whl.name).read_bytes() == whl.read_bytes()
    assert serves_offline(tmp_path, flytune_wheel, whl) == ["offline", "32"]


def test_hatchling_hook_failed_verification_is_one_line_per_problem_and_no_wheel(tmp_path):
    bad = artifact(100, 32)
    proj = project(tmp_path / "p", HATCH, artifacts=[bad])
    spoil_num_warps(proj, bad)
    r = build(proj, tmp_path / "dist", "--wheel")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "flytune: error:" in out and "config.num_warps" in out
    assert "Traceback" not in out
    assert not list((tmp_path / "dist").glob("*.whl")) if (tmp_path / "dist").exists() else True


def test_hatchling_editable_install_serves_the_bundle(tmp_path, flytune_wheel):
    proj = project(tmp_path / "p", HATCH)
    py = child_venv(tmp_path / "venv")
    assert child_install(py, flytune_wheel).returncode == 0
    r = child_install(py, editable=proj)
    assert r.returncode == 0, r.stderr
    r = run_child(py, SERVE, TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["offline", "32"]
    located = run_child(py, "import fixpkg; print(fixpkg.__file__)").stdout.strip()
    assert Path(located).resolve() == (proj / "fixpkg" / "__init__.py").resolve()  # imported from the source tree


def test_bundle_command_then_flit_builds_a_wheel_that_verifies_and_serves_offline(tmp_path, flytune_wheel):
    proj = project(tmp_path / "p", FLIT)
    r = flytune("bundle", "--output", "fixpkg", cwd=proj)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == ['[project.entry-points."flytune.bundles"]', 'fixpkg = "fixpkg._flytune"']
    assert "kept 2, excluded 0" in r.stderr
    r = build(proj, tmp_path / "dist", "--wheel")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = (tmp_path / "dist").glob("*.whl")
    assert bundle_of(whl) == pipeline.run(proj, out=io.StringIO()).files
    r = flytune("verify", whl)
    assert r.returncode == 0 and "ok; 2 artifact(s), 1 kernel(s)" in r.stdout, r.stdout + r.stderr
    assert serves_offline(tmp_path, flytune_wheel, whl) == ["offline", "32"]


def test_bundle_command_failed_verification_exits_1_and_writes_nothing(tmp_path):
    bad = artifact(100, 32)
    proj = project(tmp_path / "p", FLIT, artifacts=[bad])
    spoil_num_warps(proj, bad)
    r = flytune("bundle", "--output", proj / "fixpkg", "--project", proj)
    assert r.returncode == 1 and "config.num_warps" in r.stderr and "Traceback" not in r.stderr
    assert not (proj / "fixpkg" / "_flytune").exists()


def test_bundle_command_replaces_its_own_directory_but_no_other(tmp_path):
    proj = project(tmp_path / "p", FLIT)
    stale = proj / "fixpkg" / "_flytune" / "fixpkg.removed.json"
    assert flytune("bundle", "--output", proj / "fixpkg", "--project", proj).returncode == 0
    stale.write_text("{}")
    assert flytune("bundle", "--output", proj / "fixpkg", "--project", proj).returncode == 0
    assert not stale.exists() and (proj / "fixpkg" / "_flytune" / "manifest.json").is_file()
    before = {p.name: p.read_bytes() for p in (proj / "fixpkg" / "_flytune").iterdir()}
    (proj / "fixpkg" / "_flytune" / "__init__.py").write_text("")   # a user's: never removed unseen
    (proj / "fixpkg" / "_flytune" / "notes").mkdir()
    r = flytune("bundle", "--output", proj / "fixpkg", "--project", proj)
    assert r.returncode == 1 and "holds __init__.py, notes, which no flytune bundle holds" in r.stderr
    assert "Traceback" not in r.stderr and (proj / "fixpkg" / "_flytune" / "__init__.py").is_file()
    assert {p.name: p.read_bytes() for p in (proj / "fixpkg" / "_flytune").iterdir() if p.suffix == ".json"} == before
    (proj / "fixpkg" / "_flytune" / "__init__.py").unlink()
    (proj / "fixpkg" / "_flytune" / "notes").rmdir()
    (proj / "fixpkg" / "_flytune" / ".DS_Store").write_bytes(b"\0")   # a file browser's: no reason to refuse
    assert flytune("bundle", "--output", proj / "fixpkg", "--project", proj).returncode == 0
    other = tmp_path / "q" / "fixpkg"
    (other / "_flytune").mkdir(parents=True)
    (other / "_flytune" / "mine.txt").write_text("not a bundle")
    r = flytune("bundle", "--output", other, "--project", proj)
    assert r.returncode == 1 and "is not a flytune bundle" in r.stderr
    (tmp_path / "r" / "fixpkg").mkdir(parents=True)   # a link to a real bundle: refused as a link
    (tmp_path / "r" / "fixpkg" / "_flytune").symlink_to(proj / "fixpkg" / "_flytune")
    r = flytune("bundle", "--output", tmp_path / "r" / "fixpkg", "--project", proj)
    assert r.returncode == 1 and "is a symbolic link (to " in r.stderr and "no manifest" not in r.stderr
    assert (other / "_flytune" / "mine.txt").read_text() == "not a bundle"
    (tmp_path / "elsewhere").mkdir()   # an existing folder named otherwise: bundled there, with a warning
    r = flytune("bundle", "--output", tmp_path / "elsewhere", "--project", proj)
    assert r.returncode == 0 and "is not the directory of package fixpkg" in r.stderr
    r = flytune("bundle", "--output", tmp_path / "fixpkh", "--project", proj)   # a typo: nothing made
    assert r.returncode == 2 and not (tmp_path / "fixpkh").exists()


BLOCK_SETUPTOOLS = """
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("setuptools", "_distutils_hack"):
            raise ImportError("no setuptools here")
sys.meta_path.insert(0, Block())
import os, flytune_build.backend as b
print(b.get_requires_for_build_wheel(), b.get_requires_for_build_sdist(), b.get_requires_for_build_editable())
os.chdir(sys.argv[1])
b.build_wheel(sys.argv[2])
"""


def test_backend_without_setuptools_asks_the_frontend_for_it_and_never_tracebacks(tmp_path):
    proj = make_project(tmp_path / "p")
    r = subprocess.run([sys.executable, "-c", BLOCK_SETUPTOOLS, str(proj), str(tmp_path / "out")],
                       capture_output=True, text=True, env=python_env())
    assert r.stdout.splitlines()[0] == "['setuptools>=70'] ['setuptools>=70'] ['setuptools>=70']"
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert 'add "setuptools>=70" to [build-system] requires' in r.stderr


def test_requires_flytune_build_alone_builds_in_isolation(tmp_path, flytune_wheel):
    proj = make_project(tmp_path / "p")
    text = (proj / "pyproject.toml").read_text().replace('requires = ["setuptools>=70", "flytune-build"]',
                                                         'requires = ["flytune-build"]')
    (proj / "pyproject.toml").write_text(text)
    env = dict(os.environ, PIP_FIND_LINKS=str(flytune_wheel.parent))
    r = build(proj, tmp_path / "dist", "--wheel", isolation=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (whl,) = (tmp_path / "dist").glob("*.whl")
    assert bundle_of(whl) == pipeline.run(proj, out=io.StringIO()).files
