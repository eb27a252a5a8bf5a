"""A new user's first steps, second part: a project's declaration that does not say what the user meant
is refused with the file, the field and the fix (a misspelled `[tool.flytune]`, options in the hatchling
hook's table, a bad tuning plan), never built or tuned into something else."""
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from buildkit import TOOL, make_project, pip_wheel
from conftest import flytune

import flytune_build as ft
from flytune_build import pipeline
from flytune_build.core.errors import ProjectError


def retitle(proj: Path, old: str, new: str) -> None:
    p = proj / "pyproject.toml"
    p.write_text(p.read_text().replace(old, new))


def test_a_misspelled_flytune_table_fails_the_build_with_did_you_mean_and_no_wheel(tmp_path):
    proj = make_project(tmp_path / "p")
    retitle(proj, "[tool.flytune]", "[tool.flytun]")
    r = pip_wheel(proj, tmp_path / "dist")
    out = r.stdout + r.stderr
    assert r.returncode != 0 and not list((tmp_path / "dist").glob("*.whl")) if (tmp_path / "dist").exists() \
        else r.returncode != 0
    assert "pyproject.toml: Field `tool.flytun` is not a table flytune reads (did you mean `tool.flytune`?)" in out
    assert "rename it [tool.flytune], or run `flytune init`" in out and "Traceback" not in out


@pytest.mark.parametrize("title,named", [("[tool.flytune-build]", "tool.flytune-build"),
                                         ("[tools.flytune]", "tools.flytune"), ("[tool.flytnue]", "tool.flytnue")])
def test_a_flytune_table_under_another_name_is_refused_naming_it(tmp_path, title, named):
    proj = make_project(tmp_path / "p")
    retitle(proj, "[tool.flytune]", title)
    with pytest.raises(ProjectError) as e:
        pipeline.run(proj, out=io.StringIO())
    assert e.value.field == named and "did you mean `tool.flytune`?" in str(e.value)


@pytest.mark.parametrize("title", ["[tool.flytun]", "[tool.Flytune]", "[tool.flytune_build]", "[flytune]"])
def test_a_misspelled_main_table_beside_its_tune_table_is_named_not_blamed_on_a_missing_field(tmp_path, title):
    """`flytune init` writes [tool.flytune] and [tool.flytune.tune]: the second makes [tool.flytune] exist
    whatever the first is called, so a misspelled first is named, in the build, `verify` and `tune` alike."""
    proj = make_project(tmp_path / "p")
    (proj / "pyproject.toml").write_text((proj / "pyproject.toml").read_text() + '\n[tool.flytune.tune]\nrep = 50\n')
    retitle(proj, "[tool.flytune]\n", f"{title}\n")
    with pytest.raises(ProjectError) as e:
        pipeline.run(proj, out=io.StringIO())
    assert e.value.field == title.strip("[]") and "did you mean `tool.flytune`?" in str(e.value)
    assert "Field `tool.flytune.sources` is required" in str(e.value) and f"rename {title} to [tool.flytune]" in str(e.value)
    for command in (("verify", str(proj)), ("tune", "--project", str(proj), "--allow-ci")):
        r = flytune(*command)
        assert r.returncode != 0 and f"Field `{title.strip('[]')}` is not a table flytune reads" in r.stdout + r.stderr


def test_another_tools_table_leaves_a_project_without_flytune_to_its_backend(tmp_path):
    proj = make_project(tmp_path / "p", tool=False)
    (proj / "pyproject.toml").write_text((proj / "pyproject.toml").read_text() + '\n[tool.flynt]\nline-length = 99\n')
    assert pipeline.run(proj, out=io.StringIO()) is None  # flynt is not flytune misspelled: built untouched


def test_tune_without_a_flytune_table_says_run_flytune_init_and_names_a_near_miss(tmp_path):
    proj = make_project(tmp_path / "p", tool=False)
    r = flytune("tune", "--project", proj, "--ranking", "synthetic", "--allow-ci")
    assert r.returncode == 2 and "has no [tool.flytune] table (run `flytune init` to write one" in r.stderr, r.stderr
    make_project(tmp_path / "q")
    retitle(tmp_path / "q", "[tool.flytune]", "[tool.flytun]")
    r = flytune("tune", "--project", tmp_path / "q", "--ranking", "synthetic", "--allow-ci")
    assert "is that [tool.flytun]? rename it [tool.flytune]; else run `flytune init`" in r.stderr, r.stderr
    assert r.stderr.count("flytune: error:") == 1 and "Traceback" not in r.stderr


HATCH = """
[build-system]
requires = ["hatchling", "flytune-build"]
build-backend = "hatchling.build"

[project]
name = "fixpkg"
version = "1.0"

[tool.hatch.build.hooks.flytune]
{hook}
"""


def test_the_hatchling_hook_refuses_options_of_its_own_naming_where_they_go(tmp_path):
    proj = make_project(tmp_path / "p")
    hook = 'sources = ["artifacts"]\ntargets = ["interpreter"]\ndependencies = []'
    (proj / "pyproject.toml").write_text(HATCH.format(hook=hook) + TOOL.format(extra=""))
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(tmp_path / "d"),
                        str(proj)], capture_output=True, text=True, cwd=proj, env=dict(os.environ))
    out = r.stdout + r.stderr
    assert r.returncode != 0 and not (tmp_path / "d").exists() or not list((tmp_path / "d").glob("*.whl"))
    assert "Field `tool.hatch.build.hooks.flytune` takes no options: move sources, targets to [tool.flytune]" \
        in out, out[-3000:]
    assert "Traceback" not in out


def test_a_plan_repeating_a_shape_is_refused_naming_the_repeat_and_writes_nothing(tmp_path):
    proj = make_project(tmp_path / "p", artifacts=[], extra='[tool.flytune.tune]\nplan = "tune/plan.toml"\n')
    (proj / "tune").mkdir()
    (proj / "tune" / "plan.toml").write_text('[[entries]]\nkernel = "fixpkg.add"\nsetup = "fixpkg:setup"\n'
                                             'shapes = [{ n = 64 }, { n = 128 }, { n = 64 }]\n')
    r = flytune("tune", "--project", proj, "--ranking", "synthetic", "--allow-ci", "--output", tmp_path / "out",
                FLYTUNE_CACHE_DIR=tmp_path / "c")
    assert r.returncode == 2 and r.stderr.count("flytune: error:") == 1, r.stdout + r.stderr
    assert "tune/plan.toml: Field `entries[0].shapes[2]` repeats `entries[0].shapes[0]` (n=64)" in r.stderr
    assert not (tmp_path / "out").exists()


def test_a_plan_repeating_a_shape_is_a_warning_of_the_build_and_verify_and_tune_refuses_it(tmp_path):
    """One rule (`core.project.check_repeats`) for the plan file and the inline entries: `flytune verify`
    (as the build) names the repeat as tune does, as a warning: the build tunes nothing, coverage is the
    same, and releases before the rule built such a project (its sdist still builds)."""
    from flytune_build.core import project as project_mod
    from flytune_build.core.errors import PlanError

    proj = make_project(tmp_path / "p", extra='[tool.flytune.tune]\nplan = "tune/plan.toml"\n')
    (proj / "tune").mkdir()
    (proj / "tune" / "plan.toml").write_text('[[entries]]\nkernel = "fixpkg.add"\nsetup = "fixpkg:setup"\n'
                                             'shapes = [{ n = 64 }, { n = 64 }]\n')
    r = flytune("verify", proj)
    assert r.returncode == 0 and "warning:" in r.stdout and \
        "Field `entries[0].shapes[1]` repeats `entries[0].shapes[0]` (n=64)" in r.stdout, r.stdout + r.stderr
    assert "(`flytune tune` refuses it)" in r.stdout
    assert pip_wheel(proj, tmp_path / "dist").returncode == 0
    inline = make_project(tmp_path / "q", extra='[tool.flytune.tune]\nentries = [{ kernel = "fixpkg.add", '
                                                 'setup = "fixpkg:setup", shapes = [{ n = 8 }, { n = 8 }] }]\n')
    with pytest.raises(PlanError, match=r"repeats `tool.flytune.tune.entries\[0\].shapes\[0\]` \(n=8\)"):
        project_mod.check_repeats(project_mod.load(inline).tune_entries)
    r = flytune("verify", inline)
    assert r.returncode == 0 and "repeats `tool.flytune.tune.entries[0].shapes[0]` (n=8)" in r.stdout, r.stdout


def test_a_command_run_inside_the_package_names_the_project_root_above(tmp_path):
    proj = make_project(tmp_path / "p")
    r = flytune("tune", "--ranking", "synthetic", "--allow-ci", cwd=proj / "fixpkg")
    assert r.returncode == 2 and r.stderr.strip() == (
        f"flytune: error: {proj / 'fixpkg' / 'pyproject.toml'}: does not exist: run flytune in the project's root, "
        f"the directory that holds it (--project {proj}; from Python, project={str(proj)!r})"), r.stderr
    with pytest.raises(ft.NoProject, match="from Python, project="):   # a ProjectError and a UsageError
        ft.tune(project=proj / "fixpkg")
