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


@pytest.mark.parametrize("written", [
    '\n[tool]\nflytune.sources = ["x"]  # dotted keys\nblack.line-length = 99\n',
    '\n[tool]\nblack = { line-length = 99 }\nflytune = { sources = ["x"] }\n',
])
def test_init_force_replaces_a_tool_flytune_written_as_dotted_keys_or_inline(tmp_path, capsys, written):
    root = package(tmp_path, PYPROJECT + written)
    assert init(root, "--force") == 0
    text = (root / "pyproject.toml").read_text()
    assert text.startswith(PYPROJECT) and 'sources = ["x"]' not in text and "line-length = 99" in text
    doc = tomllib.loads(text)
    assert doc["tool"]["black"] == {"line-length": 99} and doc["tool"]["flytune"]["package"] == "mylib"


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
    assert init(root, "--target", "sm 90") == 2   # a flag's bad value: a usage error, as `--target ''` is
    assert "Field `--target[0]` must be" in capsys.readouterr().err
    assert snapshot(root) == before


def test_force_never_cuts_text_that_only_looks_like_a_tool_flytune_header(tmp_path):
    from flytune_build.pipeline import scaffold

    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    kept = '[project]\nname = "mypkg"\nversion = "0.1"\ndescription = """Usage:\n[tool.flytune]\nsecret text\n[x]\n"""\n'
    (tmp_path / "pyproject.toml").write_text(kept + '\n[tool.flytune]\npackage = "mypkg"\n')
    scaffold.write(scaffold.scaffold(tmp_path, force=True))
    text = (tmp_path / "pyproject.toml").read_text()
    assert text.startswith(kept)  # the string's header-like lines are the string's, untouched
    assert tomllib.loads(text)["project"]["description"] == "Usage:\n[tool.flytune]\nsecret text\n[x]\n"


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


# -- what `init` writes always reads back; a write that fails leaves the project as it was ------------------
def test_init_refuses_an_inline_tool_table_naming_the_field_and_the_fix_and_writes_nothing(tmp_path, capsys):
    inline = 'tool = { black = { line-length = 88 } }\n\n' + PYPROJECT
    root = package(tmp_path, inline)
    before = snapshot(root)
    assert init(root) == 1
    err = capsys.readouterr().err
    assert "pyproject.toml: Field `tool` is written in a form TOML closes to the [tool.flytune] table" in err
    assert "write it as a [tool] header" in err and "then run `flytune init` again" in err
    assert snapshot(root) == before


def test_init_refuses_an_inline_setuptools_table_it_would_add_packages_find_to(tmp_path, capsys):
    root = package(tmp_path, PYPROJECT + '\n[tool]\nsetuptools = { zip-safe = false }\n')
    before = snapshot(root)
    assert init(root) == 1
    assert "Field `tool.setuptools` is written in a form TOML closes to the [tool.setuptools.packages.find]" in \
        capsys.readouterr().err
    assert snapshot(root) == before


@pytest.mark.parametrize("tool", [
    'tool.black.line-length = 88\n\n',                 # dotted keys at the top: `tool` a table
    '',                                                # and below, a [tool] table of dotted keys
])
def test_init_appends_to_a_tool_table_written_as_dotted_keys_and_the_file_reads_back(tmp_path, tool):
    text = tool + PYPROJECT + ('' if tool else '\n[tool]\nblack.line-length = 88\nisort.profile = "black"\n')
    root = package(tmp_path, text)
    assert init(root) == 0
    written = (root / "pyproject.toml").read_text()
    assert written.startswith(text)  # appended to, never rewritten
    doc = tomllib.loads(written)
    assert doc["tool"]["black"] == {"line-length": 88} and doc["tool"]["flytune"]["package"] == "mylib"
    assert project_mod.load(root).tune_plan == "tune/plan.toml"


def test_init_appends_in_the_files_own_line_endings(tmp_path):
    crlf = PYPROJECT.replace("\n", "\r\n").encode()
    root = package(tmp_path)
    (root / "pyproject.toml").write_bytes(crlf)
    assert init(root) == 0
    written = (root / "pyproject.toml").read_bytes()
    assert written.startswith(crlf) and b"\n" not in written.replace(b"\r\n", b"")


def test_init_with_a_file_where_the_plan_directory_goes_names_it_and_writes_nothing(tmp_path, capsys):
    root = package(tmp_path)
    (root / "tune").write_text("notes\n")
    before = snapshot(root)
    assert init(root) == 1
    err = capsys.readouterr().err
    assert f"{root / 'tune'}: is a file where `flytune init` needs a directory, for tune/plan.toml: move it " \
           f"aside" in err
    assert snapshot(root) == before  # pyproject.toml included: the next init is not refused
    (root / "tune").unlink()
    assert init(root) == 0 and (root / "tune" / "plan.toml").is_file()


def test_init_leaves_a_read_only_pyproject_alone_and_says_how_to_go_on(tmp_path, capsys):
    root = package(tmp_path)
    (root / "pyproject.toml").chmod(0o444)
    before = snapshot(root)
    assert init(root) == 1
    assert "pyproject.toml: is read-only, and `flytune init` appends to it: make it writable (chmod u+w " \
           "pyproject.toml)" in capsys.readouterr().err
    assert snapshot(root) == before and (root / "pyproject.toml").stat().st_mode & 0o777 == 0o444


def test_init_into_a_read_only_package_directory_writes_nothing(tmp_path, capsys):
    root = package(tmp_path)
    (root / "mylib").chmod(0o555)
    before = snapshot(root)
    try:
        assert init(root) == 1
    finally:
        (root / "mylib").chmod(0o755)
    assert "mylib: is not writable, and `flytune init` writes mylib/tuning.py there" in capsys.readouterr().err
    assert snapshot(root) == before and not (root / "tune").exists()


def test_a_write_that_fails_midway_undoes_the_others_and_the_next_init_runs(tmp_path, monkeypatch):
    from flytune_build.core.errors import OutputError
    from flytune_build.pipeline import scaffold

    root = package(tmp_path)
    (root / "tune").mkdir()
    before = snapshot(root)
    real = scaffold.atomic_write

    def disk_full_at_pyproject(path, data, mode=0o644):
        if Path(path).name == "pyproject.toml":
            raise OutputError("cannot be written: No space left on device", file=path)
        real(path, data, mode)

    monkeypatch.setattr(scaffold, "atomic_write", disk_full_at_pyproject)
    with pytest.raises(OutputError) as e:
        scaffold.write(scaffold.scaffold(root))
    assert e.value.file == str(root / "pyproject.toml")
    assert "undid what it had written (the project is as it was)" in str(e.value)
    assert "then run `flytune init` again" in str(e.value)
    assert snapshot(root) == before and (root / "tune").is_dir()  # there before: kept
    assert not (root / "mylib" / "tuning.py").exists()
    monkeypatch.undo()
    assert init(root) == 0


def test_a_forced_init_that_fails_restores_the_plan_it_replaced(tmp_path, monkeypatch):
    from flytune_build.core.errors import OutputError
    from flytune_build.pipeline import scaffold

    root = package(tmp_path, PYPROJECT + '\n[tool.flytune]\nsources = ["mine"]\ntargets = ["sm_90"]\n')
    (root / "tune").mkdir()
    (root / "tune" / "plan.toml").write_text("# mine\n")
    (root / "tune" / "plan.toml").chmod(0o640)
    before = snapshot(root)
    real = scaffold.atomic_write

    replaced = []

    def disk_full_at_pyproject(path, data, mode=0o644):  # written last: the plan was replaced by then
        if Path(path).name == "pyproject.toml":
            replaced.append((root / "tune" / "plan.toml").read_text())
            raise OSError(28, "No space left on device")
        real(path, data, mode)

    monkeypatch.setattr(scaffold, "atomic_write", disk_full_at_pyproject)
    with pytest.raises(OutputError, match="No space left on device"):
        scaffold.write(scaffold.scaffold(root, force=True))
    assert "[[entries]]" in replaced[0]
    assert snapshot(root) == before and (root / "tune" / "plan.toml").stat().st_mode & 0o777 == 0o640


SHADOWING = '''
import triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config
''' + "".join(f'''

@ft.autotune([Config({{"BLOCK": 64}})], key=["n"])
@triton.jit
def {name}(x, n, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), 1.0, mask=tl.arange(0, BLOCK) < n)
''' for name in ("device_kernel", "torch_kernel", "softmax_kernel", "os_kernel", "sum_kernel", "lambda_kernel"))


def test_setup_names_never_shadow_the_setups_modules_imports_builtins_or_each_other(tmp_path):
    import ast
    import builtins
    import os
    import subprocess
    import sys

    (tmp_path / "softmax").mkdir()
    (tmp_path / "softmax" / "__init__.py").write_text("")
    (tmp_path / "softmax" / "kernels.py").write_text(SHADOWING)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "softmax"\nversion = "0.1"\n')
    assert init(tmp_path) == 0
    tree = ast.parse((tmp_path / "softmax" / "tuning.py").read_text())
    defined = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    imported = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    assert imported == {"os", "torch", "softmax"}
    assert len(defined) == len(set(defined)) == 7 and not set(defined) & (imported | set(dir(builtins)))
    setups = [e.setup.split(":")[1] for e in project_mod.load_plan(tmp_path, "tune/plan.toml")]
    assert setups == ["device_setup", "torch_setup", "softmax_setup", "os_setup", "sum_setup", "lambda_setup"]
    assert set(defined) == {"device", *setups}
    # and the module runs: each name is the import's or the setup's own
    r = subprocess.run([sys.executable, "-c", "import os, torch, softmax, softmax.tuning as t; "
                        "assert (t.os, t.torch, t.softmax) == (os, torch, softmax) and t.device() == 'cpu'"],
                       cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{Path(__file__).parents[1]}"})
    assert r.returncode == 0, r.stderr


def test_a_kernel_no_plan_can_name_is_left_out_with_what_to_do(tmp_path, capsys):
    root = package(tmp_path)
    (root / "mylib" / "my-ops.py").write_text(KERNELS)  # no import reaches it by that name
    assert init(root) == 0
    out = capsys.readouterr().out
    assert "mylib/my-ops.py:12: add_kernel is left out of tune/plan.toml: its module 'mylib.my-ops' cannot be " \
           "imported by that name" in out
    assert [e.kernel for e in project_mod.load_plan(root, "tune/plan.toml")] == ["mylib.kernels.add_kernel",
                                                                                 "mylib.scale"]


@pytest.mark.parametrize("after", [
    "\n# Black settings: keep in sync with CI\n[tool.black]\nx = 1\n",   # the next table's own comment
    "\n# vim: set ft=toml:\n",                                            # the file's last line
])
def test_init_force_keeps_the_comments_that_follow_tool_flytune(tmp_path, after):
    root = package(tmp_path, PYPROJECT + '\n[tool.flytune]\npackage = "mylib"  # mine\n' + after)
    assert init(root, "--force") == 0
    text = (root / "pyproject.toml").read_text()
    assert after.strip() in text and "# mine" not in text
    assert tomllib.loads(text)["tool"]["flytune"]["package"] == "mylib"


def test_init_reads_a_nan_back_as_itself(tmp_path):
    root = package(tmp_path, PYPROJECT + "\n[tool.black]\nx = nan\n")
    assert init(root) == 0
    root2 = package(tmp_path / "forced", PYPROJECT + '\n[tool.black]\nx = nan\n\n[tool.flytune]\npackage = "x"\n')
    assert init(root2, "--force") == 0


@pytest.mark.parametrize("tool, kind", [("tool = 3\n", "an integer"), ("tool = [1, 2]\n", "an array"),
                                        ("[[tool]]\nx = 1\n", "an array of tables")])
def test_init_says_what_a_tool_key_that_is_no_table_is(tmp_path, capsys, tool, kind):
    root = package(tmp_path, tool + PYPROJECT)
    before = snapshot(root)
    assert init(root) == 1
    err = capsys.readouterr().err
    assert f"is {kind}, not a table" in err and "rename or remove `tool`" in err and err.count("\n") == 1, err
    assert snapshot(root) == before


def test_a_bad_package_name_is_said_once(tmp_path, capsys):
    root = package(tmp_path)
    assert init(root, "--package", "1bad") in (1, 2)
    err = capsys.readouterr().err
    assert err.count("--package") == 1 and "must be a dotted Python package name" in err, err


def test_init_says_what_is_wrong_with_the_project_path(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir" / "pyproject.toml").mkdir(parents=True)
    expected = {"missing": "does not exist: pass --project", "file": "is not a directory: pass --project",
                "dir": "pyproject.toml: is a directory, not a regular file"}
    for name, said in expected.items():
        assert init(tmp_path / name) == 1
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_init_takes_the_project_root_as_its_argument_too(tmp_path, capsys, monkeypatch):
    """`flytune init DIR` (as `git init DIR`) is `flytune init --project DIR`; two different roots are a
    usage error that writes nothing."""
    root = package(tmp_path / "p")
    other = package(tmp_path / "q")
    before = snapshot(other)
    assert main(["init", str(other), "--project", str(root)]) == 2
    assert "two project roots" in capsys.readouterr().err and snapshot(other) == before
    assert main(["init", str(root)]) == 0
    assert "[tool.flytune]" in (root / "pyproject.toml").read_text()
    monkeypatch.chdir(other)
    assert main(["init", "."]) == 0 and "[tool.flytune]" in (other / "pyproject.toml").read_text()


def test_init_of_a_package_named_beyond_ascii_refuses_before_writing_a_table_that_would_fail(tmp_path, capsys):
    root = tmp_path / "p"
    (root / "mylïb").mkdir(parents=True)
    (root / "mylïb" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text('[project]\nname = "mylib"\nversion = "0.1"\n')
    before = snapshot(root)
    assert init(root) == 1
    assert "package 'mylïb' is named with characters" in capsys.readouterr().err and snapshot(root) == before


def test_init_force_after_a_kernel_is_added_names_each_setup_the_kept_module_lacks(tmp_path, capsys):
    root = package(tmp_path)
    kernels = root / "mylib" / "kernels.py"
    kernels.write_text(KERNELS.split("@triton.autotune")[0])   # add_kernel alone
    assert init(root) == 0
    (add,) = tomllib.loads((root / "tune" / "plan.toml").read_text())["entries"]
    tuning = f"try:\n    from os.path import join as {add['setup'].split(':')[1]}\nexcept ImportError:\n    pass\n"
    (root / "mylib" / "tuning.py").write_text(tuning)   # a setup bound as a module may bind it: found there
    tuning = tuning.encode()
    kernels.write_text(KERNELS)   # scale_kernel added since
    capsys.readouterr()
    assert init(root, "--force") == 0
    out = capsys.readouterr().out
    assert (root / "mylib" / "tuning.py").read_bytes() == tuning   # the setups module is never replaced
    plan = tomllib.loads((root / "tune" / "plan.toml").read_text())
    (scale,) = [e for e in plan["entries"] if "scale" in e["kernel"]]
    setup = scale["setup"].split(":")[1]
    assert f"add a setup `{setup}` to mylib/tuning.py: tune/plan.toml names {scale['setup']} for " \
           f"{scale['kernel']}" in out, out
    assert out.count("add a setup") == 1   # add_kernel's is there


def test_init_force_keeps_the_targets_of_the_table_it_replaces_unless_target_names_others(tmp_path):
    root = package(tmp_path)
    assert init(root) == 0
    text = (root / "pyproject.toml").read_text()
    declared = '["interpreter", { arch = "sm_90", name = "NVIDIA H200", units = 132 }]'
    (root / "pyproject.toml").write_text(text.replace('targets = ["interpreter"]', f"targets = {declared}"))
    assert init(root, "--force") == 0
    proj = project_mod.load(root)
    assert [t.label() for t in proj.targets] == ["interpreter", "sm_90/132/NVIDIA H200"]
    assert init(root, "--force", "--target", "sm_80") == 0
    assert [t.label() for t in project_mod.load(root).targets] == ["sm_80"]
