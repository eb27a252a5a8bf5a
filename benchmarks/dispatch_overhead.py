"""Host-side cost of a tuned kernel's hot path on a cache hit, no GPU needed, side by side with
`triton.autotune` on the same stub launcher in the same run (the anchor's method).

    python benchmarks/dispatch_overhead.py
"""
import os
import time

os.environ.setdefault("FLYTUNE_DEVICE", "interpreter")  # the stub launches nothing: no device needed

import torch
import triton
from triton import Config as TritonConfig
from triton.runtime.autotuner import Autotuner

import flytune_build as ft
from flytune_build import Config


def _body(x, w, y, N, stride, eps, BLOCK):
    pass


class StubLauncher:
    fn = staticmethod(_body)
    __name__ = "stub"
    arg_names = ["x", "w", "y", "N", "stride", "eps", "BLOCK"]

    def run(self, *args, **kwargs):
        return None


def timed(fn, n):
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def adopted_stub(stub, blocks, x):
    """A second triton.autotune over the stub, adopted: its hit is served by a seeded artifact."""
    import tempfile

    from flytune_build.core.artifact import Artifact
    from flytune_build.runtime import device
    from flytune_build.triton import adopt

    d = tempfile.mkdtemp()
    dtype = str(x.dtype).removeprefix("torch.")
    Artifact("bench.adopted", {"N": 8, "x": dtype, "w": dtype, "y": dtype}, device.current(),  # this machine's
             Config({"BLOCK": 512})).save(d)
    os.environ["FLYTUNE_ARTIFACT_DIR"] = d
    from flytune_build.core import settings
    from flytune_build.runtime.serving.offline import TIER

    settings.reload()  # the settings are read once per process: the first kernel's registration already did
    TIER.reset()
    tuner = Autotuner(stub, stub.arg_names, [TritonConfig({"BLOCK": b}, num_warps=w) for b, w in blocks],
                      key=["N"], reset_to_zero=None, restore_value=None)
    assert adopt(tuner, name="bench.adopted") == 1
    return tuner


def adopted_floor(adopted, stub):
    """The least an adopted hit can do: look the call up under a key as fine as Triton's (its key
    arguments and every tensor's dtype; a key function called, as the ported hit calls its own) and
    launch with the keywords an adopted hit passes (`warmup`, then `hits.launch_keywords`: the config's
    own and its compiler options but a `num_ctas` of 1); no `best_config`, hook, count or cache check."""
    hits = adopted.flytune_adopted.hits
    memo = {k: e[1] for k, e in hits.memo.items()}
    key, launch = hits.key.positional[0], stub.run

    def floor(*args, grid, warmup=None, **kwargs):
        return launch(*args, grid=grid, **memo[key(args)])
    return floor


def first_calls(stub, blocks, args, x, kernels=200):
    """The first call of a key a warm-up put into a fresh adopted Autotuner's cache (`Adopted.prime_key`),
    against Triton's first call of a key its fresh Autotuner's cache holds: the median over `kernels`
    fresh kernels each (one call each: the host's first pass through the call is in it)."""
    import statistics

    from flytune_build.triton import adopt

    dtype = str(x.dtype).removeprefix("torch.")
    key = {"N": 8, "x": dtype, "w": dtype, "y": dtype}
    out = {"adopted": [], "triton": []}
    for _ in range(kernels):
        ours = Autotuner(stub, stub.arg_names, [TritonConfig({"BLOCK": b}, num_warps=w) for b, w in blocks],
                         key=["N"], reset_to_zero=None, restore_value=None)
        adopt(ours, name="bench.adopted")
        assert ours.flytune_adopted.prime_key(key) is not None
        theirs = Autotuner(stub, stub.arg_names, [TritonConfig({"BLOCK": b}, num_warps=w) for b, w in blocks],
                           key=["N"], reset_to_zero=None, restore_value=None)
        theirs.cache[(8, str(x.dtype), str(x.dtype), str(x.dtype))] = theirs.configs[3]
        for name, tuner in (("adopted", ours), ("triton", theirs)):
            t = time.perf_counter()
            tuner.run(*args, grid=(4,), warmup=False)
            out[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) * 1e6 for k, v in out.items()}


def evicted_calls(calls: dict, rounds=31):
    """Each decided hit once right after 256 MiB copied on the host (its caches flushed by other work, more
    than any host's last-level cache), and once more just after: the median over `rounds`, in us. What a
    steady call costs cold is the yardstick for what a first call costs."""
    import statistics

    big, src = bytearray(256 << 20), bytes(range(256)) * (1 << 20)
    out = {name: ([], []) for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            big[:] = src
            t = time.perf_counter_ns()
            call()
            t2 = time.perf_counter_ns()
            call()
            out[name][0].append((t2 - t) / 1e3)
            out[name][1].append((time.perf_counter_ns() - t2) / 1e3)
    return {name: (statistics.median(a), statistics.median(b)) for name, (a, b) in out.items()}


def main(n=100_000, rounds=9):
    stub = StubLauncher()
    blocks = [(b, w) for b in (256, 512, 1024) for w in (2, 4, 8)]
    tuner = Autotuner(stub, stub.arg_names, [TritonConfig({"BLOCK": b}, num_warps=w) for b, w in blocks],
                      key=["N"], reset_to_zero=None, restore_value=None)
    ours = ft.autotune([Config({"BLOCK": b}, num_warps=w) for b, w in blocks], key=["x", "N"],
                       default=lambda a: Config({"BLOCK": 512}), name="bench.stub")(stub)
    # the same port keyed on what Triton keys this stub's cache on: N and every tensor's dtype
    keyed = ft.autotune([Config({"BLOCK": b}, num_warps=w) for b, w in blocks], key=["x", "w", "y", "N"],
                        default=lambda a: Config({"BLOCK": 512}), name="bench.stub_keyed")(stub)
    x, w, y = torch.empty(4, 8), torch.empty(8), torch.empty(4, 8)
    args = (x, w, y, 8, 8, 1e-6)
    tuner.cache[(8, str(x.dtype), str(w.dtype), str(y.dtype))] = tuner.configs[3]
    grid = (4,)
    tuner.run(*args, grid=grid, warmup=False)
    adopted = adopted_stub(stub, blocks, x)
    adopted.run(*args, grid=grid, warmup=False)
    assert ft.stats()["bench.adopted"]["calls"]["offline"] == 1
    launch = ours[grid]
    launch(*args)  # first call decides (heuristic tier); later calls are hits
    keyed[grid](*args)
    full = dict(BLOCK=512, num_warps=4, num_stages=3, num_ctas=1, warmup=False)  # what a hit passes
    floor = adopted_floor(adopted, stub)
    named = dict(zip(stub.arg_names, args))   # every argument by keyword, as fla's and flash-attn's calls pass them
    adopted.run(grid=grid, warmup=False, **named)
    res = {"triton": [], "adopted": [], "flytune": [], "keyed": [], "bare": [], "bare_full": [], "floor": [],
           "triton_kw": [], "adopted_kw": []}
    for _ in range(rounds):
        # as `kernel[grid](...)` calls a triton.autotune's run (a ported kernel's launch passes the grid only)
        res["triton"].append(timed(lambda: tuner.run(*args, grid=grid, warmup=False), n))
        res["adopted"].append(timed(lambda: adopted.run(*args, grid=grid, warmup=False), n))
        res["flytune"].append(timed(lambda: ours.run(*args, grid=grid), n))
        res["keyed"].append(timed(lambda: keyed.run(*args, grid=grid), n))
        res["bare"].append(timed(lambda: stub.run(*args, grid=grid, BLOCK=512, num_warps=4), n))
        res["bare_full"].append(timed(lambda: stub.run(*args, grid=grid, **full), n))
        res["floor"].append(timed(lambda: floor(*args, grid=grid, warmup=False), n))
        res["triton_kw"].append(timed(lambda: tuner.run(grid=grid, warmup=False, **named), n))
        res["adopted_kw"].append(timed(lambda: adopted.run(grid=grid, warmup=False, **named), n))
    med = {k: min(v) * 1e6 for k, v in res.items()}  # the least-disturbed round: the machine is shared
    print(f"triton {triton.__version__}, torch {torch.__version__}; best of {rounds} interleaved rounds x {n} calls")
    print(f"  bare launcher          {med['bare']:.3f} us/call")
    print(f"  triton.autotune hit    {med['triton']:.3f} us/call  overhead {med['triton'] - med['bare']:.3f} us")
    print(f"  adopted triton hit     {med['adopted']:.3f} us/call  overhead {med['adopted'] - med['bare']:.3f} us "
          f"({med['adopted'] - med['flytune']:+.3f} us against a ported hit; triton.autotune's own hit is "
          f"{med['triton'] / med['adopted']:.1f}x it, {(med['triton'] - med['bare']) / (med['adopted'] - med['bare']):.1f}x "
          f"its overhead)")
    print(f"  flytune_build hit      {med['flytune']:.3f} us/call  overhead {med['flytune'] - med['bare']:.3f} us")
    print(f"  flytune_build hit keyed as Triton keys (x, w, y dtypes and N)  {med['keyed']:.3f} us/call: the "
          f"adopted hit is {med['adopted'] - med['keyed']:+.3f} us over it")
    print(f"  overhead ratio triton/flytune: {(med['triton'] - med['bare']) / (med['flytune'] - med['bare']):.1f}x")
    print(f"  every argument by keyword: adopted hit {med['adopted_kw']:.3f} us/call, triton.autotune hit "
          f"{med['triton_kw']:.3f} us/call ({med['triton_kw'] / med['adopted_kw']:.1f}x)")
    first = first_calls(stub, blocks, args, x)
    print(f"  first call of a key in a fresh Autotuner's cache (median of 200 fresh kernels): adopted, put "
          f"there by a warm-up {first['adopted']:.2f} us; triton.autotune {first['triton']:.2f} us")
    cold = evicted_calls({"adopted": lambda: adopted.run(*args, grid=grid, warmup=False),
                          "triton": lambda: tuner.run(*args, grid=grid, warmup=False),
                          "flytune": lambda: ours.run(*args, grid=grid)})
    print("  a decided hit right after the host's caches were flushed (256 MiB copied), then the call after it "
          "(median of 31): " + "; ".join(f"{k} {a:.1f} us, then {b:.1f} us" for k, (a, b) in cold.items()))
    print(f"  bare launcher, full config kwargs  {med['bare_full']:.3f} us/call: flytune adds "
          f"{med['flytune'] - med['bare_full']:.3f} us over launching the same config by hand")
    print(f"  an adopted hit's floor (Triton's key looked up, its launch keywords passed, nothing else) "
          f"{med['floor']:.3f} us/call: {med['floor'] - med['flytune']:+.3f} us against the ported hit; the "
          f"adopted hit is {med['adopted'] - med['floor']:+.3f} us over it")


if __name__ == "__main__":
    main()
