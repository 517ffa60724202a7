#!/usr/bin/env bash
# The GPU jobs, by name, from the repo root on a machine with an sm_90 GPU and fbtriton importable:
#   bash benchmarks/gpu.sh tests sanitize record overhead bench ncu
# Results go to $OUT (default ./out); each job prints a short summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"

tests() {  # kernel correctness against the fp32 reference
  python -m pytest tests -m gpu -q -n 8 -p no:cacheprovider 2>&1 | tail -4
}
sanitize() {  # memcheck and racecheck on a small case of every schedule
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool"
    compute-sanitizer --tool $tool python benchmarks/sanitize_case.py 2>&1 | grep -v "^=========     \|Warning" | tail -6
  done
}
record() {  # the bundled heatmap recordings (HSP s=0.1) and the small test recordings
  for s in static lpt dynamic; do
    python -m jfa_prof record --grid hsp --lq 256 --max-kv 2048 --sparsity 0.1 --schedule $s \
      -o "$OUT/h200_hsp_lq256_kv2048_s0.1_$s.jfatrace" 2>&1 | grep -v Warn
  done
}
overhead() {  # instrumentation and host-launch overhead
  python benchmarks/profile_overhead.py --out "$OUT/profile_overhead.json" 2>&1 | tail -5
  python benchmarks/launch_overhead.py --out "$OUT/launch_overhead.json" 2>&1 | tail -6
}
bench() {  # forward over the HSP grid beside the peers (FA4 when importable)
  local fa4=""; python -c "import flash_attn.cute" 2>/dev/null && fa4="--fa4"
  python benchmarks/fwd_bench.py --grid hsp --rep-ms 100 $fa4 --out "$OUT/fwd_hsp.json" 2>&1 | grep -v Warning | tail -20
}
ncu() {  # hardware counters of the forward, LPT vs dynamic
  for s in lpt dynamic; do
    python -m jfa_prof ncu --schedule $s --grid hsp --lq 128 --max-kv 1024 --sparsity 0.5 -o "$OUT/fwd_$s.ncu-rep" 2>&1 | tail -3
  done
}

for job in "${@:-tests}"; do
  "$job"
done
