#!/usr/bin/env bash
# examples/triton_features end to end on an H200 (torch + triton installed, no network):
#   1. tune its H200 plan with `flytune tune` (pre_hook, @triton.heuristics over @triton.autotune,
#      prune_configs_by kernels), in a scratch copy of the example;
#   2. build flytune_build's wheel from this checkout and the example's wheel with it;
#   3. install both into a fresh venv (--no-index --no-deps; torch and triton from this python's site);
#   4. serve every tuned shape from the installed wheel with zero searches (FLYTUNE_AUTOTUNE=strict,
#      asserted through flytune_build.stats()), then `flytune verify --deep --execute` it;
#   5. time each kernel's first call against stock @triton.autotune, cold processes, one run.
# Logs, the wheels and the tuned artifacts (sm_90_artifacts.tgz: untar into examples/triton_features)
# go to OUTDIR.
#
#   bash benchmarks/h200_features.sh OUTDIR          (repo root, on the GPU machine)
#   DRY_RUN=1 bash benchmarks/h200_features.sh OUTDIR
# DRY_RUN=1 needs no GPU: the same steps under TRITON_INTERPRET=1, the interpreter posing as the H200
# (FLYTUNE_DEVICE), the interpreter plan ranked synthetically. It checks the plumbing; it measures nothing.
set -uo pipefail
OUT=${1:?usage: bash benchmarks/h200_features.sh OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d)
export PYTHONUNBUFFERED=1 FLYTUNE_CACHE_DIR="$WORK/scratch"
if [ "${DRY_RUN:-0}" = 1 ]; then
  export TRITON_INTERPRET=1 FLYTUNE_DEVICE="cuda:sm_90:132:NVIDIA H200"
  PLAN=tune/interpreter.toml RANKING=(--ranking synthetic)
else
  PLAN=tune/h200.toml RANKING=()
fi
step() { echo; echo "== $*"; }
FAILED=()
check() { [ "$1" = 0 ] || FAILED+=("$2"); }          # a failed check is reported at the end; the rest runs
need() { [ "$1" = 0 ] || { echo "flytune: $2 failed: stopping" >&2; exit 1; }; }   # later steps depend on it

step "environment" | tee "$OUT/env.txt"
{ command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv || true
  "$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "DRY_RUN=${DRY_RUN:-0} plan=$PLAN"; } 2>&1 | tee -a "$OUT/env.txt"

step "tune $PLAN (flytune tune, in a scratch copy of the example)"
cp -r "$REPO/examples/triton_features" "$WORK/proj"
rm -rf "$WORK/proj/artifacts/sm_90" "$WORK/proj/build" "$WORK/proj"/*.egg-info
(cd "$WORK/proj" && PYTHONPATH="$REPO" "$PY" -m flytune_build.cli tune --project . --plan "$PLAN" --allow-ci \
   --no-progress --no-resume "${RANKING[@]}") 2>&1 | tee "$OUT/tune.txt"
need $? "tune"
tar czf "$OUT/sm_90_artifacts.tgz" -C "$WORK/proj" artifacts/sm_90
PYTHONPATH="$REPO" "$PY" -m flytune_build.cli verify "$WORK/proj" 2>&1 | tee "$OUT/verify_project.txt"
check $? "verify the tuned project"

step "build flytune_build and triton-features wheels; install both into a fresh venv"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$REPO" 2>&1 | tail -5
need $? "building flytune_build's wheel"
"$PY" -m venv --without-pip "$WORK/venv"
need $? "making the venv"
VPY="$WORK/venv/bin/python"
# torch, triton, pip and setuptools come from this interpreter, after the venv's own packages
"$PY" -c "import site; print('\n'.join(site.getsitepackages()))" \
  > "$("$VPY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/parent_site.pth"
"$VPY" -m pip install -q --no-index --no-deps "$WORK"/dist/flytune_build-*.whl
need $? "installing flytune_build"
(cd "$WORK/proj" && "$VPY" -m pip wheel --no-deps --no-build-isolation -w "$WORK/dist" .) 2>&1 | tee "$OUT/build.txt" | tail -20
need $? "building the triton-features wheel"
"$VPY" -m pip install -q --no-index --no-deps "$WORK"/dist/triton_features-*.whl
need $? "installing triton-features"
cp "$WORK"/dist/*.whl "$OUT/"
cd "$WORK"  # from here on the installed packages, never the source trees
export FLYTUNE_CACHE_DIR="$WORK/scratch-serve"  # as on a new machine: no winner searched here before
"$VPY" -c "import flytune_build, triton_features; print(flytune_build.__file__); print(triton_features.__file__)" \
  | tee -a "$OUT/build.txt"
"$VPY" -m flytune_build.cli verify "$WORK"/dist/triton_features-*.whl | tee "$OUT/verify.txt"
check $? "verify the wheel"
"$VPY" -m flytune_build.cli inspect "$WORK"/dist/triton_features-*.whl | tee "$OUT/inspect.txt"

step "serve every tuned shape from the installed wheel: zero searches"
"$VPY" "$REPO/benchmarks/h200_features.py" serve "$WORK/proj/$PLAN" 2>&1 | tee "$OUT/serve.txt"
check $? "serve with zero searches"

step "verify --deep --execute of the installed distribution"
"$VPY" -m flytune_build.cli verify --deep --execute triton-features 2>&1 | tee "$OUT/verify_execute.txt"
check $? "verify --deep --execute"

step "first call vs stock @triton.autotune, cold processes"
"$VPY" "$REPO/benchmarks/h200_features.py" first-call "$WORK/proj/$PLAN" --reps "${REPS:-3}" 2>&1 \
  | tee "$OUT/first_call.txt"
check $? "first call"
echo
if [ ${#FAILED[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${FAILED[@]}" | tee "$OUT/FAILED.txt"; echo "logs in $OUT"; exit 1
fi
echo "all steps passed: logs in $OUT"
