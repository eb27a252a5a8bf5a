"""The installed `triton-features` wheel (examples/triton_features) on the device it was tuned for.

    python benchmarks/h200_features.py serve PLAN          every planned shape, twice, with zero searches
    python benchmarks/h200_features.py first-call PLAN     first call per kernel vs stock @triton.autotune

`serve` runs under FLYTUNE_AUTOTUNE=strict (a call no bundled artifact serves raises TierMissError) and
then asserts `flytune_build.stats()`: every call offline, no search, no fallback. `first-call` times each
kernel's first call at the plan's first shape, each in a cold process (fresh Triton cache and scratch
cache): `flytune` is the installed wheel (adopted and ported kernels served by the bundle), `stock` the
same kernels as plain `@triton.autotune` (TRITON_FEATURES_STOCK=1), which benchmark on the first call.
Run both from outside the source tree, so the installed package is the one imported.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("serve", "first-call"))
    ap.add_argument("plan")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    return serve(args.plan) if args.what == "serve" else first_call(args.plan, args.reps)


if __name__ == "__main__":
    raise SystemExit(main())
