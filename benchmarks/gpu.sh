#!/usr/bin/env bash
# The GPU jobs, by name, from the repo root on a machine with an sm_90 GPU and fbtriton importable:
#   bash benchmarks/gpu.sh tests sanitize record overhead profile bench bench_bwd flex waterfall waterfall_bwd ncu ncu_bwd
#   bwd_variants fwd_variants o_buf stream record_bwd host bwd_ab bwd_breakdown {fwd,bwd}_patch_{ab,tests} ncu_prof
#   calibration limits roles
# Results go to $OUT (default ./out); each job prints a short summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}; mkdir -p "$OUT"

tests() {  # kernel correctness against the fp32 reference; the jobs after it run only if it passes
  # Only the files that hold GPU tests: the others may need packages a GPU image lacks (nbclient).
  # The timer tests run alone afterwards: sixteen workers sharing the GPU would time each other.
  python -m pytest $(grep -l "pytest.mark.gpu" tests/test_*.py | grep -v test_timing) -m gpu -q -n 16 \
    -p no:cacheprovider 2>&1 | grep -v Warning | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "GPU tests failed: stopping" >&2; exit 1; }
  python -m pytest tests/test_timing.py -m gpu -q -p no:cacheprovider 2>&1 | grep -v Warning | tail -3
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "GPU timer tests failed: stopping" >&2; exit 1; }
}
sanitize() {  # memcheck and racecheck on a small case of every schedule
  # Each tool under a limit of its own (SANITIZE_LIMIT seconds), so a run cut short says which tool it
  # cut and how far it got instead of ending silently.
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool"
    timeout ${SANITIZE_LIMIT:-300} compute-sanitizer --tool $tool python benchmarks/sanitize_case.py 2>&1 \
      | grep -v "^=========     \|Warning" | tail -6
    [ "${PIPESTATUS[0]}" -ne 124 ] || echo "$tool cut off after ${SANITIZE_LIMIT:-300} s: not run to its end"
  done
}
record() {  # the bundled heatmap recordings (HSP s=0.1) and the small test recordings
  for s in static lpt dynamic; do
    python -m jfa_prof record --grid hsp --lq 256 --max-kv 2048 --sparsity 0.1 --schedule $s \
      -o "$OUT/h200_hsp_lq256_kv2048_s0.1_$s.jfatrace" 2>&1 | grep -v Warn
  done
}
record_bwd() {  # a backward recording (HSP s=0.5), each schedule
  for s in static dynamic; do
    python -m jfa_prof record --pass bwd --grid hsp --lq 256 --max-kv 2048 --sparsity 0.5 --schedule $s \
      -o "$OUT/h200_bwd_hsp_lq256_kv2048_s0.5_$s.jfatrace" 2>&1 | grep -v Warn
  done
}
overhead() {  # instrumentation and host-launch overhead
  profile
  python benchmarks/launch_overhead.py --out "$OUT/launch_overhead.json" 2>&1 | tail -6
}
host() {  # where one call's host time goes, piece by piece, beside FA4's when importable; when each launch is enqueued
  python benchmarks/host_path.py --out "$OUT/host_path.json" 2>&1 | grep -v Warn | tail -44
  python benchmarks/host_timeline.py --out "$OUT/host_timeline.json" 2>&1 | grep -v Warn | tail -4
}
roles() {  # level-3 recordings of the op's build, planted bottlenecks and ablations; every level's cost, both passes
  python benchmarks/roles_record.py --out-dir "$OUT/traces" 2>&1 | grep -v Warn | tail -12
  python benchmarks/roles_cost.py --out "$OUT/roles_cost.json" 2>&1 | grep -v Warn | tail -36
}
profile() {  # what each instrumentation level costs, and each schedule uninstrumented
  python benchmarks/profile_overhead.py --out "$OUT/profile_overhead.json" 2>&1 | tail -5
}
bench() {  # forward over the HSP and dense grids beside the peers (FA4 when importable)
  for grid in ${BENCH_GRIDS:-hsp dense}; do
    python -m jfa_prof bench --pass fwd --grid $grid --peers fa4,varlen,sdpa --no-detail \
      --out "$OUT/bench_fwd_$grid.json" --html "$OUT/bench_fwd_$grid.html" 2>&1 | grep -v Warning | tail -25
  done
}
limits() {  # both passes on the HSP and dense grids beside FA4, with our kernel recorded at every point: what limits each
  for pg in ${LIMITS_RUNS:-fwd,hsp bwd,hsp fwd,dense bwd,dense}; do
    IFS=, read -r pass grid <<< "$pg"
    python -m jfa_prof bench --pass $pass --grid $grid --peers ${LIMITS_PEERS:-fa4} --no-detail --limits \
      --out "$OUT/limits_${pass}_$grid.json" 2>&1 | grep -v Warning | tail -${LIMITS_TAIL:-24}
  done
}
bench_bwd() {  # backward over the HSP and dense grids beside the peers (FA4 when importable)
  for grid in ${BENCH_GRIDS:-hsp dense}; do
    python -m jfa_prof bench --pass bwd --grid $grid --peers ${BWD_PEERS:-fa4,varlen} --no-detail \
      --out "$OUT/bench_bwd_$grid.json" --html "$OUT/bench_bwd_$grid.html" 2>&1 | grep -v Warning | tail -25
  done
}
waterfall_bwd() {  # what the backward's dQ costs, per reduction (TMA 2 stages, 1 stage, atomics)
  for pt in ${WATERFALL_POINTS:-256,2048,0.5 128,1024,0.1}; do
    IFS=, read -r lq kv s <<< "$pt"
    for dq in ${WATERFALL_DQ:-tma tma1 atomic}; do
      python -m jfa_prof waterfall --pass bwd --dq $dq --lq "$lq" --max-kv "$kv" --sparsity "$s" --cumulative \
        --save "$OUT/waterfall_bwd_${dq}_hsp_lq${lq}_kv${kv}_s$s.json" --out "$OUT/wf.html" 2>&1 \
        | grep -v Warning | tail -9
    done
  done
}
flex() {  # FlexAttention compiles per point (tens of seconds), so two HSP points only
  python -m jfa_prof bench --pass fwd --grid hsp --peers flex --label "hsp Lq=128 max=1024 s=0.5" \
    --label "hsp Lq=256 max=2048 s=0.5" --out "$OUT/bench_fwd_hsp_flex.json" 2>&1 | grep -v Warning | tail -8
}
waterfall() {  # what each piece of the forward costs, on three HSP points
  # Points as Lq,max_kv,sparsity, space-separated.
  for pt in ${WATERFALL_POINTS:-256,2048,0.5 256,2048,0.1 128,1024,0.9}; do
    IFS=, read -r lq kv s <<< "$pt"
    python -m jfa_prof waterfall --pass fwd --lq "$lq" --max-kv "$kv" --sparsity "$s" --cumulative \
      --save "$OUT/waterfall_hsp_lq${lq}_kv${kv}_s$s.json" 2>&1 | grep -v Warning | tail -14
  done
}
ncu() {  # hardware counters of the forward: schedules, then peeled vs every block masked
  python -m jfa_prof ncu --schedule static --vs-schedule dynamic --grid hsp --lq 256 --max-kv 2048 --sparsity 0.1 \
    -o "$OUT/fwd_static.ncu-rep" --json > "$OUT/ncu_fwd_static_vs_dynamic.json" 2> "$OUT/ncu_err1.txt"
  tail -3 "$OUT/ncu_err1.txt"
  python -m jfa_prof ncu --schedule static --vs-no-peel --grid hsp --lq 256 --max-kv 2048 --sparsity 0.1 \
    -o "$OUT/fwd_static_peel.ncu-rep" 2>&1 | grep -v Warning | tail -40
}
bwd_variants() {  # the backward's build choices side by side (dQ reduction, schedule, block, tile-boundary work)
  python benchmarks/bwd_variants.py --out "$OUT/bwd_variants.json" 2>&1 | grep -v Warn | tail -24
}
fwd_variants() {  # the forward's K/V ring depth and Q buffers per consumer side by side
  python benchmarks/fwd_variants.py --out "$OUT/fwd_variants.json" 2>&1 | grep -v Warn | tail -21
}
o_buf() {  # the forward's output staged in its own buffers against the Q buffer, every HSP point, both orders
  python benchmarks/fwd_variants.py --out "$OUT/fwd_o_buf.json" --schedule dynamic --compare o_buf 2>&1 | grep -v Warn | tail -36
  python benchmarks/fwd_variants.py --out "$OUT/fwd_o_buf_reverse.json" --schedule dynamic --compare o_buf --reverse \
    2>&1 | grep -v Warn | tail -36
}
stream() {  # what keeps the forward from the HBM ceiling at the memory-bound points
  python benchmarks/fwd_stream.py --out "$OUT/fwd_stream.json" 2>&1 | grep -v Warn | tail -5
}
bwd_ab() {  # other backward builds against the checkout's: BWD_BEFORE="file ..." (git show REV:kernels/bwd.py > file),
  # BWD_BEFORE_LABEL="name ..." (one per file)
  local args=() labels=(${BWD_BEFORE_LABEL:-})
  local i=0
  for f in ${BWD_BEFORE:?set BWD_BEFORE to other kernels/bwd.py files}; do
    args+=(--before "$f")
    [ -n "${labels[$i]:-}" ] && args+=(--label-before "${labels[$i]}")
    i=$((i + 1))
  done
  python benchmarks/bwd_ab.py "${args[@]}" --out "$OUT/bwd_ab.json" 2>&1 | grep -v Warn | tail -8
}
_patched() {  # kernels/$1.py with the patches in $2 applied in turn ("a.diff+b.diff", files in patches/), written to
  # $3; a patch is made against the kernel of its day and may need refreshing after kernel changes
  local kernel=$1 patches=$2 out=$3 p
  cp "kernels/$kernel.py" "$out"
  for p in ${patches//+/ }; do
    patch -s -N -r - "$out" "benchmarks/results/patches/$p" < /dev/null \
      || { echo "patches/$p does not apply to this kernels/$kernel.py (after those before it in $patches)" >&2; return 1; }
  done
}
bwd_breakdown() {  # where each backward consumer's time goes at the tile boundary (clock reads in both consumers)
  _patched bwd bwd_epilogue_breakdown.diff "$OUT/bwd_breakdown.py" || return 1
  python benchmarks/bwd_epilogue_breakdown.py --build "$OUT/bwd_breakdown.py" --out "$OUT/bwd_epilogue_breakdown.json" \
    2>&1 | grep -v Warn | tail -12
}
patch_ab() {  # $1's builds made of patches (PATCHES="LABEL=FILE.diff[+FILE.diff] ...", files in patches/) against
  # the checkout, kernel alone at POINTS, each at the instrumentation LEVELS (default 0; "0 2" times an instrumentation
  # patch's cost beside the plain kernel): each build checked against the fp32 reference and bit for bit (the forward's
  # O, the backward's dK / dV) first. A time limit: a synchronization mistake hangs rather than fails.
  local pass=$1 args=() spec
  for spec in ${PATCHES:?set PATCHES to LABEL=FILE.diff ...}; do
    _patched "$pass" "${spec#*=}" "$OUT/${pass}_${spec%%=*}.py" || return 1
    args+=(--build "${spec%%=*}=$OUT/${pass}_${spec%%=*}.py")
  done
  timeout ${AB_LIMIT:-420} python benchmarks/kernel_ab.py --pass "$pass" "${args[@]}" --rounds ${ROUNDS:-3} \
    --levels ${LEVELS:-0} \
    --points ${POINTS:-256,2048,0.5 256,4096,0.9 256,1024,0.9 128,1024,0.1 128,4096,0.9 dense jagged,2048,1,causal} \
    --out "$OUT/${pass}_patch_ab.json" 2>&1 | grep -v Warn | tail -${AB_TAIL:-12}
}
patch_tests() {  # every GPU test and the sanitizers with $1's kernel patched (PATCH=FILE.diff[+FILE.diff]), then the
  # checkout restored
  local pass=$1
  _patched "$pass" "${PATCH:?set PATCH to files in patches/}" "$OUT/${pass}_patched.py" || return 1
  cp "kernels/$pass.py" "$OUT/${pass}_checkout.py" && cp "$OUT/${pass}_patched.py" "kernels/$pass.py"
  (tests) && sanitize
  cp "$OUT/${pass}_checkout.py" "kernels/$pass.py"
}
# The jobs by pass; the backward's keep their BWD_ variables (the commands recorded beside their results use them).
fwd_patch_ab() { patch_ab fwd; }
fwd_patch_tests() { patch_tests fwd; }
bwd_patch_ab() {
  PATCHES=${BWD_PATCHES:-${PATCHES:-}} ROUNDS=${BWD_ROUNDS:-${ROUNDS:-3}} POINTS=${BWD_POINTS:-${POINTS:-}} \
    AB_LIMIT=${BWD_AB_LIMIT:-${AB_LIMIT:-420}} AB_TAIL=${BWD_AB_TAIL:-${AB_TAIL:-12}} patch_ab bwd
}
bwd_patch_tests() { PATCH=${BWD_PATCH:-${PATCH:-}} patch_tests bwd; }
ncu_prof() {  # hardware counters of the forward uninstrumented (A) against tile records and spans (B), per schedule
  for s in ${NCU_SCHEDULES:-static dynamic}; do
    python -m jfa_prof ncu --schedule $s --vs-profile 1 --grid hsp --lq 256 --max-kv 2048 --sparsity 0.1 \
      -o "$OUT/fwd_${s}_prof0.ncu-rep" --json > "$OUT/ncu_fwd_${s}_vs_prof1.json" 2> "$OUT/ncu_prof_err_$s.txt"
    tail -2 "$OUT/ncu_prof_err_$s.txt"
    python -m jfa_prof ncu --report "$OUT/fwd_${s}_prof0.ncu-rep" --compare "$OUT/fwd_${s}_prof0.vs-$s-prof1.ncu-rep" \
      --top 12 2>&1 | grep -v Warning | tail -40
  done
}
calibration() {  # the forward against the TLX Hopper tutorial kernel on dense shapes, then ncu of each
  python benchmarks/fwd_calibration.py --out "$OUT/fwd_calibration.json" 2>&1 | grep -v Warn | tail -9
  local ncu metrics
  ncu=$(python -c "from jfa_prof.ncu_live import require_ncu; print(require_ncu())") || return 1
  metrics=$(python -c "from jfa_prof import ncu_metrics; print(ncu_metrics.metric_list('sm_90'))")
  for t in jfa tutorial; do
    "$ncu" --clock-control none -k regex:'^(_jfa_fwd|_attn_fwd_ws_pipelined_pingpong_persistent)$' -s 2 -c 1 \
      --metrics "$metrics" --section WarpStateStats -o "$OUT/fwd_dense_$t" -f \
      python benchmarks/fwd_calibration.py --ncu-target $t > "$OUT/ncu_calibration_$t.log" 2>&1
    tail -1 "$OUT/ncu_calibration_$t.log"
  done
  python -m jfa_prof ncu --report "$OUT/fwd_dense_jfa.ncu-rep" --compare "$OUT/fwd_dense_tutorial.ncu-rep" 2>&1 \
    | grep -v Warning | tail -40
}
ncu_bwd() {  # hardware counters of the backward: TMA reduce-add vs atomics for dQ
  python -m jfa_prof ncu --pass bwd --dq tma --vs-dq atomic --grid hsp --lq 256 --max-kv 2048 --sparsity 0.5 \
    -o "$OUT/bwd_tma.ncu-rep" 2>&1 | grep -v Warning | tail -40
}

for job in "${@:-tests}"; do
  "$job"
done
