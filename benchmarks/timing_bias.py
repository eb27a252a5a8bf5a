"""Where a few-microsecond kernel's time moves between cold tuning runs: with the inputs' placement in
device memory, with the process, or with nothing (repeat noise).

  python benchmarks/timing_bias.py OUT.json [--placements 8] [--rep-ms 10]

For each probed shape of the sample's rmsnorm and softmax, every declared config is timed in CUDA
graphs (`triton.testing.do_bench_cudagraph`, as a search times kernels under 50 us) on the same input
values held at `--placements` different device addresses (a pad allocation of a few KiB, a multiple of
1 KiB, shifts them; Triton's 16-byte pointer specialisation is unchanged), placement 0 timed again at the
end. Run it in several processes and compare placement 0 across them (`summarize OUT1.json OUT2.json ..`):
  spread across placements (one process) vs spread of placement 0 across processes vs repeat noise.
"""
import json
import statistics
import sys

PROBES = [("rmsnorm", 256, 1024), ("rmsnorm", 256, 4096), ("softmax", 256, 4096), ("softmax", 256, 1024)]


def probe(out: str, placements: int = 8, rep_ms: float = 10.0) -> None:
    import torch
    from triton.testing import do_bench_cudagraph

    sys.path.insert(0, "sample_pkg")
    from sample_pkg import kernels

    def inputs(kind, M, N, pad_kib):
        keep = [torch.empty(pad_kib * 1024 + 1024, dtype=torch.uint8, device="cuda")]  # shifts what follows
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(M, N, generator=gen).to("cuda", torch.float16)
        w = torch.randn(N, generator=gen).to("cuda", torch.float16)
        y = torch.empty_like(x)
        return keep, x, w, y

    def call(kind, cfg, M, N, x, w, y):
        opts = dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if kind == "rmsnorm":
            return lambda: kernels.rmsnorm_kernel.fn[(M,)](x, w, y, M, N, x.stride(0), 1e-6, **opts)
        return lambda: kernels.softmax_kernel.fn[(M,)](x, y, M, N, x.stride(0), **opts)

    results = []
    held = []
    for kind, M, N in PROBES:
        configs = kernels.RMSNORM_CONFIGS if kind == "rmsnorm" else kernels.SOFTMAX_CONFIGS
        pads = [0] + [37 * p % 509 + 3 * p for p in range(1, placements)] + [0]  # placement 0 again last
        sets = []
        for pad in pads[:-1]:
            keep, x, w, y = inputs(kind, M, N, pad)
            held.append(keep)
            sets.append((pad, x, w, y))
        sets.append(sets[0])
        for cfg in configs:
            call(kind, cfg, M, N, *sets[0][1:])()   # compile
        torch.cuda.synchronize()
        times = {str(cfg): [] for cfg in configs}
        addrs = []
        for pad, x, w, y in sets:
            addrs.append([x.data_ptr() % (1 << 21), w.data_ptr() % (1 << 21), y.data_ptr() % (1 << 21)])
            for cfg in configs:
                times[str(cfg)].append(float(do_bench_cudagraph(call(kind, cfg, M, N, x, w, y), rep=rep_ms,
                                                                return_mode="median")))
        results.append({"kind": kind, "M": M, "N": N, "pads_kib": pads, "addr_mod_2mib": addrs, "times_ms": times})
        print(kind, M, N, flush=True)
    json.dump(results, open(out, "w"), indent=1)


def summarize(paths) -> None:
    runs = [json.load(open(p)) for p in paths]
    for i, shape in enumerate(runs[0]):
        print(f"== {shape['kind']} M={shape['M']} N={shape['N']}")
        print(f"{'config':60s} {'placement spread':>17s} {'process spread':>15s} {'repeat noise':>13s}  fastest-placement/config rank per process")
        for cfg in shape["times_ms"]:
            per_run = [r[i]["times_ms"][cfg] for r in runs]
            place = statistics.median(max(t[:-1]) / min(t[:-1]) - 1 for t in per_run)
            p0 = [t[0] for t in per_run]
            proc = max(p0) / min(p0) - 1
            rep = statistics.median(abs(t[-1] / t[0] - 1) for t in per_run)
            print(f"{cfg:60s} {place:>16.1%} {proc:>15.1%} {rep:>13.1%}")
        for j, r in enumerate(runs):
            t = r[i]["times_ms"]
            best0 = min(t, key=lambda c: t[c][0])
            bestmed = min(t, key=lambda c: statistics.median(t[c][:-1]))
            print(f"  process {j}: fastest at placement 0: {best0}; fastest by median over placements: {bestmed}")


if __name__ == "__main__":
    if sys.argv[1] == "summarize":
        summarize(sys.argv[2:])
    else:
        args = sys.argv[2:]
        kw = {}
        if "--placements" in args:
            kw["placements"] = int(args[args.index("--placements") + 1])
        if "--rep-ms" in args:
            kw["rep_ms"] = float(args[args.index("--rep-ms") + 1])
        probe(sys.argv[1], **kw)
