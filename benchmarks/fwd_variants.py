"""The forward's buffer choices side by side: K/V ring depth, Q buffers per consumer, keys per
KV block and where the output is staged (`--compare o_buf`: a buffer of its own or the Q buffer,
at the op's ring and block size, on every HSP point), each checked against the fp32 reference
first. Times the kernel alone (the work list is built once, outside the timed call) with
triton.testing.do_bench, in rounds that alternate the variants; each variant's figure is the
median of its rounds. Variants that do not fit in shared memory are reported, not timed.

    python benchmarks/fwd_variants.py --out benchmarks/results/fwd_variants.json
"""
import argparse
import json
import math

import torch

from jfa_prof import bench, timing
from jfa_prof.inputs import GRIDS, select_workload
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import fwd_launch
from jfa_prof.schedule import fwd_work_list

# (K/V stages, Q buffers per consumer, keys per KV block, output staging buffer of its own): 4 x 64
# keys take the shared memory of 2 x 128 and keep more of it in flight.
RINGS = [(2, 2, 128, False), (4, 2, 64, False), (3, 1, 128, False), (2, 1, 128, False)]
POINTS = ((128, 4096, 0.9), (128, 1024, 0.5), (256, 2048, 0.5), (256, 4096, 0.9), (128, 2048, 0.1))

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--schedule", default="lpt")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--compare", choices=("rings", "o_buf"), default="rings")
ap.add_argument("--reverse", action="store_true", help="time the variants of each round in the reverse order")
args = ap.parse_args()
device = timing.require_gpu("the forward variants benchmark")
n_ctas = torch.cuda.get_device_properties(device).multi_processor_count
rows = []
points = POINTS if args.compare == "rings" else [(w.Lq, w.max_kv, w.sparsity) for w in GRIDS["hsp"]]
for lq, kv, s in points:
    if args.compare == "rings":
        VARIANTS = RINGS
    else:  # the op's ring and block size for this many query blocks
        block_n = fwd.kv_block_n(-(-lq // fwd.BLOCK_M))
        VARIANTS = [(fwd.KV_STAGES[block_n], fwd.NUM_Q_BUFS, block_n, o_buf) for o_buf in (True, False)]
    if args.reverse:  # a clock that favours the first call of each round then favours the other variant
        VARIANTS = VARIANTS[::-1]
    w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
    x = w.make(device)
    scale = 1 / math.sqrt(w.D)
    ref = bench.reference_output(x, "fwd")
    works = {n: fwd_work_list(x.kv_offsets, None, lq, w.H, lq, block_m=fwd.BLOCK_M, block_n=n, window=None,
                              causal=False, schedule=args.schedule, n_ctas=n_ctas) for n in {v[2] for v in VARIANTS}}
    row = {"workload": w.label, "flops": x.flops("fwd"), "variants": {}}
    runs = {}
    for stages, q_bufs, block_n, o_buf in VARIANTS:
        def run(stages=stages, q_bufs=q_bufs, block_n=block_n, o_buf=o_buf):
            return fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, lq, sm_scale=scale, window=None, causal=False,
                              broadcast_q=True, schedule=args.schedule, work=works[block_n], kv_stages=stages,
                              q_bufs=q_bufs, block_n=block_n, o_buf=o_buf)[0]
        name = f"kv{stages}x{block_n}/q{q_bufs}" + ("/o_buf" if o_buf else "")
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
                                      f"--rounds {args.rounds} --compare {args.compare}"
                                      + (" --reverse" if args.reverse else ""))
with open(args.out, "w") as fh:
    json.dump({"meta": meta, "results": rows}, fh, indent=1)
