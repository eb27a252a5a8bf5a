#!/usr/bin/env bash
# Zero-compile first calls on an H200, one run: re-tune the sample's H200 plan (measured ranking) so
# every artifact records its specialization, build flytune-build and the sample wheel, install both
# into a venv that takes torch and triton from the machine, then benchmarks/warmup_first_call.py:
# cold first calls (a), `flytune warmup` (b), first calls after it (c), warm-cache first calls (d),
# stock triton.autotune (e), and a copied-in Triton cache: whole (f) and kernels only (g); each first
# call in a fresh process. About 8 minutes on the H200 machine.
#
# Usage (repo root, GPU machine, no network needed): bash benchmarks/h200_warmup.sh [OUTDIR]   (default: $OUT)
# With TRITON_INTERPRET=1 the same steps run on the CPU over the interpreter plan (synthetic ranking):
# nothing compiles there, so the figures mean nothing, but every step's plumbing is exercised.
# OUTDIR receives at most 7 files: h200_warmup.log, gpu.txt, tune.txt, sm_90_artifacts.tgz (the
# re-tuned artifacts, with their specialization), warmup.json, warmup.csv, warmup_report.json.
set -uo pipefail
OUT=${1:-${OUT:?usage: bash benchmarks/h200_warmup.sh OUTDIR}}
mkdir -p "$OUT"
REPO=$(pwd)
PY=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/flytune-warmup.XXXXXX)
exec > >(tee "$OUT/h200_warmup.log") 2>&1
export PYTHONUNBUFFERED=1 FLYTUNE_AUTOTUNE=0 FLYTUNE_CACHE_DIR="$WORK/scratch"
if [ "${TRITON_INTERPRET:-0}" = 1 ]; then
  PLAN=interpreter.toml; ARCH=interpreter; RANKING=synthetic
else
  PLAN=h200.toml; ARCH=sm_90; RANKING=measured
fi
start=$SECONDS

echo "== machine"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
  $PY -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  nproc; } | tee "$OUT/gpu.txt"

echo "== re-tune the sample's $PLAN ($RANKING ranking): each artifact records its specialization"
cp -r sample_pkg "$WORK/sample_pkg"
rm -rf "$WORK/sample_pkg/artifacts/$ARCH" "$WORK/sample_pkg/build" "$WORK"/sample_pkg/*.egg-info
TRITON_CACHE_DIR="$WORK/tune-cache" PYTHONPATH="$REPO" $PY -m flytune_build.cli tune --project "$WORK/sample_pkg" \
  --plan "$WORK/sample_pkg/tune/$PLAN" --output "$WORK/sample_pkg/artifacts/$ARCH" --ranking "$RANKING" \
  --no-resume --no-progress --allow-ci 2>&1 | tee "$OUT/tune.txt" || exit 1
tar czf "$OUT/${ARCH}_artifacts.tgz" -C "$WORK/sample_pkg" "artifacts/$ARCH"
grep -L '"specialization"' "$WORK/sample_pkg/artifacts/$ARCH"/*.json | sed 's/^/NO SPECIALIZATION: /'
echo "tune + copy: $((SECONDS - start)) s"

echo "== build flytune-build and the sample wheel, install both into a venv (torch, triton from the machine)"
$PY -m pip wheel -q --no-deps --no-build-isolation "$REPO" -w "$WORK/dist" || exit 1
$PY -m venv --system-site-packages "$WORK/venv" || exit 1
VPY="$WORK/venv/bin/python"
if ! "$VPY" -c "import torch, triton" 2>/dev/null; then  # $PY is itself a venv: see its packages through a .pth
  "$PY" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" \
    > "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/parent_site.pth"
fi
"$VPY" -m pip install -q --no-deps --no-index "$WORK"/dist/flytune_build-*.whl || exit 1
(cd "$WORK" && "$VPY" -m pip wheel -q --no-deps --no-build-isolation ./sample_pkg -w "$WORK/dist" 2>&1 | tail -20) || exit 1
"$VPY" -m pip install -q --no-deps --no-index "$WORK"/dist/sample_pkg-*.whl || exit 1
(cd /tmp && "$VPY" -m flytune_build.cli verify sample-pkg) || exit 1
echo "build + install: $((SECONDS - start)) s"

echo "== first calls, each in a fresh process"
(cd /tmp && "$VPY" "$REPO/benchmarks/warmup_first_call.py" --plan "$WORK/sample_pkg/tune/$PLAN" --out "$OUT" \
  --work "$WORK") || exit 1
echo "total: $((SECONDS - start)) s"
rm -rf "$WORK"
