"""One verification: the build, `flytune verify DIR` (a project or an artifact directory) and the wheel
verifier name the same defect with the same rule, each pointing at the file it read.

A bare artifact directory declares no targets or Triton range, so only the artifact rules (key axes,
conflicts) apply to it; a bundle's shard holds one key-axis set per kernel, so a key-axis split
cannot be written into a wheel at all.
"""
import hashlib
import io
import json
import re
import zipfile
from pathlib import Path

from buildkit import H200, artifact, make_project

from flytune_build import pipeline
from flytune_build.audit import source as audit
from flytune_build.cli.render import render_verify
from flytune_build.core import codec, project, table, verification
from flytune_build.core.device import INTERPRETER
from flytune_build.dist.wheel import record_hash
from flytune_build.pipeline import collect, verify
from flytune_build.pipeline.state import BuildState

BUNDLE = "fixpkg/_flytune/"
SHARD, MANIFEST = BUNDLE + "fixpkg.add.json", BUNDLE + "manifest.json"
NAMED_FILE = re.compile(r"\S+\.json(#artifacts\[\d+\])?")


def said(errors, field):
    """The rule of each error on `field`, every file it names written <file>."""
    return [NAMED_FILE.sub("<file>", e.rule) for e in errors if e.field == field]


def build_errors(proj):
    """What the build's verify stage rejects (pipeline.run raises BuildFailure listing exactly these)."""
    return verify.verify(collect.collect(BuildState(project.load(proj)))).rejected


def bundle_files(proj):
    return dict(pipeline.run(proj, out=io.StringIO()).files)


WHEEL = b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def wheel_of(files, path: Path) -> Path:
    """A minimal wheel holding a build's bundle, with a RECORD that matches every member."""
    files = {**files, "fixpkg/__init__.py": b"", "fixpkg-1.0.dist-info/entry_points.txt":  # the bundle's own package
             b"[flytune.bundles]\nfixpkg = fixpkg._flytune\n", "fixpkg-1.0.dist-info/WHEEL": WHEEL}
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in files.items()) + "fixpkg-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in {**files, "fixpkg-1.0.dist-info/RECORD": record.encode()}.items():
            zf.writestr(name, data)
    return path


def rewrite_manifest(files, fn):
    doc = json.loads(files[MANIFEST])
    fn(doc)
    files[MANIFEST] = codec.canonical(doc) + b"\n"


def test_conflict_reads_the_same_in_build_directory_project_and_wheel(tmp_path):
    proj = make_project(tmp_path / "p")
    files = bundle_files(proj)
    artifact(100, 64).save(proj / "artifacts" / "again")  # the interpreter identity again, another config
    # the same defect in a bundle: a second row for the interpreter identity, before the first
    shard = json.loads(files[SHARD])
    block64 = next(i for i, c in enumerate(shard["configs"]) if c["kwargs"] == {"BLOCK": 64})
    at, row = next((i, r) for i, r in enumerate(shard["artifacts"]) if shard["devices"][r[0]] == INTERPRETER.to_json())
    shard["artifacts"].insert(at, [row[0], block64, *row[2:]])
    files[SHARD] = codec.canonical(shard) + b"\n"
    rewrite_manifest(files, lambda d: d["kernels"]["fixpkg.add"].update(
        sha256=hashlib.sha256(files[SHARD]).hexdigest(), artifacts=3))

    build = said(build_errors(proj), "config")
    assert len(build) == 1 and build[0].startswith("conflicts with <file>: same identity")
    assert "(Config(BLOCK=64" in build[0] and "vs Config(BLOCK=32" in build[0]
    assert said(audit.verify(str(proj)).errors, "config") == build
    assert said(audit.verify(str(proj / "artifacts")).errors, "config") == build
    wheel = audit.verify(str(wheel_of(files, tmp_path / "fixpkg-1.0-py3-none-any.whl")))
    assert said(wheel.errors, "config") == build
    assert [e.file for e in wheel.errors if e.field == "config"] == [f"{tmp_path}/fixpkg-1.0-py3-none-any.whl!{SHARD}"
                                                                      f"#artifacts[{at + 1}]"]


def test_key_axes_read_the_same_in_build_directory_and_project(tmp_path):
    proj = make_project(tmp_path / "p")
    odd = artifact(200, 32, key={"n": 200})
    odd.save(proj / "artifacts")
    build = build_errors(proj)
    (rule,) = said(build, "key")
    assert rule.startswith("has key axes ['n'], which lacks ['x'] against the ['n', 'x'] of kernel fixpkg.add's 2 other "
                           "artifact(s)") and "re-tune these shapes" in rule
    assert [e.file for e in build if e.field == "key"] == [f"artifacts/{odd.filename}"]
    assert said(audit.verify(str(proj)).errors, "key") == said(build, "key")
    directory = audit.verify(str(proj / "artifacts")).errors
    assert said(directory, "key") == said(build, "key")
    assert [e.file for e in directory] == [str(proj / "artifacts" / odd.filename)]


def test_coverage_gap_reads_the_same_in_build_project_and_wheel(tmp_path):
    proj = make_project(tmp_path / "p", artifacts=[artifact(100, 32)], extra="strict = false")
    build = build_errors(proj)
    rule = ("is not met: kernel fixpkg.add has no artifact for target sm_90/132/NVIDIA H200 (tool.flytune.targets[1]): "
            "tune it on that device (`flytune tune` there), or drop the target")
    assert said(build, "tool.flytune.coverage") == [rule]
    assert said(audit.verify(str(proj)).errors, "tool.flytune.coverage") == [rule]
    whl = wheel_of(bundle_files(proj), tmp_path / "fixpkg-1.0-py3-none-any.whl")  # not strict: built with the gap
    wheel = audit.verify(str(whl)).errors
    assert said(wheel, "coverage") == [rule]
    assert [e.file for e in wheel] == [f"{whl}!{MANIFEST}"]


def test_drift_reads_the_same_in_build_project_and_wheel(tmp_path):
    files = bundle_files(make_project(tmp_path / "clean"))
    rewrite_manifest(files, lambda d: d["toolchain"].update(triton=">=3.7,<4"))
    proj = make_project(tmp_path / "p")
    text = (proj / "pyproject.toml").read_text().replace('">=3.0,<4"', '">=3.7,<4"')
    (proj / "pyproject.toml").write_text(text)

    build = said(build_errors(proj), "provenance.triton")
    assert build == ["is 3.6.0, outside the declared Triton range '>=3.7,<4' "
                     "(toolchain drift: re-tune, or widen tool.flytune.triton)"] * 2
    assert said(audit.verify(str(proj)).errors, "provenance.triton") == build
    whl = str(wheel_of(files, tmp_path / "fixpkg-1.0-py3-none-any.whl"))
    strict = audit.verify(whl, strict=True).errors
    assert said(strict, "provenance.triton") == build
    # without --strict a verifier warns of drift, in the same words
    plain = audit.verify(whl)
    assert plain.ok and all(str(e) in plain.warnings for e in strict)


def test_duplicates_are_kept_once_with_a_note_everywhere(tmp_path):
    a = artifact(100, 32)
    arts = [a, artifact(100, 32)]
    found = verification.check(arts, lambda x: "one.json" if x is a else "two.json")
    assert not found.errors and found.kept(arts) == [a]
    assert found.warnings == ["two.json duplicates one.json; kept once"]


def test_rules_run_without_a_declaration_skip_coverage_and_toolchain():
    arts = [artifact(100, 32, triton="1.0"), artifact(100, 64, dev=H200)]
    assert not verification.check(arts, lambda x: x.filename).errors


def test_table_aligns_columns_and_drops_trailing_space():
    text = table.render([["kernel", "sm_90", "axes"], ["a.long_name", 12, ""]], align="<>", indent="  ")
    assert text.splitlines() == ["  kernel       sm_90  axes", "  a.long_name     12"]
    assert table.render([]) == ""


def test_another_backends_compiler_option_reads_the_same_in_build_directory_and_project(tmp_path):
    """`waves_per_eu` (Triton's HIP launch keyword) in an H200 artifact: Triton's CUDA backend refuses it
    at launch, so the build and `flytune verify` refuse it, naming the kwarg; on the interpreter it is kept."""
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.config import Config

    proj = make_project(tmp_path / "p")
    amd = Artifact("fixpkg.add", {"x": "float32", "n": 300}, H200, Config({"BLOCK": 64, "waves_per_eu": 2}),
                   {"triton": "3.6.0", "ranking": "synthetic"})
    amd.save(proj / "artifacts")
    Artifact("fixpkg.add", {"x": "float32", "n": 300}, INTERPRETER, Config({"BLOCK": 64, "waves_per_eu": 2}),
             {"triton": "3.6.0", "ranking": "synthetic"}).save(proj / "artifacts")
    build = build_errors(proj)
    assert said(build, "config.kwargs.waves_per_eu") == [
        "is a compiler option of Triton's hip backend, which Triton's cuda backend refuses at launch "
        "(a config tuned for another device?)"]
    assert [e.file for e in build] == [f"artifacts/{amd.filename}"]
    for where in (proj, proj / "artifacts"):
        assert said(audit.verify(str(where)).errors, "config.kwargs.waves_per_eu") == said(build, "config.kwargs.waves_per_eu")


def test_verify_strict_fails_a_bundle_that_serves_nothing(tmp_path):
    """An empty bundle is a warning in a plain verify and an error under --strict, as a wheel with no
    bundle is."""
    from flytune_build.audit import verify

    root = tmp_path / "emptyproj"
    (root / "emptypkg").mkdir(parents=True)
    (root / "emptypkg" / "__init__.py").write_text("")
    (root / "artifacts").mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "emptypkg"\nversion = "1.0"\n\n[tool.flytune]\n'
                                         'package = "emptypkg"\nsources = ["artifacts"]\ntargets = ["interpreter"]\n'
                                         'coverage = "none"\n')
    assert verify(root).ok
    strict = verify(root, strict=True)
    assert not strict.ok and "serves nothing" in str(strict.errors[-1])


def test_verify_of_a_built_bundle_directory_says_what_to_verify_instead(tmp_path):
    from flytune_build.audit import verify

    bundle_dir = tmp_path / "mypkg" / "_flytune"
    bundle_dir.mkdir(parents=True)
    (bundle_dir / "manifest.json").write_text("{}")
    src = verify(bundle_dir)
    assert [type(e).__name__ for e in src.errors] == ["InputError"]
    assert "verify the wheel" in str(src.errors[0])


def test_verify_deep_of_a_project_not_installed_says_to_install_it(tmp_path):
    from flytune_build.audit import verify
    from buildkit import artifact

    root = tmp_path / "notinstalled"
    (root / "notinstalledpkg_xyz").mkdir(parents=True)
    (root / "notinstalledpkg_xyz" / "__init__.py").write_text("")
    artifact(100, 32, kernel="notinstalledpkg_xyz.add").save(root / "artifacts")
    (root / "pyproject.toml").write_text('[project]\nname = "notinstalledpkg-xyz"\nversion = "1.0"\n\n'
                                         '[tool.flytune]\npackage = "notinstalledpkg_xyz"\nsources = ["artifacts"]\n'
                                         'targets = ["interpreter"]\ncoverage = "none"\n')
    src = verify(root, deep=True)
    assert any("install the project first" in str(e) for e in src.errors), render_verify(src)


def test_a_kernel_misspelled_in_coverage_is_one_error_with_the_kernel_meant(tmp_path):
    """A kernel `coverage` names that no artifact holds and no plan tunes is said once, not once per
    target, with the kernel meant where one is near; a listed kernel with some artifacts keeps its
    per-target gaps."""
    proj = make_project(tmp_path / "p", artifacts=[artifact(100, 32)],
                        extra='strict = false\ncoverage = ["fixpkg.addd"]')
    rules = said(build_errors(proj), "tool.flytune.coverage")
    assert rules == ["is not met: kernel fixpkg.addd has no artifact for any declared target, nor is it in the "
                     "tuning plan (did you mean `fixpkg.add`?)"]
    assert said(audit.verify(str(proj)).errors, "tool.flytune.coverage") == rules


def _pipeline_error(proj):
    try:
        pipeline.load(proj)
    except Exception as e:  # noqa: BLE001 - the build's own refusal, compared below
        return str(e)
    return None


def test_a_misnamed_table_is_named_by_verify_as_by_the_build_whatever_its_case_or_unicode_form(tmp_path):
    for i, name in enumerate(("FLYTUNE", "flytun", '"\ufb02ytune"')):   # the last: the ﬂ ligature
        proj = make_project(tmp_path / f"p{i}")
        text = (proj / "pyproject.toml").read_text("utf-8")
        (proj / "pyproject.toml").write_text(text.replace("tool.flytune", f"tool.{name}"), "utf-8")
        (error,) = audit.open_source(str(proj)).errors
        assert "is not a table flytune reads (did you mean `tool.flytune`?)" in str(error), error
        assert str(error) == _pipeline_error(proj)


def test_a_pyproject_that_is_no_regular_file_fails_verify_as_it_fails_the_build(tmp_path):
    proj = make_project(tmp_path / "p")
    (proj / "pyproject.toml").unlink()
    (proj / "pyproject.toml").mkdir()
    src = audit.open_source(str(proj))
    assert src.kind == "project" and [str(e) for e in src.errors] == [_pipeline_error(proj)]
    assert "is a directory, not a regular file" in str(src.errors[0])
    (proj / "pyproject.toml").rmdir()
    (proj / "pyproject.toml").symlink_to(tmp_path / "nowhere.toml")   # dangling
    assert audit.open_source(str(proj)).errors and _pipeline_error(proj)


def test_a_path_the_system_refuses_is_that_sources_error_and_the_others_are_still_read(tmp_path, capsys):
    from flytune_build.cli.main import main

    good = Path(__file__).parent.parent / "sample_pkg" / "artifacts" / "interpreter"
    long = str(tmp_path / ("a" * 300))   # ENAMETOOLONG
    src = audit.open_source(long)
    assert [e.rule for e in src.errors] == ["cannot be read: File name too long"]
    assert main(["verify", str(good), long]) == 1
    out = capsys.readouterr().out
    assert f"{good} (directory): ok" in out and "cannot be read: File name too long" in out
    assert main(["inspect", long]) == 1 and "Traceback" not in capsys.readouterr().err


def test_a_source_naming_a_file_that_is_no_artifact_file_is_refused_by_the_build_and_verify_alike(tmp_path):
    proj = make_project(tmp_path / "p")
    text = (proj / "pyproject.toml").read_text()
    (proj / "pyproject.toml").write_text(text.replace('sources = ["artifacts"]',
                                                     'sources = ["artifacts", "fixpkg/__init__.py"]'))
    rule = ("names 'fixpkg/__init__.py', which is not a <file> file: name the directory that holds them, or the "
            "files themselves")
    assert said(build_errors(proj), "tool.flytune.sources[1]") == [rule]
    assert said(audit.open_source(str(proj)).errors, "tool.flytune.sources[1]") == [rule]
    # and the fix a misplaced tune output is given names a directory, never that file
    assert 'output = "artifacts/{arch}"' in project.unshipped_fix(proj, ["fixpkg/__init__.py", "artifacts"],
                                                                  tmp_path / "elsewhere")
    assert 'output = "artifacts/interpreter/{arch}"' in project.unshipped_fix(proj, ["artifacts\\\\interpreter"],
                                                                              tmp_path / "elsewhere")
    # a name holding two dots is a name, not a step up; a step up is never offered
    (proj / "tuned..v2").mkdir()
    assert 'output = "tuned..v2/{arch}"' in project.unshipped_fix(proj, ["tuned..v2"], tmp_path / "elsewhere")
    assert "an `output` under a directory the sources name" in project.unshipped_fix(proj, ["../x"], tmp_path / "e")
