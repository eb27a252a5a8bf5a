"""Winner determinism across cold tuning runs; `benchmarks/h200_determinism.sh` drives it.

  python benchmarks/determinism.py triton PROJECT PLAN OUT.json
      one pass of the plan with stock `triton.autotune` over the same configs and key (the anchor's
      method): each shape's best config and every config's median time, as JSON
  python benchmarks/determinism.py report RUN1 RUN2 RUN3 [TRITON1.json TRITON2.json]
      the report: winner agreement of two cold `flytune tune` runs (goal >= 95%), each winner against
      the fastest candidate measured in its own run (goal within 2%), the same for triton.autotune,
      and what a third run into RUN1's output (RUN3, a copy of it re-tuned) kept and replaced
  python benchmarks/determinism.py replay RUN1 RUN2 [RUN...]
      each shape's recorded finalist rounds (provenance.selection) decided again by this release's
      `selection.decide`: whether each pair of runs' rounds choose alike under the rule as it is now,
      beside the winners they recorded, and over all pairs under two other rules for a test left at
      the edge. A replay cannot add rounds: the stopping was the recording release's
  python benchmarks/determinism.py pool A1 A2 B1 B2
      each shape decided on the rounds of two runs at once (A1 and A2, then B1 and B2), and whether the
      two pooled decisions agree: what measuring in two processes would buy
"""
import json
import math
import os
import sys
from pathlib import Path

AGREEMENT_GOAL = 0.95
WITHIN_GOAL = 0.02


def triton_pass(project: str, plan: str, out: str) -> None:
    import importlib
    import tomllib

    import torch
    import triton

    sys.path[:0] = [project]
    from flytune_build.runtime.serving import autotuner

    from flytune_build.runtime.searching import bench
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    # under the interpreter (a logic check, not a measurement) triton's do_bench has no device to time
    do_bench = (lambda fn, quantiles: [bench.cpu_bench(fn, 5, 20)] * 3) if interpreted else None
    entries = tomllib.loads(Path(plan).read_text())["entries"]
    swapped = {}
    rows = []
    for e in entries:
        module, fn = e["setup"].split(":")
        setup = getattr(importlib.import_module(module), fn)
        if e["kernel"] not in swapped:
            swapped[e["kernel"]] = _swap(autotuner.kernel(e["kernel"]), triton, do_bench)
        tuned = swapped[e["kernel"]]
        for shape in e["shapes"]:
            setup(**shape)()
            if torch.cuda.is_available() and not interpreted:
                torch.cuda.synchronize()
            timings = {_config(c): float(t[0] if isinstance(t, (list, tuple)) else t)
                       for c, t in tuned.configs_timings.items()}
            rows.append({"kernel": e["kernel"], "shape": shape, "best": _config(tuned.best_config),
                         "timings": [[json.loads(c), t] for c, t in timings.items()]})
            tuned.cache.clear()  # a shape with the same key is searched again, like flytune's
    Path(out).write_text(json.dumps({"runs": rows}, indent=1))


def _swap(kernel, triton, do_bench):
    """Replace the flytune kernel everywhere a module holds it with triton.autotune over its configs."""
    configs = [triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages, num_ctas=c.num_ctas,
                             maxnreg=c.maxnreg) for c in kernel.configs]
    tuned = triton.autotune(configs=configs, key=list(kernel.axis_names), do_bench=do_bench)(kernel.fn)
    for module in list(sys.modules.values()):
        for name, value in list(getattr(module, "__dict__", {}).items()):
            if value is kernel:
                setattr(module, name, tuned)
    return tuned


def _config(c) -> str:
    return json.dumps({"kwargs": dict(c.kwargs), "num_warps": c.num_warps, "num_stages": c.num_stages},
                      sort_keys=True)


# -- the report ------------------------------------------------------------------------------------------
def load_run(directory: str) -> dict:
    """{identity: {...}} for every artifact of a `flytune tune` output."""
    out = {}
    for p in sorted(Path(directory).glob("*.json")):
        doc = json.loads(p.read_bytes())
        prov = doc.get("provenance") or {}
        times = {json.dumps(c["config"], sort_keys=True): c["time_ms"] for c in prov.get("candidates", [])
                 if c.get("time_ms") is not None}
        winner = json.dumps(doc["config"], sort_keys=True)
        out[p.name] = {"kernel": doc["kernel"], "key": doc["key"], "winner": winner, "times": times,
                       "selection": prov.get("selection") or {}, "measurement": prov.get("measurement") or {}}
    return out


def short(config: str) -> str:
    c = json.loads(config)
    kw = ",".join(f"{k}={v}" for k, v in sorted(c["kwargs"].items()))
    return f"{kw} w{c.get('num_warps')} s{c.get('num_stages')}"


def over_fastest(run: dict, winner: str) -> float | None:
    """The winner's time over the fastest candidate's in its run: its paired gap to the fastest finalist where
    the selection records one (what the sequential test compares), else the re-timed finalists' medians
    (a fixed band's), else every candidate's time."""
    finalists = run["selection"].get("finalists") or []
    times = {f["index"]: f["median_ms"] for f in finalists}
    gaps = {f["index"]: f["gap"] for f in finalists if "gap" in f}
    w = run["selection"].get("winner")
    if gaps and w in times:
        return 0.0 if w == run["selection"].get("fastest") else gaps.get(w)
    if w in times:
        return times[run["selection"]["winner"]] / min(times.values()) - 1
    t, best = run["times"].get(winner), min(run["times"].values(), default=None)
    return None if t is None or not best else t / best - 1


def cross(run: dict, other_winner: str) -> float | None:
    """How the other run's winner timed in this run, against this run's own winner."""
    mine, theirs = run["times"].get(run["winner"]), run["times"].get(other_winner)
    return None if mine is None or theirs is None or not mine else theirs / mine - 1


def pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x * 100:+.2f}%"


def sure(run: dict) -> str:
    """provenance.selection's confidence, and `?` where a test that decided the winner was unresolved."""
    sel = run["selection"]
    if "confidence" not in sel:
        return "-"
    return f"{sel['confidence']:.3f}" + ("" if sel.get("resolved") else "?")


def table(rows) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def flytune_section(a: dict, b: dict) -> tuple[list[str], dict]:
    rows = [("kernel", "key", "timer", "winner run 1", "winner run 2", "same", "w1 vs fastest", "w2 vs fastest",
             "band 1", "band 2", "sure 1", "sure 2", "other's winner in run 1")]
    agree = within = guarded = shapes = resolved = 0
    for name in sorted(set(a) | set(b)):
        x, y = a.get(name), b.get(name)
        if x is None or y is None:
            rows.append((name, "-", "-", "-", "-", "missing in one run", "", "", "", "", "", "", ""))
            shapes += 1
            continue
        shapes += 1
        same = x["winner"] == y["winner"]
        agree += same
        g1, g2 = over_fastest(x, x["winner"]), over_fastest(y, y["winner"])
        within += sum(g is not None and g <= WITHIN_GOAL + 1e-9 for g in (g1, g2))
        # the kernel's default kept by the guard against it (a tuned config must beat it by the margin, surely)
        guarded += sum(g is not None and g > WITHIN_GOAL + 1e-9 and
                       (r["selection"].get("default") or {}).get("outcome") == "kept" for g, r in ((g1, x), (g2, y)))
        resolved += sum(bool(r["selection"].get("resolved")) for r in (x, y))
        key = ",".join(f"{k}={v}" for k, v in x["key"].items() if not isinstance(v, str))
        timers = "/".join(dict.fromkeys(r["measurement"].get("timer", "-") for r in (x, y)))   # run 1's/run 2's
        rows.append((x["kernel"].split(".")[-1], key, timers, short(x["winner"]),
                     short(y["winner"]), "yes" if same else "NO", pct(g1), pct(g2),
                     pct(x["selection"].get("band")), pct(y["selection"].get("band")), sure(x), sure(y),
                     "-" if same else pct(cross(x, y["winner"]))))
    summary = {"shapes": shapes, "agree": agree, "agreement": agree / shapes if shapes else None,
               "winners_within_2pct": within, "default_kept_over_2pct": guarded, "winners": 2 * shapes,
               "resolved": resolved}
    return [table(rows)], summary


def triton_section(t1: list, t2: list) -> tuple[list[str], dict]:
    rows = [("kernel", "shape", "best run 1", "best run 2", "same", "run 2's best in run 1")]
    agree = 0
    for x, y in zip(t1, t2):
        same = x["best"] == y["best"]
        agree += same
        times = {json.dumps(c, sort_keys=True): t for c, t in x["timings"]}
        mine, theirs = times.get(x["best"]), times.get(y["best"])
        gap = None if same or not mine or theirs is None else theirs / mine - 1
        shape = ",".join(f"{k}={v}" for k, v in x["shape"].items())
        rows.append((x["kernel"].split(".")[-1], shape, short(x["best"]), short(y["best"]), "yes" if same else "NO",
                     "-" if same else pct(gap)))
    n = len(t1)
    return [table(rows)], {"shapes": n, "agree": agree, "agreement": agree / n if n else None}


def retune_section(before: dict, after: dict) -> tuple[list[str], dict]:
    rows = [("kernel", "key", "outcome", "gain", "why")]
    counts = {"kept": 0, "replaced": 0, "new": 0}
    for name in sorted(after):
        x, old = after[name], before.get(name)
        shipped = x["selection"].get("shipped") or {}
        outcome = "new" if old is None else "kept" if old["winner"] == x["winner"] else "replaced"
        counts[outcome] += 1
        key = ",".join(f"{k}={v}" for k, v in x["key"].items() if not isinstance(v, str))
        why = "file unchanged (run 3's table in flytune_runs.log gives the in-margin gain)" if outcome == "kept" \
            else (x["selection"].get("why") or "")[:110]
        rows.append((x["kernel"].split(".")[-1], key, outcome, "-" if outcome == "kept" else pct(shipped.get("gain")),
                     why))
    return [table(rows)], counts


def report(run1, run2, run3, triton1="-", triton2="-") -> None:
    """The three tables; with TRITON1/TRITON2 given as "-" (TRITON_PASSES=0) the triton.autotune one is left out,
    with RUN3 given as "-" (THIRD=0) the re-tune one."""
    a, b = load_run(run1), load_run(run2)
    ft_lines, ft = flytune_section(a, b)
    agreed = "met" if ft["agreement"] >= AGREEMENT_GOAL else "NOT met"
    within = "met" if ft["winners_within_2pct"] + ft["default_kept_over_2pct"] == ft["winners"] else "NOT met"
    guarded = (f"; {ft['default_kept_over_2pct']} more are the kernel's default, kept by the guard against it "
               f"(`provenance.selection.default`)" if ft["default_kept_over_2pct"] else "")
    out = ["== flytune tune: two cold runs", *ft_lines, "",
           f"agreement: {ft['agree']}/{ft['shapes']} = {ft['agreement']:.1%} (goal >= {AGREEMENT_GOAL:.0%}: {agreed})",
           (f"winners within {WITHIN_GOAL:.0%} of their run's fastest candidate: {ft['winners_within_2pct']}/"
            f"{ft['winners']}{guarded} ({within})"),
           f"selections resolved (every deciding test settled; `?` in the sure columns where not): {ft['resolved']}/"
           f"{ft['winners']}", ""]
    summary = {"flytune": ft}
    if "-" not in (triton1, triton2):
        t1, t2 = (json.loads(Path(p).read_text())["runs"] for p in (triton1, triton2))
        tr_lines, tr = triton_section(t1, t2)
        summary["triton_autotune"] = tr
        out += ["== stock triton.autotune: two cold runs of the same plan and configs (each winner its run's fastest)",
                *tr_lines, "", f"agreement: {tr['agree']}/{tr['shapes']} = {tr['agreement']:.1%}", ""]
    if run3 != "-":   # THIRD=0: no re-tune
        re_lines, summary["retune"] = retune_section(a, load_run(run3))
        re = summary["retune"]
        out += ["== a third flytune run into run 1's output (--no-resume; kept unless >3% faster in the same search)",
                *re_lines, "", f"kept {re['kept']}, replaced {re['replaced']}, new {re['new']}"]
    print("\n".join(out))
    print(json.dumps(summary), file=sys.stderr)


def replay(*runs: str) -> None:
    """Each pair of runs' winners, recorded and decided again by this release from the recorded rounds;
    then agreement over all pairs with the edge rule this release has and with two others (`EDGE_TIE`)."""
    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
    from flytune_build.runtime.searching import selection

    def decided(sel: dict) -> int | None:
        finals = sel.get("finalists") or []
        if sel.get("rule", {}).get("test") != "sequential" or len(finals) < 2:
            return sel.get("winner")
        fields = {k: v for k, v in sel["rule"].items() if k in ("cap", "z", "noise_floor", "rounds", "max_rounds")}
        samples = {f["index"]: dict(enumerate(f["rounds_ms"])) for f in finals}
        rule = selection.Rule(**fields)
        d = selection.decide(samples, rule)
        return (selection.decide(samples, rule, final=True) if d.edge() else d).winner   # as `pick`

    loaded = [load_run(r) for r in runs]
    names = sorted(set.intersection(*(set(r) for r in loaded)))
    pairs = [(i, j) for i in range(len(runs)) for j in range(i + 1, len(runs))]
    rows, recorded, now = [], 0, 0
    for i, j in pairs:
        for name in names:
            sa, sb = loaded[i][name]["selection"], loaded[j][name]["selection"]
            was, new = (sa.get("winner"), sb.get("winner")), (decided(sa), decided(sb))
            recorded += was[0] == was[1]
            now += new[0] == new[1]
            if len({*was, *new}) > 1:
                key = ",".join(f"{k}={v}" for k, v in sorted(loaded[i][name]["key"].items()))
                rows.append(f"  runs {i + 1},{j + 1} {loaded[i][name]['kernel']} {key}: recorded #{was[0]}/#{was[1]}, "
                            f"now #{new[0]}/#{new[1]}")
    n = len(names) * len(pairs)
    print("\n".join(rows + [f"{len(pairs)} pair(s) of runs x {len(names)} shapes: recorded winners agree on "
                            f"{recorded}/{n}; decided again by this release: {now}/{n}"]))
    mine = selection.EDGE_TIE
    for label, tie in ((f"this release: an edge is a tie under {mine:g} x the cap", mine),
                       ("an edge is a tie under half the cap", 0.5), ("an edge is never a tie", -math.inf)):
        selection.EDGE_TIE = tie
        agree = sum(decided(loaded[i][m]["selection"]) == decided(loaded[j][m]["selection"])
                    for i, j in pairs for m in names)
        print(f"  {label}: {agree}/{n}")
    selection.EDGE_TIE = mine


def pool(a1, a2, b1, b2) -> None:
    """Two decisions per shape, each on the recorded rounds of two runs at once (A1+A2, B1+B2; a round is
    paired only with the rounds of its own run), and how often the two pooled decisions agree."""
    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
    from flytune_build.runtime.searching import selection

    def decided(sels: list[dict]) -> int | None:
        samples: dict = {}
        for k, sel in enumerate(sels):
            for f in sel.get("finalists") or []:
                samples.setdefault(f["index"], {}).update({(k, j): t for j, t in enumerate(f["rounds_ms"])})
        if len(samples) < 2:
            return next(iter(samples), sels[0].get("winner"))
        d = selection.decide(samples, selection.MEASURED)
        return (selection.decide(samples, selection.MEASURED, final=True) if d.edge() else d).winner

    runs = [load_run(r) for r in (a1, a2, b1, b2)]
    names = sorted(set.intersection(*(set(r) for r in runs)))
    apart = [n for n in names if decided([runs[0][n]["selection"], runs[1][n]["selection"]])
             != decided([runs[2][n]["selection"], runs[3][n]["selection"]])]
    for n in apart:
        print(f"  {runs[0][n]['kernel']} {runs[0][n]['key']}")
    print(f"pooled decisions agree on {len(names) - len(apart)}/{len(names)}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["triton"]:
        triton_pass(*sys.argv[2:5])
    elif sys.argv[1:2] == ["report"]:
        report(*sys.argv[2:7])
    elif sys.argv[1:2] == ["pool"] and len(sys.argv) == 6:
        pool(*sys.argv[2:6])
    elif sys.argv[1:2] == ["replay"] and len(sys.argv) > 3:
        replay(*sys.argv[2:])
    else:
        raise SystemExit(__doc__)
