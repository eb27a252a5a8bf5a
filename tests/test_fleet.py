"""`flytune tune --executor local|ray` and `flytune merge`: one plan over many workers, crash-isolated,
resumable, device-guarded; real kernels on Triton's interpreter, every run under a subprocess timeout."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from buildkit import tune_pyproject
from conftest import python_env

from flytune_build.core.artifact import Artifact
from flytune_build.core.config import Config
from flytune_build.core.device import INTERPRETER, DeviceIdentity
from flytune_build.core.project import TuneEntry
from flytune_build.pipeline import reader
from flytune_build.tuning.job import job_id
from flytune_build.tuning.ledger import read_state

TIMEOUT = 240  # seconds for any one flytune run (a worker imports torch and triton: seconds each)

KERNELS = '''
import os, time
import torch, triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config

@ft.autotune([Config({"BLOCK": b}, num_warps=w) for b in (16, 32, 64) for w in (1, 2)], ["x", "n"],
             name="fleetpkg.add")
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

from fleetpkg.log import _log

def add(n, pause=0.0):
    _log("add", n=n)
    x, y = torch.ones(n), torch.ones(n)
    out = torch.empty(n)
    def call():
        time.sleep(pause)
        add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)
    return call
'''

LOG = '''
import os

def _log(what, **shape):
    with open(os.environ["FLEET_TEST_LOG"], "a") as fh:
        fh.write(f"{what} {shape} {os.getpid()}\\n")
'''

CRASHES = '''
import ctypes, os, time
from fleetpkg.log import _log

def exits(n):
    _log("exits", n=n)
    return lambda: os._exit(3)

def segfault(n):
    _log("segfault", n=n)
    return lambda: ctypes.string_at(0)

def hangs(n):
    _log("hangs", n=n)
    return lambda: time.sleep(600)

def raises(n):
    _log("raises", n=n)
    raise ValueError(f"no such shape n={n}")
'''


def make_project(root: Path, entries: str, output="out/{arch}") -> Path:
    (root / "fleetpkg").mkdir(parents=True)
    (root / "fleetpkg" / "__init__.py").write_text("")
    (root / "fleetpkg" / "kernels.py").write_text(KERNELS)
    (root / "fleetpkg" / "crashes.py").write_text(CRASHES)
    (root / "fleetpkg" / "log.py").write_text(LOG)
    (root / "pyproject.toml").write_text(tune_pyproject("fleetpkg", f"entries = [\n{entries}\n]", output))
    return root


def add_entry(*ns, pause=0.0):
    shapes = ", ".join(f"{{ n = {n}, pause = {pause} }}" for n in ns)
    return f'{{ kernel = "fleetpkg.add", setup = "fleetpkg.kernels:add", shapes = [{shapes}] }},'


def crash_entry(kind):
    return f'{{ kernel = "fleetpkg.{kind}", setup = "fleetpkg.crashes:{kind}", shapes = [{{ n = 1 }}] }},'


def env_for(tmp_path, **extra):
    env = {"TRITON_INTERPRET": 1, "FLYTUNE_AUTOTUNE": 0, "FLYTUNE_CACHE_DIR": tmp_path / "cache",
           "FLEET_TEST_LOG": tmp_path / "calls.log", **extra}
    return python_env(**env)


def flytune(proj, *args, env, timeout=TIMEOUT):
    cmd = [sys.executable, "-m", "flytune_build.cli", "tune", "--project", proj, "--ranking", "synthetic",
           "--allow-ci", *args]
    return subprocess.run([str(a) for a in cmd], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=proj)


def calls(tmp_path):
    path = tmp_path / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def comparable(path: Path) -> dict:
    """The artifact with the provenance fields that differ between runs removed."""
    doc = json.loads(path.read_bytes())
    for field in ("created", "host", "worker"):
        doc["provenance"].pop(field, None)
    return doc


def seeded(src: Path, dst: Path) -> dict[str, bytes]:
    """`dst`: `src`'s identities, each holding another declared config than the winner `src` chose."""
    dst.mkdir()
    for p in sorted(src.glob("*.json")):
        a = Artifact.load(p)
        other = Config({"BLOCK": 16 if a.config.kwargs["BLOCK"] != 16 else 32}, num_warps=1)
        Artifact(a.kernel, a.key, a.device, other, a.provenance).save(dst)
    return {p.name: p.read_bytes() for p in dst.glob("*.json")}


EXECUTOR_ARGS = {"inprocess": (), "local": ("--executor", "local", "--workers", "2"),
                 "ray": ("--executor", "ray", "--workers", "2")}


@pytest.mark.parametrize("executor", ["inprocess", "local", "ray"])
def test_every_executor_keeps_and_replaces_winners_as_the_sequential_run(tmp_path, executor):
    """One engine: repeat, min-improvement and the keep-or-replace rule against the output's winners give
    the same files and the same changes on every executor."""
    if executor == "ray":
        pytest.importorskip("ray", reason="Ray is in the test extra; without it --executor ray is not tested")
    proj = make_project(tmp_path / "p", add_entry(100, 200, 300))
    env = env_for(tmp_path)
    seq = flytune(proj, "--output", tmp_path / "seq", "--no-progress", env=env)
    assert seq.returncode == 0, seq.stderr[-3000:]
    assert "3 tuned, 0 resumed, 0 failed" in seq.stdout and "on 1 inprocess worker(s)" in seq.stdout
    assert "3 new, 0 kept, 0 replaced" in seq.stdout
    before = seeded(tmp_path / "seq", tmp_path / "keep")
    r = flytune(proj, "--output", tmp_path / "keep", "--repeat", "2", "--min-improvement", "900",
                *EXECUTOR_ARGS[executor], env=env_for(tmp_path, FLYTUNE_CACHE_DIR=tmp_path / "c1"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "0 new, 3 kept, 0 replaced" in r.stdout and r.stdout.count(" 2/2 ") == 3, r.stdout
    assert {p.name: p.read_bytes() for p in (tmp_path / "keep").glob("*.json")} == before  # kept: byte for byte
    seeded(tmp_path / "seq", tmp_path / "replace")
    r = flytune(proj, "--output", tmp_path / "replace", "--repeat", "2", "--min-improvement", "0",
                *EXECUTOR_ARGS[executor], env=env_for(tmp_path, FLYTUNE_CACHE_DIR=tmp_path / "c2"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "0 new, 0 kept, 3 replaced" in r.stdout, r.stdout
    for p in (tmp_path / "seq").glob("*.json"):
        got = comparable(tmp_path / "replace" / p.name)
        assert got["config"] == comparable(p)["config"]
        assert got["provenance"]["selection"]["stability"] == {"runs": 2, "agreed": 2}


def test_fleet_artifacts_equal_a_sequential_run(tmp_path):
    proj = make_project(tmp_path / "p", add_entry(100, 200, 300, 400, 500))
    env = env_for(tmp_path)
    seq = flytune(proj, "--output", tmp_path / "seq", "--no-progress", env=env)
    assert seq.returncode == 0, seq.stderr[-3000:]
    r = flytune(proj, "--output", tmp_path / "fleet", "--executor", "local", "--workers", "2",
                env=env_for(tmp_path, FLYTUNE_CACHE_DIR=tmp_path / "cache2"))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "5 tuned, 0 resumed, 0 failed" in r.stdout and "on 2 local worker(s)" in r.stdout
    assert "Traceback" not in r.stderr
    assert "flytune: [5/5] tuned fleetpkg.add" in r.stderr  # plain lines: stderr is not a terminal
    made = sorted(p.name for p in (tmp_path / "fleet").glob("*.json"))
    assert made == sorted(p.name for p in (tmp_path / "seq").glob("*.json")) and len(made) == 5
    for name in made:
        assert comparable(tmp_path / "fleet" / name) == comparable(tmp_path / "seq" / name)
        data = (tmp_path / "fleet" / name).read_bytes()
        strict = Artifact.from_bytes(data, file=name, canonical=True)
        fast = reader.read(data, file=name)
        assert strict.provenance["worker"] in ("local:0", "local:1") and strict.provenance["host"]
        assert dict(fast.provenance) == dict(strict.provenance)
    workers = {line.split()[-1] for line in r.stdout.splitlines() if line.startswith("fleetpkg.add")}
    assert workers <= {f"local:{i}@{os.uname().nodename}" for i in (0, 1)} and workers
    state = json.loads((tmp_path / "fleet" / ".flytune-tune-state").read_bytes())
    assert state == json.loads((tmp_path / "seq" / ".flytune-tune-state").read_bytes())  # the same job ids
    again = flytune(proj, "--output", tmp_path / "fleet", "--executor", "local", "--workers", "2", env=env)
    assert again.returncode == 0 and "0 tuned, 5 resumed, 0 failed" in again.stdout


def test_a_job_that_kills_its_worker_fails_alone_after_one_retry(tmp_path):
    entries = "\n".join([add_entry(100, 200)] + [crash_entry(k) for k in ("exits", "segfault", "hangs", "raises")])
    proj = make_project(tmp_path / "p", entries)
    r = flytune(proj, "--output", tmp_path / "out", "--executor", "local", "--workers", "2", "--job-timeout", "8",
                env=env_for(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert "Traceback" not in r.stderr + r.stdout
    assert "2 tuned, 0 resumed, 4 failed" in r.stdout
    failed = {line.split(":")[1].strip(): line for line in r.stdout.splitlines() if line.startswith("failed:")}
    assert "its worker exited with status 3 (both attempts)" in failed["fleetpkg.exits n=1"]
    assert "killed its worker (SIGSEGV) (both attempts)" in failed["fleetpkg.segfault n=1"]
    assert "ran past --job-timeout 8 s (both attempts)" in failed["fleetpkg.hangs n=1"]
    assert "ValueError: no such shape n=1" in failed["fleetpkg.raises n=1"]
    log = calls(tmp_path)
    count = {kind: sum(line.startswith(kind + " ") for line in log) for kind in ("exits", "segfault", "hangs", "raises")}
    assert count == {"exits": 2, "segfault": 2, "hangs": 2, "raises": 1}  # retried once; a raise is not
    assert len(list((tmp_path / "out").glob("*.json"))) == 2
    assert "retrying on a fresh worker" in r.stderr


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie is dead, only not yet reaped


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkilled_driver_leaves_no_worker_and_resumes_without_redoing(tmp_path):
    ns = list(range(100, 1300, 100))
    proj = make_project(tmp_path / "p", add_entry(*ns, pause=0.4))
    out, env = tmp_path / "out", env_for(tmp_path)
    cmd = [sys.executable, "-m", "flytune_build.cli", "tune", "--project", proj, "--ranking", "synthetic",
           "--allow-ci", "--output", out, "--executor", "local", "--workers", "2", "--no-progress"]
    driver = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=env, cwd=proj)
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(read_state(out)) < 3:  # three jobs published and recorded
            assert driver.poll() is None and time.monotonic() < deadline, "the run ended before it was killed"
            time.sleep(0.05)
        workers = _children(driver.pid)
        assert len(workers) == 2
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    deadline = time.monotonic() + 20
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, workers)), "a worker outlived its driver"
    done = json.loads((out / ".flytune-tune-state").read_bytes())["done"]
    assert 3 <= len(done) < len(ns)
    before = len(calls(tmp_path))
    r = flytune(proj, "--output", out, "--executor", "local", "--workers", "2", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{len(ns) - len(done)} tuned, {len(done)} resumed, 0 failed" in r.stdout
    entry = TuneEntry("fleetpkg.add", "fleetpkg.kernels:add", ())
    finished = {n for n in ns if job_id(entry, {"n": n, "pause": 0.4}, "interpreter") in done}
    redone = [int(line.split("'n': ")[1].split("}")[0]) for line in calls(tmp_path)[before:]]
    assert sorted(redone) == sorted(set(ns) - finished)  # each unfinished job once, no finished one again
    assert len(list(out.glob("*.json"))) == len(ns)


DEVICES = '''
import sys
from pathlib import Path
from flytune_build.cli.tune import summary
from flytune_build.core import project
from flytune_build.tuning import driver as fleet
from flytune_build.tuning import executors

specs = ["cuda:sm_90:132:NVIDIA H200", "cuda:sm_90:114:NVIDIA H100 PCIe"]
proj = project.load(Path(sys.argv[1]))
options = fleet.Options("local", 2, output=sys.argv[2], ranking="synthetic")
ex = executors.LocalExecutor(proj, "synthetic", 2, lambda slot: {"FLYTUNE_DEVICE": specs[slot]}, Path(sys.argv[3]))
try:
    report = fleet.Driver(proj, proj.tune_entries, options, ex).run()
except fleet.Refused as e:
    print("refused:", e)
    raise SystemExit(2)
print(summary(report))
'''


def test_workers_on_different_devices_need_a_template_that_separates_them(tmp_path):
    proj = make_project(tmp_path / "p", add_entry(100, 200))
    script = tmp_path / "devices.py"
    script.write_text(DEVICES)

    def run(template):
        return subprocess.run([sys.executable, str(script), str(proj), str(tmp_path / template), str(tmp_path / "logs")],
                              capture_output=True, text=True, env=env_for(tmp_path), timeout=TIMEOUT)

    r = run("by-arch/{arch}")
    assert r.returncode == 2, r.stderr[-3000:]
    assert "workers report different devices" in r.stdout and "put {device}" in r.stdout
    assert not list((tmp_path / "by-arch").rglob("*.json")) and not calls(tmp_path)  # refused before any job
    r = run("by-device/{device}")
    assert r.returncode == 0, r.stderr[-3000:]
    dirs = {d.name: d for d in (tmp_path / "by-device").iterdir()}
    assert set(dirs) == {"cuda-sm_90-132-NVIDIA_H200", "cuda-sm_90-114-NVIDIA_H100_PCIe"}
    for name, slot in (("cuda-sm_90-132-NVIDIA_H200", "local:0"), ("cuda-sm_90-114-NVIDIA_H100_PCIe", "local:1")):
        arts = [Artifact.load(p) for p in dirs[name].glob("*.json")]
        assert len(arts) == 2  # the whole plan, for each device
        assert {a.provenance["worker"] for a in arts} == {slot}
        assert {a.device.units for a in arts} == {132 if "H200" in name else 114}


def test_usage_errors_exit_2_in_one_line(tmp_path):
    proj = make_project(tmp_path / "p", add_entry(100))
    env = env_for(tmp_path)
    r = flytune(proj, "--workers", "2", env=env)
    assert r.returncode == 2 and r.stderr.strip() == \
        "flytune: error: --workers, --address and --job-timeout need --executor local or ray"
    no_ray = ("import sys; sys.modules['ray'] = None; from flytune_build.cli.main import main; "
              "sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", no_ray, "tune", "--project", str(proj), "--allow-ci",
                        "--executor", "ray"], capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "flytune: error: --executor ray needs Ray, which is not installed (pip install 'flytune-build[ray]')"]


def _artifact(directory, block, time_ms, created, n=100, other_ms=2.0):
    cands = [{"config": Config({"BLOCK": block}).to_json(), "time_ms": time_ms},
             {"config": Config({"BLOCK": 999}).to_json(), "time_ms": other_ms}]
    a = Artifact("fleetpkg.add", {"x": "float32", "n": n}, INTERPRETER, Config({"BLOCK": block}),
                 {"triton": "3.6.0", "ranking": "measured", "created": created, "candidates": cands,
                  "host": "gpu-node-1", "worker": "ray:3"})
    return a.save(directory)


def merge(*args):
    return subprocess.run([sys.executable, "-m", "flytune_build.cli", "merge", *map(str, args)],
                          capture_output=True, text=True, env=python_env(), timeout=TIMEOUT)


def test_merge_lists_conflicts_with_files_and_times_and_writes_nothing(tmp_path):
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    fa = _artifact(a, 32, 1.5, "2026-12-01T00:00:00Z")
    fb = _artifact(b, 64, 1.25, "2026-11-01T00:00:00Z")
    _artifact(a, 16, 1.0, "2026-12-01T00:00:00Z", n=200)
    _artifact(b, 16, 1.0, "2026-12-02T00:00:00Z", n=200)  # same winner: not a conflict
    _artifact(b, 16, 1.0, "2026-12-02T00:00:00Z", n=300)
    r = merge(a, b, "--output", out)
    assert r.returncode == 1 and not out.exists()
    assert f"{fa}: Config(BLOCK=32" in r.stdout and "winner time 1.5000 ms" in r.stdout
    assert f"{fb}: Config(BLOCK=64" in r.stdout and "winner time 1.2500 ms" in r.stdout
    assert "1 identity(ies) with different winners; nothing written" in r.stderr
    r = merge(a, b, "--output", out, "--prefer", "faster")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted({p.name for p in [*a.iterdir(), *b.iterdir()]})
    assert (out / fb.name).read_bytes() == fb.read_bytes() and "(faster: 1.2500 ms)" in r.stdout
    newer = tmp_path / "newer"
    assert merge(a, b, "--output", newer, "--prefer", "newer").returncode == 0
    assert (newer / fa.name).read_bytes() == fa.read_bytes()
    c = tmp_path / "c"
    _artifact(c, 128, 1.0, "zzz")  # not a timestamp: never the newest by sorting as text
    r = merge(a, c, "--output", tmp_path / "odd", "--prefer", "newer")
    assert r.returncode == 1 and "provenance.created (UTC, YYYY-MM-DDTHH:MM:SSZ) is missing" in r.stderr + r.stdout


def test_merge_into_one_of_its_inputs_swaps_the_whole_directory(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _artifact(a, 32, 1.5, "2026-12-01T00:00:00Z")
    (a / ".flytune-tune-state").write_text('{"format":1,"done":{}}\n')
    (a / "sub" / "deeper").mkdir(parents=True)  # whatever else OUT holds stays, as it was
    (a / "sub" / "deeper" / "notes.txt").write_text("keep")
    (a / "link").symlink_to("sub")
    added = _artifact(b, 16, 1.0, "2026-12-02T00:00:00Z", n=200)
    r = merge(a, b, "--output", a)
    assert r.returncode == 0, r.stderr
    assert (a / added.name).read_bytes() == added.read_bytes() and (a / ".flytune-tune-state").exists()
    assert (a / "sub" / "deeper" / "notes.txt").read_text() == "keep" and os.readlink(a / "link") == "sub"
    assert len(list(a.glob("*.json"))) == 2 and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    (b / "x").mkdir()
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    r = merge(b, "--output", occupied)
    assert r.returncode == 1 and "exists and is not empty" in r.stderr and (occupied / "keep.txt").exists()
    r = merge(b, "--output", occupied / "keep.txt")   # a file: said so, and kept
    assert r.returncode == 1 and "it is a file, not a directory" in r.stderr, r.stderr
    assert (occupied / "keep.txt").read_text() == "mine"


def test_device_slug_and_separation():
    from flytune_build.tuning import layout as placement
    from flytune_build.core.errors import FlytuneError

    h200 = DeviceIdentity("cuda", "sm_90", "NVIDIA H200", 132)
    h100 = DeviceIdentity("cuda", "sm_90", "NVIDIA H100 80GB HBM3", 132)
    mi300 = DeviceIdentity("hip", "gfx942", "AMD Instinct MI300X", 304)
    assert placement.slug(h100) == "cuda-sm_90-132-NVIDIA_H100_80GB_HBM3" and placement.slug(INTERPRETER) == "interpreter"
    assert placement.expand("a/{backend}/{arch}", mi300) == Path("a/hip/gfx942")
    assert len(placement.check_separates("out/{arch}", [h200, mi300, h200])) == 2
    with pytest.raises(FlytuneError, match="put \\{device\\}"):
        placement.check_separates("out/{arch}", [h200, h100])
    assert len(set(placement.check_separates("out/{device}", [h200, h100]).values())) == 2


def test_ray_executor_matches_a_sequential_run_and_survives_a_dying_actor(tmp_path):
    pytest.importorskip("ray", reason="Ray is in the test extra; without it --executor ray is not tested")
    proj = make_project(tmp_path / "p", "\n".join([add_entry(100, 200, 300), crash_entry("exits")]))
    env = env_for(tmp_path)
    seq = flytune(proj, "--output", tmp_path / "seq", "--kernel", "fleetpkg.add", "--no-progress", env=env)
    assert seq.returncode == 0, seq.stderr[-3000:]
    r = flytune(proj, "--output", tmp_path / "ray", "--executor", "ray", "--workers", "2",
                env=env_for(tmp_path, FLYTUNE_CACHE_DIR=tmp_path / "cache2"))
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]
    assert "3 tuned, 0 resumed, 1 failed" in r.stdout and "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if ln.startswith("failed: fleetpkg.exits")]
    assert "killed its Ray actor" in line
    # two attempts; a third run only where Ray lost the result of the job before it with the actor
    # (that job is then blamed and retried, and the dying one handed out again)
    assert sum(ln.startswith("exits ") for ln in calls(tmp_path)) in (2, 3)
    for p in (tmp_path / "seq").glob("*.json"):
        assert comparable(tmp_path / "ray" / p.name) == comparable(p)
        assert Artifact.load(tmp_path / "ray" / p.name).provenance["worker"] in ("ray:0", "ray:1")


RAY_BATCH = '''
import sys, time
from pathlib import Path
from flytune_build.tuning.executors import RayExecutor
from flytune_build.tuning.job import Job
from flytune_build.core import project
from flytune_build.core.device import INTERPRETER

proj = project.load(Path(sys.argv[1]))
crash, add = sorted(proj.tune_entries, key=lambda e: e.kernel != "fleetpkg.exits")
ex = RayExecutor(proj, "synthetic", 1, None)


def batch(*entries):
    """Start the actor, hand it the entries' jobs at once, and poll once after all have ended."""
    ex.start(0)
    events = []
    while not events:
        events = ex.poll(1.0)
    assert [e[0] for e in events] == ["hello"], events
    for e in entries:
        ex.submit(0, Job(e, e.shapes[0], INTERPRETER.spec()), {"repeat": 1, "min_improvement": 3.0, "winners": {}})
    time.sleep(12)
    print("EVENTS", [e[0] for e in ex.poll(5.0)], ex.pending)


try:
    batch(crash, add)  # the job ahead fails with its actor: one death
    batch(add, crash)  # the first job's result, then the death
finally:
    ex.close()
'''


def test_ray_executor_reports_a_batch_in_handout_order_and_a_death_once(tmp_path):
    """Refs of one actor ready in one `ray.wait` batch are reported in the order they were handed out, and
    an actor's death once: a job done before its actor died in the job ahead is kept, not retried."""
    pytest.importorskip("ray", reason="Ray is in the test extra; without it --executor ray is not tested")
    proj = make_project(tmp_path / "p", "\n".join([crash_entry("exits"), add_entry(100)]))
    script = tmp_path / "batch.py"
    script.write_text(RAY_BATCH)
    r = subprocess.run([sys.executable, str(script), str(proj)], capture_output=True, text=True,
                       env=env_for(tmp_path), timeout=TIMEOUT, cwd=proj)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("EVENTS")]  # the executor's stdout goes there
    # the second: the first job's result, then the death; never the death first (Ray may lose a result
    # still on its way when the actor dies: then the death alone, blamed on that job)
    assert lines[0] == "EVENTS ['died'] {}" and lines[1] in ("EVENTS ['done', 'died'] {}", "EVENTS ['died'] {}")


def test_the_resume_state_keeps_what_other_runs_add_and_drops_what_this_run_redoes(tmp_path):
    """`write_state(dir, done, base)`: records another run added or changed since `base` (the state as
    this run found it) stay; the rest is this run's view, so a `--no-resume` run (done empty at its
    start) drops the records it set out to redo, even if it is interrupted."""
    from flytune_build.tuning.ledger import snapshot, write_state

    old = {"a": {"winner": "w", "time_ms": 1.0}, "b": {"winner": "w", "time_ms": 2.0}}
    write_state(tmp_path, old)
    base = snapshot(tmp_path)                     # a --no-resume run starts
    other = dict(old, c={"winner": "x", "time_ms": 3.0})
    write_state(tmp_path, other, base)            # another run finishes c meanwhile
    write_state(tmp_path, {"a": {"winner": "v", "time_ms": 0.5}}, base)  # this run redid a, then stops
    assert read_state(tmp_path) == {"a": {"winner": "v", "time_ms": 0.5}, "c": {"winner": "x", "time_ms": 3.0}}


def test_a_shipped_winner_in_an_earlier_releases_key_form_is_kept_or_replaced_in_that_form(tmp_path, monkeypatch):
    """An earlier release wrote an adopted kernel's None arguments as no axis: a re-tune finds that file as
    the shipped winner, keeps it byte for byte, or replaces it under its own name (never one identity twice)."""
    from flytune_build.tuning.shipped import ShippedWinners, read_output

    monkeypatch.setenv("FLYTUNE_DEVICE", "interpreter")
    old = Artifact("fleetpkg.cumsum", {"T": 64}, INTERPRETER, Config({"BLOCK": 16}, num_warps=1))
    old.save(tmp_path)
    held = ShippedWinners(read_output(tmp_path)["fleetpkg.cumsum"], 3.0)
    assert held.lookup("fleetpkg.cumsum", {"T": 64, "scale": None}).config == old.config
    same = Artifact("fleetpkg.cumsum", {"T": 64, "scale": None}, INTERPRETER, old.config)
    assert held.change(same) == ("kept", None)
    other = Artifact("fleetpkg.cumsum", {"T": 64, "scale": None}, INTERPRETER, Config({"BLOCK": 32}, num_warps=1))
    change, written = held.change(other)
    assert change == "replaced" and written.filename == old.filename and dict(written.key) == {"T": 64}
    assert written.config == other.config
    fresh = Artifact("fleetpkg.cumsum", {"T": 128, "scale": None}, INTERPRETER, old.config)
    assert held.change(fresh) == ("new", fresh)


# -- no silent stale bundle ---------------------------------------------------------------------------------
def test_a_changed_config_space_is_re_tuned_on_resume_and_the_summary_says_why(tmp_path):
    proj = make_project(tmp_path / "p", add_entry(100, 200))
    env = env_for(tmp_path)
    r = flytune(proj, "--no-progress", env=env)
    assert r.returncode == 0 and "2 tuned, 0 resumed" in r.stdout, r.stderr[-3000:]
    r = flytune(proj, "--no-progress", env=env)
    assert "0 tuned, 2 resumed" in r.stdout and "re-tuned" not in r.stdout
    kernels = proj / "fleetpkg" / "kernels.py"
    kernels.write_text(kernels.read_text().replace("for b in (16, 32, 64)", "for b in (16, 32, 64, 128)"))
    r = flytune(proj, "--no-progress", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 tuned, 0 resumed" in r.stdout and "2 re-tuned: config space changed" in r.stdout
    report = json.loads(flytune(proj, "--no-progress", "--json", env=env).stdout)  # the new space holds now
    assert [o["status"] for o in report["outcomes"]] == ["resumed", "resumed"]
    setup = proj / "fleetpkg" / "kernels.py"
    setup.write_text(setup.read_text().replace('_log("add", n=n)', '_log("add", n=n)  # a comment: no change'))
    assert "0 tuned, 2 resumed" in flytune(proj, "--no-progress", env=env).stdout
    setup.write_text(setup.read_text().replace("x, y = torch.ones(n), torch.ones(n)", "x, y = torch.ones(n), torch.zeros(n)"))
    r = flytune(proj, "--no-progress", env=env)
    assert "2 tuned, 0 resumed" in r.stdout and "2 re-tuned: setup changed" in r.stdout
    setup.write_text(setup.read_text().replace("tl.load(y + offs, mask=m), mask=m)", "tl.load(y + offs, mask=m) * 1, mask=m)"))
    r = flytune(proj, "--no-progress", env=env)
    assert "2 tuned, 0 resumed" in r.stdout and "2 re-tuned: kernel source changed" in r.stdout
    r = flytune(proj, "--no-progress", env={**env, "TRITON_DEFAULT_FP_FUSION": "0"})  # compiles other code
    assert "2 tuned, 0 resumed" in r.stdout and "2 re-tuned: toolchain changed" in r.stdout


def test_a_resume_state_an_earlier_release_wrote_loads_and_its_jobs_are_re_tuned_saying_why(tmp_path):
    proj = make_project(tmp_path / "p", add_entry(100, 200))
    env, state = env_for(tmp_path), tmp_path / "p" / "out" / "interpreter" / ".flytune-tune-state"
    assert flytune(proj, "--no-progress", env=env).returncode == 0
    doc = json.loads(state.read_bytes())
    for record in doc["done"].values():  # as the first releases wrote it: winner, time, margin
        record.pop("depends")
        record.pop("ranking")
    state.write_text(json.dumps(doc))
    assert read_state(state.parent) == doc["done"]
    r = flytune(proj, "--no-progress", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 tuned, 0 resumed" in r.stdout and "2 re-tuned: tuned by a release that recorded no fingerprint" in r.stdout
    assert all("depends" in rec for rec in read_state(state.parent).values())


def test_a_misspelled_plan_kernel_is_refused_once_before_any_job_naming_the_field_and_the_real_kernels(tmp_path):
    entry = add_entry(100).replace('"fleetpkg.add"', '"fleetpkg.addd"')
    proj = make_project(tmp_path / "p", entry)
    r = flytune(proj, "--no-progress", env=env_for(tmp_path))
    assert r.returncode == 1 and not list((tmp_path / "p" / "out").rglob("*.json")), r.stdout
    assert r.stdout == "", r.stdout
    said = (f"flytune: error: {proj}/pyproject.toml: Field `tool.flytune.tune.entries[0].kernel` names "
            f"'fleetpkg.addd', a kernel no setup registers (registered kernels: fleetpkg.add) (did you mean "
            f"`fleetpkg.add`?)")
    assert r.stderr.startswith(said) and r.stderr.count("fleetpkg.addd") == 1, r.stderr
    r = flytune(make_project(tmp_path / "q", add_entry(100)), "--kernel", "fleetpkg.addd", env=env_for(tmp_path))
    assert r.returncode == 2 and r.stderr.strip() == ("flytune: error: kernel fleetpkg.addd: not in the tuning plan "
                                                      "(its kernels: fleetpkg.add) (did you mean `fleetpkg.add`?)")


def test_a_tune_output_the_build_would_not_ship_is_warned_at_tune_time(tmp_path):
    from flytune_build.core.project import ships as shipped

    proj = make_project(tmp_path / "p", add_entry(100), output="tuned/{arch}")
    r = flytune(proj, "--no-progress", env=env_for(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"flytune: warning: {proj / 'tuned' / 'interpreter'} is outside [tool.flytune] sources (artifacts): "
            f"the build does not ship what this run writes there") in r.stderr
    r = flytune(proj, "--no-progress", "--output", proj / "artifacts" / "sm_90", env=env_for(tmp_path))
    assert r.returncode == 0 and "outside [tool.flytune] sources" not in r.stderr
    root = tmp_path / "p"
    assert shipped(root, ["artifacts"], root / "artifacts")
    assert shipped(root, ["artifacts"], root / "artifacts" / "sm_90")
    assert shipped(root, ["vendor/*/tuned"], root / "vendor" / "h200" / "tuned" / "sm_90")
    assert shipped(root, ["**/tuned"], root / "a" / "b" / "tuned")
    assert shipped(root, ["artifacts/*.json"], root / "artifacts")
    assert not shipped(root, ["artifacts"], root / "tuned" / "sm_90")
    assert not shipped(root, ["artifacts"], root / "artifacts-old")
    assert not shipped(root, ["artifacts"], tmp_path / "elsewhere")



def test_a_strict_build_refuses_a_tune_output_its_sources_do_not_reach(tmp_path):
    import io

    from flytune_build import pipeline
    from flytune_build.core.errors import BuildFailure

    proj = make_project(tmp_path / "p", add_entry(100), output="tuned/{arch}")
    (proj / "artifacts").mkdir()
    text = (proj / "pyproject.toml").read_text().replace('targets = ["interpreter"]',
                                                         'targets = ["interpreter"]\ncoverage = "none"')
    (proj / "pyproject.toml").write_text(text)
    with pytest.raises(BuildFailure) as e:
        pipeline.run(proj, out=io.StringIO())
    assert ("1 problem(s)" in str(e.value) and "Field `tool.flytune.tune.output` is 'tuned/{arch}', which writes "
            "tuned/interpreter: outside the sources (artifacts)") in str(e.value)
    (proj / "pyproject.toml").write_text(text.replace('targets = ["interpreter"]', 'targets = ["interpreter"]\nstrict = false'))
    out = io.StringIO()
    assert pipeline.run(proj, out=out) is not None and "warning: dropped:" in out.getvalue()
    (proj / "pyproject.toml").write_text(text.replace('output = "tuned/{arch}"', 'output = "artifacts/{arch}"'))
    pipeline.run(proj, out=io.StringIO())  # reached: no error


def test_the_resume_state_is_never_written_past_the_cap_it_is_read_with(tmp_path, monkeypatch):
    from flytune_build.core.errors import OutputError
    from flytune_build.tuning import ledger

    record = {"winner": "w" * 10_000, "time_ms": 1.0}
    ledger.write_state(tmp_path, {"a": record})
    assert read_state(tmp_path)["a"]["winner"] == "w" * ledger.WINNER_MAX  # cut to what the reader takes
    before = (tmp_path / ledger.STATE_FILE).read_bytes()
    monkeypatch.setattr(ledger, "MAX_STATE_BYTES", len(before) + 100)
    with pytest.raises(OutputError, match="over the .* this flytune reads back"):
        ledger.write_state(tmp_path, {f"job{i}": record for i in range(3)})
    assert (tmp_path / ledger.STATE_FILE).read_bytes() == before  # the state there stays as it was
    assert read_state(tmp_path) == {"a": {**record, "winner": "w" * ledger.WINNER_MAX}}


# -- rankings never mix -------------------------------------------------------------------------------------
def test_a_measured_re_tune_replaces_every_synthetic_winner_and_the_table_labels_ranks(tmp_path):
    proj = make_project(tmp_path / "p", add_entry(100, 200))
    env = env_for(tmp_path)
    r = flytune(proj, "--no-progress", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [line for line in r.stdout.splitlines() if line.startswith("fleetpkg.add")]
    assert len(rows) == 2 and all(" rank 1." in line for line in rows)  # a synthetic rank, never "ms"
    out = proj / "out" / "interpreter"
    seeded = {p.name: Artifact.load(p) for p in out.glob("*.json")}
    assert {a.provenance["ranking"] for a in seeded.values()} == {"synthetic"}
    cmd = [sys.executable, "-m", "flytune_build.cli", "tune", "--project", proj, "--allow-ci", "--no-resume",
           "--ranking", "measured", "--json"]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=TIMEOUT, cwd=proj)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert [o["change"] for o in report["outcomes"]] == ["replaced (synthetic -> measured)"] * 2
    after = {p.name: Artifact.load(p) for p in out.glob("*.json")}
    assert set(after) == set(seeded) and {a.provenance["ranking"] for a in after.values()} == {"measured"}
    assert all("shipped" not in a.provenance["selection"] for a in after.values())  # never a finalist


def test_merge_never_ranks_a_synthetic_artifact_against_a_measured_one(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    measured = _artifact(a, 32, 1.5, "2026-12-01T00:00:00Z")
    synthetic = Artifact.load(_artifact(b, 64, 1.25, "2026-11-01T00:00:00Z"))
    synthetic = synthetic.with_provenance({**synthetic.provenance, "ranking": "synthetic"})
    path = synthetic.save(b)
    r = merge(a, b, "--output", tmp_path / "out", "--prefer", "faster")
    assert r.returncode == 1 and not (tmp_path / "out").exists()
    assert "a synthetic rank and a measured time cannot be compared" in r.stdout
    assert f"{path}: Config(BLOCK=64" in r.stdout and "winner rank 1.2500 (synthetic)" in r.stdout
    assert f"{measured}: Config(BLOCK=32" in r.stdout and "winner time 1.5000 ms" in r.stdout
    r = merge(a, b, "--output", tmp_path / "newer", "--prefer", "newer")
    assert r.returncode == 0 and (tmp_path / "newer" / measured.name).read_bytes() == measured.read_bytes()
