#!/usr/bin/env bash
# GEMM template choices served from an installed wheel, on one lent GPU (H100 or H200), per model:
#   H       flytune harvest, max-autotune-no-cudagraphs (coordinate descent and GEMM templates)
#   wheel   examples/compiled_model built with H's artifacts for this GPU (pip wheel through
#           flytune_build.backend), verified, installed with flytune-build: nothing from the checkout
#   A       a cold compile without flytune, saving Inductor's cache artifacts
#   C, C2   a compile in empty caches that loads A's cache artifacts (torch.compiler.load_cache_artifacts);
#           C2's caches at another path
#   S1, S2  cold compiles served from the installed wheel
# Every compile's output against eager; S1 against S2 (same templates and configs).
#   bash benchmarks/gemm_wheel.sh [ENTRY ...]     (default: compiled_model:block compiled_model:mlp;
#                                                  STEPS=A,S1,S2: fewer compile steps; PHASE=tc: torch.compile's
#                                                  default mode instead of max-autotune-no-cudagraphs)
# .whl/ holds the platformdirs wheel. Results: $OUT/env.txt, $OUT/<model>.tgz (its table.txt, steps.json,
# summary.json, verify.txt, logs), $OUT/artifacts.tgz (each model's harvested artifacts).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gemm-wheel-out}
WORK=/tmp/gemm-wheel
RES=$WORK/results  # few files come back from a lent machine: each model's folder is packed into one
rm -rf "$WORK" /tmp/site && mkdir -p "$OUT" "$WORK/wheels" "$RES"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$WORK/wheels" . || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$WORK"/wheels/flytune_build-*.whl \
  || exit 1
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python3 -c "import sys, torch, triton; p = torch.cuda.get_device_properties(0); print(sys.version); \
print(torch.__version__, triton.__version__, p.name, p.multi_processor_count)"; nproc; } > "$OUT/env.txt" 2>&1
NAME=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).name)")
UNITS=$(python3 -c "import torch; print(torch.cuda.get_device_properties(0).multi_processor_count)")
for ENTRY in ${@:-compiled_model:block compiled_model:mlp}; do
  M=${ENTRY#*:}
  mkdir -p "$RES/$M"
  # H: from the checkout (the entry importable from examples/), into a fresh artifact directory
  PYTHONPATH=/tmp/site python3 benchmarks/inductor_compile.py --entry "$ENTRY" --phases "${PHASE:-ma}" --steps H \
    --timeouts H=${H_S:-200} --out "$WORK/$M-h" --mirror "$RES/$M/h" > "$RES/$M/h.log" 2>&1
  PROJ=$WORK/$M-proj
  rm -rf "$PROJ" && cp -r examples/compiled_model "$PROJ" && rm -rf "$PROJ/artifacts" "$PROJ"/build "$PROJ"/*.egg-info
  mkdir -p "$PROJ/artifacts" && cp -r "$WORK/$M-h/work/artifacts-${PHASE:-ma}" "$PROJ/artifacts/sm_90"
  sed -i "s/^targets = .*/targets = [{ arch = \"sm_90\", name = \"$NAME\", units = $UNITS }]/" "$PROJ/pyproject.toml"
  rm -f "$WORK"/wheels/compiled_model-*.whl
  python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$WORK/wheels" "$PROJ" > "$RES/$M/wheel.log" 2>&1
  python3 -m flytune_build.cli verify "$WORK"/wheels/compiled_model-*.whl > "$RES/$M/verify.txt" 2>&1
  echo "verify exit $?" >> "$RES/$M/verify.txt"
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site \
    "$WORK"/wheels/compiled_model-*.whl >> "$RES/$M/wheel.log" 2>&1
  # A, C, C2, S1, S2: the checkout off the path; flytune-build and compiled-model as installed
  python3 benchmarks/inductor_compile.py --installed --shipped "$PROJ/artifacts/sm_90" --entry "$ENTRY" \
    --phases "${PHASE:-ma}" --steps "${STEPS:-A,C,C2,S1,S2}" --timeouts "A=${A_S:-120},C=${C_S:-90},C2=${C_S:-90},S1=${S_S:-90},S2=${S_S:-90}" \
    --out "$WORK/$M-s" --mirror "$RES/$M" > "$RES/$M/s.log" 2>&1
  cp "$WORK/$M-s/summary.json" "$RES/$M/" 2>/dev/null
  tar -C "$RES" -czf "$OUT/$M.tgz" "$M"
  cat "$RES/$M/verify.txt"; tail -c 2500 "$RES/$M/s.log"
done
tar -C "$WORK" -czf "$OUT/artifacts.tgz" $(cd "$WORK" && ls -d *-proj/artifacts) 2>/dev/null
