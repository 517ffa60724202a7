#!/usr/bin/env bash
# GPU round: doctor, compute-sanitizer memcheck/racecheck on small cases, a live heatmap.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python -m jfa_prof doctor 2>&1 | tee "$OUT/doctor.txt"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool"
  compute-sanitizer --tool $tool python benchmarks/sanitize_case.py 2>&1 | grep -v "^=========     \|Warning" | tail -8
done
python -m jfa_prof heatmap --clc both --grid hsp --lq 128 --max-kv 1024 --sparsity 0.1 --out "$OUT/live_heatmap.html" 2>&1 | head -30
