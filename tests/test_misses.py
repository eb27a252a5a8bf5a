"""The loop from production misses: FLYTUNE_MISSES records every key no tuned config served (from many
processes at once, bounded), and `flytune tune --misses` tunes exactly those shapes."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import flytune_build as ft
from conftest import ROOT
from flytune_build.core import misses as misses_file
from flytune_build.core.config import Config
from flytune_build.core.errors import UsageError
from kernels import make_add

SAMPLE = ROOT / "sample_pkg"


@pytest.fixture(autouse=True)
def _forget_misses():
    from flytune_build.runtime.serving import misses

    misses.reset()
    yield
    misses.reset()  # this test's misses are not written by a later test's flush, nor at exit


def add(k, n):
    x = torch.randn(n)
    out = torch.empty_like(x)
    k[lambda m: ((n + m["BLOCK"] - 1) // m["BLOCK"],)](x, x, out, n)
    assert torch.allclose(out, 2 * x)


def test_a_process_records_each_missed_key_with_its_tier_and_calls(tmp_path, monkeypatch):
    from flytune_build.runtime.serving import misses

    path = tmp_path / "misses.json"
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    k = make_add("t.misses.add", default=lambda a: Config({"BLOCK": 32}))
    for n in (100, 100, 100, 50):
        add(k, n)
    misses.flush()
    got = {(m.kernel, m.key["n"]): (m.tier, m.calls, m.decisions) for m in misses_file.misses(misses_file.load(path))}
    assert got == {("t.misses.add", 100): ("heuristic", 3, 1), ("t.misses.add", 50): ("heuristic", 1, 1)}
    assert all(m.device == "interpreter" for m in misses_file.misses(misses_file.load(path)))


@pytest.mark.parametrize("held", [b"", b"\n  \n"])
def test_a_misses_file_made_empty_beforehand_is_recorded_into(tmp_path, monkeypatch, held):
    """`touch misses.json` (a mount's placeholder) was "not valid JSON": one warning per run, never written."""
    from flytune_build.runtime.serving import misses

    path = tmp_path / "misses.json"
    path.write_bytes(held)
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    add(make_add("t.misses.touched", default=lambda a: Config({"BLOCK": 32})), 100)
    misses.flush()
    assert [(m.kernel, m.key["n"]) for m in misses_file.misses(misses_file.load(path))] == [("t.misses.touched", 100)]


@pytest.mark.parametrize("name", ["FLYTUNE_MISSES", "FLYTUNE_CACHE_DIR", "FLYTUNE_EMIT_DIR"])
def test_a_path_setting_of_blanks_only_is_refused_naming_it(name):
    """FLYTUNE_MISSES=" " wrote files named " " and " .lock" in the working directory."""
    from flytune_build.core import settings
    from flytune_build.core.errors import SettingsError

    with pytest.raises(SettingsError, match=f"Field `{name}` must be a path"):
        settings.read({name: " "})
    field = {"FLYTUNE_MISSES": "misses", "FLYTUNE_CACHE_DIR": "cache_dir", "FLYTUNE_EMIT_DIR": "emit_dir"}[name]
    assert getattr(settings.read({name: ""}), field) is None and getattr(settings.read({name: "p"}), field) is not None


def test_a_key_json_cannot_hold_is_not_recorded_and_never_fails_the_call(tmp_path, monkeypatch):
    """A NaN key value raised ValueError out of the kernel call (the entry's canonical JSON)."""
    from flytune_build.runtime.serving import misses

    path = tmp_path / "misses.json"
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    k = make_add("t.misses.nan", key=(ft.nearest("n"),), default=lambda a: Config({"BLOCK": 32}))
    x = torch.randn(8)
    with pytest.warns(ft.FlytuneWarning, match="cannot be written as JSON"):
        k[(1,)](x, x, torch.empty(8), float("nan"))   # masked by n: stores nothing
    misses.flush()
    assert not path.exists()


def test_a_served_tuned_key_is_no_miss_and_nothing_is_written_without_the_setting(tmp_path, monkeypatch):
    from flytune_build.core.artifact import Artifact
    from flytune_build.core.device import INTERPRETER
    from flytune_build.runtime.serving import misses

    k = make_add("t.misses.tuned", default=lambda a: Config({"BLOCK": 32}))
    Artifact("t.misses.tuned", {"x": "float32", "n": 100}, INTERPRETER, Config({"BLOCK": 64})).save(tmp_path / "a")
    monkeypatch.setenv("FLYTUNE_ARTIFACT_DIR", str(tmp_path / "a"))
    add(k, 100)  # FLYTUNE_MISSES unset: nothing recorded anywhere
    path = tmp_path / "misses.json"
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    ft.reset_stats()
    add(k, 100)  # served offline: no miss
    misses.flush()
    assert not path.exists()


RECORD = """
import sys, torch
sys.path.insert(0, sys.argv[2])
from kernels import make_add
from flytune_build import Config
k = make_add("t.misses.many", default=lambda a: Config({"BLOCK": 32}))
n = int(sys.argv[1])
for _ in range(3):
    x = torch.randn(n); out = torch.empty_like(x)
    k[lambda m: ((n + m["BLOCK"] - 1) // m["BLOCK"],)](x, x, out, n)
"""


def test_many_processes_record_into_one_file_and_lose_nothing(tmp_path):
    from conftest import python_env

    path = tmp_path / "misses.json"
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_MISSES=path,
                     FLYTUNE_CACHE_DIR=tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", RECORD, str(n), str(ROOT / "tests")], env=env,
                              stderr=subprocess.PIPE) for n in (10, 20, 30, 10)]
    for p in procs:
        assert p.wait(timeout=240) == 0, p.stderr.read()[-2000:]
    got = {m.key["n"]: (m.calls, m.decisions) for m in misses_file.misses(misses_file.load(path))}
    assert got == {10: (6, 2), 20: (3, 1), 30: (3, 1)}


def test_the_file_is_bounded_and_a_bad_one_is_a_typed_error(tmp_path):
    doc = misses_file.empty()
    for n in range(misses_file.MAX_ENTRIES + 5):
        misses_file.add(doc, "k", {"n": n}, "interpreter", "heuristic", 1, 1)
    assert len(doc["misses"]) == misses_file.MAX_ENTRIES and doc["dropped"] == 5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 1, "misses": [{"kernel": "k"}]}))
    with pytest.raises(ft.InputError, match="misses\\[0\\]"):
        misses_file.load(bad)


def test_tune_misses_tunes_exactly_the_missed_shapes_with_the_plans_setups(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SAMPLE))
    path = tmp_path / "misses.json"
    doc = misses_file.empty()
    misses_file.add(doc, "sample_pkg.rmsnorm", {"x": "float32", "M": 8, "N": 256}, "interpreter", "heuristic", 7, 1)
    misses_file.add(doc, "other.kernel", {"n": 3}, "interpreter", "heuristic", 1, 1)
    misses_file.write(path, doc)
    report = ft.tune(SAMPLE, misses=path, output=tmp_path / "out", ranking="synthetic")
    assert report.ok, [o.reason for o in report.failed]
    assert sorted({(o.job.entry.kernel, tuple(sorted(o.job.shape.items()))) for o in report.outcomes}) == [
        ("sample_pkg.rmsnorm", (("M", 8), ("N", 256)))]
    assert any("other.kernel" in n and "no entry" in n for n in report.notes)
    only_other = tmp_path / "other.json"
    doc = misses_file.empty()
    misses_file.add(doc, "other.kernel", {"n": 3}, "interpreter", "heuristic", 1, 1)
    misses_file.write(only_other, doc)
    with pytest.raises(UsageError, match="no miss names a kernel of the tuning plan"):
        ft.tune(SAMPLE, misses=only_other, output=tmp_path / "out", ranking="synthetic")


def test_a_hostile_misses_file_is_a_typed_error_and_never_fails_a_kernel_call(tmp_path, monkeypatch):
    from flytune_build.runtime.serving import misses

    bad = tmp_path / "bad.json"
    for doc, field in (({"format": True, "misses": []}, "format"), ({"format": 1, "misses": [], "dropped": "x"},
                                                                     "dropped")):
        bad.write_text(json.dumps(doc))
        with pytest.raises(ft.InputError) as e:
            misses_file.load(bad)
        assert e.value.field == field
    entry = {"kernel": "k", "key": {"n": 1}, "device": "interpreter", "tier": "heuristic", "calls": 1, "decisions": 1}
    bad.write_text(json.dumps({"format": 1, "misses": [entry, entry]}))
    with pytest.raises(ft.InputError, match="repeats"):
        misses_file.load(bad)
    monkeypatch.setenv("FLYTUNE_MISSES", str(bad))
    k = make_add("t.misses.hostile", default=lambda a: Config({"BLOCK": 32}))
    with pytest.warns(ft.FlytuneWarning, match="cannot record"):
        add(k, 100)  # the call is served all the same
        misses.flush()  # the writer thread's write or this one: the warning is said by then


def test_the_writer_stays_within_its_own_read_cap_and_writes_through_a_link(tmp_path, monkeypatch):
    monkeypatch.setattr(misses_file, "MAX_BYTES", 20_000)
    doc = misses_file.empty()
    for n in range(400):
        misses_file.add(doc, "k", {"n": n}, "interpreter", "heuristic", 1, 1)
    target = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    misses_file.write(link, doc)
    assert link.is_symlink() and target.stat().st_size <= 20_000
    back = misses_file.load(link)
    assert back["dropped"] > 0 and len(back["misses"]) + back["dropped"] == 400


def test_tune_misses_says_a_file_that_does_not_exist_does_not_exist(tmp_path, capfd):
    from flytune_build.cli.main import main

    absent = tmp_path / "absent.json"
    with pytest.raises(UsageError, match="absent.json: does not exist") as e:
        ft.tune(SAMPLE, misses=absent, output=tmp_path / "out", ranking="synthetic")
    assert e.value.file == str(absent)
    assert main(["tune", "--project", str(SAMPLE), "--misses", str(absent), "--output", str(tmp_path / "out"),
                 "--ranking", "synthetic", "--no-progress"]) == 2
    err = capfd.readouterr().err
    assert "does not exist" in err and "no miss names" not in err
    assert not (tmp_path / "out").exists()
    empty = tmp_path / "empty.json"
    misses_file.write(empty, misses_file.empty())
    with pytest.raises(UsageError, match="records no miss"):
        ft.tune(SAMPLE, misses=empty, output=tmp_path / "out", ranking="synthetic")


@pytest.mark.parametrize(("value", "kind"), [([1, 2], "an array"), ({"a": 1}, "an object"), ([], "an array")])
def test_a_key_value_that_is_no_scalar_is_an_input_error_naming_the_field_and_nothing_is_tuned(tmp_path, value,
                                                                                               kind):
    good = {"kernel": "sample_pkg.rmsnorm", "key": {"x": "float32", "M": 8, "N": 256}, "device": "interpreter",
            "tier": "heuristic", "calls": 1, "decisions": 1}
    bad = dict(good, key={"x": "float32", "M": 8, "N": value})
    path = tmp_path / "misses.json"
    path.write_text(json.dumps({"format": 1, "misses": [good, bad]}))
    with pytest.raises(ft.InputError) as e:
        misses_file.load(path)
    assert (e.value.field, e.value.file) == ("misses[1].key.N", str(path))
    assert "must be a number, a string, a boolean or null" in e.value.rule and kind in e.value.rule
    with pytest.raises(ft.InputError, match=r"misses\[1\]\.key\.N"):
        ft.tune(SAMPLE, misses=path, output=tmp_path / "out", ranking="synthetic")
    assert not (tmp_path / "out").exists()


def test_the_text_output_names_a_missed_kernel_the_plan_has_no_entry_for(tmp_path):
    from conftest import flytune

    path = tmp_path / "misses.json"
    doc = misses_file.empty()
    misses_file.add(doc, "sample_pkg.rmsnorm", {"x": "float32", "M": 8, "N": 256}, "interpreter", "heuristic", 7, 1)
    for n in (3, 4):
        misses_file.add(doc, "other.kernel", {"n": n}, "interpreter", "heuristic", 2, 1)
    misses_file.write(path, doc)
    r = flytune("tune", "--project", SAMPLE, "--misses", path, "--output", tmp_path / "out", "--ranking", "synthetic",
                "--no-progress", TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "cache",
                PYTHONPATH=SAMPLE)
    assert r.returncode == 0, r.stderr[-3000:]
    said = [line for line in (r.stdout + r.stderr).splitlines() if "other.kernel" in line]
    assert len(said) == 1, r.stdout + r.stderr
    assert "no entry for other.kernel" in said[0] and "2 missed key(s)" in said[0] and "4 call(s)" in said[0]


def test_a_tuning_run_in_process_records_no_miss(tmp_path, monkeypatch):
    from flytune_build.runtime.serving import misses

    monkeypatch.syspath_prepend(str(SAMPLE))
    path = tmp_path / "misses.json"
    monkeypatch.setenv("FLYTUNE_MISSES", str(path))
    report = ft.tune(SAMPLE, kernels=["sample_pkg.rmsnorm"], output=tmp_path / "out", ranking="synthetic")
    assert report.ok and report.count("tuned") >= 1, [o.reason for o in report.failed]
    misses.flush()
    assert not path.exists() or misses_file.load(path)["misses"] == []
