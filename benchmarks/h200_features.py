"""The installed `triton-features` wheel (examples/triton_features) on the device it was tuned for.

    python benchmarks/h200_features.py serve PLAN          every planned shape, twice, with zero searches
    python benchmarks/h200_features.py first-call PLAN     first call per kernel vs stock @triton.autotune
    python benchmarks/h200_features.py warm PLAN           first calls after a background warm-up vs steady state

`serve` runs under FLYTUNE_AUTOTUNE=strict (a call no bundled artifact serves raises TierMissError) and
then asserts `flytune_build.stats()`: every call offline, no search, no fallback. `first-call` times each
kernel's first call at the plan's first shape, each in a cold process (fresh Triton cache and scratch
cache): `flytune` is the installed wheel (adopted and ported kernels served by the bundle), `stock` the
same kernels as plain `@triton.autotune` (TRITON_FEATURES_STOCK=1), which benchmark on the first call.
`warm` runs, in each of --reps fresh processes with an empty Triton cache, `flytune_build.warmup(
"triton-features", background=True)` right after the import, builds every planned shape's inputs meanwhile,
awaits the warm-up, then times each shape's first call (call + device sync) and its steady state (the
median of 5 such calls): the goal is first <= 2x steady for every shape, the adopted kernels' included
(their keys decided ahead: `primed`); per first call it also records the host's part (the call returned,
before the sync) and how many kernels it added to the JIT's in-process cache (`jit+`, 0: the warm-up
readied it), and after the steady calls each call once more right after 256 MiB copied on the host
(`evicted`: the CPU's caches flushed by other work), what a call that is no first call pays cold. `--prealloc` also allocates each output size once before the first calls (untimed): what the
caching allocator's first meeting with a size costs.
Run all three from outside the source tree, so the installed package is the one imported.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib

CHILD = r"""
import json, sys, time
import torch
entry, shape = json.loads(sys.argv[1]), json.loads(sys.argv[2])
from triton_features import tuning
call = getattr(tuning, entry["setup"].rsplit(":", 1)[1])(**shape)
sync = torch.cuda.synchronize if torch.cuda.is_available() and torch.cuda.is_initialized() else (lambda: None)
sync()
t = time.perf_counter(); call(); sync(); first = time.perf_counter() - t
t = time.perf_counter(); call(); sync(); second = time.perf_counter() - t
print(json.dumps({"first_call_s": round(first, 4), "second_call_s": round(second, 5)}))
"""

WARM = r"""
import json, os, sys, time
import torch
import flytune_build as ft
entries, prealloc = json.loads(sys.argv[1]), sys.argv[2] == "1"
bg = ft.warmup("triton-features", background=True)
from triton_features import kernels, tuning
calls = [(e["kernel"], s, getattr(tuning, e["setup"].rsplit(":", 1)[1])(**s)) for e in entries for s in e["shapes"]]
if os.environ.get("FEATURES_ORDER") == "reverse":   # the process's first call another kernel's: what is whose
    calls.reverse()
sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)   # the interpreter: plumbing only
sync()
t = time.perf_counter(); report = bg.result(600); waited = time.perf_counter() - t
def jit_of(k):   # the @triton.jit function under Heuristics, Autotuner or flytune's kernel (none: the interpreter)
    while k is not None and not hasattr(k, "device_caches"):
        k = getattr(k, "fn", None)
    return k
jits = [j for j in map(jit_of, (kernels.scale_rows_kernel, kernels.add_bias_kernel, kernels.matmul_kernel)) if j]
def jit_entries():
    return sum(len(c[0]) for j in jits for c in j.device_caches.values())
def out_bytes(kernel, s):   # what each wrapper allocates: out like x (fp32); y like x, c (M, N): fp16
    return 4 * s["n"] if kernel == "triton_features.add_bias" else 2 * s["M"] * s["N"]
if prealloc:   # each output's size met once by the caching allocator (allocated and freed), untimed
    for kernel, s, _ in calls:
        torch.empty(out_bytes(kernel, s), dtype=torch.uint8, device="cuda")
    sync()
if os.environ.get("FEATURES_TINY") == "1":   # the process's first Triton launch made ahead, untimed, by a
    import triton                             # one-program kernel of this script's own (not the package's)
    import triton.language as tl

    @triton.jit
    def _tiny(p):
        tl.store(p, tl.load(p) + 1)
    z = torch.zeros(1, device="cuda", dtype=torch.int32)
    _tiny[(1,)](z)
    sync()
profile = os.environ.get("FEATURES_PROFILE")   # a path: each first call under cProfile (its time inflated)
if profile:
    import cProfile, pstats
    out = open(profile, "w")
rows = []
for kernel, shape, call in calls:
    e0 = jit_entries()
    if profile:
        prof = cProfile.Profile(); prof.enable()
    t = time.perf_counter(); y = call(); host = time.perf_counter() - t; sync(); first = time.perf_counter() - t
    rows.append({"kernel": kernel, "shape": shape, "first_s": first, "host_s": host, "jit_added": jit_entries() - e0})
    del y
    if profile:   # in us: pstats prints seconds to 3 places, all zeros here
        prof.disable()
        out.write(f"== first call of {kernel} {shape}: cumulative us, own us, calls, function\n")
        for (path, line, fn), (_, n, own, cum, _) in sorted(pstats.Stats(prof).stats.items(), key=lambda i: -i[1][3])[:40]:
            out.write(f"{cum * 1e6:10.1f} {own * 1e6:10.1f} {n:5d}  {path.rsplit('site-packages/', 1)[-1]}:{line}({fn})\n")
for row, (_, _, call) in zip(rows, calls):
    times, hosts = [], []
    for _ in range(5):
        t = time.perf_counter(); call(); hosts.append(time.perf_counter() - t); sync(); times.append(time.perf_counter() - t)
    row["steady_s"], row["steady_host_s"] = sorted(times)[2], sorted(hosts)[2]
    row["ratio"] = round(row["first_s"] / row["steady_s"], 2)
_big, _src = bytearray(256 << 20), bytes(range(256)) * (1 << 20)
for row, (_, _, call) in zip(rows, calls):   # once more after the host's caches were flushed by other work
    _big[:] = _src
    t = time.perf_counter(); call(); host = time.perf_counter() - t; sync(); cold = time.perf_counter() - t
    row["evicted_s"], row["evicted_host_s"] = cold, host
    row["evicted_ratio"] = round(cold / row["steady_s"], 2)
del _big, _src
print(json.dumps({"waited_s": round(waited, 3), "primed": report.to_json()["primed"],
                  "counts": report.to_json()["counts"], "notes": report.notes, "rows": rows,
                  "stats": {n: s["calls"] for n, s in ft.stats().items()}}))
"""


def plan_entries(path):
    with open(path, "rb") as f:
        return tomllib.load(f)["entries"]


def _setup(entry):
    from triton_features import tuning

    return getattr(tuning, entry["setup"].rsplit(":", 1)[1])


def serve(plan):
    os.environ["FLYTUNE_AUTOTUNE"] = "strict"
    import torch

    import flytune_build
    import triton_features

    print(f"triton_features from {os.path.dirname(triton_features.__file__)}")
    expected = {}
    for entry in plan_entries(plan):
        for shape in entry["shapes"]:
            call = _setup(entry)(**shape)
            call()
            call()
            expected[entry["kernel"]] = expected.get(entry["kernel"], 0) + 2
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    stats = flytune_build.stats()
    print(json.dumps(stats, indent=2, sort_keys=True))
    bad = []
    for kernel, calls in expected.items():
        s = stats.get(kernel)
        if s is None or s["searches"] or s["fallbacks"] or s["calls"]["offline"] != calls:
            bad.append(f"{kernel}: expected {calls} offline calls, no search, no fallback; got {s}")
    for line in bad:
        print(f"FAIL {line}")
    print("OK: every tuned shape served by the bundle, zero searches" if not bad else f"{len(bad)} kernel(s) failed")
    return 1 if bad else 0


def first_call(plan, reps):
    script = os.path.join(tempfile.mkdtemp(), "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    rows = {}
    for entry in plan_entries(plan):
        shape = entry["shapes"][0]
        for mode in ("flytune", "stock"):
            for rep in range(reps):
                env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(), FLYTUNE_CACHE_DIR=tempfile.mkdtemp(),
                           TRITON_FEATURES_STOCK="1" if mode == "stock" else "0", FLYTUNE_AUTOTUNE="")
                t = time.perf_counter()
                p = subprocess.run([sys.executable, script, json.dumps(entry), json.dumps(shape)], env=env,
                                   capture_output=True, text=True)
                wall = time.perf_counter() - t
                if p.returncode:
                    print(json.dumps({"kernel": entry["kernel"], "mode": mode, "error": p.stderr[-1500:]}), flush=True)
                    continue
                line = {"kernel": entry["kernel"], "shape": shape, "mode": mode, "rep": rep,
                        "process_s": round(wall, 3), **json.loads(p.stdout.strip().splitlines()[-1])}
                print(json.dumps(line), flush=True)
                rows.setdefault((entry["kernel"], mode), []).append(line["first_call_s"])
    print(f"\nfirst call (median of {reps} cold processes), seconds")
    print(f"{'kernel':32} {'flytune':>9} {'stock':>9} {'stock/flytune':>14}")
    for kernel in dict.fromkeys(k for k, _ in rows):
        ours, theirs = rows.get((kernel, "flytune")), rows.get((kernel, "stock"))
        a = statistics.median(ours) if ours else float("nan")
        b = statistics.median(theirs) if theirs else float("nan")
        print(f"{kernel:32} {a:9.3f} {b:9.3f} {b / a if a else float('nan'):13.1f}x")
    return 0 if all(len(v) == reps for v in rows.values()) and len(rows) % 2 == 0 else 1


def warm(plan, reps, prealloc=False):
    script = os.path.join(tempfile.mkdtemp(), "warm.py")
    with open(script, "w") as f:
        f.write(WARM)
    runs = []
    for rep in range(reps):
        env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(), FLYTUNE_CACHE_DIR=tempfile.mkdtemp(),
                   FLYTUNE_AUTOTUNE="0")
        p = subprocess.run([sys.executable, script, json.dumps(plan_entries(plan)), "1" if prealloc else "0"], env=env,
                           capture_output=True, text=True)
        if p.returncode:
            print(json.dumps({"rep": rep, "error": p.stderr[-3000:]}), flush=True)
            return 1
        run = json.loads(p.stdout.strip().splitlines()[-1])
        print(json.dumps(run), flush=True)
        runs.append(run)
    print(f"\nfirst call after a background warm-up / steady state, {reps} processes (primed keys: "
          f"{[r['primed'] for r in runs]}, warm-up awaited {[r['waited_s'] for r in runs]} s)")
    print(f"{'kernel':28} {'shape':34} {'first (ms)':>22} {'of it host':>22} {'steady (ms)':>22} {'ratio':>16} "
          f"{'evicted ratio':>16} jit+")
    worst = 0.0
    for i, row in enumerate(runs[0]["rows"]):
        cells = [r["rows"][i] for r in runs]
        worst = max(worst, *(c["ratio"] for c in cells))
        first = ", ".join(f"{c['first_s'] * 1e3:.3f}" for c in cells)
        steady = ", ".join(f"{c['steady_s'] * 1e3:.3f}" for c in cells)
        host = ", ".join(f"{c['host_s'] * 1e3:.3f}" for c in cells)
        added = ",".join(str(c["jit_added"]) for c in cells)
        ratio = ", ".join(f"{c['ratio']:.1f}" for c in cells)
        cold = ", ".join(f"{c['evicted_ratio']:.1f}" for c in cells)
        print(f"{row['kernel']:28} {json.dumps(row['shape']):34} {first:>22} {host:>22} {steady:>22} {ratio:>16} "
              f"{cold:>16} {added}")
    print(f"worst ratio {worst:.2f} (goal <= 2)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("serve", "first-call", "warm"))
    ap.add_argument("plan")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--prealloc", action="store_true", help="warm: each output size allocated once before")
    args = ap.parse_args()
    return {"serve": lambda: serve(args.plan), "first-call": lambda: first_call(args.plan, args.reps),
            "warm": lambda: warm(args.plan, args.reps, args.prealloc)}[args.what]()


if __name__ == "__main__":
    raise SystemExit(main())
