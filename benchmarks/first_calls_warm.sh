#!/usr/bin/env bash
# First calls after a warm-up against steady state, on one lent GPU (H100 or H200), and the hit's host cost:
#   features  examples/triton_features tuned here (`flytune tune`, its H200 plan, the target renamed to this
#             device), built into a wheel through flytune_build.backend and installed: every shape served with
#             zero searches (`h200_features.py serve`), then first calls after a background warm-up against
#             steady state (`h200_features.py warm`): two adopted @triton.autotune kernels (a config pre_hook;
#             @triton.heuristics over the Autotuner) and a ported one
#   sample    the sample wheel (its committed sm_90 artifacts): `warmup_inprocess.py`, MODES (default
#             background,bg_prealloc), REPS processes each
#   dispatch  benchmarks/dispatch_overhead.py on this host
#   bash benchmarks/first_calls_warm.sh            (repo root, on the GPU machine; .whl/ holds platformdirs)
#   PARTS="features dispatch" bash benchmarks/first_calls_warm.sh     (some of them; all three by default)
#   MODES=background,bg_prealloc,bg_tiny,bg_tiny_only  (the sample's modes: benchmarks/warmup_inprocess.py)
#   SHORT=1      the features' first calls with and without --prealloc only (not in reverse order, nor with a launch ahead)
# Results in $OUT: env.txt, features.txt (features_profile*.txt with PROFILE=1), sample.txt, sample.json, dispatch.txt.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/first-calls-out}
WORK=/tmp/first-calls
REPO=$(pwd)
rm -rf "$WORK" /tmp/site && mkdir -p "$OUT" "$WORK/wheels"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$WORK/wheels" . || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WORK"/wheels/flytune_build-*.whl || exit 1
export PYTHONPATH=/tmp/site FLYTUNE_CACHE_DIR=$WORK/scratch
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import sys, torch, triton; p = torch.cuda.get_device_properties(0); print(sys.version); \
print(torch.__version__, triton.__version__, p.name, p.multi_processor_count)"; nproc; } > "$OUT/env.txt" 2>&1
NAME=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).name)")
UNITS=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)")
target() {   # the project's sm_90 target: this device
  sed -i "s/{ arch = \"sm_90\", name = \"NVIDIA H200\", units = 132 }/{ arch = \"sm_90\", name = \"$NAME\", units = $UNITS }/" "$1"
}
build() {    # project dir -> its wheel installed into /tmp/site
  (cd "$1" && python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$WORK/wheels" .) || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WORK"/wheels/"$2"-*.whl
}
PARTS=" ${PARTS:-features sample dispatch} "
[[ $PARTS == *" features "* ]] && {
  echo "== triton_features: tune on $NAME ($UNITS units)"
  P=$WORK/features && cp -r examples/triton_features "$P" && rm -rf "$P/artifacts/sm_90" "$P/build" "$P"/*.egg-info
  target "$P/pyproject.toml"
  (cd "$P" && PYTHONPATH="/tmp/site" python3 -m flytune_build.cli tune --project . --plan tune/h200.toml --allow-ci \
     --no-progress --no-resume 2>&1 | tail -15)
  build "$P" triton_features || echo "BUILD FAILED"
  cd /tmp
  python3 -m flytune_build.cli verify "$WORK"/wheels/triton_features-*.whl | tail -3
  echo "== serve from the wheel (strict, zero searches)"
  FLYTUNE_CACHE_DIR=$WORK/scratch-serve python3 "$REPO/benchmarks/h200_features.py" serve "$P/tune/h200.toml" 2>&1 | tail -4
  echo "== first calls after a background warm-up"
  python3 "$REPO/benchmarks/h200_features.py" warm "$P/tune/h200.toml" --reps "${REPS:-3}" 2>&1
  echo "== the same, each output size allocated once before the first calls (untimed)"
  python3 "$REPO/benchmarks/h200_features.py" warm "$P/tune/h200.toml" --reps "${REPS:-3}" --prealloc 2>&1
  [ -z "${SHORT:-}" ] && {
  echo "== the same, the calls in reverse order (the process's first call is matmul's)"
  FEATURES_ORDER=reverse python3 "$REPO/benchmarks/h200_features.py" warm "$P/tune/h200.toml" --reps "${REPS:-3}" \
    --prealloc 2>&1 | tail -9
  echo "== the same two, a one-program Triton kernel of the script's own launched before the first calls (untimed)"
  FEATURES_TINY=1 python3 "$REPO/benchmarks/h200_features.py" warm "$P/tune/h200.toml" --reps "${REPS:-3}" \
    --prealloc 2>&1 | tail -9
  FEATURES_TINY=1 FEATURES_ORDER=reverse python3 "$REPO/benchmarks/h200_features.py" warm "$P/tune/h200.toml" \
    --reps "${REPS:-3}" --prealloc 2>&1 | tail -9
  }
  [ -n "${PROFILE:-}" ] && {
    echo "== two more processes, each first call under cProfile: $OUT/features_profile.txt, features_profile_reverse.txt"
    FEATURES_PROFILE=$OUT/features_profile.txt python3 "$REPO/benchmarks/h200_features.py" warm "$P/tune/h200.toml" \
      --reps 1 --prealloc 2>&1 | tail -9
    FEATURES_ORDER=reverse FEATURES_PROFILE=$OUT/features_profile_reverse.txt python3 \
      "$REPO/benchmarks/h200_features.py" warm "$P/tune/h200.toml" --reps 1 --prealloc 2>&1 | tail -9
  }
  cd "$REPO"
} > "$OUT/features.txt" 2>&1
[[ $PARTS == *" sample "* ]] && {
  echo "== sample wheel (committed sm_90 artifacts)"
  S=$WORK/sample && cp -r sample_pkg "$S" && rm -rf "$S/build" "$S"/*.egg-info   # its H200 target kept: an H100 is served at arch_units
  build "$S" sample_pkg || echo "BUILD FAILED"
  cd /tmp
  python3 "$REPO/benchmarks/warmup_inprocess.py" --plan "$REPO/sample_pkg/tune/h200.toml" --out "$OUT" \
    --modes "${MODES:-background,bg_prealloc}" --reps "${REPS:-3}" 2>&1 | tail -20
  mv "$OUT/warmup_inprocess.json" "$OUT/sample.json"
  cd "$REPO"
} > "$OUT/sample.txt" 2>&1
[[ $PARTS == *" dispatch "* ]] && python3 benchmarks/dispatch_overhead.py > "$OUT/dispatch.txt" 2>&1
for f in features sample dispatch; do [ -f "$OUT/$f.txt" ] && grep -v '^{' "$OUT/$f.txt" | tail -24; done
