"""docs/guide.md's "Ship your first pre-tuned wheel", run as written: its files are written, its
`console` blocks' commands run in order (in a fresh virtual environment where flytune-build is
installed from its wheel, as a user's is) and each line the guide shows must be printed (`…` stands
for what varies). A step the docs change without the code, or the code without the docs, fails here."""
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from buildkit import ROOT

GUIDE = ROOT / "docs" / "guide.md"
SECTION = "## Ship your first pre-tuned wheel"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)

pytestmark = pytest.mark.docs


def section(text: str, title: str) -> str:
    start = text.index(title + "\n")
    end = text.find("\n## ", start + len(title))
    return text[start:end if end != -1 else None]


def steps(text: str):
    """("file", path, content) for a toml/python block opening with `# path`; ("run", command,
    expected lines) for each `$ ` line of a console block."""
    for lang, body in BLOCK.findall(text):
        first, _, rest = body.partition("\n")
        if lang in ("toml", "python") and re.fullmatch(r"# [\w./-]+\.(?:toml|py)", first):
            yield "file", first[2:].strip(), rest
        elif lang == "console":
            command, shown = None, []
            for line in body.splitlines():
                if line.startswith("$ "):
                    if command:
                        yield "run", command, shown
                    command, shown = line[2:], []
                elif line.strip():
                    shown.append(line)
            if command:
                yield "run", command, shown


def printed(shown: str, lines: list[str]) -> bool:
    """Whether `shown` (`…`: any text; runs of blanks: any blanks) is one of `lines`."""
    pattern = r"\s+".join(".*".join(map(re.escape, word.split("…"))) for word in shown.split())
    return any(re.fullmatch(pattern, " ".join(line.split())) for line in lines)


@pytest.fixture
def user_env(tmp_path, flytune_wheel):
    """A fresh venv with flytune-build installed from its wheel (torch, triton, numpy, build seen from
    this one through a .pth), on PATH; nothing of the checkout on sys.path; the wheel on PIP_FIND_LINKS."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.check_output([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   text=True).strip()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TRITON_INTERPRET", "FLYTUNE_AUTOTUNE", "VIRTUAL_ENV")}
    # before the .pth, and with no PYTHONPATH: pip would take the checkout seen through them as installed
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(flytune_wheel)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and (env_dir / "bin" / "flytune").is_file(), r.stdout + r.stderr
    import torch
    Path(site, "parent_site.pth").write_text(str(Path(torch.__file__).resolve().parent.parent) + "\n")
    (tmp_path / "home").mkdir()
    env.update(PATH=f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}", HOME=str(tmp_path / "home"),
               PIP_FIND_LINKS=str(flytune_wheel.parent), FLYTUNE_CACHE_DIR=str(tmp_path / "cache"),
               VIRTUAL_ENV=str(env_dir))
    return env


def test_ship_your_first_pre_tuned_wheel_runs_as_written_on_a_cpu(tmp_path, user_env):
    project = tmp_path / "mylib-project"
    project.mkdir()
    ran = 0
    for kind, what, content in steps(section(GUIDE.read_text("utf-8"), SECTION)):
        if kind == "file":
            path = project / what
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            continue
        r = subprocess.run(["bash", "-c", what], cwd=project, env=user_env, capture_output=True, text=True,
                           timeout=600)
        out = r.stdout + r.stderr
        assert r.returncode == 0, f"$ {what}\n{out[-4000:]}"
        lines = [" ".join(line.split()) for line in out.splitlines()]
        missing = [line for line in content if not printed(line, lines)]
        assert not missing, f"$ {what}\nthe guide shows, and the command did not print:\n" + "\n".join(missing) + \
            f"\n--- it printed:\n{out[-4000:]}"
        ran += 1
    assert ran == 6  # init, tune, build, verify, install, run


def test_printed_matches_what_varies_and_nothing_else():
    assert printed("flytune: 2 tuned in … s", ["flytune: 2 tuned in 4.1 s"])
    assert printed("a   b", ["a b"]) and not printed("a b", ["a b c"]) and not printed("a…", ["b"])


def test_the_readme_example_is_a_complete_project_whose_kernel_runs(tmp_path):
    """README's "In 30 seconds": its pyproject.toml and package, then the `flytune init` it names, make a
    project whose [tool.flytune] is what the README says init appends, and the package's kernel runs
    (here on the interpreter)."""
    from flytune_build.cli.main import main
    from flytune_build.core import project as project_mod

    readme = section((ROOT / "README.md").read_text("utf-8"), "## In 30 seconds")
    files = [s for s in steps(readme) if s[0] == "file"]
    assert [f[1] for f in files] == ["pyproject.toml", "mylib/__init__.py"]
    for _, path, content in files:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(content)
    assert "`flytune init --target interpreter --target sm_90`" in readme
    assert main(["init", str(tmp_path), "--target", "interpreter", "--target", "sm_90"]) == 0
    proj = project_mod.load(tmp_path)
    assert proj.package == "mylib" and [t.arch for t in proj.targets] == ["interpreter", "sm_90"]
    assert proj.sources == ("artifacts",) and proj.tune_plan == "tune/plan.toml"
    assert proj.tune_output == "artifacts/{arch}" and (tmp_path / "mylib" / "tuning.py").is_file()
    code = ("import torch, mylib; x = torch.randn(3000); assert torch.equal(mylib.add(x, x), x + x); print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}", TRITON_INTERPRET="1",
                                FLYTUNE_AUTOTUNE="0", FLYTUNE_CACHE_DIR=str(tmp_path / "cache")))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-3000:]
