"""The backward's build choices side by side on HSP points, each checked against the fp32
reference's gradients first: dQ reduction and staging depth, schedule, query rows per step. Times the whole backward launch (delta kernel, main kernel, dQ conversion) with
triton.testing.do_bench, in rounds that alternate the variants (a drifting GPU clock then spreads
over all of them); each variant's figure is the median of its rounds, and the first variant's
spread across rounds is the noise.

    python benchmarks/bwd_variants.py --out benchmarks/results/bwd_variants.json
"""
import argparse
import json
import math

from jfa_prof import bench, timing
from jfa_prof.inputs import select_workload, upstream_grad
from jfa_prof.kernels.attention import bwd_launch, fwd_launch

VARIANTS = {  # name: bwd_launch options
    "m64/tma2/static": {},
    "m64/tma1/static": {"dq_stages": 1},
    "m64/tma2/dynamic": {"schedule": "dynamic"},
    "m64/atomic/static": {"dq": "atomic"},
    "m32/tma2/static": {"block_m": 32},
}
POINTS = ((256, 2048, 0.5), (128, 1024, 0.1), (256, 4096, 0.9))

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
device = timing.require_gpu("the backward variants benchmark")
rows = []
for lq, kv, s in POINTS:
    w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
    x = w.make(device)
    scale = 1 / math.sqrt(w.D)
    o, lse, _, _ = fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, lq, sm_scale=scale, window=None, causal=False,
                              broadcast_q=True)
    do = upstream_grad(x, o)
    ref = bench.reference_output(x, "bwd")
    runs = {name: (lambda opts=opts: bwd_launch(x.q, x.k, x.v, o, lse, do, None, x.kv_offsets, lq, x.max_seq_len_kv,
                                                 sm_scale=scale, window=None, causal=False, broadcast_q=True, **opts))
            for name, opts in VARIANTS.items()}
    row = {"workload": w.label, "flops": x.flops("bwd"), "variants": {}}
    for name, run in runs.items():
        row["variants"][name] = {"options": VARIANTS[name], "rel_err_vs_ref": bench.rel_err(run(), ref)}
    for name, rounds in timing.alternated(runs, args.rounds).items():
        entry = row["variants"][name]
        entry.update(timing.rounds_summary(rounds, row["flops"]))
        print(f"{w.label:28s} {name:24s} {timing.format_rounds(entry)} err {entry['rel_err_vs_ref']:.1e}", flush=True)
    rows.append(row)
meta = timing.measurement_meta(command=f"python benchmarks/bwd_variants.py --out {args.out} --rounds {args.rounds}")
with open(args.out, "w") as fh:
    json.dump({"meta": meta, "results": rows}, fh, indent=1)
