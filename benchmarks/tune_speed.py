"""Wall time to tune a plan: `flytune tune` (concurrent precompile) against a sequential
triton.autotune-style search of the same plan, same configs, both with a cold Triton cache, one run.

Run on the target GPU from the repo root:  python benchmarks/tune_speed.py sample_pkg tune/h200.toml OUTDIR
OUTDIR receives the artifacts `flytune tune` writes.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

SEQUENTIAL = r"""
import sys, time, tomllib, importlib, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[3])
import _triton_swap; _triton_swap.swap()
plan = tomllib.loads(open(sys.argv[2]).read())["entries"]
for e in plan:
    mod, fn = e["setup"].split(":")
    setup = getattr(importlib.import_module(mod), fn)
    for shape in e["shapes"]:
        setup(**shape)(); torch.cuda.synchronize()
"""


def main():
    project, plan, out = sys.argv[1], sys.argv[2], sys.argv[3]
    here = os.path.dirname(os.path.abspath(__file__))
    base = dict(os.environ, FLYTUNE_AUTOTUNE="0")
    env = dict(base, TRITON_CACHE_DIR=tempfile.mkdtemp(), FLYTUNE_CACHE_DIR=tempfile.mkdtemp())
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "flytune_build.cli", "tune", "--project", project, "--plan",
                        os.path.join(project, plan), "--output", out, "--no-resume", "--no-progress"], env=env,
                       capture_output=True, text=True)
    ours = time.perf_counter() - t
    print(p.stdout[-6000:], p.stderr[-3000:], flush=True)
    if p.returncode:
        raise SystemExit(p.returncode)
    script = os.path.join(tempfile.mkdtemp(), "sequential.py")
    with open(script, "w") as f:
        f.write(SEQUENTIAL)
    env = dict(base, TRITON_CACHE_DIR=tempfile.mkdtemp())
    t = time.perf_counter()
    p = subprocess.run([sys.executable, script, project, os.path.join(project, plan), here], env=env,
                       capture_output=True, text=True)
    seq = time.perf_counter() - t
    if p.returncode:
        print(p.stderr[-3000:])
        raise SystemExit(p.returncode)
    print(json.dumps({"flytune_tune_s": round(ours, 2), "sequential_triton_autotune_s": round(seq, 2),
                      "ratio": round(ours / seq, 3)}))


if __name__ == "__main__":
    main()
