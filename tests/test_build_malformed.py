"""Build-level malformed inputs: each fails the build, names file, field and rule, writes no wheel."""
import io
import json
import os
from pathlib import Path

import pytest
from buildkit import H200, artifact, make_project, pip_wheel

from flytune_build import pipeline
from flytune_build.core import codec
from flytune_build.core.errors import FlytuneError

GOOD = artifact(100, 32)


def edit_doc(proj, fn, name=GOOD.filename):
    path = proj / "artifacts" / name
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_bytes(codec.canonical(doc) + b"\n")


def set_in(doc, dotted, value):
    *parts, last = dotted.split(".")
    for p in parts:
        doc = doc[p]
    doc[last] = value


def write(proj, name, data):
    (proj / "artifacts" / name).write_bytes(data)


def table(proj, old, new):
    p = proj / "pyproject.toml"
    p.write_text(p.read_text().replace(old, new))


def conflict(proj):
    other = artifact(100, 64)
    (proj / "artifacts" / "again").mkdir()
    other.save(proj / "artifacts" / "again")


def axes(proj):
    artifact(200, 32, key={"n": 200}).save(proj / "artifacts")


def escape_symlink(proj):
    outside = proj.parent / "outside"
    artifact(300, 32).save(outside)
    (proj / "artifacts" / "link").symlink_to(outside)


CASES = [
    # id, mutate(proj), file fragment, field, rule fragment
    ("truncated", lambda p: write(p, GOOD.filename, GOOD.to_bytes()[:50]), GOOD.filename, None, "not valid JSON"),
    ("non-utf8", lambda p: write(p, GOOD.filename, b'{"k": "\xff"}'), GOOD.filename, None, "UTF-8"),
    ("duplicate-key", lambda p: write(p, GOOD.filename, b'{"format":1,"format":1}'), GOOD.filename, "format",
     "duplicate JSON key"),
    ("nan", lambda p: write(p, GOOD.filename, GOOD.to_bytes().replace(b'"ranking"', b'"x":NaN,"ranking"')),
     GOOD.filename, None, "non-finite"),
    ("unknown-field", lambda p: edit_doc(p, lambda d: set_in(d, "config.unroll", 2)), GOOD.filename,
     "config.unroll", "not a known field"),
    ("unknown-version", lambda p: edit_doc(p, lambda d: set_in(d, "format", 9)), GOOD.filename, "format",
     "unknown format version 9"),
    ("wrong-type", lambda p: edit_doc(p, lambda d: set_in(d, "config.num_warps", 4.5)), GOOD.filename,
     "config.num_warps", "must be an integer"),
    ("num-warps-3-on-a-gpu", lambda p: edit_doc(p, lambda d: set_in(d, "config.num_warps", 3),
                                                 artifact(100, 64, dev=H200).filename),
     artifact(100, 64, dev=H200).filename, "config.num_warps", "compiles only a power of two"),
    ("bad-kernel-name", lambda p: edit_doc(p, lambda d: set_in(d, "kernel", "fix pkg")), GOOD.filename, "kernel",
     "dotted Python name"),
    ("hand-edited-key", lambda p: edit_doc(p, lambda d: set_in(d, "key.n", 101)), GOOD.filename, "<file name>",
     "content address"),
    ("renamed", lambda p: os.rename(p / "artifacts" / GOOD.filename, p / "artifacts" / "fixpkg.add-0123456789abcdef.json"),
     "fixpkg.add-0123456789abcdef.json", "<file name>", "content address"),
    ("not-canonical", lambda p: write(p, GOOD.filename, json.dumps(GOOD.to_json(), indent=1).encode()),
     GOOD.filename, "<document>", "canonical form"),
    ("arch-backend-mismatch", lambda p: edit_doc(p, lambda d: set_in(d, "device.arch", "sm_90")), GOOD.filename,
     "device.arch", "not a interpreter arch"),
    ("oversized", lambda p: write(p, GOOD.filename, b" " * (codec.MAX_DOCUMENT_BYTES + 1)), GOOD.filename, None,
     "cap"),
    ("conflict", conflict, "again/" + GOOD.filename, "config", "same identity"),
    ("key-axes", axes, "fixpkg.add-", "key", "has key axes ['n']"),
    ("coverage-gap", lambda p: os.unlink(p / "artifacts" / artifact(100, 64, dev=H200).filename), "pyproject.toml",
     "tool.flytune.coverage", "no artifact for target sm_90/132/NVIDIA H200"),
    ("coverage-named", lambda p: table(p, 'triton = ', 'coverage = ["fixpkg.add", "fixpkg.mul"]\ntriton = '),
     "pyproject.toml", "tool.flytune.coverage", "kernel fixpkg.mul has no artifact"),
    ("empty-sources", lambda p: [f.unlink() for f in (p / "artifacts").glob("*.json")], "pyproject.toml",
     "tool.flytune.coverage", None),
    ("drift", lambda p: table(p, '">=3.0,<4"', '">=3.7,<4"'), GOOD.filename, "provenance.triton",
     "outside the declared Triton range"),
    ("drift-missing", lambda p: edit_doc(p, lambda d: d.pop("provenance")), GOOD.filename, "provenance.triton",
     "is required when"),
    ("drift-bad-version", lambda p: edit_doc(p, lambda d: set_in(d, "provenance.triton", "three")), GOOD.filename,
     "provenance.triton", "outside the declared Triton range"),
    ("table-unknown-key", lambda p: table(p, "[tool.flytune]", "[tool.flytune]\nstirct = true"), "pyproject.toml",
     "tool.flytune.stirct", "did you mean `strict`"),
    ("table-bad-target", lambda p: table(p, 'targets = ["interpreter"', 'targets = ["sm90"'), "pyproject.toml",
     "tool.flytune.targets[0]", "arch such as"),
    ("table-dotdot", lambda p: table(p, 'sources = ["artifacts"]', 'sources = ["../artifacts"]'), "pyproject.toml",
     "tool.flytune.sources[0]", "`..` is not allowed"),
    ("table-absolute", lambda p: table(p, 'sources = ["artifacts"]', 'sources = ["/tmp"]'), "pyproject.toml",
     "tool.flytune.sources[0]", "absolute"),
    ("table-missing-source", lambda p: table(p, 'sources = ["artifacts"]', 'sources = ["tuned"]'), "pyproject.toml",
     "tool.flytune.sources[0]", "does not exist"),
    ("table-bad-triton", lambda p: table(p, '">=3.0,<4"', '"3.x"'), "pyproject.toml", "tool.flytune.triton",
     "PEP 440"),
    ("table-invalid-toml", lambda p: table(p, "[tool.flytune]", "[tool.flytune"), "pyproject.toml", None,
     "not valid TOML"),
    ("table-strict-type", lambda p: table(p, "[tool.flytune]", "[tool.flytune]\nstrict = 1"), "pyproject.toml",
     "tool.flytune.strict", "must be a boolean"),
    ("symlink-escape", escape_symlink, "pyproject.toml", "tool.flytune.sources[0]", "outside the project root"),
]


@pytest.mark.parametrize("case,mutate,file,field,rule", CASES, ids=[c[0] for c in CASES])
def test_malformed_build_input(tmp_path, case, mutate, file, field, rule):
    proj = make_project(tmp_path / "p")
    mutate(proj)
    with pytest.raises(FlytuneError) as e:
        pipeline.run(proj, out=io.StringIO())
    text = str(e.value)
    assert file in text, text
    if field:
        assert f"Field `{field}`" in text, text
    if rule:
        assert rule in text, text


def test_corpus_is_large_enough():
    assert len(CASES) >= 25


@pytest.mark.parametrize("case", ["wrong-type", "conflict", "drift", "table-unknown-key"])
def test_real_build_exits_non_zero_without_traceback_or_wheel(tmp_path, case):
    _, mutate, file, field, rule = next(c for c in CASES if c[0] == case)
    proj = make_project(tmp_path / "p")
    mutate(proj)
    r = pip_wheel(proj, tmp_path / "dist")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert not list(Path(tmp_path / "dist").glob("*.whl"))
    assert rule in out and "Traceback" not in out


def test_configs_differing_only_as_true_and_one_conflict(tmp_path):
    """True and 1 are equal in Python, not in JSON: two such configs for one identity conflict."""
    import io

    from flytune_build import pipeline
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.config import Config
    from flytune_build.core.device import INTERPRETER
    from flytune_build.pipeline import BuildFailure

    a = Artifact("fixpkg.add", {"x": "float32", "n": 100}, INTERPRETER, Config({"BLOCK": 16, "EVEN": True}))
    b = Artifact("fixpkg.add", {"x": "float32", "n": 100}, INTERPRETER, Config({"BLOCK": 16, "EVEN": 1}))
    assert a.config != b.config and len({a.config, b.config}) == 2
    proj = make_project(tmp_path / "p", artifacts=[a])
    (proj / "more").mkdir()
    b.save(proj / "more")
    text = (proj / "pyproject.toml").read_text().replace('sources = ["artifacts"]', 'sources = ["artifacts", "more"]')
    (proj / "pyproject.toml").write_text(text)
    with pytest.raises(BuildFailure) as e:
        pipeline.run(proj, out=io.StringIO())
    assert "different config" in str(e.value)


BAD_PLAN = '[[entries]]\nkernel = "fixpkg.add"\nsetup = "fixpkg.tuning:add"\nshape = [{ n = 100 }]\n'


@pytest.mark.parametrize("strict", ["true", "false"])
def test_a_bad_tuning_plan_is_a_declaration_problem_that_strict_false_never_drops(tmp_path, strict):
    """A plan file's error is the plan's, not an artifact's: the refusal says where, never advises
    `strict = false` (which would drop the plan and with it the coverage of its kernels), and fails that
    build too."""
    proj = make_project(tmp_path / "p", extra=f'strict = {strict}\n[tool.flytune.tune]\nplan = "tune/plan.toml"\n')
    (proj / "tune").mkdir()
    (proj / "tune" / "plan.toml").write_text(BAD_PLAN)
    out = io.StringIO()
    with pytest.raises(pipeline.BuildFailure) as e:
        pipeline.run(proj, out=out)
    head, *lines = str(e.value).splitlines()
    assert head.endswith("1 problem(s) in the tuning plan tune/plan.toml; no wheel was written:"), head
    assert "artifacts" not in head and "strict" not in head
    assert len(lines) == 1 and "plan.toml: Field `entries[0].shape` is not a known field" in lines[0], lines
    assert "dropped" not in out.getvalue()


def test_the_build_report_counts_rejected_artifacts_apart_from_declaration_problems(tmp_path):
    """`rejected N` counts artifacts: a kernel misspelled in `coverage` is a problem of the declaration."""
    import io

    from buildkit import artifact, make_project

    from flytune_build import pipeline

    proj = make_project(tmp_path / "p", artifacts=[artifact(100, 32)], extra='strict = false\ncoverage = ["fixpkg.addd"]')
    out = io.StringIO()
    pipeline.run(proj, out=out)
    assert "rejected 0; 1 problem(s) in the declaration or the tuning plan" in out.getvalue(), out.getvalue()
