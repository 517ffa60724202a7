"""The forward's buffer choices side by side: K/V ring depth, Q buffers per consumer and keys per
KV block, on HSP points, each checked against the fp32 reference first. Times the kernel alone (the work list is
built once, outside the timed call) with triton.testing.do_bench, in rounds that alternate the
variants; each variant's figure is the median of its rounds. Variants that do not fit in shared
memory are reported, not timed.

    python benchmarks/fwd_variants.py --out benchmarks/results/fwd_variants.json
"""
import argparse
import json
import math

import torch

from jfa_prof import bench, timing
from jfa_prof.inputs import select_workload
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import fwd_launch
from jfa_prof.schedule import fwd_work_list

# (K/V stages, Q buffers per consumer, keys per KV block): 4 x 64 keys take the shared memory of
# 2 x 128 and keep more of it in flight.
VARIANTS = [(2, 2, 128), (4, 2, 64), (3, 1, 128), (2, 1, 128)]
POINTS = ((128, 4096, 0.9), (128, 1024, 0.5), (256, 2048, 0.5), (256, 4096, 0.9), (128, 2048, 0.1))

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--schedule", default="lpt")
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
device = timing.require_gpu("the forward variants benchmark")
n_ctas = torch.cuda.get_device_properties(device).multi_processor_count
rows = []
for lq, kv, s in POINTS:
    w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
    x = w.make(device)
    scale = 1 / math.sqrt(w.D)
    ref = bench.reference_output(x, "fwd")
    works = {n: fwd_work_list(x.kv_offsets, None, lq, w.H, lq, block_m=fwd.BLOCK_M, block_n=n, window=None,
                              causal=False, schedule=args.schedule, n_ctas=n_ctas) for n in {v[2] for v in VARIANTS}}
    row = {"workload": w.label, "flops": x.flops("fwd"), "variants": {}}
    runs = {}
    for stages, q_bufs, block_n in VARIANTS:
        def run(stages=stages, q_bufs=q_bufs, block_n=block_n):
            return fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, lq, sm_scale=scale, window=None, causal=False,
                              broadcast_q=True, schedule=args.schedule, work=works[block_n], kv_stages=stages,
                              q_bufs=q_bufs, block_n=block_n)[0]
        name = f"kv{stages}x{block_n}/q{q_bufs}"
        try:
            row["variants"][name] = {"rel_err_vs_ref": bench.rel_err(run(), ref)}
            runs[name] = run
        except Exception as err:  # noqa: BLE001 - a variant over the shared-memory limit is reported
            row["variants"][name] = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
            print(f"{w.label:28s} {name:12s} failed: {row['variants'][name]['error']}", flush=True)
    for name, rounds in timing.alternated(runs, args.rounds).items():
        entry = row["variants"][name]
        entry.update(timing.rounds_summary(rounds, row["flops"]))
        print(f"{w.label:28s} {name:12s} {timing.format_rounds(entry)} err {entry['rel_err_vs_ref']:.1e}", flush=True)
    rows.append(row)
meta = timing.measurement_meta(command=f"python benchmarks/fwd_variants.py --out {args.out} --schedule {args.schedule} "
                                      f"--rounds {args.rounds}")
with open(args.out, "w") as fh:
    json.dump({"meta": meta, "results": rows}, fh, indent=1)
