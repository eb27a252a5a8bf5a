#!/usr/bin/env bash
# The main job from a fresh clone: build the pre-tuned sample wheel with flytune's backend (isolated,
# sdist -> wheel), verify it, install it into a fresh virtual environment and run its kernels,
# printing which tier served each call, then proves in one step that the installed bundle serves every
# tuned shape (FLYTUNE_AUTOTUNE=bundle: a shape no installed bundle serves is a TierMissError saying why;
# the scratch cache, which a tune fills too, is skipped). On a machine without a GPU the kernels run on
# Triton's interpreter, and the `interpreter` artifacts serve.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORK=.demo
rm -rf "$WORK" && mkdir -p "$WORK/dist"
"$PY" -m venv "$WORK/build-env"
"$WORK/build-env/bin/python" -m pip install -q --upgrade pip build
echo "== build flytune-build, then the sample wheel with it (python -m build: sdist, then wheel from the sdist)"
"$WORK/build-env/bin/python" -m build -q --outdir "$WORK/dist" .
PIP_FIND_LINKS="$PWD/$WORK/dist" "$WORK/build-env/bin/python" -m build --outdir "$WORK/dist" sample_pkg \
  | grep -v '^\(copying\|adding\|creating\|running\|writing\|reading\|removing\|\* \)' || true
echo "== install into a fresh virtual environment"
"$PY" -m venv "$WORK/run-env"
"$WORK/run-env/bin/python" -m pip install -q --upgrade pip
"$WORK/run-env/bin/python" -m pip install -q torch==2.13.0 triton==3.6.0 "numpy<2.4"
"$WORK/run-env/bin/python" -m pip install -q --find-links "$WORK/dist" flytune-build sample-pkg
echo "== verify"
"$WORK/run-env/bin/flytune" verify "$WORK"/dist/sample_pkg-*.whl
"$WORK/run-env/bin/flytune" inspect "$WORK"/dist/sample_pkg-*.whl
echo "== run"
if ! "$WORK/run-env/bin/python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  export TRITON_INTERPRET=1
fi
export FLYTUNE_CACHE_DIR="$PWD/$WORK/cache"
(cd "$WORK" && ./run-env/bin/python ../scripts/demo_run.py)
echo "== prove it: FLYTUNE_AUTOTUNE=bundle, where only the installed bundle may serve (the scratch cache is skipped)"
(cd "$WORK" && FLYTUNE_AUTOTUNE=bundle ./run-env/bin/python - ../sample_pkg/tune <<'PROOF'
import importlib
import sys
import tomllib
from pathlib import Path

import flytune_build as ft
from flytune_build.runtime import device

# the plan the shipped artifacts were tuned from, as demo_run.py picks it
plan = Path(sys.argv[1]) / ("interpreter.toml" if device.current().backend == "interpreter" else "h200.toml")
shapes = 0
for entry in tomllib.loads(plan.read_text())["entries"]:
    module, _, name = entry["setup"].partition(":")
    setup = getattr(importlib.import_module(module), name)
    for shape in entry["shapes"]:
        setup(**shape)()  # a TierMissError (kernel, key, device, why) unless the installed bundle serves it
        shapes += 1
calls = {k: s["calls"] for k, s in ft.stats().items()}
offline = sum(c["offline"] for c in calls.values())
print(f"{shapes} tuned shape(s), each served by the installed bundle: offline {offline}, "
      f"scratch {sum(c['scratch'] for c in calls.values())}, searches {sum(s['searches'] for s in ft.stats().values())}")
sys.exit(0 if offline == shapes == sum(sum(c.values()) for c in calls.values()) else 1)
PROOF
)
