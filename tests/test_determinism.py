"""Cold re-tunes timed for real: two measured searches of one plan in one process (the kernel reset
between them, so each searches afresh), under the interpreter, where `num_warps` changes nothing and each
BLOCK's configs are exact ties; then a re-tune against the first run's winners (hysteresis). Asserted:
what the selection rule guarantees in any run; printed: how often the runs agreed."""
import statistics
import time

import pytest
import torch
import triton
import triton.language as tl

import flytune_build as ft
from flytune_build import Config
from flytune_build.core import settings
from flytune_build.runtime.searching import selection, session

pytestmark = [pytest.mark.skipif(not settings.current().interpret, reason="measured under TRITON_INTERPRET=1"),
              pytest.mark.timed]

# Exact ties: within a BLOCK the three configs run the same interpreted code. Across BLOCKs the time
# differs (a program per BLOCK elements), so the search must also tell real differences apart.
CONFIGS = [Config({"BLOCK": b}, num_warps=w) for b in (64, 128) for w in (1, 2, 4)]
SHAPES = [64 * i for i in range(1, 13)]   # 12 shapes, 12 keys: 1 to 12 programs of BLOCK 64


# rep=300: a finalist's round gets a tenth of it, 30 ms, about ten calls whose least CPU time holds
# within a few percent on a shared 2-core machine. At rep=100 (two to four calls a round) exact ties read
# 3-8% apart there and two cold tunes agreed on 8 to 12 of 12 shapes; at 300, on 12 in seven runs, and
# on 9 in a later run alone on the same machine: agreement is printed, never asserted.
@ft.autotune(CONFIGS, ["n"], name="test_determinism.scale", rep=300, warmup=1)
@triton.jit
def scale_kernel(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * 2.0, mask=m)


def tune_plan() -> dict[int, dict]:
    """One cold pass over SHAPES: each shape's winner and provenance.selection."""
    scale_kernel.reset()
    out = {}
    for n in SHAPES:
        x, y = torch.randn(n), torch.empty(n)
        scale_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
        torch.testing.assert_close(y, 2 * x)
        d = scale_kernel.decision(x, y, n)
        out[n] = {"config": d.config, "selection": d.search.selection}
    return out


def test_cold_searches_of_real_timings_keep_the_rule_in_every_run_and_a_re_tune_replaces_only_past_its_margin(
        tmp_path):
    """What the rule guarantees whatever the timings read (on a shared machine they read anything): every
    winner within the cap of its run's fastest, round for round; every finalist declared before it judged
    apart, or at the edge past the tie; a re-tune against the first run's winners keeps each one, or
    replaces it only with a paired gain over the margin. How often cold runs agree is a statistic, not a
    guarantee: the seeded-noise tests of tests/test_selection.py hold it exactly, benchmarks/determinism.py
    measures it on a GPU, and this test prints it."""
    start = time.perf_counter()
    with settings.override(autotune="search", ranking="measured", cache_dir=tmp_path, emit_dir=None):
        first, second = tune_plan(), tune_plan()
        kept = {n: r["config"] for n, r in first.items()}
        with session.opened(shipped=lambda kernel, key: selection.Shipped(kept[key["n"]], 0.03)):
            third = tune_plan()
    for run in (first, second, third):
        for n, r in run.items():
            sel = r["selection"]
            won = next(f for f in sel["finalists"] if f["index"] == sel["winner"])
            if "shipped" not in sel and sel.get("default", {}).get("outcome") != "kept":  # else the held one
                assert sel["winner"] == sel["fastest"] or won["gap"] <= selection.CPU_TIME.cap, (n, sel)
                for f in sel["finalists"]:
                    if f["index"] < sel["winner"]:
                        assert f["verdict"] == "apart" or (f["verdict"] == "edge" and f["gap"] > selection.EDGE_TIE
                                                           * selection.CPU_TIME.cap), (n, sel)
            assert isinstance(sel["resolved"], bool) and 0.5 <= sel["confidence"] <= 1
    for n, r in third.items():
        shipped = r["selection"]["shipped"]
        assert shipped["outcome"] in ("kept", "replaced"), shipped
        if shipped["outcome"] == "kept":
            assert r["config"] == kept[n], (n, r["selection"])
        else:   # the paired gain less its error was over the margin: the gain itself is
            assert shipped["gain"] > 0.03 and r["config"] != kept[n], (n, r["selection"])
    agree = sum(first[n]["config"] == second[n]["config"] for n in SHAPES)
    declared = sum(r["config"].num_warps == 1 for run in (first, second) for r in run.values())
    churn = sum(r["selection"]["shipped"]["outcome"] == "replaced" for r in third.values())
    resolved = statistics.mean(r["selection"]["resolved"] for run in (first, second) for r in run.values())
    print(f"{agree}/{len(SHAPES)} agree, {declared}/{2 * len(SHAPES)} exact ties to the earliest declared, "
          f"{churn} replaced by the re-tune, {resolved:.0%} resolved, {time.perf_counter() - start:.1f} s")
