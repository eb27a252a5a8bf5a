#!/usr/bin/env bash
# Winner determinism on the GPU: two cold `flytune tune` runs of the sample's H200 plan, each winner
# against the fastest candidate of its own run, the same two runs with stock triton.autotune, and a
# third flytune run into the first run's output (kept / replaced).
#
# Usage (repo root, on the GPU machine; flytune_build is imported from the repo, nothing is installed):
#   bash benchmarks/h200_determinism.sh [OUTDIR]          OUTDIR defaults to $OUT
#   PLAN=path/to/plan.toml bash benchmarks/h200_determinism.sh OUTDIR     another plan (a logic check
#                                                         under TRITON_INTERPRET=1 uses a tiny one)
#   TRITON_PASSES=0 bash benchmarks/h200_determinism.sh OUTDIR    the flytune runs alone (about 1 minute)
#   THIRD=0 ...                                           the two cold runs alone, no re-tune
#   LOAD=N ...                                            N CPU-bound loops run beside every run (a
#                                                         busy machine; N=$(nproc) takes every core)
# Writes into OUTDIR: report.txt (read this), summary.json, flytune_runs.log, triton_runs.json (both
# triton passes; not with TRITON_PASSES=0), artifacts.tgz (the three flytune outputs), gpu.txt.
# About 3 minutes on an H200 (1 with TRITON_PASSES=0).
set -uo pipefail
DEST=${1:-${OUT:?give OUTDIR or set OUT}}
PLAN=${PLAN:-sample_pkg/tune/h200.toml}
LIMIT=${LIMIT:-300}                     # seconds any one run may take
mkdir -p "$DEST"
WORK=$(mktemp -d)
LOADERS=()
trap 'kill "${LOADERS[@]}" 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq "${LOAD:-0}"); do       # the load generator: one busy loop per N, killed on exit
  ( while :; do :; done ) &
  LOADERS+=($!)
done
export PYTHONPATH="$PWD:$PWD/sample_pkg${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 FLYTUNE_AUTOTUNE=0
unset FLYTUNE_RANKING FLYTUNE_ARTIFACT_DIR FLYTUNE_EMIT_DIR
PY=${PYTHON:-python3}

{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "plan $PLAN"; echo "load ${LOAD:-0} CPU-bound loops beside each run on $(nproc) CPUs"; } > "$DEST/gpu.txt" 2>&1
cat "$DEST/gpu.txt"

flytune() {  # flytune RUN_NAME OUTPUT_DIR [args]: a cold process: fresh Triton and scratch caches
  local name=$1 out=$2; shift 2
  echo "== flytune $name -> $out $*" >> "$DEST/flytune_runs.log"
  local start=$SECONDS
  TRITON_CACHE_DIR="$WORK/triton-$name" FLYTUNE_CACHE_DIR="$WORK/scratch-$name" timeout "$LIMIT" \
    $PY -m flytune_build.cli tune --project sample_pkg --plan "$PLAN" --output "$out" --no-resume \
    --no-progress --allow-ci "$@" >> "$DEST/flytune_runs.log" 2>&1
  local rc=$?
  echo "== flytune $name: exit $rc in $((SECONDS - start)) s" | tee -a "$DEST/flytune_runs.log"
  return $rc
}

triton_pass() {  # triton_pass RUN_NAME: one cold pass with stock triton.autotune
  local name=$1 start=$SECONDS
  TRITON_CACHE_DIR="$WORK/triton-$name" timeout "$LIMIT" \
    $PY benchmarks/determinism.py triton sample_pkg "$PLAN" "$WORK/$name.json" >> "$DEST/flytune_runs.log" 2>&1
  local rc=$?
  echo "== triton.autotune $name: exit $rc in $((SECONDS - start)) s" | tee -a "$DEST/flytune_runs.log"
  return $rc
}

flytune run1 "$WORK/run1" || exit 1
flytune run2 "$WORK/run2" || exit 1
RUN3="$WORK/run3"
if [ "${THIRD:-1}" = 0 ]; then              # the two cold runs alone (the re-tune table left out)
  RUN3=-
else
  cp -r "$WORK/run1" "$WORK/run3"         # the third run re-tunes a copy of run 1's output
  flytune run3 "$WORK/run3" || exit 1
fi
TRITONS=("$WORK/triton1.json" "$WORK/triton2.json")
if [ "${TRITON_PASSES:-1}" = 0 ]; then      # the flytune runs alone (the triton.autotune table left out)
  TRITONS=(- -)
else
  triton_pass triton1 || exit 1
  triton_pass triton2 || exit 1
  $PY -c "import json,sys; print(json.dumps({n: json.load(open(f'$WORK/{n}.json'))['runs'] for n in ('triton1', 'triton2')}))" \
    > "$DEST/triton_runs.json"
fi
$PY benchmarks/determinism.py report "$WORK/run1" "$WORK/run2" "$RUN3" "${TRITONS[@]}" \
  > "$DEST/report.txt" 2> "$DEST/summary.json"
rc=$?
tar czf "$DEST/artifacts.tgz" -C "$WORK" run1 run2 $([ "$RUN3" = - ] || echo run3)
cat "$DEST/report.txt" "$DEST/summary.json"
exit $rc
