#!/usr/bin/env bash
# Issue 27 on the GPU machine: benchmarks/h200_determinism.sh on the sample's H200 plan (15 shapes) and on
# benchmarks/h200_wide.toml (22 shapes), each packed into DEST/<plan>.tgz (report.txt, summary.json, logs,
# artifacts), the reports printed last.   Usage (repo root): bash benchmarks/h200_determinism_two_plans.sh DEST
set -uo pipefail
DEST=${1:-${OUT:?give DEST or set OUT}}
WORK=$(mktemp -d)
PLANS=${PLANS:-"h200:sample_pkg/tune/h200.toml wide:benchmarks/h200_wide.toml"}   # name:plan ...
for plan in $PLANS; do
  name=${plan%%:*}
  PLAN=${plan#*:} LIMIT=${LIMIT:-150} bash benchmarks/h200_determinism.sh "$WORK/$name" > "$WORK/$name.out" 2>&1
  echo "== $name: exit $?"
  tar czf "$DEST/$name.tgz" -C "$WORK" "$name" "$name.out"
done
for plan in $PLANS; do name=${plan%%:*}; echo "=== $name"; cat "$WORK/$name/report.txt" 2>/dev/null | grep -v "^$" | tail -60; done
