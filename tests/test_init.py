"""`flytune init`: an existing package's [tool.flytune], plan and setups, found from its source without
importing it; nothing that is there is overwritten without --force, and a refusal writes nothing."""
import tomllib
from pathlib import Path

import pytest

from flytune_build.cli.main import main
from flytune_build.core import project as project_mod

KERNELS = '''
import triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config, pow2

raise RuntimeError("init must not import the package")


@ft.autotune([Config({"BLOCK": b}) for b in (64, 128)], key=["x", pow2("n")], default=lambda a: Config({"BLOCK": 64}))
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) + tl.load(y + offs, mask=offs < n), mask=offs < n)


@triton.autotune([triton.Config({"BLOCK": b}) for b in (64, 256)], key=["n"])
@triton.jit
def scale_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)
'''

PYPROJECT = '''[build-system]
requires = ["setuptools>=70", "flytune-build"]
build-backend = "flytune_build.backend"

[project]
name = "mylib"
version = "0.1.0"
dependencies = ["flytune-build"]  # kept as written
'''


def package(root: Path, pyproject=PYPROJECT, layout="."):
    pkg = root / layout / "mylib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernels.py").write_text(KERNELS)
    (root / "pyproject.toml").write_text(pyproject)
    return root


def snapshot(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def init(root, *args):
    return main(["init", "--project", str(root), *args])


def test_init_finds_both_kinds_of_kernel_without_importing_and_writes_a_plan_the_tuner_reads(tmp_path, capsys):
    root = package(tmp_path)
    assert init(root) == 0
    out = capsys.readouterr().out
    assert "mylib.kernels.add_kernel" in out and "mylib.scale" in out and "@triton.autotune" in out
    text = (root / "pyproject.toml").read_text()
    assert text.startswith(PYPROJECT)  # appended to, never rewritten
    proj = project_mod.load(root)
    assert proj.package == "mylib" and proj.tune_plan == "tune/plan.toml" and proj.tune_output == "artifacts/{arch}"
    assert [t.arch for t in proj.targets] == ["interpreter"]
    entries = project_mod.load_plan(root, proj.tune_plan)
    assert [(e.kernel, e.setup, e.shapes, e.autotuner) for e in entries] == [
        ("mylib.kernels.add_kernel", "mylib.tuning:add", ({"n": 1024},), None),  # x is loaded from: a tensor
        ("mylib.scale", "mylib.tuning:scale", ({"n": 1024},), "mylib.kernels:scale_kernel")]
    setups = (root / "mylib" / "tuning.py").read_text()
    assert "def add(n):" in setups and "def scale(n):" in setups
    compile(setups, "tuning.py", "exec")
    assert tomllib.loads(text)["tool"]["setuptools"]["packages"]["find"] == {"include": ["mylib*"]}
    # what is left to do, and the next three commands
    assert 'adopt(scale_kernel, name="mylib.scale")' in out
    assert "TRITON_INTERPRET=1 flytune tune --ranking synthetic" in out and "flytune verify dist/*.whl" in out


def test_init_never_overwrites_a_tool_flytune_table(tmp_path, capsys):
    root = package(tmp_path, PYPROJECT + '\n[tool.flytune]\nsources = ["mine"]\ntargets = ["sm_90"]\n')
    before = snapshot(root)
    assert init(root) == 1
    err = capsys.readouterr().err
    assert "pyproject.toml: already has a [tool.flytune] table; `flytune init` wrote nothing (--force" in err
    assert snapshot(root) == before


def test_init_never_overwrites_a_plan_file_and_writes_nothing_else_either(tmp_path, capsys):
    root = package(tmp_path)
    (root / "tune").mkdir()
    (root / "tune" / "plan.toml").write_text("# mine\n")
    before = snapshot(root)
    assert init(root) == 1
    assert "tune/plan.toml: already exists; `flytune init` wrote nothing" in capsys.readouterr().err
    assert snapshot(root) == before


def test_init_keeps_an_existing_setups_module_even_with_force(tmp_path, capsys):
    root = package(tmp_path)
    (root / "mylib" / "tuning.py").write_text("# mine\n")
    assert init(root, "--force") == 0
    assert "kept mylib/tuning.py (it exists)" in capsys.readouterr().out
    assert (root / "mylib" / "tuning.py").read_text() == "# mine\n"


def test_init_force_replaces_only_the_tool_flytune_tables(tmp_path, capsys):
    old = PYPROJECT + ('\n[tool.flytune]\nsources = ["old"]\ntargets = ["sm_80"]\n\n[tool.flytune.tune]\n'
                       'entries = []\n\n[tool.other]\nkeep = 1\n')
    root = package(tmp_path, old)
    assert init(root, "--force", "--target", "interpreter", "--target", "sm_90") == 0
    assert "replaced [tool.flytune] in pyproject.toml (--force)" in capsys.readouterr().out
    doc = tomllib.loads((root / "pyproject.toml").read_text())
    assert doc["tool"]["other"] == {"keep": 1} and doc["project"]["dependencies"] == ["flytune-build"]
    assert doc["tool"]["flytune"]["sources"] == ["artifacts"] and doc["tool"]["flytune"]["targets"] == [
        "interpreter", "sm_90"]


def test_init_refuses_to_force_a_tool_flytune_written_as_dotted_keys(tmp_path, capsys):
    root = package(tmp_path, PYPROJECT + '\n[tool]\nflytune.sources = ["x"]\n')
    before = snapshot(root)
    assert init(root, "--force") == 1
    assert "cannot replace; remove it by hand" in capsys.readouterr().err
    assert snapshot(root) == before


@pytest.mark.parametrize("layout, pyproject", [
    ("src", PYPROJECT),
    (".", PYPROJECT + '\n[tool.setuptools]\npackages = ["mylib"]\n'),
])
def test_init_adds_the_packages_find_fix_only_where_the_layout_needs_it(tmp_path, capsys, layout, pyproject):
    root = package(tmp_path, pyproject, layout)
    assert init(root) == 0
    assert "packages.find" not in capsys.readouterr().out
    assert "packages.find" not in (root / "pyproject.toml").read_text()
    assert project_mod.load(root).package == "mylib"


def test_init_without_a_pyproject_says_what_to_write_first(tmp_path, capsys):
    assert init(tmp_path) == 1
    assert "has no pyproject.toml: `flytune init` configures an existing package" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_init_of_a_project_with_a_setuptools_backend_says_which_backend_to_name(tmp_path, capsys):
    root = package(tmp_path, PYPROJECT.replace("flytune_build.backend", "setuptools.build_meta"))
    assert init(root) == 0
    assert 'build-backend = "flytune_build.backend"' in capsys.readouterr().out


def test_init_keeps_a_crlf_pyproject_byte_for_byte_and_appends(tmp_path, capsys):
    crlf = PYPROJECT.replace("\n", "\r\n").encode()
    root = package(tmp_path)
    (root / "pyproject.toml").write_bytes(crlf)
    assert init(root) == 0
    assert (root / "pyproject.toml").read_bytes().startswith(crlf)
    assert project_mod.load(root).package == "mylib"


def test_init_of_a_project_with_several_packages_asks_which(tmp_path, capsys):
    root = package(tmp_path)
    (root / "other").mkdir()
    (root / "other" / "__init__.py").write_text("")
    assert init(root) == 1
    assert "cannot tell which package to configure (several packages: mylib, other): pass --package NAME" in \
        capsys.readouterr().err
    assert not (root / "tune").exists()
    assert init(root, "--package", "mylib") == 0


def test_init_checks_a_target_by_the_rule_tool_flytune_follows_before_writing(tmp_path, capsys):
    root = package(tmp_path)
    before = snapshot(root)
    assert init(root, "--target", "sm 90") == 1
    assert "Field `--target[0]` must be" in capsys.readouterr().err
    assert snapshot(root) == before


def test_force_never_cuts_text_that_only_looks_like_a_tool_flytune_header(tmp_path):
    from flytune_build.core.errors import ProjectError
    from flytune_build.pipeline import scaffold

    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    text = ('[project]\nname = "mypkg"\nversion = "0.1"\ndescription = """Usage:\n[tool.flytune]\nsecret text\n'
            '[x]\n"""\n\n[tool.flytune]\npackage = "mypkg"\n')
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(ProjectError, match="header-like line inside a string"):
        scaffold.scaffold(tmp_path, force=True)
    assert (tmp_path / "pyproject.toml").read_text() == text


def _plain_project(root):
    (root / "mypkg").mkdir(parents=True)
    (root / "mypkg" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text('[project]\nname = "mypkg"\nversion = "0.1"\n')
    return root


def test_init_writes_nothing_through_a_link(tmp_path):
    from flytune_build.core.errors import InputError
    from flytune_build.pipeline import scaffold

    root = _plain_project(tmp_path / "p")
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "tune").symlink_to(outside)
    with pytest.raises(InputError, match="symlink"):
        scaffold.write(scaffold.scaffold(root))
    assert not list(outside.iterdir())
    assert "[tool.flytune]" not in (root / "pyproject.toml").read_text()  # nothing written before the refusal


def test_init_refuses_a_package_that_is_no_dotted_name(tmp_path):
    from flytune_build.core.errors import InputError
    from flytune_build.pipeline import scaffold

    root = _plain_project(tmp_path / "p")
    with pytest.raises(InputError, match="dotted Python package name") as e:
        scaffold.scaffold(root, package=str(root / "mypkg"))
    assert e.value.field == "--package"
