"""First-call time per kernel on a GPU, each in a cold process (fresh Triton cache), side by side:

  (a) offline: the installed sample_pkg wheel, its bundle serving the tuned shape (flytune)
  (b) fixed:   the same config launched directly on the bare @triton.jit function
  (c) triton:  triton.autotune over the same configs and key (the anchor)

Run on the target GPU with sample_pkg installed:  python benchmarks/first_call.py [--reps 3]
Prints one JSON line per process, then a table of medians and ratios.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SHAPES = {"rmsnorm": {"M": 8192, "N": 8192}, "softmax": {"M": 8192, "N": 8192},
          "matmul": {"M": 4096, "N": 4096, "K": 4096}}

CHILD = r"""
import json, os, sys, time
mode, kind, shape, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
import torch, triton
import sample_pkg
from sample_pkg import kernels
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[5])))
from sample_pkg import tuning
torch.cuda.init()
if mode == "triton":
    import _triton_swap; _triton_swap.swap()
call = getattr(tuning, kind)(**shape)
if mode == "fixed":
    from flytune_build import Config
    c = Config.from_json(cfg, __import__("flytune_build.core.codec").core.codec.Fields("cfg", ValueError))
    k = getattr(kernels, kind + "_kernel")
    k.run = lambda *a, grid, warmup=False, **kw: k.fn.run(*a, grid=grid, warmup=warmup, **kw, **c.launch_kwargs())
torch.cuda.synchronize()
t = time.perf_counter(); call(); torch.cuda.synchronize(); first = time.perf_counter() - t
print(json.dumps({"mode": mode, "kind": kind, "first_call_s": round(first, 4)}))
"""


def tuned_config(kind, shape):
    import sample_pkg  # noqa: F401  (registers the kernels)
    from flytune_build.core import key as keys
    from flytune_build.runtime.serving import autotuner

    k = autotuner.kernel(f"sample_pkg.{kind}")
    dtype = "float16"
    values = {"x": dtype, "a": dtype, **shape}
    kt = tuple(keys.bucket(values[a.name], a) for a in k.axes)
    hit = k.offline_index().hit(kt)
    if hit is None:
        raise SystemExit(f"no offline artifact for {kind} {kt}: is the tuned sample_pkg installed?")
    return hit.config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    script = os.path.join(tempfile.mkdtemp(), "child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    here = os.path.abspath(__file__)
    results = {}
    for kind, shape in SHAPES.items():
        cfg = tuned_config(kind, shape)
        for mode in ("offline", "fixed", "triton"):
            for rep in range(args.reps):
                env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(), FLYTUNE_CACHE_DIR=tempfile.mkdtemp(),
                           FLYTUNE_AUTOTUNE="0", PYTHONPATH=os.path.dirname(here) + os.pathsep + os.environ.get("PYTHONPATH", ""))
                p = subprocess.run([sys.executable, script, mode, kind, json.dumps(shape), json.dumps(cfg), here],
                                   env=env, capture_output=True, text=True)
                if p.returncode:
                    print(json.dumps({"mode": mode, "kind": kind, "error": p.stderr[-1500:]}), flush=True)
                    continue
                line = json.loads(p.stdout.strip().splitlines()[-1])
                line["rep"] = rep
                print(json.dumps(line), flush=True)
                results.setdefault((kind, mode), []).append(line["first_call_s"])
    print(f"\n{'kernel':10} {'(a) offline':>12} {'(b) fixed':>10} {'(c) triton':>11} {'a/b':>6} {'c/a':>6}")
    for kind in SHAPES:
        med = {m: statistics.median(results.get((kind, m), [float("nan")])) for m in ("offline", "fixed", "triton")}
        print(f"{kind:10} {med['offline']:12.3f} {med['fixed']:10.3f} {med['triton']:11.3f} "
              f"{med['offline'] / med['fixed']:6.2f} {med['triton'] / med['offline']:6.1f}")


if __name__ == "__main__":
    main()
