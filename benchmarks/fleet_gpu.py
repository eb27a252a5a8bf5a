"""A tuning fleet on real GPUs: one worker per visible GPU, one job that faults the GPU.

The plan tunes a vector add at a few sizes (measured ranking) and holds one job whose kernel stores
far outside any allocation: an illegal memory access, which leaves the CUDA context broken. That
job must fail alone (its worker replaced, the job retried once), every other job must be tuned, and
each artifact must carry the device its own worker measured.

    python benchmarks/fleet_gpu.py [--workers N]      # on the GPU machine, repo root
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

KERNELS = '''
import torch, triton
import triton.language as tl
import flytune_build as ft
from flytune_build import Config

@ft.autotune([Config({"BLOCK": b}, num_warps=w) for b in (256, 512, 1024, 2048) for w in (2, 4, 8)], ["x", "n"],
             name="fleetgpu.add")
@triton.jit
def add_kernel(x, y, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

@triton.jit
def poke(x, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK).to(tl.int64) + (1 << 40)   # a terabyte past the allocation
    tl.store(x + offs, tl.zeros([BLOCK], tl.float32))

def add(n):
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    return lambda: add_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, out, n)

def fault(n):
    x = torch.zeros(n, device="cuda")
    return lambda: poke[(1,)](x, BLOCK=16)
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int)
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-gpu-"))
    (tmp / "fleetgpu").mkdir()
    (tmp / "fleetgpu" / "__init__.py").write_text(KERNELS)
    sizes = ", ".join(f"{{ n = {1 << k} }}" for k in (16, 18, 20, 22, 24, 26))
    (tmp / "pyproject.toml").write_text(textwrap.dedent(f'''
        [tool.flytune]
        sources = ["artifacts"]
        targets = ["sm_90"]

        [tool.flytune.tune]
        output = "artifacts/{{device}}"
        entries = [
          {{ kernel = "fleetgpu.add", setup = "fleetgpu:add", shapes = [{sizes}] }},
          {{ kernel = "fleetgpu.fault", setup = "fleetgpu:fault", shapes = [{{ n = 16 }}] }},
        ]
        '''))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "flytune_build.cli", "tune", "--project", str(tmp), "--executor", "local",
           "--job-timeout", "300", "--allow-ci", "--no-progress"]
    if args.workers:
        cmd += ["--workers", str(args.workers)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, timeout=1200)
    print(r.stdout)
    print(r.stderr[-4000:], file=sys.stderr)
    print(f"exit {r.returncode}")
    for path in sorted((tmp / "artifacts").rglob("*.json")):
        doc = json.loads(path.read_bytes())
        print(path.relative_to(tmp), doc["key"], doc["device"]["name"], doc["provenance"]["worker"],
              doc["provenance"]["host"])
    return r.returncode


if __name__ == "__main__":
    raise SystemExit(main())
