"""The forward's buffer choices side by side: K/V ring depth and Q buffers per consumer, on HSP
points, each checked against the fp32 reference first. Times the kernel alone (the work list is
built once, outside the timed call), medians of triton.testing.do_bench; the first variant is timed
twice for the noise. Variants that do not fit in shared memory are reported, not timed.

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

VARIANTS = [(2, 2), (3, 1), (2, 1)]  # (K/V stages, Q buffers per consumer)
POINTS = ((128, 4096, 0.9), (128, 1024, 0.5), (256, 2048, 0.5), (256, 4096, 0.9), (128, 2048, 0.1))

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--schedule", default="lpt")
args = ap.parse_args()
device = timing.require_gpu("the forward variants benchmark")
n_ctas = torch.cuda.get_device_properties(device).multi_processor_count
rows = []
for lq, kv, s in POINTS:
    w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
    x = w.make(device)
    scale = 1 / math.sqrt(w.D)
    ref = bench.reference_output(x, "fwd")
    work = fwd_work_list(x.kv_offsets, None, lq, w.H, lq, block_m=fwd.BLOCK_M, block_n=fwd.BLOCK_N, window=None,
                         causal=False, schedule=args.schedule, n_ctas=n_ctas)
    row = {"workload": w.label, "flops": x.flops("fwd"), "variants": {}}
    for i, (stages, q_bufs) in enumerate(VARIANTS):
        def run(stages=stages, q_bufs=q_bufs):
            return fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, lq, sm_scale=scale, window=None, causal=False,
                              broadcast_q=True, schedule=args.schedule, work=work, kv_stages=stages,
                              q_bufs=q_bufs)[0]
        name = f"kv{stages}/q{q_bufs}"
        try:
            entry = {"rel_err_vs_ref": bench.rel_err(run(), ref)}
        except Exception as err:  # noqa: BLE001 - a variant over the shared-memory limit is reported
            row["variants"][name] = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
            print(f"{w.label:28s} {name:10s} failed: {row['variants'][name]['error']}", flush=True)
            continue
        if i == 0:
            t = timing.time_twice(run)
            entry["ms"], entry["ms_repeat"] = t.ms, t.ms_repeat
        else:
            entry["ms"] = timing.bench(run)
        entry["tflops"] = row["flops"] / entry["ms"] / 1e9
        row["variants"][name] = entry
        print(f"{w.label:28s} {name:10s} {entry['ms']:8.3f} ms {entry['tflops']:6.1f} TFLOPS "
              f"err {entry['rel_err_vs_ref']:.1e}", flush=True)
    rows.append(row)
meta = timing.measurement_meta(command=f"python benchmarks/fwd_variants.py --out {args.out} --schedule {args.schedule}")
with open(args.out, "w") as fh:
    json.dump({"meta": meta, "results": rows}, fh, indent=1)
