#!/usr/bin/env bash
# The whole test suite from a fresh clone: creates .venv-test, installs everything, runs pytest.
# Tests pin FLYTUNE_AUTOTUNE=0 and run every kernel on Triton's CPU interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-test/bin/python ] || "$PY" -m venv .venv-test
.venv-test/bin/python -m pip install -q --upgrade pip
.venv-test/bin/python -m pip install -q -e ".[test]"
export FLYTUNE_AUTOTUNE=0 TRITON_INTERPRET=1
exec .venv-test/bin/python -m pytest -q "$@"
