"""Errors that lead: each says what is wrong, in which file, and what to do, one line per problem."""
import os
import subprocess
import sys

import pytest
from buildkit import make_project
from conftest import flytune, python_env

import flytune_build
from flytune_build.core import codec
from flytune_build.core import project as project_mod
from flytune_build.core.errors import ArtifactError, DeclarationError, ProjectError


def test_a_failed_strict_build_lists_its_problems_one_per_line_and_names_a_missing_source_as_a_declaration_problem(
        tmp_path):
    proj = make_project(tmp_path / "p", artifacts=[])
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(tmp_path / "d"),
                        str(proj)], capture_output=True, text=True, cwd=proj, env=python_env())
    out = r.stdout + r.stderr
    assert r.returncode != 0 and not (tmp_path / "d").exists() or not list((tmp_path / "d").glob("*.whl"))
    assert "\\n" not in out  # real line breaks, not escaped ones
    head = next(line for line in out.splitlines() if line.startswith("flytune: error:"))
    assert head.endswith("2 problem(s) in [tool.flytune]; no wheel was written:")  # the source, and coverage
    assert "tuned artifacts" not in head
    problems = [line for line in out.splitlines() if line.startswith("  - ")]
    assert len(problems) == 2 and "`tool.flytune.sources[0]` names 'artifacts', which does not exist" in problems[0]
    assert "`flytune tune` writes them" in out  # and the report says what writes them


def test_a_failed_strict_build_of_bad_artifacts_says_so_and_how_to_drop_them(tmp_path):
    proj = make_project(tmp_path / "p")
    bad = next((proj / "artifacts").glob("*.json"))
    bad.write_bytes(bad.read_bytes().replace(b'"BLOCK":', b'"BLOCK" :'))  # not canonical: refused
    with pytest.raises(flytune_build.BuildFailure) as e:
        from flytune_build import pipeline
        pipeline.run(proj, out=open(os.devnull, "w"))
    lines = str(e.value).splitlines()
    # the artifact, and the coverage it leaves unmet
    assert lines[0].endswith("1 problem(s) in [tool.flytune] and 1 in the tuned artifacts; no wheel was written (set "
                             "tool.flytune.strict = false to drop bad artifacts with a warning instead):")
    assert len(lines) == 3 and all(line.startswith("  - ") for line in lines[1:])


PLAN = '''
[[entries]]
kernel = "fixpkg.add"
setup = "fixpkg.nosuch:setup"
shapes = [{ n = 100 }]
'''


def test_a_plan_entry_that_cannot_be_loaded_names_the_plan_file_and_the_entry(tmp_path):
    proj = make_project(tmp_path / "p", extra='[tool.flytune.tune]\nplan = "tune/plan.toml"\n')
    (proj / "tune").mkdir()
    (proj / "tune" / "plan.toml").write_text(PLAN)
    r = flytune("tune", "--project", proj, "--ranking", "synthetic", FLYTUNE_CACHE_DIR=tmp_path / "c",
                PYTHONPATH=proj)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "tune/plan.toml: Field `entries[0].setup` names 'fixpkg.nosuch:setup'" in r.stdout + r.stderr
    assert "pyproject.toml" not in r.stdout


def test_an_inline_plan_entry_that_cannot_be_loaded_names_pyproject_and_the_entry(tmp_path):
    from flytune_build.tuning import job

    proj = make_project(tmp_path / "p", extra='[tool.flytune.tune]\nentries = [{ kernel = "fixpkg.add", '
                                              'setup = "fixpkg.nosuch:setup", shapes = [{ n = 1 }] }]\n')
    (entry,) = project_mod.load(proj).tune_entries
    with pytest.raises(ProjectError) as e:
        job.run(proj, entry, {"n": 1})
    assert e.value.file == str(proj / "pyproject.toml") and e.value.field == "tool.flytune.tune.entries[0].setup"


@pytest.mark.parametrize("typo, meant", [("shape", "shapes"), ("setpu", "setup"), ("kernal", "kernel")])
def test_a_misspelled_required_plan_key_gets_a_did_you_mean(tmp_path, typo, meant):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.replace(f"\n{meant} =", f"\n{typo} ="))
    with pytest.raises(ProjectError) as e:
        project_mod.load_plan(tmp_path, "plan.toml")
    assert str(e.value) == f"{plan}: Field `entries[0].{typo}` is not a known field (did you mean `{meant}`?)"


def test_a_missing_required_key_with_no_near_miss_is_still_required(tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.replace('setup = "fixpkg.nosuch:setup"\n', ""))
    with pytest.raises(ProjectError, match=r"Field `entries\[0\]\.setup` is required$"):
        project_mod.load_plan(tmp_path, "plan.toml")


def test_an_unterminated_json_string_reads_at_once():
    with pytest.raises(ArtifactError) as e:
        codec.loads(b'{"kernel": "x', file="a.json", error=ArtifactError)
    assert str(e.value) == "a.json: is not valid JSON: Unterminated string starting at line 1 column 12"


def test_jit_above_autotune_says_to_put_autotune_outside():
    import triton
    import triton.language as tl

    with pytest.raises(DeclarationError) as e:
        @triton.jit
        @flytune_build.autotune([flytune_build.Config({"BLOCK": 16})], key=["n"], name="t.misordered")
        def kernel(x, n, BLOCK: tl.constexpr):
            tl.store(x + tl.arange(0, BLOCK), 1.0)
    assert str(e.value) == ("t.misordered: is not a @triton.jit kernel: put @autotune outside, above @triton.jit, "
                            "as @triton.autotune goes")


def test_bundle_into_the_project_root_is_refused_naming_the_package_directory(tmp_path):
    proj = make_project(tmp_path / "p")
    r = flytune("bundle", "--output", ".", cwd=proj)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "flytune: error: --output . is the project root; the bundle goes into the package's own directory: " \
           "--output fixpkg" in r.stderr
    assert not (proj / "_flytune").exists()


def test_review_is_reachable_from_the_package_without_importing_it_first():
    r = subprocess.run([sys.executable, "-c", "import flytune_build; print(flytune_build.review.render.__name__)"],
                       capture_output=True, text=True, env=python_env())
    assert r.returncode == 0 and r.stdout.strip() == "render", r.stderr


def test_a_setup_whose_module_lacks_a_package_says_what_to_install(tmp_path, monkeypatch):
    from flytune_build.core.errors import ProjectError
    from flytune_build.tuning.job import load_setup

    (tmp_path / "needsnp_setup.py").write_text("import numpy_is_not_installed_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ProjectError, match="install numpy_is_not_installed_here in this environment") as e:
        load_setup("needsnp_setup:run", tmp_path / "plan.toml", "entries[0].setup")
    assert e.value.field == "entries[0].setup"


def test_a_default_may_return_the_kwargs_as_a_plain_dict():
    from flytune_build.core.config import Config

    assert Config.coerce({"BLOCK": 64}) == Config({"BLOCK": 64})
    assert Config.coerce({"BLOCK": 64, "num_warps": 8}) == Config({"BLOCK": 64}, num_warps=8)
    assert Config.coerce({"kwargs": {"BLOCK": 64}, "num_warps": 8}) == Config({"BLOCK": 64}, num_warps=8)
