#!/usr/bin/env bash
# One session on an H200: tune the sample plan (timed against a sequential triton.autotune search of
# it), build and verify the sample wheel, run it end to end, then measure first-call times.
# Usage (repo root, on the GPU machine): bash benchmarks/h200_session.sh OUTDIR
# With SKIP_TUNE=1 the committed sm_90 artifacts are bundled as they are (no tuning run); with RETUNE=1
# they are re-tuned in place: `flytune tune` into them, keeping each shipped winner unless a candidate is
# faster by more than the margin in the same run (tune.txt says kept / replaced per shape).
# With FIRST_CALL=0 the first-call timing is left out.
set -uo pipefail
OUT=${1:?OUTDIR}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 FLYTUNE_AUTOTUNE=0
python3 -m pip install -q --no-deps --no-build-isolation . 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
if [ "${RETUNE:-0}" = 1 ]; then
  echo "== re-tune the committed artifacts in place (hysteresis against the shipped winners)"
  FLYTUNE_CACHE_DIR=$(mktemp -d) python3 -m flytune_build.cli tune --project sample_pkg --plan sample_pkg/tune/h200.toml \
    --output sample_pkg/artifacts/sm_90 --no-resume --no-progress 2>&1 | tee "$OUT/tune.txt"
  tar czf "$OUT/sm_90_artifacts.tgz" sample_pkg/artifacts/sm_90
elif [ "${SKIP_TUNE:-0}" != 1 ]; then
  echo "== tune (flytune tune vs sequential triton.autotune, cold caches)"
  rm -rf sample_pkg/artifacts/sm_90
  python3 benchmarks/tune_speed.py sample_pkg tune/h200.toml sample_pkg/artifacts/sm_90 2>&1 | tee "$OUT/tune.txt"
  tar czf "$OUT/sm_90_artifacts.tgz" sample_pkg/artifacts/sm_90
fi
echo "== build, verify, install"
rm -rf /tmp/dist && python3 -m pip wheel -q --no-deps --no-build-isolation ./sample_pkg -w /tmp/dist 2>&1 | tail -20
cp /tmp/dist/*.whl "$OUT/" 2>/dev/null
python3 -m flytune_build.cli verify /tmp/dist/*.whl | tee "$OUT/verify.txt"; python3 -m flytune_build.cli inspect /tmp/dist/*.whl | tee "$OUT/inspect.txt"
python3 -m pip install -q --no-deps --force-reinstall /tmp/dist/*.whl 2>&1 | tail -2
echo "== end to end on the installed wheel"
(cd /tmp && FLYTUNE_CACHE_DIR=$(mktemp -d) python3 "$OLDPWD/scripts/demo_run.py") 2>&1 | tee "$OUT/demo.txt"
echo "== verify --deep --execute of the installed distribution"
(cd /tmp && python3 -m flytune_build.cli verify --deep --execute sample-pkg) 2>&1 | tee "$OUT/verify_execute.txt"
if [ "${FIRST_CALL:-1}" != 0 ]; then
  echo "== first call, cold processes"
  (cd /tmp && python3 "$OLDPWD/benchmarks/first_call.py" --reps 3) 2>&1 | tee "$OUT/first_call.txt"
fi
