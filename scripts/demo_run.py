"""Run the installed sample_pkg's kernels on tuned and untuned shapes; print which tier served each call.

Tuned shapes come from the plan that produced this device's artifacts (sample_pkg/tune/*.toml).
Exits non-zero if a result differs from torch, or a tuned shape was not served by the offline tier.
"""
import sys
from pathlib import Path

import tomllib
import torch

import flytune_build as ft
import sample_pkg
from flytune_build.runtime import device

ROOT = Path(__file__).resolve().parent.parent
dev = device.current()
plan = "interpreter.toml" if dev.backend == "interpreter" else "h200.toml"
where = "cpu" if dev.backend == "interpreter" else "cuda"
entries = tomllib.loads((ROOT / "sample_pkg" / "tune" / plan).read_text())["entries"]
UNTUNED = {"sample_pkg.rmsnorm": {"M": 3, "N": 200}, "sample_pkg.softmax": {"M": 5, "N": 300},
           "sample_pkg.matmul": {"M": 48, "N": 40, "K": 24}}


def run(kernel, M, N, K=None):
    g = torch.Generator().manual_seed(M * 131 + N)
    if kernel == "sample_pkg.rmsnorm":
        x = torch.randn(M, N, generator=g).to(where, torch.float16)
        w = torch.randn(N, generator=g).to(where, torch.float16)
        y = sample_pkg.rmsnorm(x, w)
        ref = x.float() * torch.rsqrt((x.float() ** 2).mean(-1, keepdim=True) + 1e-6) * w.float()
        return torch.allclose(y.float(), ref, atol=2e-2, rtol=2e-2)
    if kernel == "sample_pkg.softmax":
        x = torch.randn(M, N, generator=g).to(where, torch.float16)
        return torch.allclose(sample_pkg.softmax(x).float(), torch.softmax(x.float(), -1), atol=2e-3, rtol=1e-2)
    a = torch.randn(M, K, generator=g).to(where, torch.float16)
    b = torch.randn(K, N, generator=g).to(where, torch.float16)
    return torch.allclose(sample_pkg.matmul(a, b).float(), a.float() @ b.float(), atol=5e-2 * K ** 0.5, rtol=1e-2)


def served(kernel, before):
    after = ft.stats()[kernel]
    prev = before.get(kernel, {"calls": {}, "offline_levels": {}})
    tier = next(t for t, n in after["calls"].items() if n != prev["calls"].get(t, 0))
    level = next((lv for lv, n in after["offline_levels"].items() if n != prev["offline_levels"].get(lv, 0)), "-")
    return tier, level


print(f"device: {dev}  (python {sys.version.split()[0]}, torch {torch.__version__})")
print(f"{'kernel':20} {'shape':24} {'planned':8} {'tier':10} {'level':10} result")
bad = 0
for e in entries:
    cases = [(s, True) for s in e["shapes"]] + [(UNTUNED[e["kernel"]], False)]
    for shape, planned in cases:
        if dev.backend != "interpreter" and not planned:
            shape = {k: v * 3 + 8 for k, v in shape.items()}
        before = ft.stats()
        ok = run(e["kernel"], **shape)
        tier, level = served(e["kernel"], before)
        good = ok and (tier == "offline") == planned
        bad += not good
        print(f"{e['kernel']:20} {str(shape):24} {'yes' if planned else 'no':8} {tier:10} {level:10} "
              f"{'matches torch' if ok else 'MISMATCH'}{'' if good else '  <-- unexpected'}")
searches = sum(s["searches"] for s in ft.stats().values())
print(f"searches: {searches}")
sys.exit(1 if bad or searches else 0)
