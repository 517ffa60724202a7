#!/usr/bin/env bash
# GPU round: bundled/test traces, then the forward bench over the HSP grid (with FA4 when importable).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
for s in static lpt dynamic; do
  python -m jfa_prof record --grid hsp --lq 256 --max-kv 2048 --sparsity 0.1 --schedule $s -o "$OUT/h200_hsp_lq256_kv2048_s0.1_$s.jfatrace"
done
for s in static dynamic; do
  python -m jfa_prof record --grid hsp --lq 128 --max-kv 1024 --sparsity 0.5 --schedule $s -o "$OUT/small_hsp_lq128_kv1024_s0.5_$s.jfatrace"
done
fa4=""; python -c "import flash_attn.cute" 2>/dev/null && fa4="--fa4"
python benchmarks/fwd_bench.py --grid hsp --rep-ms 100 $fa4 --out "$OUT/fwd_hsp.json" 2>&1 | grep -v Warning | tail -25
