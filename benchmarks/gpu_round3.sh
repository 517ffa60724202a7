#!/usr/bin/env bash
# GPU round: tests, sanitizers, instrumentation and launch overhead, re-recorded traces.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python -m pytest tests/test_fwd_gpu.py -q -n 8 -p no:cacheprovider 2>&1 | tail -4
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool"
  compute-sanitizer --tool $tool python benchmarks/sanitize_case.py 2>&1 | grep -v "^=========     \|Warning" | tail -6
done
python benchmarks/profile_overhead.py --out "$OUT/profile_overhead.json" 2>&1 | tail -5
python benchmarks/launch_overhead.py --out "$OUT/launch_overhead.json" 2>&1 | tail -6
for s in static lpt dynamic; do
  python -m jfa_prof record --grid hsp --lq 256 --max-kv 2048 --sparsity 0.1 --schedule $s -o "$OUT/h200_hsp_lq256_kv2048_s0.1_$s.jfatrace" 2>&1 | grep -v Warn
done
python -m jfa_prof record --grid hsp --lq 128 --max-kv 1024 --sparsity 0.5 --schedule lpt --level 1 -o "$OUT/small_hsp_lq128_kv1024_s0.5_lpt_tiles.jfatrace" 2>&1 | grep -v Warn
