#!/usr/bin/env bash
# GPU round: re-record the bundled and test traces (kernel time from the profiler), then the
# instrumentation overhead, then the GPU tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
for s in static lpt dynamic; do
  python -m jfa_prof record --grid hsp --lq 256 --max-kv 2048 --sparsity 0.1 --schedule $s -o "$OUT/h200_hsp_lq256_kv2048_s0.1_$s.jfatrace"
done
for s in static dynamic; do
  python -m jfa_prof record --grid hsp --lq 128 --max-kv 1024 --sparsity 0.5 --schedule $s -o "$OUT/small_hsp_lq128_kv1024_s0.5_$s.jfatrace"
done
python benchmarks/profile_overhead.py --out "$OUT/profile_overhead.json" 2>&1 | tail -8
python -m pytest tests/test_fwd_gpu.py -q -n 8 -p no:cacheprovider 2>&1 | tail -3
