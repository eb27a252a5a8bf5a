#!/usr/bin/env bash
# Issue #45 on one lent GPU (H100 or H200, torch 2.11): a max-autotune-no-cudagraphs harvest of
# examples/compiled_model with its GEMM template choices (H), a compile served from those artifacts
# through FLYTUNE_ARTIFACT_DIR (S1), then a cold compile without flytune (A). Autotune seconds of each,
# and whether S1 benchmarked any GEMM choice (select_algorithm's do_autotuning / benchmark calls).
#   bash benchmarks/h100_gemm.sh        (run from the checkout; .whl/ holds the platformdirs wheel)
# Results under $OUT: env.txt, log.txt, steps.json, table.txt, summary.json, artifacts-ma.tgz.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gemm-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import sys, torch, triton; p = torch.cuda.get_device_properties(0); print(sys.version); \
print(torch.__version__, triton.__version__, p.name, p.multi_processor_count, repr(p.gcnArchName))"
  nproc; } > "$OUT/env.txt" 2>&1
python3 benchmarks/inductor_compile.py --out /tmp/gemm-bench --mirror "$OUT" --phases ma --steps H,S1,A \
  --timeouts "H=${H_S:-200},S1=${S1_S:-90},A=${A_S:-100}" > "$OUT/log.txt" 2>&1
cp /tmp/gemm-bench/summary.json "$OUT/" 2>/dev/null
tar -C /tmp/gemm-bench/work -czf "$OUT/artifacts-ma.tgz" artifacts-ma 2>/dev/null
tail -c 6000 "$OUT/log.txt"
