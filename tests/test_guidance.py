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


# -- a plan's mistakes: said once, naming the plan file, the field and the fix ---------------------------------
SETUPS = '''
import torch
from fixpkg import add


def setup(n):
    x, y = torch.ones(n), torch.ones(n)
    return lambda: add(x, y)


def scale(n):
    return lambda: None
'''


def planned(tmp_path, plan: str):
    """A project whose [tool.flytune.tune] plan is `plan` (tune/plan.toml), with setups in fixpkg.setups."""
    proj = make_project(tmp_path / "p", extra='[tool.flytune.tune]\nplan = "tune/plan.toml"\n')
    (proj / "fixpkg" / "setups.py").write_text(SETUPS)
    (proj / "tune").mkdir()
    (proj / "tune" / "plan.toml").write_text(plan)
    return proj


def entry(kernel, shapes=(100,), setup="fixpkg.setups:setup", extra=""):
    return (f'\n[[entries]]\nkernel = "{kernel}"\nsetup = "{setup}"\n{extra}'
            f'shapes = [{", ".join(f"{{ n = {n} }}" for n in shapes)}]\n')


def tune(proj, tmp_path, *args):
    return flytune("tune", "--project", proj, "--ranking", "synthetic", "--allow-ci", *args,
                   FLYTUNE_CACHE_DIR=tmp_path / "c", PYTHONPATH=proj)


def test_a_misspelled_plan_kernel_is_said_once_naming_the_plan_file_the_field_and_the_kernel_meant(tmp_path):
    proj = planned(tmp_path, entry("fixpkg.addd", (100, 200, 300)))
    r = tune(proj, tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert out.count("fixpkg.addd") == 1 and out.count("did you mean") == 1, out
    assert r.stderr.startswith(f"flytune: error: {proj / 'tune' / 'plan.toml'}: Field `entries[0].kernel` names "
                               f"'fixpkg.addd', a kernel no setup registers (registered kernels: fixpkg.add) (did you "
                               f"mean `fixpkg.add`?): correct the name in the plan")
    assert not (proj / "artifacts" / "interpreter").exists()  # nothing ran


def test_two_misspelled_kernels_over_three_shapes_are_one_error_naming_each_entry_once(tmp_path):
    proj = planned(tmp_path, entry("fixpkg.add", (100,)) + entry("fixpkg.ad", (100, 200, 300)) +
                   entry("fixpkg.adds", (100, 200, 300)))
    r = tune(proj, tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1 and len(out.strip().splitlines()) == 1, out
    for field, name in (("entries[1].kernel", "'fixpkg.ad'"), ("entries[2].kernel", "'fixpkg.adds'")):
        assert out.count(field) == 1 and out.count(name) == 1, out
    assert out.count("did you mean `fixpkg.add`?") == 2 and "tune/plan.toml" in out


def test_an_autotuner_that_names_a_plain_function_names_the_plan_field_and_what_to_name(tmp_path):
    proj = planned(tmp_path, entry("fixpkg.scaled", (100, 200), setup="fixpkg.setups:scale",
                                   extra='autotuner = "fixpkg.setups:scale"\n'))
    r = tune(proj, tmp_path, "--no-progress")
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"{proj / 'tune' / 'plan.toml'}: Field `entries[0].autotuner` names 'fixpkg.setups:scale', a "
            f"function, not a @triton.autotune kernel: name the kernel @triton.autotune decorates, or leave "
            f"`autotuner` out for a @flytune_build.autotune one") in r.stderr
    assert "DeclarationError" not in r.stdout + r.stderr
    # the entry's second shape fails alike: said once, the other pointing at it
    assert r.stderr.count("not a @triton.autotune kernel") == 1
    assert "fixpkg.scaled n=200: the same error as fixpkg.scaled n=100" in r.stderr


TRITON_KERNEL = '''
import torch, triton, triton.language as tl

@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def scale_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)

def setup(n):
    x, out = torch.ones(n), torch.empty(n)
    return lambda: scale_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
'''


def test_a_triton_autotune_kernel_the_package_never_adopts_is_said_once_with_the_line_that_adopts_it(tmp_path):
    proj = planned(tmp_path, entry("fixpkg.scale", (100, 200), setup="fixpkg.tri:setup",
                                   extra='autotuner = "fixpkg.tri:scale_kernel"\n'))
    (proj / "fixpkg" / "tri.py").write_text(TRITON_KERNEL)
    r = tune(proj, tmp_path, "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.count("fixpkg.scale is adopted by no one") == 1, r.stderr
    assert '`flytune_build.triton.adopt(scale_kernel, name="fixpkg.scale")`' in r.stderr
    (proj / "fixpkg" / "tri.py").write_text(TRITON_KERNEL + '\nimport flytune_build.triton\n'
                                            'flytune_build.triton.adopt(scale_kernel, name="fixpkg.scale")\n')
    r = tune(proj, tmp_path, "--no-progress", "--no-resume")
    assert r.returncode == 0 and "adopted by no one" not in r.stderr, r.stdout + r.stderr


def test_a_setup_attribute_that_is_not_there_names_the_one_that_is(tmp_path):
    from flytune_build.tuning.job import load_setup

    (tmp_path / "typo_setups.py").write_text("def setup(n):\n    return lambda: None\n")
    with pytest.raises(ProjectError) as e:
        sys.path.insert(0, str(tmp_path))
        try:
            load_setup("typo_setups:setpu", tmp_path / "plan.toml", "entries[3].setup")
        finally:
            sys.path.remove(str(tmp_path))
    assert e.value.field == "entries[3].setup"
    assert e.value.rule == ("names 'typo_setups:setpu', which cannot be loaded: module typo_setups has no attribute "
                            "'setpu' (did you mean `typo_setups:setup`?)")


def test_a_setup_module_that_raises_on_import_is_named_with_the_field_not_a_traceback(tmp_path, monkeypatch):
    from flytune_build.tuning.job import load_setup

    (tmp_path / "boom_setups.py").write_text("raise SystemExit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ProjectError, match="its import raised SystemExit: 3") as e:
        load_setup("boom_setups:setup", tmp_path / "plan.toml", "entries[0].setup")
    assert e.value.field == "entries[0].setup"


def test_a_tune_output_outside_the_sources_says_how_to_make_it_ship(tmp_path):
    import dataclasses

    from flytune_build.tuning.driver import unshipped_note

    proj = project_mod.load(make_project(tmp_path / "p"))
    note = unshipped_note(proj, proj.root / "tuned" / "interpreter")
    assert note.endswith("the build does not ship what this run writes there: move the output under a "
                         "source (`output = \"artifacts/{arch}\"` in [tool.flytune.tune]), or add 'tuned' to "
                         "[tool.flytune] sources")
    error = project_mod.unshipped_output_error(dataclasses.replace(proj, tune_output="tuned/{arch}"))
    assert error.field == "tool.flytune.tune.output" and str(error).endswith(
        "so the build never ships what `flytune tune` writes there: move the output under a source (`output = "
        "\"artifacts/{arch}\"` in [tool.flytune.tune]), or add 'tuned' to [tool.flytune] sources")
    assert project_mod.unshipped_output_error(dataclasses.replace(proj, tune_output="artifacts/{arch}")) is None
    outside = unshipped_note(proj, tmp_path / "elsewhere")
    assert "tune into a directory under the sources instead" in outside and "add 'elsewhere'" not in outside


def test_the_in_process_worker_that_cannot_start_says_why_and_what_to_do_once(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the worker starts")
    proj = planned(tmp_path, entry("fixpkg.add"))
    env = {k: v for k, v in python_env(PYTHONPATH=proj, FLYTUNE_CACHE_DIR=tmp_path / "c").items()
           if k not in ("TRITON_INTERPRET", "FLYTUNE_DEVICE")}
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "tune", "--project", str(proj), "--allow-ci",
                        "--ranking", "synthetic"], capture_output=True, text=True, env=env)
    assert r.returncode == 2, r.stdout + r.stderr   # refused before any worker starts: what to run instead
    assert r.stderr.strip() == ("flytune: error: no GPU is visible, and a search runs the kernels: tune on the GPU you "
                                "ship for, or, on a CPU, for the interpreter target: TRITON_INTERPRET=1 flytune tune "
                                "--ranking synthetic")


def test_inspect_of_a_project_gives_the_bytes_of_its_artifacts(tmp_path):
    import json

    proj = make_project(tmp_path / "p")
    size = sum(p.stat().st_size for p in (proj / "artifacts").glob("*.json"))
    r = flytune("inspect", proj)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == f"  2 artifact(s), {size} bytes" and size > 0
    doc = json.loads(flytune("inspect", "--json", proj).stdout)
    assert doc["bytes"] == size and len(doc["sizes"]) == 2


def test_a_setup_that_returns_no_call_names_the_setup_the_field_and_the_fix_said_once(tmp_path):
    proj = planned(tmp_path, entry("fixpkg.add", (100, 200), setup="fixpkg.setups:returns_none"))
    (proj / "fixpkg" / "setups.py").write_text(SETUPS + "\n\ndef returns_none(n):\n    return None\n")
    r = tune(proj, tmp_path)   # progress on: its line names the failed job, the reason is said once at the end
    assert r.returncode == 1, r.stdout + r.stderr
    assert (f"{proj / 'tune' / 'plan.toml'}: Field `entries[0].setup` names 'fixpkg.setups:returns_none', which "
            f"returned NoneType: a setup returns the call to time") in r.stderr, r.stderr
    assert r.stderr.count("returned NoneType") == 1 and "Traceback" not in r.stderr   # n=200: "the same error as"
