#!/usr/bin/env python3
"""Inductor compiles with and without shipped winners, on one GPU: autotune seconds, configs, bytes.

    python benchmarks/inductor_compile.py --out OUT [--phases tc,aoti,ma] [--small]

(--small: a tiny block, to check the script itself on a CPU, where Inductor autotunes nothing.)

Per phase (tc: torch.compile mode=default; aoti: AOTInductor; ma: max-autotune-no-cudagraphs, with
GEMM templates) the model of `examples/compiled_model` is compiled, each step in a fresh process whose
Inductor and Triton caches are empty and at the same paths:

  A, B   cold compiles without flytune (what a user gets today; how many kernels B chose differently);
         A saves Inductor's own cache artifacts (`torch.compiler.save_cache_artifacts()`)
  C      a compile in empty cache directories that first loads A's cache artifacts
         (`torch.compiler.load_cache_artifacts`): "why not copy Inductor's caches?"; C2 the same with
         the cache directories at another path
  H      `flytune_build.harvest(...)`: every autotuned kernel recorded, chosen by flytune's selection
  S1, S2 cold compiles under `flytune_build.inductor.serve()` with H's artifacts (FLYTUNE_ARTIFACT_DIR),
         or, with --installed, with the installed wheel's bundle (--shipped: its artifact directory)

--entry MODULE:FUNCTION picks the model (default compiled_model:block; compiled_model:mlp is an MLP of
three matmul shapes). Every compile step's output is compared with the eager model's (`max_abs_err`,
`eager_close`: within rtol=atol=2e-2 in bfloat16), and S1 and S2 with each other (same GEMM templates,
same kernel configs).

Per step: autotune seconds (the time inside CachingAutotuner.benchmark_all_configs and
coordinate_descent_tuning; GEMM template selection separately: `gemm_s`, the time in select_algorithm,
`gemm_autotune_s` and `gemm_selects`, the time in and number of its benchmarking runs, `do_autotuning`,
and `gemm_benchmarks`, of its benchmark calls), each generated kernel's chosen config by lookup hash,
each GEMM select's chosen template, the flytune serving counts, and for aoti the .pt2 file's sha256.
Then: kernels B chose differently from A, kernels of S1/S2 whose config differs from the shipped one,
autotune seconds of S against A, whether S benchmarked any GEMM choice, and whether S1 and S2 (and A
and B) gave byte-identical .pt2 files. Writes OUT/summary.json and OUT/table.txt. Needs a GPU (CPU
Inductor does no autotuning).

    --timeouts H=200,S1=100   a step's own time limit (default: --timeout)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY = os.environ.get("INDUCTOR_BENCH_ENTRY", "compiled_model:block")
MODES = {"tc": "default", "aoti": "aoti", "ma": "max-autotune-no-cudagraphs"}


def step(args) -> dict:
    """One compile in this (fresh) process; returns its record."""
    if not os.environ.get("INDUCTOR_BENCH_INSTALLED"):
        sys.path[:0] = [str(ROOT), str(ROOT / "examples" / "compiled_model")]
    import torch
    from torch._inductor.runtime import triton_heuristics as th

    timers = {"autotune_s": 0.0, "gemm_s": 0.0, "gemm_autotune_s": 0.0, "gemm_benchmark_s": 0.0}
    counts = {"gemm_selects": 0, "gemm_benchmarks": 0}
    seen = []
    selected = []

    def timed(owner, name, slot, count=None, result=None):
        original = getattr(owner, name, None)
        if original is None:
            return

        def wrapper(self, *a, **k):
            t = time.perf_counter()
            if count:
                counts[count] += 1
            try:
                out = original(self, *a, **k)
                if result:
                    result(a, out)
                return out
            finally:
                timers[slot] += time.perf_counter() - t
        setattr(owner, name, wrapper)

    def chosen_template(args, out):  # select_algorithm's answer: (node, the choice), None while deferred
        choice = out[1] if isinstance(out, tuple) and len(out) == 2 else None
        ktc = (getattr(choice, "annotations", None) or {}).get("ktc")
        selected.append({"name": str(args[0]) if args else None, "choices": len(args[1]) if len(args) > 1 else None,
                         "template": getattr(getattr(ktc, "template", None), "uid", None),
                         "choice": str(getattr(choice, "name", None))})

    benchmarked = []  # the kernels Inductor benchmarked in this step, by name
    original_bench = th.CachingAutotuner.benchmark_all_configs

    def bench_all(self, *a, **k):
        benchmarked.append(str(self.inductor_meta.get("kernel_name")))
        return original_bench(self, *a, **k)
    th.CachingAutotuner.benchmark_all_configs = bench_all
    timed(th.CachingAutotuner, "benchmark_all_configs", "autotune_s")
    timed(th.CachingAutotuner, "coordinate_descent_tuning", "autotune_s")
    try:
        from torch._inductor.select_algorithm import AlgorithmSelectorCache
        timed(AlgorithmSelectorCache, "__call__", "gemm_s", result=chosen_template)
        timed(AlgorithmSelectorCache, "do_autotuning", "gemm_autotune_s", count="gemm_selects")
        timed(AlgorithmSelectorCache, "benchmark", "gemm_benchmark_s", count="gemm_benchmarks")
    except ImportError:
        pass
    original_precompile = th.CachingAutotuner.precompile

    def precompile(self, *a, **k):  # parent side, for every kernel (a worker's autotuner is unpickled here)
        seen.append(self)
        return original_precompile(self, *a, **k)
    th.CachingAutotuner.precompile = precompile

    mode = MODES[args.phase]
    out: dict = {"step": args.step, "phase": args.phase, "torch": torch.__version__,
                 # Triton's line info names each kernel's .py file, whose mtime ptxas writes into the cubin
                 "line_info": os.environ.get("TRITON_DISABLE_LINE_INFO") != "1"}
    start = time.perf_counter()
    if args.step == "H":
        import flytune_build as ft
        got = ft.harvest(ENTRY, mode=mode, output=args.artifacts, allow_ci=True)
        out["harvested"] = len(got.artifacts)
        out["gemm_harvested"] = got.gemm_choices
        out["harvest"] = got.to_json()
    else:
        import contextlib
        serving = contextlib.nullcontext()
        if args.step.startswith("S"):
            import flytune_build.inductor as fti
            serving = fti.serve()
        import importlib
        module, _, function = ENTRY.partition(":")
        model, inputs = getattr(importlib.import_module(module), function)()
        with torch.no_grad():
            eager = model(*inputs)
        cache_file = Path(args.live).parent / f"{args.phase}_cache_artifacts.bin"
        start = time.perf_counter()  # the compile (C: with loading the cache artifacts), not the eager run
        if args.step in ("C", "C2"):
            torch.compiler.load_cache_artifacts(cache_file.read_bytes())
            out["load_s"] = round(time.perf_counter() - start, 3)
            out["cache_artifacts_bytes"] = cache_file.stat().st_size
        compiled_out = None
        with serving:
            if mode == "aoti":
                exported = torch.export.export(model, inputs)
                pt2 = Path(args.live) / "model.pt2"
                torch._inductor.aoti_compile_and_package(exported, package_path=str(pt2))
                out["pt2_sha256"] = hashlib.sha256(pt2.read_bytes()).hexdigest()
                out["pt2_members"] = members(pt2)
                shutil.copyfile(pt2, Path(args.live).parent / f"{args.phase}_{args.step}.pt2")
            else:
                compiled_out = torch.compile(model, mode=mode)(*inputs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        out["compile_s"] = round(time.perf_counter() - start, 3)
        if mode == "aoti":
            compiled_out = torch._inductor.aoti_load_package(str(pt2))(*inputs)
        if args.step == "A" and hasattr(torch.compiler, "save_cache_artifacts"):
            saved = torch.compiler.save_cache_artifacts()
            if saved is not None:
                cache_file.write_bytes(saved[0])
                out["cache_artifacts_bytes"] = len(saved[0])
        if compiled_out is not None:
            got, want = compiled_out.float(), eager.float()
            out["max_abs_err"] = float((got - want).abs().max())
            out["eager_max_abs"] = float(want.abs().max())
            out["eager_close"] = bool(torch.allclose(got, want, rtol=2e-2, atol=2e-2))
        if args.step.startswith("S"):
            import flytune_build as ft
            out["served"] = ft.stats().get("torch.compile")
    out.setdefault("compile_s", round(time.perf_counter() - start, 3))
    out.update({k: round(v, 4) for k, v in timers.items()})
    out.update(counts)
    out["gemm_selected"] = selected
    out["benchmarked"] = benchmarked
    chosen = {}
    for at in seen:
        launchers = getattr(at, "launchers", None) or []
        if len(launchers) == 1 and getattr(at.fn, "src", None):
            key = th.generate_lookup_hash_from_source_code(str(at.size_hints), at.fn.src)
            c = launchers[0].config
            chosen[key] = {"name": str(at.inductor_meta.get("kernel_name")), "kwargs": dict(c.kwargs),
                           "num_warps": c.num_warps, "num_stages": c.num_stages}
    out["kernels"] = chosen
    return out


def members(pt2: Path) -> dict:
    """Each member of a .pt2 archive (a zip): its sha256, size and stored date."""
    import zipfile

    with zipfile.ZipFile(pt2) as z:
        return {i.filename: {"sha256": hashlib.sha256(z.read(i)).hexdigest(), "size": i.file_size,
                             "date": list(i.date_time)} for i in z.infolist()}


def member_diff(work: Path, phase: str, x: str, y: str, name: str) -> str:
    """Where one member differs between two steps' archives: a text diff, or the differing bytes."""
    import difflib
    import zipfile

    with zipfile.ZipFile(work / f"{phase}_{x}.pt2") as zx, zipfile.ZipFile(work / f"{phase}_{y}.pt2") as zy:
        bx, by = zx.read(name), zy.read(name)
    try:
        if b"\0" in bx + by:
            raise UnicodeDecodeError("utf-8", b"", 0, 1, "a NUL byte: binary")
        tx, ty = bx.decode(), by.decode()
        return "\n".join(list(difflib.unified_diff(tx.splitlines(), ty.splitlines(), lineterm="", n=1))[:60])
    except UnicodeDecodeError:
        at = [i for i in range(min(len(bx), len(by))) if bx[i] != by[i]]
        first = at[0] if at else min(len(bx), len(by))
        return (f"binary: sizes {len(bx)} / {len(by)}, {len(at)} bytes differ, first at {first}: "
                f"{bx[max(0, first - 32):first + 64]!r} / {by[max(0, first - 32):first + 64]!r}")


def run_step(name: str, phase: str, work: Path, artifacts: Path, timeout: float) -> dict:
    live = work / ("live-at-another-path" if name == "C2" else "live")
    shutil.rmtree(live, ignore_errors=True)
    (live / "inductor").mkdir(parents=True)
    (live / "triton").mkdir()
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(live / "inductor"), TRITON_CACHE_DIR=str(live / "triton"),
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "examples" / "compiled_model"),
                                           os.environ.get("PYTHONPATH", "")]))
    env.pop("FLYTUNE_ARTIFACT_DIR", None)
    if env.get("INDUCTOR_BENCH_INSTALLED"):  # flytune-build and compiled-model installed wheels, nothing else
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    elif name.startswith("S"):
        env["FLYTUNE_ARTIFACT_DIR"] = str(artifacts)
    record = work / f"{phase}_{name}.json"
    cmd = [sys.executable, __file__, "--_step", name, "--_phase", phase, "--_live", str(live),
           "--_artifacts", str(artifacts), "--_record", str(record)]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"step": name, "phase": phase, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode != 0:
        return {"step": name, "phase": phase, "error": proc.stderr[-3000:]}
    got = json.loads(record.read_text())
    got["stderr_tail"] = proc.stderr[-1500:]  # flytune's warnings, Inductor's notes
    return got


def compare(phase: str, steps: dict) -> dict:  # noqa: C901 (one report, read top to bottom)
    a, b = steps.get("A", {}), steps.get("B", {})
    out: dict = {"phase": phase}
    if "kernels" in a and "kernels" in b:
        common = set(a["kernels"]) & set(b["kernels"])
        out["cold_kernels"] = len(common)
        out["cold_differ"] = sorted(a["kernels"][k]["name"] for k in common if a["kernels"][k] != b["kernels"][k])
        out["cold_autotune_s"] = [a.get("autotune_s"), b.get("autotune_s")]
    shipped = {}
    art_dir = steps.get("_artifacts")
    if art_dir:
        for p in Path(art_dir).glob("*.json"):
            doc = json.loads(p.read_text())
            shipped[doc["key"].get("inductor_source")] = doc["config"]
    for s in ("S1", "S2"):
        got = steps.get(s, {})
        if "kernels" not in got:
            continue
        differ = []
        for key, c in got["kernels"].items():
            want = shipped.get(key)
            if want is not None and (want["kwargs"] != c["kwargs"] or want.get("num_warps", 4) != c["num_warps"]
                                     or want.get("num_stages", 3) != c["num_stages"]):
                differ.append(c["name"])
        out[f"{s}_autotune_s"] = got.get("autotune_s")
        out[f"{s}_gemm_s"] = got.get("gemm_s")
        out[f"{s}_differs_from_shipped"] = differ
        out[f"{s}_served"] = got.get("served")
        out[f"{s}_gemm_selects"] = got.get("gemm_selects")
        out[f"{s}_gemm_benchmarks"] = got.get("gemm_benchmarks")
        out[f"{s}_gemm_benchmarked"] = bool(got.get("gemm_selects") or got.get("gemm_benchmarks"))
        shipped_gemm = {k for k in shipped if k and k.startswith("((")}
        out[f"{s}_gemm_shipped"] = len(shipped_gemm)
        if a.get("autotune_s"):
            out[f"{s}_autotune_share_of_cold"] = round(got.get("autotune_s", 0) / a["autotune_s"], 4)
    if "autotune_s" in a:
        out["cold_gemm"] = {k: a.get(k) for k in ("gemm_s", "gemm_autotune_s", "gemm_selects", "gemm_benchmarks")}
    for name in ("C", "C2"):  # Inductor's own cache artifacts, loaded into empty caches (C2: at another path)
        c = steps.get(name, {})
        if "compile_s" in c:
            out[f"{name}_cache_artifacts"] = {k: c.get(k) for k in ("compile_s", "load_s", "cache_artifacts_bytes",
                                                                    "autotune_s", "gemm_selects", "gemm_benchmarks",
                                                                    "benchmarked")}
    s1, s2 = steps.get("S1", {}), steps.get("S2", {})
    if "kernels" in s1 and "kernels" in s2:  # two served compiles: the same templates and configs
        pick = [(g.get("name"), g.get("template"), g.get("choice")) for g in s1.get("gemm_selected", [])]
        out["S1_S2_same_gemm_templates"] = pick == [(g.get("name"), g.get("template"), g.get("choice"))
                                                    for g in s2.get("gemm_selected", [])]
        out["S1_S2_same_kernel_configs"] = s1["kernels"] == s2["kernels"]
    out["eager"] = {name: {k: steps[name].get(k) for k in ("max_abs_err", "eager_max_abs", "eager_close")}
                    for name in ("A", "B", "C", "C2", "S1", "S2") if "max_abs_err" in steps.get(name, {})}
    for x, y in (("A", "B"), ("S1", "S2")):
        hx, hy = steps.get(x, {}).get("pt2_sha256"), steps.get(y, {}).get("pt2_sha256")
        if hx and hy:
            out[f"{x}_{y}_pt2_identical"] = hx == hy
            mx, my = steps[x].get("pt2_members", {}), steps[y].get("pt2_members", {})
            differ = sorted(n for n in set(mx) | set(my) if mx.get(n) != my.get(n))
            out[f"{x}_{y}_pt2_members_differ"] = {
                n: member_diff(Path(steps["_work"]), phase, x, y, n) if n in mx and n in my else "only in one"
                for n in differ[:20]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="inductor-out")
    p.add_argument("--phases", default="tc,aoti,ma")
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--timeouts", default="", help="a step's own limit in seconds: H=200,S1=100")
    p.add_argument("--mirror", help="a directory that gets steps.json and table.txt after each step (a run "
                   "stopped at a time limit keeps what it finished there)")
    p.add_argument("--steps", default="A,B,H,S1,S2", help="which steps to run, of A,B,C,C2,H,S1,S2 (C, C2 after A)")
    p.add_argument("--installed", action="store_true", help="S steps serve the installed compiled-model wheel's "
                   "bundle (flytune-build and compiled-model installed, the checkout off the path); the shipped "
                   "configs compared are --shipped's")
    p.add_argument("--shipped", default=str(ROOT / "examples" / "compiled_model" / "artifacts" / "sm_90"),
                   help="with --installed: the artifact directory the installed wheel was built from")
    p.add_argument("--entry", default=ENTRY, help="the model: MODULE:FUNCTION returning (model, inputs)")
    p.add_argument("--artifacts-from", help="a directory of harvested artifacts per phase "
                   "(artifacts-PHASE/), used instead of step H")
    p.add_argument("--small", action="store_true", help="a tiny block (COMPILED_MODEL_SMALL=1)")
    for hidden in ("--_step", "--_phase", "--_live", "--_artifacts", "--_record"):
        p.add_argument(hidden, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._step:
        ns = argparse.Namespace(step=args._step, phase=args._phase, live=args._live, artifacts=args._artifacts)
        Path(args._record).write_text(json.dumps(step(ns), indent=1, sort_keys=True))
        return 0
    if args.small:
        os.environ["COMPILED_MODEL_SMALL"] = "1"
    os.environ["INDUCTOR_BENCH_ENTRY"] = args.entry  # the steps' processes read it
    out = Path(args.out).resolve()
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    summary = {"phases": []}
    lines = []
    for phase in args.phases.split(","):
        artifacts = work / f"artifacts-{phase}"
        shutil.rmtree(artifacts, ignore_errors=True)
        steps: dict = {"_artifacts": str(artifacts), "_work": str(work)}
        if args.installed:
            os.environ["INDUCTOR_BENCH_INSTALLED"] = "1"
            shutil.copytree(args.shipped, artifacts)
        elif args.artifacts_from:
            shutil.copytree(Path(args.artifacts_from) / f"artifacts-{phase}", artifacts)
        limits = dict(item.split("=") for item in args.timeouts.split(",") if item)
        for name in args.steps.split(","):
            t = time.perf_counter()
            steps[name] = run_step(name, phase, work, artifacts, float(limits.get(name, args.timeout)))
            lines.append(f"{phase} {name}: {time.perf_counter() - t:.1f} s, autotune "
                         f"{steps[name].get('autotune_s')} s, gemm {steps[name].get('gemm_s')} s (selects benchmarked "
                         f"{steps[name].get('gemm_selects')}, {steps[name].get('gemm_autotune_s')} s), "
                         f"{len(steps[name].get('kernels', {}))} kernels"
                         + (f", ERROR {steps[name]['error'][-300:]}" if "error" in steps[name] else ""))
            print(lines[-1], flush=True)
            # written after each step: a run stopped at a time limit keeps the steps it finished
            for where in (out, *([Path(args.mirror)] if args.mirror else [])):
                where.mkdir(parents=True, exist_ok=True)
                (where / "steps.json").write_text(json.dumps(steps, indent=1, sort_keys=True, default=str))
                (where / "table.txt").write_text("\n".join(lines) + "\n")
        result = compare(phase, steps)
        summary["phases"].append({"compare": result, "steps": steps})
        lines.append(json.dumps(result, sort_keys=True))
        print(lines[-1], flush=True)
        # written after each phase: a run stopped at a time limit keeps the phases it finished
        (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
        (out / "table.txt").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
