"""The public Python API: `flytune_build.tune`, `verify`, `inspect`, `diff`, `merge`, `fmt` return data and
print nothing; the CLI is one caller of them. Real kernels on Triton's interpreter."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import python_env

import flytune_build as ft

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_pkg"


@pytest.fixture
def sample_importable(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(SAMPLE))
    monkeypatch.setenv("FLYTUNE_CACHE_DIR", str(tmp_path / "cache"))


TUNE_TWICE = """
import json, sys
from pathlib import Path
import flytune_build as ft
from flytune_build.tuning import Reporter

class Heard(Reporter):
    def __init__(self):
        self.lines = []
    def finished(self, line, *, failed=False):
        self.lines.append(line)

out, heard = Path(sys.argv[1]), Heard()
first = ft.tune(sys.argv[2], kernels=["sample_pkg.matmul"], output=out, ranking="synthetic", reporter=heard)
files = {p.name: p.read_bytes() for p in out.glob("*.json")}
again = ft.tune(sys.argv[2], kernels=["sample_pkg.matmul"], output=out, ranking="synthetic", resume=False, repeat=2)
print(json.dumps({
    "ok": first.ok, "executor": first.executor, "statuses": sorted({o.status for o in first.outcomes}),
    "outcomes": len(first.outcomes), "jobs": len({o.job.id for o in first.outcomes}), "heard": len(heard.lines),
    "files": len(files), "winners": all(o.winner for o in first.outcomes), "first": first.changes(),
    "again": again.changes(), "stable": sorted({o.stable.label for o in again.outcomes if o.stable}),
    "unchanged": files == {p.name: p.read_bytes() for p in out.glob("*.json")}}))
"""


def test_tune_returns_outcomes_prints_nothing_and_a_re_tune_keeps_every_winner(tmp_path):
    """In a process of its own: the in-process executor imports the sample's kernels."""
    script = tmp_path / "tune_twice.py"
    script.write_text(TUNE_TWICE)
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "cache",
                     PYTHONPATH=SAMPLE)
    r = subprocess.run([sys.executable, str(script), str(tmp_path / "out"), str(SAMPLE)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout  # the script's own line: tune() printed nothing
    got = json.loads(lines[0])
    n = got["outcomes"]
    assert got["ok"] and got["executor"] == "inprocess" and got["statuses"] == ["tuned"] and n >= 2
    assert got["heard"] == got["jobs"] and got["files"] == n and got["winners"]
    assert got["first"] == {"new": n, "kept": 0, "replaced": 0}
    assert got["again"] == {"new": 0, "kept": n, "replaced": 0} and got["stable"] == ["2/2"]
    assert got["unchanged"]  # kept: byte for byte


@pytest.mark.parametrize("kwargs, message", [
    ({"kernels": ["sample_pkg.nope"]}, "not in the tuning plan"),
    ({"repeat": 0}, "repeat must be an integer from 1 to 100, not 0"),
    ({"repeat": 30_000}, "repeat must be an integer from 1 to 100, not 30000"),
    ({"min_improvement": -1}, "Field `min_improvement` must be a percentage from 0 to below 1000, not -1"),
    ({"executor": "inprocess", "job_timeout": 5}, "cannot do to itself"),
    ({"executor": "spark"}, "must be one of inprocess, local, ray"),
])
def test_tune_refuses_what_it_cannot_run_and_writes_nothing(tmp_path, kwargs, message, sample_importable):
    with pytest.raises(ft.UsageError, match=message):
        ft.tune(SAMPLE, output=tmp_path / "out", ranking="synthetic", **kwargs)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.json"))


@pytest.mark.parametrize("kernels", [[], (), ""])
def test_tune_of_no_kernel_is_refused_never_every_kernel(tmp_path, kernels, sample_importable):
    with pytest.raises(ft.UsageError, match="is empty") as e:
        ft.tune(SAMPLE, kernels=kernels, output=tmp_path / "out", ranking="synthetic")
    assert e.value.field == "kernels" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("call, field", [
    (lambda d, t: ft.merge([d], t / "x\0y"), "output"),
    (lambda d, t: ft.merge([f"{d}\0"], t / "o"), "dirs[0]"),
    (lambda d, t: ft.tune(SAMPLE, output=f"{t}/o\0"), "output"),
    (lambda d, t: ft.tune(SAMPLE, plan="o\0"), "plan"),
    (lambda d, t: ft.tune(f"{SAMPLE}\0"), "project"),
    (lambda d, t: ft.tune(SAMPLE, misses="m\0"), "misses"),
    (lambda d, t: ft.verify(f"{d}\0"), "path"),
    (lambda d, t: ft.fmt([f"{d}\0"]), "paths[0]"),
    (lambda d, t: ft.review.write(t / "r\0.html", d), "path"),
], ids=["merge-output", "merge-dirs", "tune-output", "tune-plan", "tune-project", "tune-misses", "verify", "fmt",
        "report"])
def test_a_nul_byte_in_a_path_is_a_usage_error_naming_the_field(tmp_path, call, field):
    """Python refuses a NUL in a path with a bare ValueError; the API's one path rule says which argument."""
    with pytest.raises(ft.UsageError, match="NUL byte") as e:
        call(SAMPLE / "artifacts" / "interpreter", tmp_path)
    assert e.value.field == field and not list(tmp_path.iterdir())


def test_an_empty_name_is_refused_as_an_empty_path_is(monkeypatch):
    with pytest.raises(ft.UsageError, match="empty name") as e:
        ft.warmup("")
    assert e.value.field == "distributions[0]"
    with pytest.raises(ft.UsageError, match="empty name") as e:
        ft.tune(SAMPLE, kernels=["sample_pkg.matmul", ""])
    assert e.value.field == "kernels[1]"
    for default in ({"plan": ""}, {"output": ""}):   # "" there means the default, as it always has
        with pytest.raises(ft.UsageError, match="not in the tuning plan"):
            ft.tune(SAMPLE, kernels=["sample_pkg.nope"], **default)


def test_tune_of_a_project_without_a_table_is_a_project_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\nversion = '1'\n")
    with pytest.raises(ft.ProjectError, match=r"has no \[tool.flytune\] table"):
        ft.tune(tmp_path)


def test_verify_inspect_diff_merge_fmt_return_data_and_print_nothing(tmp_path, capsys):
    a = ROOT / "sample_pkg" / "artifacts" / "interpreter"
    report = ft.verify(a)
    assert report.ok and report.artifacts and not report.errors
    info = ft.inspect(a)
    assert info["ok"] and info["coverage"]
    assert ft.diff(a, a)["changed"] == []
    b = tmp_path / "b"
    shutil.copytree(a, b)
    merged = ft.merge([a, b], tmp_path / "m")
    assert merged.ok and len(merged.chosen) == len(report.artifacts)
    assert ft.fmt([tmp_path / "m"]).actions == []
    assert capsys.readouterr() == ("", "")


def test_tune_json_is_the_report_and_the_table_says_how_sure_each_choice_is(tmp_path):
    from flytune_build.cli.tune import sure
    from flytune_build.tuning.driver import Outcome

    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "cache", PYTHONPATH=SAMPLE)
    r = subprocess.run([sys.executable, "-m", "flytune_build.cli", "tune", "--project", str(SAMPLE), "--kernel",
                        "sample_pkg.matmul", "--ranking", "synthetic", "--output", str(tmp_path / "out"), "--allow-ci",
                        "--no-progress", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["format"] == 1 and doc["ok"] and doc["changes"]["new"] == len(doc["outcomes"]) >= 2
    assert {o["status"] for o in doc["outcomes"]} == {"tuned"} and all(o["winner"] for o in doc["outcomes"])
    assert all(o["confidence"] is None for o in doc["outcomes"])  # a synthetic ranking is sure of nothing
    job = type("J", (), {})()
    assert sure(Outcome(job, "tuned", confidence=0.9991, resolved=True)) == "0.999"
    assert sure(Outcome(job, "tuned", confidence=0.81, resolved=False)) == "0.810?"
    assert sure(Outcome(job, "tuned")) == "-"


HOSTILE_KERNELS = '''
import concurrent.futures, contextvars, sys
import torch, triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config
from flytune_build.runtime.searching import outputs, selection

SEEN = []   # what a search started from a worker thread is asked: (checked, a shipped winner held)

@ft.autotune([Config({"BLOCK": b}) for b in (16, 32, 64)], ["n"], name="hostilepkg.add")
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

def add(n):
    x, y, out = torch.ones(n), torch.ones(n), torch.empty(n)
    return lambda: add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)

def threaded(n):
    launch = add(n)
    def seen_then_launched():
        SEEN.append((outputs.policy() is not None, selection.shipped("hostilepkg.add", {"n": n}) is not None))
        launch()
    def call():
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(contextvars.copy_context().run, seen_then_launched).result()
    return call

def plain_thread(n):
    launch = add(n)
    def call():
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(launch).result()   # no context carried: outside the job's session
    return call

def interrupted(n):
    raise KeyboardInterrupt

def exits(n):
    raise SystemExit(3)

def moves_path(n):
    sys.path.insert(0, "/nonexistent/flytune-setup-path")
    return add(n)
'''

TUNE_HOSTILE = '''
import json, sys
from pathlib import Path
import flytune_build as ft
from flytune_build.core import settings
from flytune_build.runtime.searching import session

root, got = Path(sys.argv[1]), {}
state = lambda: (list(sys.path), settings.current(), session.current())
before = state()

def tune(setup, out, **kwargs):
    plan = root / f"{setup}.toml"
    plan.write_text(f'entries = [{{ kernel = "hostilepkg.add", setup = "hostilepkg.kernels:{setup}", '
                    f'shapes = [{{ n = 100 }}] }}]')
    return ft.tune(root, plan=plan, output=root / out, ranking="synthetic", resume=False, **kwargs)

got["threaded"] = [tune("threaded", "t").changes(), tune("threaded", "t", min_improvement=900).changes()]
got["seen"] = sys.modules["hostilepkg.kernels"].SEEN
got["plain_thread"] = [o.status for o in tune("plain_thread", "p").outcomes]
got["threaded_restored"] = state() == before
try:
    tune("interrupted", "i")
except KeyboardInterrupt:
    got["interrupted"] = "raised"
got["interrupted_restored"] = state() == before
got["exits"] = [o.reason for o in tune("exits", "e").outcomes]
got["exits_restored"] = state() == before
got["moves_path"] = tune("moves_path", "m").changes()
got["moves_path_restored"] = state() == before
with session.opened(collect=True) as mine:
    got["inside"] = tune("add", "u").changes()
    got["inside_collected"] = [f.kernel for f in mine.found[-1]]
    got["inside_restored"] = session.current() is mine and sys.path == before[0]
got["restored"] = state() == before
print(json.dumps(got))
'''


def test_tune_in_one_process_leaves_no_session_and_its_searches_see_the_job_from_any_thread(tmp_path):
    """`tune()` called again and again in one process, from inside a caller's own session, after a setup
    raised KeyboardInterrupt or SystemExit or moved sys.path: no session stays open, sys.path and the
    settings are as they were; a kernel a setup launches from a worker thread is searched inside the job
    (its outputs checked, the output's winner kept); a caller's collecting session hears each search."""
    from buildkit import tune_pyproject

    (tmp_path / "hostilepkg").mkdir()
    (tmp_path / "hostilepkg" / "__init__.py").write_text("")
    (tmp_path / "hostilepkg" / "kernels.py").write_text(HOSTILE_KERNELS)
    (tmp_path / "pyproject.toml").write_text(tune_pyproject("hostilepkg", "entries = []"))
    script = tmp_path / "tune_hostile.py"
    script.write_text(TUNE_HOSTILE)
    env = python_env(TRITON_INTERPRET=1, FLYTUNE_AUTOTUNE=0, FLYTUNE_CACHE_DIR=tmp_path / "cache")
    r = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["threaded"] == [{"new": 1, "kept": 0, "replaced": 0}, {"new": 0, "kept": 1, "replaced": 0}]
    assert got["seen"] == [[True, False], [True, True]]   # checked both times; the second holds the winner
    assert got["plain_thread"] == ["no-search"]   # a thread that does not carry the job's context is outside it
    assert got["interrupted"] == "raised" and got["exits"] == ["SystemExit: 3"]
    assert got["moves_path"] == {"new": 1, "kept": 0, "replaced": 0}
    assert got["inside"] == {"new": 1, "kept": 0, "replaced": 0} and got["inside_collected"] == ["hostilepkg.add"]
    assert all(got[k] for k in ("threaded_restored", "interrupted_restored", "exits_restored",
                                "moves_path_restored", "inside_restored", "restored")), got
