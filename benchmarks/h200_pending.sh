#!/usr/bin/env bash
# The GPU figures docs/benchmarks.md still lacks, each a part of its own (one device call each; a call
# may run at most 10 minutes):
#   tc        torch.compile from the installed compiled-model wheel: two cold served compiles (S1, S2),
#             autotune seconds and configs against the shipped ones (about 1 minute)
#   ma        max-autotune: cold (A), a harvest (H) with flytune's coordinate-descent selection, and a
#             served compile (S1) with H's winners (about 3 minutes)
#   features  examples/triton_features end to end: kept @triton.autotune kernels tuned with checked
#             outputs and flytune's selection, built, installed, served with zero search (about 3 minutes)
#
# Usage (repo root, on the GPU machine; for tc, flytune-build and examples/compiled_model installed as
# wheels, e.g. `pip install --target DIR ...` with DIR on PYTHONPATH):
#   PARTS=tc,ma bash benchmarks/h200_pending.sh OUTDIR
#   PARTS=features bash benchmarks/h200_pending.sh OUTDIR
set -uo pipefail
DEST=${1:?usage: PARTS=tc,ma,features bash benchmarks/h200_pending.sh OUTDIR}
mkdir -p "$DEST"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
rc=0
for part in ${PARTS//,/ }; do
  start=$SECONDS
  case $part in
    tc)
      TRITON_DISABLE_LINE_INFO=1 timeout 300 "$PY" benchmarks/inductor_compile.py --installed --out "$DEST/tc" \
        --phases tc --steps S1,S2 --timeout 120 || rc=1 ;;
    ma)
      timeout 420 "$PY" benchmarks/inductor_compile.py --out "$DEST/ma" --phases ma --steps A,H,S1 --timeout 130 \
        || rc=1 ;;
    features)
      timeout 420 bash benchmarks/h200_features.sh "$DEST/features" > "$DEST/features.log" 2>&1 || rc=1
      rm -f "$DEST"/features/*.whl ;;
    *)
      echo "unknown part $part (tc, ma, features)" >&2; exit 2 ;;
  esac
  echo "== $part: $((SECONDS - start)) s"
  rm -rf "$DEST/$part/work/live"   # the compiles' caches (the harvested artifacts stay in work/)
done
exit $rc
