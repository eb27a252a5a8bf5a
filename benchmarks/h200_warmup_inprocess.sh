#!/usr/bin/env bash
# Issue 26 on an H200, one run: install flytune-build and the sample wheel (the committed sm_90
# artifacts, no tuning), then benchmarks/warmup_inprocess.py over the sample's 15 tuned shapes (cold,
# `flytune warmup` in another process, in-process warm-up, background warm-up, FLYTUNE_WARMUP,
# triton.autotune, steady state) and benchmarks/dispatch_overhead.py. About 4 minutes.
#
# Usage (repo root, on the GPU machine): bash benchmarks/h200_warmup_inprocess.sh [OUTDIR]   (default: $OUT)
# OUTDIR receives: h200_warmup_inprocess.log, gpu.txt, warmup_inprocess.json, dispatch_overhead.txt.
set -uo pipefail
OUT=${1:-${OUT:?usage: bash benchmarks/h200_warmup_inprocess.sh OUTDIR}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(pwd)
PY=${PYTHON:-python3}
exec > >(tee "$OUT/h200_warmup_inprocess.log") 2>&1
export PYTHONUNBUFFERED=1
start=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  nproc; } | tee "$OUT/gpu.txt"
echo "== install flytune-build and the sample wheel (committed sm_90 artifacts)"
# a machine without an index: the dependencies it lacks (platformdirs, ...) as wheels in .whl/
[ -d "$REPO/.whl" ] && $PY -m pip install -q --no-index --find-links "$REPO/.whl" "$REPO"/.whl/*.whl 2>&1 | tail -3
$PY -m pip install -q --no-deps --no-build-isolation "$REPO" 2>&1 | tail -3
WORK=$(mktemp -d /tmp/flytune-w26.XXXXXX)
cp -r "$REPO/sample_pkg" "$WORK/sample_pkg" && rm -rf "$WORK/sample_pkg/build" "$WORK"/sample_pkg/*.egg-info
(cd "$WORK" && $PY -m pip wheel -q --no-deps --no-build-isolation ./sample_pkg -w "$WORK/dist" 2>&1 | tail -20) || exit 1
$PY -m pip install -q --no-deps --force-reinstall "$WORK"/dist/sample_pkg-*.whl 2>&1 | tail -3
echo "install: $((SECONDS - start)) s"
cd /tmp
echo "== first calls, side by side"
$PY "$REPO/benchmarks/warmup_inprocess.py" --plan "$REPO/sample_pkg/tune/h200.toml" --out "$OUT"
echo "== dispatch overhead on a hit"
$PY "$REPO/benchmarks/dispatch_overhead.py" 2>&1 | tee "$OUT/dispatch_overhead.txt"
echo "total: $((SECONDS - start)) s"
