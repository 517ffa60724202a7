"""The backward's build choices side by side: query rows per step (block_m), dQ staging depth and
the tile schedule, on HSP points, each checked against the fp32 reference's gradients first.
Times the whole backward launch (delta kernel, main kernel, dQ conversion), medians of
triton.testing.do_bench; the first variant is timed twice for the noise.

    python benchmarks/bwd_variants.py --out benchmarks/results/bwd_variants.json
"""
import argparse
import json
import math

from jfa_prof import bench, timing
from jfa_prof.inputs import select_workload
from jfa_prof.kernels.attention import bwd_launch, fwd_launch

VARIANTS = [  # (block_m, dq, dq_stages, schedule)
    (32, "tma", 2, "static"), (32, "tma", 1, "static"), (64, "tma", 2, "static"), (64, "tma", 1, "static"),
    (64, "tma", 2, "dynamic"), (64, "atomic", 1, "static"), (64, "deterministic", 1, "static"),
]
POINTS = ((256, 2048, 0.5), (128, 1024, 0.1), (256, 4096, 0.9))

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
args = ap.parse_args()
device = timing.require_gpu("the backward variants benchmark")
rows = []
for lq, kv, s in POINTS:
    w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
    x = w.make(device)
    scale = 1 / math.sqrt(w.D)
    o, lse, _, _ = fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, lq, sm_scale=scale, window=None, causal=False,
                              broadcast_q=True)
    do = bench.upstream_grad(x, o)
    ref = bench.reference_output(x, "bwd") if not rows else None
    row = {"workload": w.label, "flops": x.flops("bwd"), "variants": {}}
    for i, (block_m, dq, stages, schedule) in enumerate(VARIANTS):
        def run(block_m=block_m, dq=dq, stages=stages, schedule=schedule):
            return bwd_launch(x.q, x.k, x.v, o, lse, do, None, x.kv_offsets, lq, x.max_seq_len_kv, sm_scale=scale,
                              window=None, causal=False, broadcast_q=True, dq=dq, dq_stages=stages,
                              schedule=schedule, block_m=block_m)
        name = f"m{block_m}/{dq}{stages if dq == 'tma' else ''}/{schedule}"
        entry = {}
        if ref is not None:
            entry["rel_err_vs_ref"] = bench.rel_err(run(), ref)
        if i == 0:
            t = timing.time_twice(run)
            entry["ms"], entry["ms_repeat"] = t.ms, t.ms_repeat
        else:
            entry["ms"] = timing.bench(run)
        entry["tflops"] = row["flops"] / entry["ms"] / 1e9
        row["variants"][name] = entry
        print(f"{w.label:28s} {name:22s} {entry['ms']:8.3f} ms {entry['tflops']:6.1f} TFLOPS"
              + (f" err {entry['rel_err_vs_ref']:.1e}" if "rel_err_vs_ref" in entry else ""), flush=True)
    rows.append(row)
meta = timing.measurement_meta(command="python benchmarks/bwd_variants.py --out " + args.out)
with open(args.out, "w") as fh:
    json.dump({"meta": meta, "results": rows}, fh, indent=1)
