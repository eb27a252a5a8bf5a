"""`flytune verify`, `inspect`, `diff`, `fmt`, `tune`: exit codes and messages on real wheels."""
import base64
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from buildkit import ROOT, artifact, make_project, pip_wheel
from conftest import flytune, python_env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("w")
    proj = make_project(tmp / "p")
    r = pip_wheel(proj, tmp / "dist")
    assert r.returncode == 0, r.stderr
    (whl,) = (tmp / "dist").glob("*.whl")
    return whl


def record_hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def rewrite(src: Path, dst: Path, *, replace=None, add=None, drop_record=None, add_record=None, fix_record=True):
    """Copy a wheel, changing members; RECORD follows the change only when `fix_record`."""
    replace, add = replace or {}, add or {}
    with zipfile.ZipFile(src) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    record = next(n for n in members if n.endswith(".dist-info/RECORD"))
    members.update(replace)
    members.update(add)
    rows = [r for r in csv.reader(io.StringIO(members[record].decode())) if r]
    if fix_record:
        rows = [[n, record_hash(members[n]), str(len(members[n]))] if n in replace else r
                for r in rows for n in [r[0]]]
    rows = [r for r in rows if r[0] != drop_record]
    if add_record:
        rows.insert(0, [add_record, record_hash(b"x"), "1"])
    members[record] = ("\n".join(",".join(r) for r in rows) + "\n").encode()
    with zipfile.ZipFile(dst, "w") as zf:
        for n, data in members.items():
            zf.writestr(n, data)
    return dst


SHARD = "fixpkg/_flytune/fixpkg.add.json"
MANIFEST = "fixpkg/_flytune/manifest.json"


def read(whl, name):
    with zipfile.ZipFile(whl) as zf:
        return zf.read(name)


def test_clean_wheel_verifies(wheel):
    r = flytune("verify", wheel)
    assert r.returncode == 0 and "ok; 2 artifact(s), 1 kernel(s)" in r.stdout


def test_one_tampered_byte_names_the_member(wheel, tmp_path):
    data = bytearray(read(wheel, SHARD))
    data[data.index(b'"BLOCK":32') + 9] = ord("6")
    bad = rewrite(wheel, tmp_path / wheel.name, replace={SHARD: bytes(data)}, fix_record=False)
    r = flytune("verify", bad)
    assert r.returncode == 1
    assert f"{bad}!{SHARD}: Field `RECORD` does not match its RECORD line" in r.stdout


def test_manifest_shard_mismatch_even_with_a_consistent_record(wheel, tmp_path):
    data = read(wheel, SHARD).replace(b'"BLOCK":32', b'"BLOCK":16')
    bad = rewrite(wheel, tmp_path / wheel.name, replace={SHARD: data})
    r = flytune("verify", bad)
    assert r.returncode == 1
    assert "Field `kernels.fixpkg.add.sha256` does not match the manifest" in r.stdout
    assert "RECORD" not in r.stdout


def test_record_only_line(wheel, tmp_path):
    bad = rewrite(wheel, tmp_path / wheel.name, add_record="fixpkg/ghost.py")
    r = flytune("verify", bad)
    assert r.returncode == 1 and "fixpkg/ghost.py: Field `RECORD` is listed in RECORD but absent" in r.stdout


def test_member_missing_from_record(wheel, tmp_path):
    bad = rewrite(wheel, tmp_path / wheel.name, add={"fixpkg/extra.py": b"print(1)\n"})
    r = flytune("verify", bad)
    assert r.returncode == 1 and "fixpkg/extra.py: Field `RECORD` is in the wheel but missing from RECORD" in r.stdout


def test_drift_is_a_warning_or_with_strict_an_error(wheel, tmp_path):
    doc = json.loads(read(wheel, MANIFEST))
    doc["toolchain"]["triton"] = ">=9"
    bad = rewrite(wheel, tmp_path / wheel.name, replace={MANIFEST: json.dumps(doc).encode()})
    r = flytune("verify", bad)
    assert r.returncode == 0 and "warning:" in r.stdout and "toolchain drift" in r.stdout
    r = flytune("verify", "--strict", bad)
    assert r.returncode == 1 and "Field `toolchain.triton`" in r.stdout


def test_coverage_gap(wheel, tmp_path):
    doc = json.loads(read(wheel, MANIFEST))
    doc["targets"].append({"arch": "gfx942", "name": None, "units": None, "accept": ["exact"]})
    bad = rewrite(wheel, tmp_path / wheel.name, replace={MANIFEST: json.dumps(doc).encode()})
    r = flytune("verify", bad)
    assert r.returncode == 1 and "manifest.json: Field `coverage` is not met: kernel fixpkg.add has no artifact for target gfx942" in r.stdout


def test_usage_error_exits_2(wheel):
    r = flytune("verify", "--frobnicate", wheel)
    assert r.returncode == 2 and "unrecognized arguments" in r.stderr
    assert flytune("verify").returncode == 2


@pytest.mark.parametrize("argv", [("verify", ""), ("inspect", " "), ("merge", ".", "--output", ""),
                                  ("tune", "--project", ""), ("fmt", "")])
def test_an_empty_path_or_name_is_a_usage_error_never_the_current_directory(argv, tmp_path):
    r = flytune(*argv, cwd=tmp_path)
    assert r.returncode == 2 and "must not be empty" in r.stderr, r.stderr
    assert not any(tmp_path.iterdir())


def test_json_report_fields(wheel, tmp_path):
    bad = rewrite(wheel, tmp_path / wheel.name, add_record="fixpkg/ghost.py")
    r = flytune("verify", "--json", wheel, bad)
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc["ok"] is False
    good, worse = doc["reports"]
    assert good == {"path": str(wheel), "kind": "wheel", "ok": True, "kernels": 1, "artifacts": 2, "errors": [],
                    "warnings": []}
    err = worse["errors"][0]
    assert set(err) == {"type", "file", "field", "rule", "message"} and err["field"] == "RECORD"


def test_verify_directory_sdist_and_installed(wheel, tmp_path):
    d = tmp_path / "arts"
    artifact(100, 32).save(d)
    assert flytune("verify", d).returncode == 0
    (d / "junk.json").write_text("{")
    r = flytune("verify", d)
    assert r.returncode == 1 and "junk.json" in r.stdout
    r = flytune("verify", "no-such-dist-anywhere")
    assert r.returncode == 1 and "does not exist: no file, directory or installed distribution" in r.stdout
    r = flytune("verify", tmp_path / "gone" / "x.whl")
    assert r.returncode == 1 and "x.whl: does not exist" in r.stdout
    r = flytune("inspect", d / "junk.json")
    assert r.returncode == 1 and "junk.json: is one artifact file: pass the directory that holds it" in r.stdout


def test_deep_catches_a_renamed_kernel_parameter(wheel, tmp_path):
    proj = make_project(tmp_path / "src", artifacts=[])
    init = proj / "fixpkg" / "__init__.py"
    init.write_text(init.read_text().replace("BLOCK", "BLOCK_SIZE"))
    r = flytune("verify", "--deep", wheel, PYTHONPATH=f"{proj}{os.pathsep}{ROOT}", TRITON_INTERPRET=1)
    assert r.returncode == 1
    assert "Field `config.kwargs.BLOCK` binds to no parameter of kernel fixpkg.add" in r.stdout
    clean = make_project(tmp_path / "clean", artifacts=[])
    r = flytune("verify", "--deep", "--execute", wheel, PYTHONPATH=f"{clean}{os.pathsep}{ROOT}", TRITON_INTERPRET=1)
    assert r.returncode == 1, r.stdout + r.stderr  # it executed nothing: a check that checked nothing fails
    assert "declares no `validate`: not executed" in r.stdout and "--execute ran no artifact" in r.stdout


def test_execute_runs_sample_artifacts_and_reports_a_failing_one(tmp_path):
    r = flytune("verify", "--deep", "--execute", ROOT / "sample_pkg", PYTHONPATH=f"{ROOT / 'sample_pkg'}{os.pathsep}{ROOT}",
                TRITON_INTERPRET=1)
    assert r.returncode == 0, r.stdout + r.stderr
    import shutil

    from flytune_build.core.artifact import Artifact
    from flytune_build.core.config import Config
    from flytune_build.core.device import INTERPRETER

    proj = tmp_path / "proj"  # --execute imports only what a project declares: a copy of the sample
    shutil.copytree(ROOT / "sample_pkg", proj,
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    bad = Artifact("sample_pkg.rmsnorm", {"x": "float16", "M": 4, "N": 256}, INTERPRETER, Config({"BLOCK": 384}),
                   {"triton": "3.6.0", "ranking": "synthetic"})
    bad.save(proj / "artifacts" / "interpreter")
    r = flytune("verify", "--execute", proj, PYTHONPATH=f"{proj}{os.pathsep}{ROOT}", TRITON_INTERPRET=1)
    assert r.returncode == 1 and f"{bad.filename}: Field `config` failed when executed on interpreter" in r.stdout


def test_inspect_table_and_json(wheel):
    r = flytune("inspect", wheel)
    assert r.returncode == 0 and "fixpkg.add" in r.stdout and "accepted match levels" in r.stdout
    info = json.loads(flytune("inspect", "--json", wheel).stdout)
    assert info["coverage"] == {"fixpkg.add": {"interpreter": 1, "sm_90/132/NVIDIA H200": 1}}
    assert info["key_axes"] == {"fixpkg.add": ["n", "x"]} and info["toolchain"]["tuned_with_triton"] == ["3.6.0"]


def test_diff_names_added_removed_and_changed_winner_with_margin(tmp_path):
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.config import Config
    from flytune_build.core.device import INTERPRETER

    old, new = tmp_path / "old", tmp_path / "new"
    artifact(100, 32).save(old)
    artifact(200, 32).save(old)
    cands = [{"config": Config({"BLOCK": 32}).to_json(), "time_ms": 1.5},
             {"config": Config({"BLOCK": 64}).to_json(), "time_ms": 1.0}]
    Artifact("fixpkg.add", {"x": "float32", "n": 100}, INTERPRETER, Config({"BLOCK": 64}),
             {"triton": "3.6.0", "candidates": cands}).save(new)
    artifact(300, 32).save(new)
    r = flytune("diff", old, new)
    assert r.returncode == 0
    assert "+ fixpkg.add {'n': 300, 'x': 'float32'} on interpreter" in r.stdout
    assert "- fixpkg.add {'n': 200, 'x': 'float32'} on interpreter" in r.stdout
    assert "BLOCK=32" in r.stdout and "-> Config(BLOCK=64" in r.stdout and "(old winner 50.0% slower in" in r.stdout
    d = json.loads(flytune("diff", "--json", old, new).stdout)
    assert len(d["added"]) == len(d["removed"]) == len(d["changed"]) == 1 and d["changed"][0]["margin"] == 0.5
    cands[0]["time_ms"] = 0.8  # the new run timed the old winner faster than its own (a winner kept by no rule)
    shutil.rmtree(new)
    Artifact("fixpkg.add", {"x": "float32", "n": 100}, INTERPRETER, Config({"BLOCK": 64}),
             {"triton": "3.6.0", "candidates": cands}).save(new)
    assert "(old winner 20.0% faster in the new run)" in flytune("diff", old, new).stdout


def test_fmt_rewrites_to_canonical_name_and_form(tmp_path):
    a = artifact(100, 32)
    (tmp_path / "handmade.json").write_text(json.dumps(a.to_json(), indent=2))
    r = flytune("fmt", tmp_path)
    assert r.returncode == 0
    assert [p.name for p in tmp_path.iterdir()] == [a.filename]
    assert (tmp_path / a.filename).read_bytes() == a.to_bytes()


@pytest.mark.parametrize("layout", ["swapped", "misnamed_as_another", "duplicate_misnamed", "twice"])
def test_fmt_loses_no_artifact_whatever_the_names(tmp_path, layout):
    """Names that overlap in any order (a file holding another's address, a duplicate under a stray
    name, one directory named twice): every artifact read ends up in exactly its own file."""
    from buildkit import H200

    a, b = artifact(100, 32), artifact(100, 64, dev=H200)
    d = tmp_path / "d"
    d.mkdir()
    files = {"swapped": {a.filename: b, b.filename: a},
             "misnamed_as_another": {a.filename: b, "stray.json": a},
             "duplicate_misnamed": {"aaa.json": a, a.filename: a, b.filename: b},
             "twice": {"x.json": a, b.filename: b}}[layout]
    for name, art in files.items():
        (d / name).write_text(json.dumps(art.to_json(), indent=1))
    r = flytune("fmt", d, *([tmp_path / "d" / "."] if layout == "twice" else []))
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in d.iterdir()) == sorted([a.filename, b.filename])
    assert (d / a.filename).read_bytes() == a.to_bytes() and (d / b.filename).read_bytes() == b.to_bytes()
    assert flytune("fmt", d).stdout.strip() == "flytune: 0 file(s) rewritten"


def test_fmt_refuses_a_symbolic_link_it_would_replace_with_a_file_and_rewrites_nothing(tmp_path):
    a, b = artifact(100, 32), artifact(200, 32)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "made.json").write_text(json.dumps(a.to_json(), indent=2))
    d = tmp_path / "d"
    d.mkdir()
    (d / "stray.json").write_text(json.dumps(b.to_json(), indent=2))
    (d / "linked.json").symlink_to(tmp_path / "elsewhere" / "made.json")
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    r = flytune("fmt", d)
    assert r.returncode == 1 and "linked.json: is a symbolic link" in r.stderr, r.stdout + r.stderr
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before and (d / "linked.json").is_symlink()


def test_fmt_names_the_input_that_is_not_a_directory(tmp_path):
    artifact(100, 32).save(tmp_path / "arts")
    r = flytune("fmt", tmp_path / "arts", f"{tmp_path}/./arts", tmp_path / "does-not-exist")
    assert r.returncode == 1 and "does-not-exist: is not a directory" in r.stderr, r.stderr


def test_tune_refuses_in_ci(tmp_path):
    r = flytune("tune", "--project", ROOT / "sample_pkg", CI="true")
    assert r.returncode == 2 and "refusing to tune where CI is set" in r.stderr


def test_tune_in_ci_refuses_a_measured_run_only_as_the_python_api_does(monkeypatch):
    """One rule, in tuning.tune: where CI is set a measured run is refused; a synthetic one (--ranking or
    FLYTUNE_RANKING) is not. `--workers 0` then stops the run before any work, with its own usage error."""
    for how in ({"args": ("--ranking", "synthetic"), "env": {}}, {"args": (), "env": {"FLYTUNE_RANKING": "synthetic"}}):
        r = flytune("tune", "--project", ROOT / "sample_pkg", *how["args"], "--executor", "local", "--workers", "0",
                    CI="true", **how["env"])
        assert r.returncode == 2 and "refusing" not in r.stderr and "--workers must be at least 1" in r.stderr, r.stderr
    import flytune_build

    monkeypatch.setenv("CI", "true")  # conftest's monkeypatch re-reads flytune's settings
    monkeypatch.setenv("FLYTUNE_RANKING", "synthetic")
    with pytest.raises(flytune_build.UsageError, match="must be one of"):
        flytune_build.tune(ROOT / "sample_pkg", executor="nope")
    monkeypatch.delenv("FLYTUNE_RANKING")
    with pytest.raises(flytune_build.UsageError, match="refusing to tune where CI is set"):
        flytune_build.tune(ROOT / "sample_pkg", executor="nope")


def test_tune_synthetic_ranking_writes_artifacts_and_resumes(tmp_path):
    env = dict(TRITON_INTERPRET=1, FLYTUNE_CACHE_DIR=tmp_path / "cache", PYTHONPATH=f"{ROOT / 'sample_pkg'}{os.pathsep}{ROOT}")
    out = tmp_path / "out"
    args = ["tune", "--project", ROOT / "sample_pkg", "--kernel", "sample_pkg.matmul", "--ranking", "synthetic",
            "--output", out, "--allow-ci", "--no-progress"]
    r = flytune(*args, **env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 tuned, 0 resumed" in r.stdout and "margin" in r.stdout
    made = sorted(p.name for p in out.glob("*.json"))
    committed = sorted(p.name for p in (ROOT / "sample_pkg" / "artifacts" / "interpreter").glob("sample_pkg.matmul-*.json"))
    assert made == committed  # deterministic: the same command made the committed interpreter artifacts
    for name in made:
        assert (out / name).read_bytes().split(b'"created"')[0] == \
            (ROOT / "sample_pkg" / "artifacts" / "interpreter" / name).read_bytes().split(b'"created"')[0]
    r = flytune(*args, **env)
    assert r.returncode == 0 and "0 tuned, 2 resumed" in r.stdout


def test_tune_writes_that_fail_are_each_said_once_and_a_failed_artifact_is_no_tuned_job(tmp_path):
    env = dict(TRITON_INTERPRET=1, FLYTUNE_CACHE_DIR=tmp_path / "cache", PYTHONPATH=f"{ROOT / 'sample_pkg'}{os.pathsep}{ROOT}")
    out = tmp_path / "out"
    blocked = sorted((ROOT / "sample_pkg" / "artifacts" / "interpreter").glob("sample_pkg.matmul-*.json"))[0].name
    (out / blocked).mkdir(parents=True)          # the artifact's path, and the resume state's, cannot be written
    (out / ".flytune-tune-state").mkdir()
    r = flytune("tune", "--project", ROOT / "sample_pkg", "--kernel", "sample_pkg.matmul", "--ranking", "synthetic",
                "--output", out, "--allow-ci", "--no-progress", "--no-resume", **env)
    text = r.stdout + r.stderr
    assert r.returncode == 1, text
    # as every failure: one line in the table, one error line; the progress line's "tuned" explained
    assert r.stdout.count("tuned, but its artifact could not be written") == 1, text
    assert r.stderr.count("tuned, but its artifact could not be written") == 1, text
    assert text.count("the resume state in") == 1, text   # one warning, however many writes failed alike


# -- conventions (pip, uv and ruff are the references) -------------------------------------------------------
def test_version_flag():
    from flytune_build.core.version import VERSION

    r = flytune("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"flytune {VERSION}"


def test_help_lists_exit_codes_and_every_option_and_argument_has_help():
    import argparse

    from flytune_build.cli.main import build_parser

    parser = build_parser()
    r = flytune("--help")
    assert r.returncode == 0 and "exit codes:" in r.stdout
    assert all(f"\n  {code} " in r.stdout for code in (0, 1, 2, 120, 130))
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"tune", "verify", "inspect", "diff", "fmt", "export", "import", "bundle"} <= set(sub.choices)
    for name, command in sub.choices.items():
        assert "exit codes: 0" in command.format_help(), name
        for action in command._actions:
            assert action.help, f"flytune {name} {action.option_strings or action.dest} has no help"
    for action in parser._actions:
        assert action.help, action.option_strings


def test_diff_and_fmt_exit_nonzero_on_missing_inputs(tmp_path):
    artifact(100, 32).save(tmp_path / "old")
    r = flytune("diff", tmp_path / "old", tmp_path / "missing")
    assert r.returncode == 1 and "0 added, 1 removed" in r.stdout and "missing" not in r.stdout
    assert r.stderr == f"flytune: error: {tmp_path / 'missing'}: does not exist: pass a wheel, an sdist, a directory " \
                       f"or an installed distribution's name\n"   # as every command's errors
    assert flytune("diff", tmp_path / "old", tmp_path / "old").returncode == 0
    r = flytune("fmt", tmp_path / "old", tmp_path / "missing")
    assert r.returncode == 1 and r.stderr == f"flytune: error: {tmp_path / 'missing'}: is not a directory of artifact files (it does not exist)\n"
    assert "rewrote" not in r.stdout  # every input is checked before anything is rewritten


def test_json_documents_carry_a_format_version(wheel, tmp_path):
    artifact(100, 32).save(tmp_path / "a")
    for args in (("verify", "--json", wheel), ("inspect", "--json", wheel), ("diff", "--json", tmp_path / "a", wheel)):
        doc = json.loads(flytune(*args).stdout)
        assert doc["format"] == 1, args


def test_closed_stdout_ends_quietly(wheel):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before flytune writes a byte: `flytune verify --json x | head -c1`
    try:
        r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "verify", "--json", str(wheel)], stdout=write,
                           stderr=subprocess.PIPE, text=True, env=python_env())
    finally:
        os.close(write)
    assert r.returncode == 120 and r.stderr == ""


@pytest.mark.parametrize("command", ["merge", "verify", "warmup"])
def test_a_stdout_closed_from_the_start_keeps_the_work_and_exits_120(tmp_path, command):
    """`flytune merge ... >&-`: Python starts with sys.stdout None; the merge is done all the same, its
    summary dropped, exit 120 as for a reader gone, and no error line."""
    artifact(100, 32).save(tmp_path / "a")
    args = {"merge": ["merge", tmp_path / "a", "--output", tmp_path / "m"], "verify": ["verify", tmp_path / "a"],
            "warmup": ["warmup", "--json", "no-such-distribution"]}[command]
    r = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "flytune_build.cli", *map(str, args)],
                       capture_output=True, text=True, env=python_env())
    assert "Error" not in r.stderr, r.stderr
    if command == "warmup":  # a failure is still the failure it is, said on stderr
        assert r.returncode == 1 and r.stderr.startswith("flytune: error:"), r.stderr
        return
    assert r.returncode == 120 and r.stderr == "", r.stderr
    if command == "merge":
        assert [p.name for p in (tmp_path / "m").iterdir()] == [p.name for p in (tmp_path / "a").iterdir()]
    else:   # violations found are still exit 1 with stdout closed: a failure is never read as a reader gone
        (tmp_path / "a" / "broken.json").write_text("{")
        r = subprocess.run(["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "flytune_build.cli",
                            *map(str, args)], capture_output=True, text=True, env=python_env())
        assert r.returncode == 1, r.stderr


def test_unexpected_error_is_one_line_without_traceback(monkeypatch, capsys, tmp_path):
    from flytune_build.audit import inspection as audit
    from flytune_build.cli.main import main

    def boom(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr(audit, "diff", boom)
    artifact(100, 32).save(tmp_path / "a")
    assert main(["diff", str(tmp_path / "a"), str(tmp_path / "a")]) == 1
    assert capsys.readouterr().err == "flytune: error: RuntimeError: boom\n"


def test_tune_progress_off_a_terminal_is_one_plain_line_per_job(tmp_path):
    env = dict(TRITON_INTERPRET=1, FLYTUNE_CACHE_DIR=tmp_path / "cache", PYTHONPATH=f"{ROOT / 'sample_pkg'}{os.pathsep}{ROOT}")
    r = flytune("tune", "--project", ROOT / "sample_pkg", "--kernel", "sample_pkg.matmul", "--ranking", "synthetic",
                "--output", tmp_path / "out", "--allow-ci", **env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "\r" not in r.stderr  # stderr is a pipe here: no progress frames
    lines = [line for line in r.stderr.splitlines() if line.startswith("flytune: [")]
    assert [line[:14] for line in lines] == ["flytune: [1/2]", "flytune: [2/2]"], r.stderr


def test_control_characters_from_data_never_reach_the_terminal(tmp_path):
    """A file name or value holding an escape sequence is printed escaped, whichever command and path
    (typed errors and the last-resort handler alike)."""
    evil = tmp_path / "x\x1b[31mred"
    for args in (("fmt", evil), ("merge", evil, "--output", tmp_path / "o"), ("verify", evil)):
        r = flytune(*args)
        assert r.returncode != 0 and "\x1b" not in r.stdout + r.stderr and "\\x1b[31mred" in r.stdout + r.stderr


def test_an_output_that_is_a_file_is_a_typed_error(tmp_path):
    (tmp_path / "afile").write_text("mine")
    artifact(100, 32).save(tmp_path / "d")
    for args in (("merge", tmp_path / "d", "--output", tmp_path / "afile" / "x"),
                 ("bundle", "--project", ROOT / "sample_pkg", "--output", tmp_path / "afile")):
        r = flytune(*args)
        assert r.returncode == 1 and "afile" in r.stderr and "Error:" not in r.stderr, r.stderr
    assert (tmp_path / "afile").read_text() == "mine"


@pytest.mark.parametrize("raised", ["SystemExit(0)", "SystemExit(5)", "GeneratorExit()"])
def test_code_that_exits_at_import_is_a_finding_not_a_verdict(tmp_path, raised):
    """`verify --deep` imports the package: `sys.exit` (or any BaseException but Ctrl-C) there is its
    failure, reported in the JSON, exit 1; what the import prints never mixes into the JSON."""
    proj = make_project(tmp_path / "p")
    init = proj / "fixpkg" / "__init__.py"
    init.write_text(f"print('hello from import')\nraise {raised}\n" + init.read_text())
    r = flytune("verify", "--deep", "--json", proj)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    (report,) = json.loads(r.stdout)["reports"]
    assert any("cannot be imported for --deep" in e["rule"] for e in report["errors"])


def test_a_tune_setup_that_exits_fails_its_shapes_and_the_run(tmp_path):
    """A setup that calls sys.exit (or pytest.skip) fails its entry like an exception: exit 1, named."""
    proj = make_project(tmp_path / "p", extra='[tool.flytune.tune]\nentries = [{ kernel = "fixpkg.add", '
                                              'setup = "fixpkg.bye:setup", shapes = [{ n = 8 }] }]\n')
    (proj / "fixpkg" / "bye.py").write_text("import sys\n\ndef setup(n):\n    sys.exit(0)\n")
    r = flytune("tune", "--project", proj, "--allow-ci", "--ranking", "synthetic", "--no-progress")
    assert r.returncode == 1 and "SystemExit" in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr
    r = flytune("tune", "--project", proj, "--allow-ci", "--ranking", "synthetic", "--no-progress",
                "--output", tmp_path / "new" / "out")
    assert r.returncode == 1 and not (tmp_path / "new").exists()   # nothing written: no empty folder left behind


def test_tune_state_and_table_values_are_read_safely(tmp_path):
    """A resume state whose time is null, and whose winner text holds escape sequences, prints a
    table: no crash, no escape sequence reaches the terminal."""
    proj = make_project(tmp_path / "p", extra='[tool.flytune.tune]\nentries = [{ kernel = "fixpkg.add", '
                                              'setup = "fixpkg:setup", shapes = [{ n = 8 }] }]\n')
    from flytune_build.core.device import INTERPRETER
    from flytune_build.core.project import load
    from flytune_build.tuning.job import job_id

    entry = load(proj).tune_entries[0]
    out = tmp_path / "out"
    out.mkdir()
    init = proj / "fixpkg" / "__init__.py"
    init.write_text(init.read_text() + "\n\ndef setup(n):\n    return lambda: None\n")
    depends = subprocess.run([sys.executable, "-c", "import json, sys; from flytune_build.core.project import load; "
                              "from flytune_build.tuning import fingerprint; p = load(sys.argv[1]); "
                              "print(json.dumps(list(fingerprint.of_plan(p.root, p.tune_entries).values())[0]))",
                              str(proj)], capture_output=True, text=True, env=python_env(), check=True).stdout
    state = {"format": 1, "done": {job_id(entry, {"n": 8}, INTERPRETER.spec()):  # this plan's, resumed as it is
                                   {"winner": "\x1b[2JOWNED\u202e", "time_ms": None, "depends": json.loads(depends)}}}
    (out / ".flytune-tune-state").write_text(json.dumps(state))
    r = flytune("tune", "--project", proj, "--allow-ci", "--ranking", "synthetic", "--no-progress", "--output", out)
    assert r.returncode == 0 and "\x1b" not in r.stdout and "\\x1b[2JOWNED\\u202e" in r.stdout, r.stdout + r.stderr
    (tmp_path / "afile").write_text("mine")
    r = flytune("tune", "--project", proj, "--allow-ci", "--output", tmp_path / "afile")
    assert r.returncode == 1 and "cannot be an output directory" in r.stderr and "Error:" not in r.stderr
    r = flytune("tune", "--project", proj, "--allow-ci", "--ranking", "synthetic", "--no-progress",
                "--output", tmp_path / "afile" / "sub")   # a file above it: named, not "Not a directory"
    assert r.returncode != 0 and f"{tmp_path / 'afile'} is a file, not a directory" in r.stderr, r.stdout + r.stderr


def test_deep_refuses_a_hand_edited_config_unless_its_provenance_says_it_was_chosen_by_hand(tmp_path):
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.config import Config

    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "sample_pkg", proj, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__"))
    path = sorted((proj / "artifacts" / "interpreter").glob("sample_pkg.rmsnorm-*.json"))[0]
    tuned = Artifact.load(path)
    env = {"PYTHONPATH": f"{proj}{os.pathsep}{ROOT}", "TRITON_INTERPRET": 1}

    def deep(art):
        art.save(path.parent)
        return flytune("verify", "--deep", proj, **env)

    assert deep(tuned).returncode == 0
    edited = Artifact(tuned.kernel, tuned.key, tuned.device, Config({"BLOCK": 8192}, num_warps=8), tuned.provenance)
    r = deep(edited)  # none of its candidates: plain verify refuses it already, as the build does
    assert r.returncode == 1 and (f"{path.name}: Field `config` is Config(BLOCK=8192, num_warps=8, num_stages=3, "
                                  f"num_ctas=1), none of the {len(tuned.provenance['candidates'])} candidates its "
                                  f"provenance searched") in r.stdout
    assert flytune("verify", proj, **env).returncode == 1
    declared = Config({"BLOCK": 256}, num_warps=2)  # declared, and candidate #0: not the winner its selection names
    cands = tuned.provenance["candidates"]
    last = len(cands) - 1
    assert cands[0]["config"] == declared.to_json()
    swapped = Artifact(tuned.kernel, tuned.key, tuned.device, declared,
                       {**tuned.provenance, "selection": {"winner": last}})
    r = deep(swapped)
    assert r.returncode == 1 and f"but its provenance's selection chose candidate #{last}" in r.stdout
    by_hand = edited.with_provenance({**tuned.provenance, "by_hand": "BLOCK=8192 covers N=8192 in one program"})
    r = deep(by_hand)
    assert r.returncode == 0, r.stdout
    assert (f"{path.name}: config Config(BLOCK=8192, num_warps=8, num_stages=3, num_ctas=1) chosen by hand: "
            f"BLOCK=8192 covers N=8192 in one program") in r.stdout + r.stderr


def test_tune_names_the_flag_the_path_and_the_fix_for_each_argument_it_cannot_use(tmp_path):
    """`--output` a device, `--project` its pyproject.toml, `--min-improvement` below 0, `--plan` with no
    entries: each is one error naming the flag or the file and what to pass; nothing runs."""
    proj = make_project(tmp_path / "p", extra='[tool.flytune.tune]\nentries = [{ kernel = "fixpkg.add", '
                                              'setup = "fixpkg:setup", shapes = [{ n = 8 }] }]\n')
    (tmp_path / "empty.toml").write_text("entries = []\n")
    said = {("--output", os.devnull): f"{os.devnull}: cannot be an output directory: it is a character device, "
                                      f"not a directory",
            ("--project", proj / "pyproject.toml"): f"{proj / 'pyproject.toml'}: is not a directory: pass the "
                                                   f"project's directory",
            ("--min-improvement", "-5"): "argument --min-improvement: must be a percentage from 0 to below 1000",
            ("--plan", tmp_path / "empty.toml"): f"{tmp_path / 'empty.toml'}: Field `entries` is empty: the tuning "
                                                 f"plan names nothing to tune",
            ("--output", str(tmp_path / "a" / "{arhc}")): "Field `output` has `{arhc}`",   # a placeholder's typo
            ("--output", str(tmp_path / "a" / "{arch")): "that no `}` closes"}
    for (flag, value), message in said.items():
        args = ("--project", proj) if flag != "--project" else ()
        r = flytune("tune", *args, flag, value, "--ranking", "synthetic", "--allow-ci", "--no-progress")
        assert r.returncode in (1, 2) and r.stderr.count("flytune: error:") == 1, r.stderr
        assert message in r.stderr and "min_improvement" not in r.stderr and "File exists" not in r.stderr, r.stderr
        assert "pyproject.toml/pyproject.toml" not in r.stderr
    assert not (tmp_path / "a").exists()   # no directory named after a typo


def test_bundle_into_a_misspelled_package_directory_is_refused_and_makes_nothing(tmp_path):
    proj = make_project(tmp_path / "p")
    r = flytune("bundle", "--output", "fixpkh", cwd=proj)
    assert r.returncode == 2 and r.stderr.count("flytune: error:") == 1, r.stdout + r.stderr
    assert "--output fixpkh does not exist" in r.stderr and "--output fixpkg" in r.stderr
    assert not (proj / "fixpkh").exists()
    assert flytune("bundle", "--output", "fixpkg", cwd=proj).returncode == 0


@pytest.mark.parametrize("output", ["fixpkg/_flytune", "fixpkg/_flytune/deeper", "fresh/_flytune"])
def test_bundle_into_a_bundle_directory_is_refused_naming_the_package_directory(tmp_path, output):
    proj = make_project(tmp_path / "p")
    assert flytune("bundle", "--output", "fixpkg", cwd=proj).returncode == 0
    (proj / "fixpkg" / "_flytune" / "deeper").mkdir()
    (proj / "fresh" / "_flytune").mkdir(parents=True)
    before = sorted(p.relative_to(proj) for p in proj.rglob("*"))
    r = flytune("bundle", "--output", output, cwd=proj)
    parent = output.split("/_flytune")[0]
    assert r.returncode == 2 and r.stderr.count("flytune: error:") == 1, r.stdout + r.stderr
    assert "flytune bundle directory" in r.stderr and f"--output {parent}\n" in r.stderr, r.stderr
    assert sorted(p.relative_to(proj) for p in proj.rglob("*")) == before   # nothing built, nothing nested
    (proj / "fixpkg" / "_flytune" / "deeper").rmdir()
    assert flytune("bundle", "--output", "fixpkg", cwd=proj).returncode == 0   # the right one, as ever


def test_a_runtime_warning_during_a_command_is_one_line_as_the_commands_own(tmp_path):
    (tmp_path / "afile").write_text("x")
    r = flytune("inspect", "--installed", FLYTUNE_ARTIFACT_DIR=tmp_path / "afile", TRITON_INTERPRET=1)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[0] == f"flytune: warning: FLYTUNE_ARTIFACT_DIR names '{tmp_path / 'afile'}', which " \
                                       f"is not a directory; ignored", r.stderr
    assert "FlytuneWarning" not in r.stderr and "SystemExit" not in r.stderr


def test_tune_on_a_cpu_without_the_interpreter_says_how_to_tune_there(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    # naming a device (FLYTUNE_DEVICE) runs no kernel on it: the same refusal (test_guidance: without it)
    r = flytune("tune", "--project", ROOT / "sample_pkg", "--allow-ci", "--output", tmp_path / "out",
                TRITON_INTERPRET=0, FLYTUNE_DEVICE="cuda:sm_90:132:NVIDIA H200")
    assert r.returncode == 2 and "TRITON_INTERPRET=1 flytune tune --ranking synthetic" in r.stderr, r.stderr
    assert "FLYTUNE_DEVICE" not in r.stderr and not (tmp_path / "out").exists()


def test_an_output_directory_that_cannot_take_a_file_is_refused_before_any_work(tmp_path, monkeypatch):
    """An existing directory on a read-only mount (or full) was found only when the first winner was
    written, after every search; it is written once when the run starts (a file made and removed)."""
    import errno
    import tempfile

    from flytune_build.core import fsutil
    from flytune_build.core.errors import OutputError

    out = tmp_path / "out"
    out.mkdir()
    assert fsutil.output_directory(out) == out and list(out.iterdir()) == []   # the probe leaves nothing

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(tempfile, "mkstemp", read_only)   # a read-only mount, as root cannot be made one here
    with pytest.raises(OutputError, match="cannot be an output directory: a file cannot be written in it "
                                          r"\(Read-only file system\)") as e:
        fsutil.output_directory(out)
    assert e.value.file == str(out)
