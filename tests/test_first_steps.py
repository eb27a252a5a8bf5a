"""A new user's first steps, as the README and the guide give them: the install block installs what its
own lines and the runtime need; `flytune init` writes a project that reads back, or nothing; the first
`flytune tune` of setups not yet filled in says each setup's error once."""
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import ROOT, python_env

KERNEL = '''
import triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config, pow2


@ft.autotune([Config({"BLOCK": b}) for b in (64, 128)], key=[pow2("n")], default=lambda a: Config({"BLOCK": 64}))
@triton.jit
def double_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)
'''


def install_block() -> list[list[str]]:
    """The README's install commands, each split as a shell splits it (comments dropped)."""
    readme = (ROOT / "README.md").read_text("utf-8")
    section = readme.split("## Install", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if shlex.split(line, comments=True)]


def test_the_readme_install_block_installs_the_build_frontend_before_it_runs_it_and_the_kernels_stack():
    lines = install_block()
    installs = [i for i, words in enumerate(lines) if words[:2] == ["pip", "install"]]
    build = next(i for i, words in enumerate(lines) if words[:3] == ["python", "-m", "build"])
    installed = {re.split(r"[<>=\[]", w)[0] for i in installs for w in lines[i][2:]}
    assert "build" in {re.split(r"[<>=\[]", w)[0] for i in installs if i < build for w in lines[i][2:]}
    assert {"torch", "triton", "numpy"} <= installed  # what runs the kernels; flytune-build depends on neither
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    for i in installs:  # an extra the block names is one pyproject.toml declares
        for word in lines[i][2:]:
            for extra in re.findall(r"\[([\w,-]+)\]", word):
                assert set(extra.split(",")) <= set(extras), word


def flytune(*args, cwd=None, **env):
    return subprocess.run([sys.executable, "-m", "flytune_build.cli", *map(str, args)], capture_output=True,
                          text=True, env=python_env(**env), cwd=cwd)


def new_package(root: Path) -> Path:
    (root / "mylib").mkdir(parents=True)
    (root / "mylib" / "__init__.py").write_text(KERNEL)
    (root / "pyproject.toml").write_text('[project]\nname = "mylib"\nversion = "0.1.0"\n')
    return root


def test_a_refused_init_leaves_the_project_so_the_next_init_runs(tmp_path):
    root = new_package(tmp_path / "p")
    (root / "tune").write_text("my notes\n")  # a file where the plan's directory goes
    before = (root / "pyproject.toml").read_bytes()
    r = flytune("init", "--project", root)
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.count("flytune: error:") == 1 and "tune: is a file where `flytune init` needs a directory" \
        in r.stderr and "move it aside" in r.stderr
    assert (root / "pyproject.toml").read_bytes() == before and not (root / "mylib" / "tuning.py").exists()
    (root / "tune").unlink()
    r = flytune("init", "--project", root)
    assert r.returncode == 0, r.stderr
    assert tomllib.loads((root / "pyproject.toml").read_text())["tool"]["flytune"]["package"] == "mylib"


def test_the_first_tune_of_setups_not_filled_in_says_each_setups_error_once(tmp_path):
    root = new_package(tmp_path / "p")
    assert flytune("init", "--project", root).returncode == 0
    plan = root / "tune" / "plan.toml"
    plan.write_text(plan.read_text().replace("shapes = [{ n = 1024 }]", "shapes = [{ n = 64 }, { n = 128 }, "
                                                                          "{ n = 256 }]"))
    r = flytune("tune", "--project", root, "--ranking", "synthetic", "--allow-ci", "--no-progress",
                PYTHONPATH=root, FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert r.returncode == 1, r.stdout + r.stderr
    said = "mylib/tuning.py: double() must build inputs and return the call to tune"
    assert r.stdout.count(said) == 1 and r.stderr.count(said) == 1, r.stdout + r.stderr  # the table, the error
    assert r.stderr.count("the same error as mylib.double_kernel n=64") == 2
    assert "0 tuned, 0 resumed, 3 failed" in r.stdout


def test_the_first_tune_of_a_src_layout_imports_the_package_in_process_and_in_workers(tmp_path):
    """`flytune init` writes src/mylib/tuning.py and `setup = "mylib.tuning:add"`: the tuning session puts
    src/ (the project's package base) on sys.path beside the root, in this process and in a worker."""
    root = tmp_path / "p"
    (root / "src").mkdir(parents=True)
    new_package(root / "src")
    (root / "src" / "pyproject.toml").rename(root / "pyproject.toml")
    assert flytune("init", "--project", root).returncode == 0
    setups = root / "src" / "mylib" / "tuning.py"
    text = setups.read_text()
    body = text[text.index("def double(n):"):]
    setups.write_text(text.replace(body, "def double(n):\n    x = torch.randn(n)\n    out = torch.empty_like(x)\n"
                                         "    return lambda: mylib.double_kernel[(1,)](x, out, n)\n"))
    for i, executor in enumerate((["--executor", "inprocess"], ["--executor", "local", "--workers", "1"])):
        r = flytune("tune", "--project", root, "--ranking", "synthetic", "--allow-ci", "--no-progress", *executor,
                    "--output", tmp_path / f"out{i}", "--no-resume", FLYTUNE_CACHE_DIR=tmp_path / "c")
        assert r.returncode == 0 and "1 tuned" in r.stdout, r.stdout + r.stderr
    plan = root / "tune" / "plan.toml"
    plan.write_text(plan.read_text().replace('"mylib.tuning:', '"mylib.tunning:'))
    r = flytune("tune", "--project", root, "--ranking", "synthetic", "--allow-ci", "--no-progress",
                FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert r.returncode == 1 and "No module named 'mylib.tunning'" in r.stderr, r.stdout + r.stderr
    assert "correct the module in the plan, or run `pip install -e .`" in r.stderr
