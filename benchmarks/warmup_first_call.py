"""First calls with and without `flytune warmup`, each in a fresh process, over every shape of a tuning plan.

Run by benchmarks/h200_warmup.sh with the python of a venv holding flytune-build and the sample wheel:

  (a) cold      empty TRITON_CACHE_DIR per shape: the first call compiles the kernel, its launcher and
                Triton's driver utilities
  (b) warmup    `flytune warmup sample-pkg` into one empty TRITON_CACHE_DIR W (wall time of the command)
  (c) warmed    each shape's first call with W
  (d) warm      each shape's first call with the cache its own (a) process filled
  (e) triton    stock triton.autotune over the same configs, empty cache per shape
  (f) shipped   W copied elsewhere (group files rewritten): what shipping Triton's cache would give
  (g) kernels   (f) without the launcher/driver modules (the part a wheel could ship portably)

(a), (c), (d) cover every shape; (e), (f), (g) each kernel's largest (a fresh process costs several
seconds there). `process_start_s` is a process that only imports torch, triton and the package and
initialises CUDA: the floor under (b)'s wall time.
Goals: (b) <= 25% of the sum of (a); sum of (c) within 1.1x of the sum of (d); (c) adds no cache entry.
Writes warmup.json (everything), warmup.csv (one row per shape) and warmup_report.json (the warm-up's
own report) into --out, and prints a summary.
"""
import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile

CHILD = r"""
import json, os, sys, time
mode, kind, shape = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
import torch
import flytune_build as ft
from sample_pkg import tuning
cuda = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
if mode == "triton":
    sys.path.insert(0, sys.argv[4]); import _triton_swap; _triton_swap.swap()
    if not cuda:  # the interpreter has no benchmarker: time one call (validates the plumbing only)
        from sample_pkg import kernels
        def bench(fn, quantiles=None):
            t = time.perf_counter(); fn(); ms = (time.perf_counter() - t) * 1e3
            return [ms] * len(quantiles) if quantiles else ms
        for name in ("rmsnorm_kernel", "softmax_kernel", "matmul_kernel"):
            getattr(kernels, name).do_bench = bench
sync = torch.cuda.synchronize if cuda else (lambda: None)
if cuda:
    torch.cuda.init()
call = getattr(tuning, kind)(**shape)
sync()
t = time.perf_counter(); call(); sync(); first = time.perf_counter() - t
served = sorted(tier for s in ft.stats().values() for tier, n in s["calls"].items() if n)
print(json.dumps({"first_call_s": round(first, 4), "served": served}))
"""


def run_child(script, mode, kind, shape, cache, bench_dir):
    env = dict(os.environ, TRITON_CACHE_DIR=cache, FLYTUNE_CACHE_DIR=tempfile.mkdtemp(), FLYTUNE_AUTOTUNE="0")
    p = subprocess.run([sys.executable, script, mode, kind, json.dumps(shape), bench_dir], env=env,
                       capture_output=True, text=True)
    if p.returncode:
        return {"error": p.stderr[-600:]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def entries(cache):
    return sorted(e for e in os.listdir(cache) if os.path.isdir(os.path.join(cache, e)))


def is_module(cache, entry):
    """A launcher or driver-utilities entry (a host C module) rather than a compiled kernel."""
    return any(f.endswith(".so") for f in os.listdir(os.path.join(cache, entry)))


def copy_cache(src, dst, kernels_only=False):
    """Copy Triton's cache `src` to `dst`, rewriting the absolute paths its group files hold."""
    os.makedirs(dst)
    for e in entries(src):
        if kernels_only and is_module(src, e):
            continue
        shutil.copytree(os.path.join(src, e), os.path.join(dst, e), ignore=shutil.ignore_patterns("tmp.*", "lock"))
        for name in os.listdir(os.path.join(dst, e)):
            if name.startswith("__grp__"):
                path = os.path.join(dst, e, name)
                with open(path) as f:
                    group = json.load(f)
                group["child_paths"] = {k: v.replace(src, dst, 1) for k, v in group["child_paths"].items()}
                with open(path, "w") as f:
                    json.dump(group, f)


def sizes(cache):
    """Bytes of the cache's kernel entries and module entries, and the kernel entries zip-deflated."""
    out = {"kernel_bytes": 0, "module_bytes": 0, "kernel_entries": 0, "module_entries": 0}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for e in entries(cache):
            kind = "module" if is_module(cache, e) else "kernel"
            out[f"{kind}_entries"] += 1
            for name in os.listdir(os.path.join(cache, e)):
                path = os.path.join(cache, e, name)
                if os.path.isfile(path) and name != "lock":
                    out[f"{kind}_bytes"] += os.path.getsize(path)
                    if kind == "kernel":
                        zf.write(path, f"{e}/{name}")
    out["kernel_zip_bytes"] = len(buf.getvalue())
    return out


def measure(args, shapes, script, bench_dir, rows, extra, save):
    def each(label, mode, cache_of, only=None):
        for i, (kind, shape) in enumerate(shapes):
            if only is not None and i not in only:
                continue
            r = run_child(script, mode, kind, shape, cache_of(i), bench_dir)
            rows[i][label] = r.get("first_call_s")
            rows[i][label + "_served"] = r.get("served", r.get("error"))
            print(json.dumps({"mode": label, "kernel": kind, "shape": shape, **r}), flush=True)
        save()  # after each mode: a run stopped early keeps what it measured

    cold = [tempfile.mkdtemp(dir=args.work) for _ in shapes]
    each("a_cold", "flytune", cold.__getitem__)
    each("d_warm", "flytune", cold.__getitem__)
    t = time.perf_counter()  # what any process pays before its first call: the floor under (b)
    bare = "import torch, triton, sample_pkg, flytune_build.cli.main; torch.cuda.init()"
    subprocess.run([sys.executable, "-c", bare],
                   env=dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(dir=args.work)), capture_output=True)
    extra["process_start_s"] = round(time.perf_counter() - t, 3)
    warmed = tempfile.mkdtemp(dir=args.work)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "flytune_build.cli", "warmup", "sample-pkg", "--json"],
                       env=dict(os.environ, TRITON_CACHE_DIR=warmed, FLYTUNE_CACHE_DIR=tempfile.mkdtemp()),
                       capture_output=True, text=True)
    warmup_s = time.perf_counter() - t
    print(p.stderr[-3000:], flush=True)
    report = json.loads(p.stdout) if p.stdout.strip().startswith("{") else {"error": p.stdout[-3000:]}
    with open(os.path.join(args.out, "warmup_report.json"), "w") as f:
        json.dump(report, f, indent=1)
    shipped, kernels_only = os.path.join(args.work, "shipped"), os.path.join(args.work, "kernels-only")
    copy_cache(warmed, shipped)
    copy_cache(warmed, kernels_only, kernels_only=True)
    extra.update({"b_warmup_s": round(warmup_s, 3), "warmup_rc": p.returncode, "warmup_internal_s":
                  report.get("seconds"), "warmup_counts": report.get("counts"), "cache": sizes(warmed)})
    before = entries(warmed)
    extra["entries_added_by_c"] = []
    each("c_warmed", "flytune", lambda i: warmed)
    extra["entries_added_by_c"] = sorted(set(entries(warmed)) - set(before))
    # a fresh process costs ~7 s on the H200 machine: (f), (g), (e) take each kernel's largest shape
    largest = {kind: i for i, (kind, _) in enumerate(shapes)}
    extra["subset"] = [shapes[i] for i in sorted(largest.values())]
    each("f_shipped", "flytune", lambda i: shipped, set(largest.values()))
    each("g_kernels_shipped", "flytune", lambda i: kernels_only, set(largest.values()))
    each("e_triton", "triton", lambda i: tempfile.mkdtemp(dir=args.work), set(largest.values()))


def summarize(rows, extra):
    def total(col, among=None):
        vals = [r.get(col) for r in rows.values() if among is None or r.get(among) is not None]
        return round(sum(vals), 3) if vals and all(isinstance(v, (int, float)) for v in vals) else None

    sums = {col: total(col) for col in ("a_cold", "c_warmed", "d_warm")}
    subset = {col: total(col, "e_triton") for col in ("a_cold", "c_warmed", "d_warm", "f_shipped",
                                                       "g_kernels_shipped", "e_triton")}
    s = {"sums_s": sums, "subset_sums_s": subset, **extra}
    if sums["a_cold"] and "b_warmup_s" in extra:
        s["b_over_sum_a"] = round(extra["b_warmup_s"] / sums["a_cold"], 3)
        s["goal_b_le_25pct_of_a"] = s["b_over_sum_a"] <= 0.25
    if sums["c_warmed"] and sums["d_warm"]:
        s["sum_c_over_sum_d"] = round(sums["c_warmed"] / sums["d_warm"], 3)
        s["goal_c_within_1_1x_of_d"] = s["sum_c_over_sum_d"] <= 1.1
        s["goal_c_adds_no_cache_entry"] = not extra["entries_added_by_c"]
    for col in ("f_shipped", "g_kernels_shipped", "e_triton"):  # over the subset they were measured on
        among = total("c_warmed", col)
        if total(col) and among:
            s[f"subset_{col}_over_c_warmed"] = round(total(col) / among, 3)
    s["all_flytune_calls_offline"] = all(r.get(c + "_served") in (None, ["offline"]) for r in rows.values()
                                         for c in ("a_cold", "c_warmed", "d_warm", "f_shipped", "g_kernels_shipped"))
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    args.work = args.work or tempfile.mkdtemp()
    with open(args.plan, "rb") as f:
        plan = tomllib.load(f)["entries"]
    shapes = [(e["kernel"].rsplit(".", 1)[1], s) for e in plan for s in e["shapes"]]
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(args.work, "first_call_child.py")
    with open(script, "w") as f:
        f.write(CHILD)
    rows = {i: {"kernel": k, "shape": s} for i, (k, s) in enumerate(shapes)}
    extra = {}

    def save():
        summary = summarize(rows, extra)
        with open(os.path.join(args.out, "warmup.json"), "w") as f:
            json.dump({"summary": summary, "shapes": list(rows.values())}, f, indent=1)
        cols = ["kernel", "shape", "a_cold", "c_warmed", "d_warm", "f_shipped", "g_kernels_shipped", "e_triton"]
        with open(os.path.join(args.out, "warmup.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(cols)
            for r in rows.values():
                w.writerow([json.dumps(r[c]) if c == "shape" else r.get(c) for c in cols])
        return summary

    measure(args, shapes, script, bench_dir, rows, extra, save)
    print(json.dumps(save(), indent=1))


if __name__ == "__main__":
    main()
