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
# One worker per CPU (pytest-xdist): much of the suite waits on subprocesses (builds, pip, venvs, fleet
# workers). A file's tests stay on one worker (--dist loadfile): its module fixtures are built once, and
# test_fleet's local Ray clusters never start side by side. FLYTUNE_TEST_WORKERS=N sets the count (0: one
# process); more workers than CPUs crowd the tests that time lock waits (test_hardening's sixteen writers).
# The tests marked `timed` tune on real measured time (they assert only what the selection rule guarantees
# in any run, and print how often cold runs agreed): they run after the rest, in one process, so the
# suite's own workers are never their load. Exit 5 is pytest's "nothing selected".
PYTEST=(.venv-test/bin/python -m pytest -q)
rc=0
"${PYTEST[@]}" -n "${FLYTUNE_TEST_WORKERS:-auto}" --dist loadfile -m "not timed" "$@" || rc=$?
timed=0
"${PYTEST[@]}" -p no:xdist -m timed "$@" || timed=$?
if [ "$rc" -eq 5 ] && [ "$timed" -ne 5 ]; then rc=0; fi   # only timed tests were selected
if [ "$timed" -ne 0 ] && [ "$timed" -ne 5 ]; then rc=$timed; fi
exit "$rc"
