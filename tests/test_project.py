import subprocess
import sys
import textwrap

import pytest
from conftest import python_env

from flytune_build.core import project
from flytune_build.core.errors import ProjectError

GOOD = """
[project]
name = "demo-pkg"
version = "1.0"

[tool.flytune]
sources = ["artifacts"]
targets = ["sm_90", {{ arch = "gfx942", units = 304, accept = ["exact"] }}, "interpreter"]
coverage = ["demo.rmsnorm"]
triton = ">=3.4,<4"
strict = false
{extra}
"""


def write(tmp_path, text, pkg="demo"):
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent(text))
    if pkg:
        (tmp_path / pkg).mkdir(exist_ok=True)
        (tmp_path / pkg / "__init__.py").write_text("")
    return tmp_path


def test_good_table_parses_whole(tmp_path):
    p = project.load(write(tmp_path, GOOD.format(extra="")))
    assert p.package == "demo"  # inferred: the only package
    assert p.sources == ("artifacts",)
    assert [t.label() for t in p.targets] == ["sm_90", "gfx942/304", "interpreter"]
    assert p.targets[1].accept == ("exact",)
    assert p.coverage == ("demo.rmsnorm",) and p.triton == ">=3.4,<4" and p.strict is False
    assert p.name == "demo-pkg"


def test_absent_table_is_none(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname='x'\nversion='1'\n")
    assert project.load(tmp_path) is None


def test_tune_entries_inline_and_plan_file(tmp_path):
    extra = """
[tool.flytune.tune]
output = "artifacts/{arch}"
entries = [{ kernel = "demo.rmsnorm", setup = "demo.tuning:rmsnorm", shapes = [{ M = 4, N = 256 }] }]
"""
    p = project.load(write(tmp_path, GOOD.format(extra=extra)))
    assert p.tune_entries[0].kernel == "demo.rmsnorm" and p.tune_entries[0].shapes == ({"M": 4, "N": 256},)
    (tmp_path / "plan.toml").write_text('[[entries]]\nkernel = "demo.softmax"\nsetup = "demo.t:s"\n'
                                        'shapes = [{ N = 1 }]\n')
    p = project.load(write(tmp_path, GOOD.format(extra='[tool.flytune.tune]\nplan = "plan.toml"\n')))
    assert p.tune_plan == "plan.toml" and p.tune_entries == ()
    assert project.load_plan(tmp_path, p.tune_plan)[0].kernel == "demo.softmax"
    (tmp_path / "bad.toml").write_text('[[entries]]\nkernel = "demo.softmax"\n')
    with pytest.raises(ProjectError) as e:
        project.load_plan(tmp_path, "bad.toml")
    assert e.value.field == "entries[0].setup" and str(tmp_path / "bad.toml") in str(e.value)


BAD = [
    ("unknown-key", 'sources = ["a"]\ntargets = ["sm_90"]\nsoruces = 1', "tool.flytune.soruces",
     "did you mean `sources`"),
    ("missing-sources", 'targets = ["sm_90"]', "tool.flytune.sources", "is required"),
    ("missing-targets", 'sources = ["a"]', "tool.flytune.targets", "is required"),
    ("sources-string", 'sources = "a"\ntargets = ["sm_90"]', "tool.flytune.sources", "must be an array"),
    ("sources-empty", 'sources = []\ntargets = ["sm_90"]', "tool.flytune.sources", "at least one"),
    ("source-absolute", 'sources = ["/etc"]\ntargets = ["sm_90"]', "tool.flytune.sources[0]", "absolute"),
    ("source-traversal", 'sources = ["a/../../x"]\ntargets = ["sm_90"]', "tool.flytune.sources[0]", "`..`"),
    ("source-number", 'sources = [1]\ntargets = ["sm_90"]', "tool.flytune.sources[0]", "must be a string"),
    ("targets-empty", 'sources = ["a"]\ntargets = []', "tool.flytune.targets", "at least one"),
    ("target-arch-int", 'sources = ["a"]\ntargets = [{ arch = 90 }]', "tool.flytune.targets[0].arch",
     "must be a string"),
    ("target-bad-arch", 'sources = ["a"]\ntargets = ["sm90"]', "tool.flytune.targets[0]", "arch such as"),
    ("target-second-bad", 'sources = ["a"]\ntargets = ["sm_90", { arch = "sm_80", units = -2 }]',
     "tool.flytune.targets[1].units", ">= 0"),
    ("coverage-word", 'sources = ["a"]\ntargets = ["sm_90"]\ncoverage = "most"', "tool.flytune.coverage",
     "must be \"all\""),
    ("coverage-bad-name", 'sources = ["a"]\ntargets = ["sm_90"]\ncoverage = ["a b"]', "tool.flytune.coverage[0]",
     "dotted kernel name"),
    ("triton-bad-spec", 'sources = ["a"]\ntargets = ["sm_90"]\ntriton = "three"', "tool.flytune.triton",
     "PEP 440"),
    ("strict-string", 'sources = ["a"]\ntargets = ["sm_90"]\nstrict = "yes"', "tool.flytune.strict",
     "must be a boolean"),
    ("package-bad", 'package = "my-pkg"\nsources = ["a"]\ntargets = ["sm_90"]', "tool.flytune.package",
     "dotted Python package"),
    ("tune-both", 'sources = ["a"]\ntargets = ["sm_90"]\ntune = { plan = "p.toml", entries = [] }',
     "tool.flytune.tune", "exactly one"),
    ("tune-entry-setup", 'sources = ["a"]\ntargets = ["sm_90"]\ntune = { entries = [{ kernel = "k", setup = "nope", '
     'shapes = [{ N = 1 }] }] }', "tool.flytune.tune.entries[0].setup", "`module:function`"),
    ("tune-entry-no-shapes", 'sources = ["a"]\ntargets = ["sm_90"]\ntune = { entries = [{ kernel = "k", '
     'setup = "m:f", shapes = [] }] }', "tool.flytune.tune.entries[0].shapes", "at least one"),
    ("tune-unknown", 'sources = ["a"]\ntargets = ["sm_90"]\ntune = { plna = "x" }', "tool.flytune.tune.plna",
     "did you mean `plan`"),
]


@pytest.mark.parametrize("case,body,field,rule", BAD, ids=[b[0] for b in BAD])
def test_bad_table_names_dotted_key(tmp_path, case, body, field, rule):
    write(tmp_path, "[project]\nname = 'x'\nversion = '1'\n[tool.flytune]\n" + body + "\n")
    with pytest.raises(ProjectError) as e:
        project.load(tmp_path)
    assert e.value.field == field, e.value
    assert rule in e.value.rule, e.value
    assert str(tmp_path / "pyproject.toml") in str(e.value)
    assert str(e.value).count("Field `") == 1


def test_package_cannot_be_inferred_from_two(tmp_path):
    write(tmp_path, '[tool.flytune]\nsources = ["a"]\ntargets = ["sm_90"]\n', pkg="one")
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "__init__.py").write_text("")
    with pytest.raises(ProjectError, match="several packages: one, two"):
        project.load(tmp_path)


def test_invalid_toml_and_utf8(tmp_path):
    (tmp_path / "pyproject.toml").write_bytes(b"[tool.flytune\n")
    with pytest.raises(ProjectError, match="not valid TOML"):
        project.load(tmp_path)
    (tmp_path / "pyproject.toml").write_bytes(b"x = '\xff'\n")
    with pytest.raises(ProjectError, match="UTF-8"):
        project.load(tmp_path)


def test_import_is_light():
    code = ("import sys, flytune_build, flytune_build.core.artifact, flytune_build.core.project, flytune_build.core.target;"
            "bad=[m for m in sys.modules if m.split('.')[0] in ('torch','triton','setuptools','numpy')];"
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_importtime_shows_no_heavy_import():
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", "import flytune_build"], env=python_env(),
                       capture_output=True, text=True)
    assert r.returncode == 0
    imported = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert not imported & {"torch", "triton", "setuptools"}, imported


def _validate(tmp_path, text):
    (tmp_path / "pyproject.toml").write_text(text)
    return subprocess.run([sys.executable, "-m", "validate_pyproject", str(tmp_path / "pyproject.toml")],
                          env=python_env(), capture_output=True, text=True)


def test_validate_pyproject_uses_our_schema(tmp_path):
    good = _validate(tmp_path, '[project]\nname = "x"\nversion = "1"\n[tool.flytune]\nsources = ["a"]\n'
                               'targets = ["sm_90", { arch = "interpreter" }]\n')
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _validate(tmp_path, '[project]\nname = "x"\nversion = "1"\n[tool.flytune]\nsources = ["a"]\n'
                              'targets = [{ arch = 90 }]\n')
    assert bad.returncode != 0
    assert "tool.flytune" in bad.stdout + bad.stderr


def test_a_pyproject_saved_with_a_byte_order_mark_is_named_for_it(tmp_path):
    from flytune_build.core import project as project_mod
    from flytune_build.core.errors import ProjectError

    (tmp_path / "pyproject.toml").write_bytes(b"\xef\xbb\xbf[project]\nname = 'x'\n")
    with pytest.raises(ProjectError, match="byte-order mark") as e:
        project_mod.load(tmp_path)
    assert e.value.file == tmp_path / "pyproject.toml" or str(e.value.file).endswith("pyproject.toml")
