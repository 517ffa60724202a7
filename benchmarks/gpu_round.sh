#!/usr/bin/env bash
# One GPU round: correctness tests, the forward bench, bundled/test traces and ncu reports.
# Run from the repo root on the GPU machine with fbtriton importable; results go to $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"
python -m pytest tests/test_fwd_gpu.py -q -n 8 -p no:cacheprovider 2>&1 | tail -15
python benchmarks/fwd_bench.py --grid hsp --rep-ms 100 --out "$OUT/fwd_hsp.json" 2>&1 | tail -20
for s in static lpt dynamic; do
  python -m jfa_prof record --grid hsp --lq 256 --max-kv 2048 --sparsity 0.1 --schedule $s -o "$OUT/h200_hsp_lq256_kv2048_s0.1_$s.jfatrace"
done
for s in static dynamic; do
  python -m jfa_prof record --grid hsp --lq 128 --max-kv 1024 --sparsity 0.5 --schedule $s -o "$OUT/small_hsp_lq128_kv1024_s0.5_$s.jfatrace"
done
metrics=sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor.sum,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum,launch__registers_per_thread,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
for s in lpt dynamic; do
  ncu --clock-control none -k regex:_jfa_fwd -s 2 -c 1 --metrics $metrics --section WarpStateStats -o "$OUT/fwd_$s" -f \
    python benchmarks/fwd_once.py --lq 128 --max-kv 1024 --sparsity 0.5 --schedule $s 2>&1 | tail -2
done
ls -la "$OUT"
