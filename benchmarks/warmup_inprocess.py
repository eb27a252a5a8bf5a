"""First calls at steady-state speed (issue 26): the sample's tuned shapes, side by side in one run.

Each mode is a fresh process that imports torch and the installed sample wheel, builds every shape's
inputs, then calls each shape once (the first calls, each timed call + device sync), then again
(steady state: the median of 5 such timed calls per shape). Modes:

  cold         empty TRITON_CACHE_DIR, no warm-up
  disk         `flytune warmup sample-pkg` in another process into an empty cache W (its wall time is
               reported), then this process with W and no warm-up of its own
  inproc       empty cache; `flytune_build.warmup("sample-pkg")` here (timed), then the calls
  inproc_disk  cache W (already filled); `flytune_build.warmup("sample-pkg")` here (timed)
  inproc_thr   empty cache; the warm-up with processes=False (compiles on threads), timed
  inproc_novar empty cache; the warm-up with align_variants=False (the tuned specializations only)
  background   empty cache; `flytune_build.warmup(background=True)` right after the import, the
               inputs built meanwhile, its `result()` awaited, then the calls
  env          empty cache, FLYTUNE_WARMUP=background: importing the package starts it; awaited
  racing       empty cache, FLYTUNE_WARMUP=background, calls made at once while it runs: every
               output checked against torch (no wrong kernel, nothing broken)
  triton       stock triton.autotune over the same configs (benchmarks/_triton_swap.py), empty cache

  bg_prealloc  background, with each output size allocated once (and freed) before the first calls,
               untimed: the caching allocator's first cudaMalloc of a size is not the kernel's cost
  bg_touch     bg_prealloc, and one torch kernel launched and awaited before the first calls, untimed:
               the process's first launch on the device is not a tuned call's cost
  bg_eager     bg_prealloc under CUDA_MODULE_LOADING=EAGER: whether lazy module loading is left to
               the first calls
  bg_tiny      bg_prealloc, and one launch of a one-program Triton kernel of this script's own (not the
               sample's) awaited before the first calls, untimed: whether what the process's first call
               pays beyond steady state is the process's first Triton launch, whatever the kernel
  bg_tiny_only background and that launch, the output sizes not met before
  bg_tiny_thread bg_tiny, the launch made on another thread (as a background warm-up would make it):
               whether what it pays ahead is this process's or only that thread's
  bg_anatomy   bg_prealloc, each call's host time split where the launch path passes (flytune's `run`
               entered, `JITFunction.run` entered, `CudaLauncher.__call__` entered, its C `launch` entered
               and left, the device sync): `parts_first` and `parts_steady` per shape, in microseconds
               (the package's wrapper, flytune's hit, Triton's run, the launcher's Python, the C launch,
               the sync)
  bg_anatomy_spin  bg_anatomy, and 20 ms of busy Python on the calling thread just before the first
               calls: whether what a first call pays is the core waking (its clock, its caches) after
               the setup's waits, or the call path's own first pass
  bg_grow      background, then on another thread (as a warm-up's) one 256 MiB block and four 1 MiB
               ones allocated and freed, untimed: whether growing the caching allocator blindly, not
               knowing the outputs' sizes, does what bg_prealloc does

`--reps N` runs the list of modes N times over (keys `mode#r` past the first).

Per shape a child records the first call, whether flytune had decided its key before it
(`decided_ahead`), how many kernels the first call added to the JIT's in-process cache (`jit_added`,
0: a hit there) and the steady-state time; then, after the steady calls, the same call once more right
after 256 MiB copied on the host (`evicted_s`: the CPU's caches flushed by other work, more than any
host's last-level cache; `parts_evicted` in the anatomy modes) and once more after 50 ms asleep
(`slept_s`): what a call that is no first call pays cold, the yardstick for what a first call pays.

  python benchmarks/warmup_inprocess.py --plan sample_pkg/tune/h200.toml --out OUTDIR
Writes OUTDIR/warmup_inprocess.json and prints a table; goals: background first calls <= 2x steady
state, the in-process warm-up <= 1 s.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import tomllib

CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
mode, shapes, bench_dir = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
import torch
import flytune_build as ft
out = {"mode": mode}
bg = None
marks = []
anatomy = mode.startswith("bg_anatomy")
if anatomy:   # before the warm-up, which makes the launchers
    import triton.runtime.jit as _jit
    from triton.backends.nvidia import driver as _drv
    _now, _run, _call, _init = time.perf_counter_ns, _jit.JITFunction.run, _drv.CudaLauncher.__call__, _drv.CudaLauncher.__init__
    def _jit_run(self, *a, **k):
        marks.append(("jit", _now()))
        return _run(self, *a, **k)
    def _launcher(self, *a):
        marks.append(("launcher", _now()))
        r = _call(self, *a)
        marks.append(("launched", _now()))
        return r
    def _made(self, *a, **k):
        _init(self, *a, **k)
        inner = self.launch
        def launch(*b):
            marks.append(("c", _now()))
            r = inner(*b)
            marks.append(("c_end", _now()))
            return r
        self.launch = launch
    _jit.JITFunction.run, _drv.CudaLauncher.__call__, _drv.CudaLauncher.__init__ = _jit_run, _launcher, _made
def parts(start, end):
    # us: the call's start to Triton's run, Triton's run to the launcher, the launcher's Python, the C launch,
    # after it to the sync's end
    m = dict(marks)
    keys = ("ft", "jit", "launcher", "c", "c_end", "launched")
    if not all(k in m for k in keys):
        return None
    p = [m["ft"] - start, m["jit"] - m["ft"], m["launcher"] - m["jit"], m["c"] - m["launcher"], m["c_end"] - m["c"],
         end - m["c_end"]]
    return [round(x / 1e3, 1) for x in p]
if mode in ("background", "bg_prealloc", "bg_touch", "bg_eager", "bg_grow", "bg_tiny", "bg_tiny_only",
            "bg_tiny_thread") or anatomy:
    bg = ft.warmup("sample-pkg", background=True)
import sample_pkg
from sample_pkg import kernels, tuning
if mode == "triton":
    sys.path.insert(0, bench_dir); import _triton_swap; _triton_swap.swap()
if anatomy:   # flytune's `run` entered (`kernel[grid]` reads it on each call)
    def _entered(inner):
        def run(*a, **k):
            marks.append(("ft", _now()))
            return inner(*a, **k)
        return run
    for _k in (kernels.rmsnorm_kernel, kernels.softmax_kernel, kernels.matmul_kernel):
        _k.run = _entered(_k.run)
torch.cuda.init()
if mode in ("inproc", "inproc_disk", "inproc_thr", "inproc_novar"):
    t = time.perf_counter()
    report = ft.warmup("sample-pkg", processes=False if mode == "inproc_thr" else None,
                       align_variants=mode != "inproc_novar")
    out["warmup_s"] = round(time.perf_counter() - t, 4)
    out["report"] = report.to_json()
calls = [(kind, s, getattr(tuning, kind)(**s)) for kind, s in shapes]
torch.cuda.synchronize()
if bg is not None:
    t = time.perf_counter(); report = bg.result(120); out["waited_s"] = round(time.perf_counter() - t, 4)
    out["report"] = report.to_json()
if mode in ("env", "racing"):
    from flytune_build.runtime.warming import warmup as w
    auto = w.auto()
    out["auto_started"] = auto is not None
if mode == "env":
    t = time.perf_counter(); auto.wait(120); out["waited_s"] = round(time.perf_counter() - t, 4)
    out["report"] = next(iter(auto.reports.values())).to_json() if auto.reports else None
if mode in ("bg_prealloc", "bg_touch", "bg_eager", "bg_tiny", "bg_tiny_thread") or anatomy:
    for kind, s, _ in calls:
        torch.empty((s["M"], s["N"]), device="cuda", dtype=torch.float16)
    torch.cuda.synchronize()
if mode == "bg_grow":
    import threading
    def reserve():
        blocks = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda")]
        blocks += [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(4)]
        del blocks
        torch.cuda.synchronize()
    t = threading.Thread(target=reserve); t.start(); t.join()
if mode == "bg_touch":
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
if mode in ("bg_tiny", "bg_tiny_only", "bg_tiny_thread"):
    import threading
    import triton
    import triton.language as tl

    @triton.jit
    def _tiny(p):
        tl.store(p, tl.load(p) + 1)

    def tiny():
        z = torch.zeros(1, device="cuda", dtype=torch.int32)
        _tiny[(1,)](z)
        torch.cuda.synchronize()
        assert int(z.item()) == 1
    if mode == "bg_tiny_thread":
        th = threading.Thread(target=tiny); th.start(); th.join()
    else:
        tiny()
if mode == "bg_anatomy_spin":
    _until = time.perf_counter() + 0.02
    while time.perf_counter() < _until:
        pass
out["since_start_s"] = round(time.perf_counter() - t0, 3)
def jit_entries():
    n = 0
    for k in (kernels.rmsnorm_kernel, kernels.softmax_kernel, kernels.matmul_kernel):
        fn = k.fn
        for caches in fn.device_caches.values():
            n += len(caches[0])
    return n
def reference(kind, s):
    g = torch.Generator().manual_seed(0)
    if kind == "matmul":
        a = torch.randn(s["M"], s["K"], generator=g).cuda().half(); b = torch.randn(s["K"], s["N"], generator=g).cuda().half()
        return (a.float() @ b.float()), 5e-2 * s["K"] ** 0.5
    x = torch.randn(s["M"], s["N"], generator=g).cuda().half()
    if kind == "softmax":
        return torch.softmax(x.float(), -1), 2e-3
    w = torch.randn(s["N"], generator=g).cuda().half()
    return x.float() * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6) * w.float(), 2e-2
rows = []
for kind, s, call in calls:
    k = getattr(kernels, kind + "_kernel")
    memo = getattr(k, "_memo", None)
    before = len(memo) if memo is not None else None
    e0 = jit_entries() if mode != "triton" else 0
    marks.clear()
    t = time.perf_counter_ns(); y = call(); torch.cuda.synchronize(); end = time.perf_counter_ns()
    first = (end - t) / 1e9
    row = {"kernel": kind, "shape": s, "first_s": first, "jit_added": (jit_entries() - e0) if mode != "triton" else None,
           "decided_ahead": (memo is not None and len(memo) == before and before > 0)}
    if anatomy:
        row["parts_first"] = parts(t, end)
    if mode == "racing":
        ref, tol = reference(kind, s)
        row["correct"] = bool(torch.allclose(y.float(), ref, atol=tol, rtol=1e-2))
    rows.append(row)
del y
for row, (kind, s, call) in zip(rows, calls):
    times = []
    split = []
    for _ in range(5):
        marks.clear()
        t = time.perf_counter_ns(); call(); torch.cuda.synchronize(); end = time.perf_counter_ns()
        times.append((end - t) / 1e9)
        split.append((times[-1], parts(t, end)))
    row["steady_s"] = sorted(times)[2]
    if anatomy:
        row["parts_steady"] = sorted(split, key=lambda e: e[0])[2][1]
# the same call once more after the CPU's caches were flushed by other work (256 MiB copied: more than any
# host's last-level cache), then after 50 ms asleep: what a call pays cold that is no first call's own
_big, _src = bytearray(256 << 20), bytes(range(256)) * (1 << 20)
for row, (kind, s, call) in zip(rows, calls):
    _big[:] = _src
    marks.clear()
    t = time.perf_counter_ns(); call(); torch.cuda.synchronize(); end = time.perf_counter_ns()
    row["evicted_s"] = (end - t) / 1e9
    if anatomy:
        row["parts_evicted"] = parts(t, end)
    time.sleep(0.05)
    t = time.perf_counter_ns(); call(); torch.cuda.synchronize(); end = time.perf_counter_ns()
    row["slept_s"] = (end - t) / 1e9
del _big, _src
out["rows"] = rows
out["stats"] = {n: s["calls"] for n, s in ft.stats().items()} if mode != "triton" else None
print("RESULT " + json.dumps(out))
"""


def child(script, mode, shapes, cache, bench_dir, **env):
    e = dict(os.environ, TRITON_CACHE_DIR=cache, FLYTUNE_CACHE_DIR=tempfile.mkdtemp(), FLYTUNE_AUTOTUNE="0", **env)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, script, mode, json.dumps(shapes), bench_dir], env=e, capture_output=True,
                       text=True, check=False)
    wall = time.perf_counter() - t
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode or line is None:
        return {"mode": mode, "error": (p.stdout + p.stderr)[-3000:], "wall_s": wall}
    out = json.loads(line[7:])
    out["wall_s"] = round(wall, 3)
    out["stderr_tail"] = p.stderr[-1500:]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="cold,disk,inproc,inproc_disk,inproc_thr,inproc_novar,background,bg_prealloc,"
                                       "bg_touch,bg_eager,bg_grow,env,racing,triton")
    ap.add_argument("--reps", type=int, default=1)
    args = ap.parse_args()
    with open(args.plan, "rb") as f:
        shapes = [(e["kernel"].rsplit(".", 1)[1], s) for e in tomllib.load(f)["entries"] for s in e["shapes"]]
    work = tempfile.mkdtemp()
    script = os.path.join(work, "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    fresh = lambda: tempfile.mkdtemp(dir=work)
    results, extra = {}, {}
    disk = fresh()
    for rep, mode in [(r, m) for r in range(args.reps) for m in args.modes.split(",")]:
        name = mode if rep == 0 else f"{mode}#{rep}"
        if mode == "disk":
            disk = fresh()
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "flytune_build.cli", "warmup", "sample-pkg", "--json"],
                               env=dict(os.environ, TRITON_CACHE_DIR=disk, FLYTUNE_CACHE_DIR=tempfile.mkdtemp()),
                               capture_output=True, text=True, check=False)
            cli = {"cli_warmup_wall_s": round(time.perf_counter() - t, 3), "cli_warmup_rc": p.returncode}
            try:
                cli["cli_report"] = json.loads(p.stdout)
            except ValueError:
                cli["cli_report"] = {"error": (p.stdout + p.stderr)[-3000:]}
            extra.update(cli) if rep == 0 else extra.setdefault("cli_reps", []).append(cli)
            r = child(script, mode, shapes, disk, bench_dir)
        elif mode == "inproc_disk":
            r = child(script, mode, shapes, disk, bench_dir)
        elif mode in ("env", "racing"):
            r = child(script, mode, shapes, fresh(), bench_dir, FLYTUNE_WARMUP="background")
        elif mode == "bg_eager":
            r = child(script, mode, shapes, fresh(), bench_dir, CUDA_MODULE_LOADING="EAGER")
        else:
            r = child(script, mode, shapes, fresh(), bench_dir)
        results[name] = r
        print(json.dumps({k: v for k, v in r.items() if k not in ("rows", "report", "stderr_tail")}), flush=True)
        with open(os.path.join(args.out, "warmup_inprocess.json"), "w") as f:
            json.dump({"results": results, **extra}, f, indent=1)
    summary = {}
    print(f"\n{'mode':12} {'first 15 (ms)':>14} {'steady 15 (ms)':>15} {'ratio':>7} {'evicted':>8} {'warm-up (s)':>12} "
          f"{'decided':>8} {'jit+':>5} {'correct':>8}")
    for mode, r in results.items():
        if "rows" not in r:
            print(f"{mode:12} ERROR {r.get('error', '')[-300:]}")
            continue
        first = sum(x["first_s"] for x in r["rows"]) * 1e3
        steady = sum(x["steady_s"] for x in r["rows"]) * 1e3
        warm = r.get("warmup_s", r.get("waited_s"))
        dec = sum(bool(x["decided_ahead"]) for x in r["rows"])
        added = sum(x["jit_added"] or 0 for x in r["rows"]) if mode.split("#")[0] != "triton" else None
        correct = all(x.get("correct", True) for x in r["rows"])
        evicted = sum(x.get("evicted_s", 0) for x in r["rows"]) * 1e3
        summary[mode] = {"first_ms": round(first, 3), "steady_ms": round(steady, 3), "ratio": round(first / steady, 2),
                         "evicted_ms": round(evicted, 3), "evicted_ratio": round(evicted / steady, 2),
                         "warmup_s": warm, "decided_ahead": dec, "jit_added": added, "correct": correct}
        print(f"{mode:12} {first:14.2f} {steady:15.3f} {first / steady:7.1f} {evicted / steady:8.1f} "
              f"{'' if warm is None else f'{warm:.3f}':>12} {dec:>8} {'' if added is None else added:>5} {correct!s:>8}")
    print(f"flytune warmup (CLI, another process): {extra.get('cli_warmup_wall_s')} s wall, "
          f"report seconds {extra.get('cli_report', {}).get('seconds')}")
    with open(os.path.join(args.out, "warmup_inprocess.json"), "w") as f:
        json.dump({"summary": summary, "results": results, **extra}, f, indent=1)


if __name__ == "__main__":
    main()
