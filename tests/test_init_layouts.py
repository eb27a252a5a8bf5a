"""`flytune init` on the layouts and sources a package really has: a package that `package-dir` maps is
configured and shipped under its own name; a setups module the package already holds in any form is
kept; every module it cannot read and every kernel it cannot name is said, never skipped in silence; a
tune output's placeholders are checked; the next steps follow the declared targets."""
import zipfile
from pathlib import Path

import pytest
from buildkit import pip_wheel
from test_init import KERNELS, PYPROJECT, init, package, snapshot

from flytune_build.core import project as project_mod
from flytune_build.core.codec import Fields
from flytune_build.core.errors import InputError, ProjectError

MAPPED = '\n[tool.setuptools.package-dir]\nmylib = "lib"\n'


def mapped_package(root: Path, pyproject=PYPROJECT + MAPPED, directory="lib") -> Path:
    (root / directory).mkdir(parents=True)
    (root / directory / "__init__.py").write_text("")
    (root / directory / "kernels.py").write_text(KERNELS)
    (root / "pyproject.toml").write_text(pyproject)
    return root


@pytest.mark.parametrize("args", [(), ("--package", "mylib")])
def test_init_of_a_package_dir_layout_configures_and_ships_the_mapped_package(tmp_path, capsys, args):
    root = mapped_package(tmp_path / "p")
    assert init(root, *args) == 0
    out = capsys.readouterr().out
    assert "found 2 kernel(s) in mylib" in out and "packages.find" not in out
    text = (root / "pyproject.toml").read_text()
    assert "packages.find" not in text and project_mod.load(root).package == "mylib"
    assert (root / "lib" / "tuning.py").is_file() and not (root / "mylib").exists()
    assert [e.setup for e in project_mod.load_plan(root, "tune/plan.toml")] == ["mylib.tuning:add",
                                                                                 "mylib.tuning:scale"]
    # and the wheel ships mylib, whole, from lib/
    (root / "pyproject.toml").write_text(text.replace('sources = ["artifacts"]\n',
                                                      'sources = ["artifacts"]\ncoverage = "none"\n'))
    (root / "artifacts").mkdir()
    r = pip_wheel(root, tmp_path / "dist")
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}
    assert {"mylib/__init__.py", "mylib/kernels.py", "mylib/tuning.py"} <= names
    assert all(n.startswith("mylib/") for n in names), names


def test_init_finds_a_package_under_the_directory_package_dir_names_for_all(tmp_path, capsys):
    root = mapped_package(tmp_path, PYPROJECT + '\n[tool.setuptools.package-dir]\n"" = "lib"\n', "lib/mylib")
    assert init(root) == 0
    assert "packages.find" not in (root / "pyproject.toml").read_text()
    assert project_mod.load(root).package == "mylib" and (root / "lib" / "mylib" / "tuning.py").is_file()


# -- the setups module: one the package holds in any form is kept; a file that is none is refused -----------
@pytest.mark.parametrize("make", [
    lambda d: ((d / "tuning").mkdir(), (d / "tuning" / "__init__.py").write_text("# mine\n")),  # a package
    lambda d: ((d / "tuning").mkdir(), (d / "tuning" / "add.py").write_text("# mine\n")),       # a namespace
])
def test_init_keeps_a_tuning_package_and_writes_no_module_it_would_shadow(tmp_path, capsys, make):
    root = package(tmp_path)
    make(root / "mylib")
    assert init(root) == 0
    assert "kept mylib/tuning/ (it exists)" in capsys.readouterr().out
    assert not (root / "mylib" / "tuning.py").exists()


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: p.symlink_to("missing.py")])
def test_init_refuses_a_tuning_py_that_is_no_regular_file_and_writes_nothing(tmp_path, capsys, make):
    root = package(tmp_path)
    make(root / "mylib" / "tuning.py")
    before = snapshot(root)
    assert init(root) == 1
    err = capsys.readouterr().err
    assert f"{root / 'mylib' / 'tuning.py'}: is not a regular file, and `flytune init` writes the setups module " \
           f"mylib/tuning.py there: move it aside" in err and err.count("\n") == 1, err
    assert snapshot(root) == before and "[tool.flytune]" not in (root / "pyproject.toml").read_text()


# -- a tune output's placeholders ----------------------------------------------------------------------------
@pytest.mark.parametrize("output, said", [
    ("artifacts/{arhc}", "has `{arhc}` in 'artifacts/{arhc}', which is no placeholder: did you mean `{arch}`?"),
    ("artifacts/{ARCH}", "did you mean `{arch}`?"),
    ("artifacts/{arch", "has a `{` that no `}` closes in 'artifacts/{arch'"),
    ("artifacts/{gpu}", "write one of {arch}, {backend}, {device}"),
])
def test_a_tune_output_that_is_no_template_is_refused_naming_the_placeholder(tmp_path, capsys, output, said):
    from flytune_build.cli.main import main

    root = package(tmp_path)
    assert init(root) == 0
    text = (root / "pyproject.toml").read_text().replace('output = "artifacts/{arch}"', f'output = "{output}"')
    (root / "pyproject.toml").write_text(text)
    with pytest.raises(ProjectError, match="did you|closes|write one") as e:
        project_mod.load(root)
    assert e.value.field == "tool.flytune.tune.output" and said in e.value.rule
    capsys.readouterr()
    assert main(["tune", "--project", str(root), "--ranking", "synthetic", "--allow-ci", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert err.count(said) == 1 and not [p for p in root.rglob("*") if "{" in p.name], err  # no `{arhc}/` made
    with pytest.raises(InputError, match="--output"):  # the rule a --output flag is checked by
        project_mod.check_output_template(output, Fields(None, InputError), "--output")
    assert project_mod.check_output_template("out/{device}-{backend}/{arch}", Fields(None, InputError), "--output")


# -- every module read as Python reads it; one it cannot read is said ----------------------------------------
def test_init_reads_a_module_in_its_declared_coding_and_names_one_it_cannot_parse(tmp_path, capsys):
    root = package(tmp_path)
    (root / "mylib" / "kernels.py").write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + KERNELS.encode())
    (root / "mylib" / "broken.py").write_text("import triton\n\ndef f(:\n    pass\n")
    assert init(root) == 0
    out = capsys.readouterr().out
    assert "found 2 kernel(s) in mylib" in out
    assert "mylib/broken.py:3: is not valid Python (invalid syntax), so any kernel it declares is not in " \
           "tune/plan.toml: fix it, then run `flytune init --force`" in out


def test_init_that_reads_no_module_says_so_not_that_there_is_no_kernel(tmp_path, capsys):
    root = package(tmp_path)
    (root / "mylib" / "kernels.py").write_text(KERNELS.replace("def add_kernel(", "def add_kernel(("))
    assert init(root) == 0
    out = capsys.readouterr().out
    assert "found 0 kernel(s)" in out and "mylib/kernels.py:" in out and "is not valid Python" in out
    assert "no kernel found in mylib (in the modules it could read: see above)" in out


# -- a kernel's name: read as the module spells it, never guessed; two kernels never share one --------------
NAMED = '''
import triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config

NAME = "mylib.mul"
OTHER = "mylib.twice"
OTHER = "mylib.thrice"


def name_of(x):
    return x


@ft.autotune([Config({"BLOCK": 64})], key=["n"], name=NAME)
@triton.jit
def mul_kernel(x, n, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), 1.0, mask=tl.arange(0, BLOCK) < n)


@ft.autotune([Config({"BLOCK": 64})], key=["n"], name=OTHER)
@triton.jit
def twice_kernel(x, n, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), 1.0, mask=tl.arange(0, BLOCK) < n)


@ft.autotune([Config({"BLOCK": 64})], key=["n"], name=name_of("mylib.f"))
@triton.jit
def called_kernel(x, n, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), 1.0, mask=tl.arange(0, BLOCK) < n)


@ft.autotune([Config({"BLOCK": 64})], key=["n"], name="mylib.mul")
@triton.jit
def again_kernel(x, n, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), 1.0, mask=tl.arange(0, BLOCK) < n)
'''


def test_init_reads_a_name_constant_and_leaves_out_a_name_it_cannot_read_or_one_named_twice(tmp_path, capsys):
    root = package(tmp_path)
    (root / "mylib" / "kernels.py").write_text(NAMED)
    assert init(root) == 0
    out = capsys.readouterr().out
    assert [e.kernel for e in project_mod.load_plan(root, "tune/plan.toml")] == ["mylib.mul"]
    assert "mylib/kernels.py:24: twice_kernel is left out of tune/plan.toml: its name= is neither a string " \
           "literal nor a string constant its module binds once" in out  # OTHER is bound twice
    assert "mylib/kernels.py:30: called_kernel is left out" in out
    assert "mylib/kernels.py:36: again_kernel is left out of tune/plan.toml: its name 'mylib.mul' is the name " \
           "of mul_kernel (mylib/kernels.py:18) too" in out


# -- the next steps follow the targets; what the build system lacks is named ---------------------------------
def test_init_for_a_gpu_target_only_gives_no_cpu_tune_step(tmp_path, capsys):
    root = package(tmp_path)
    assert init(root, "--target", "sm_90") == 0
    out = capsys.readouterr().out
    assert "TRITON_INTERPRET=1" not in out and "artifacts/interpreter" not in out
    assert "flytune tune" in out and "tune on a sm_90 GPU: artifacts/sm_90/" in out
    root2 = package(tmp_path / "both")
    assert init(root2, "--target", "interpreter", "--target", "sm_90") == 0
    out = capsys.readouterr().out
    assert "artifacts/interpreter/" in out and "artifacts/sm_90/" in out


def test_init_names_a_missing_build_backend_and_a_missing_project_table(tmp_path, capsys):
    root = package(tmp_path, '[build-system]\nrequires = ["setuptools>=70"]\n')
    assert init(root) == 0
    out = capsys.readouterr().out
    assert "(None)" not in out and 'build-backend = "flytune_build.backend" (none is named' in out
    assert "pyproject.toml has no [project] table" in out
