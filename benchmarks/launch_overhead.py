"""Where a short forward call's time goes: the eager call (work list built each time), the
kernel with a work list built beforehand (what every layer after the first pays), and the
whole call replayed as a CUDA graph (the op never synchronizes, so it can be captured).

    python benchmarks/launch_overhead.py --out benchmarks/results/launch_overhead.json
"""
import argparse
import datetime
import json
import math
import sys

import torch
import triton
import triton.testing

from jfa_prof.inputs import select_workload
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import fwd_launch
from jfa_prof.schedule import fwd_work_list
from jfa_prof.timing import cuda_graphed


ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
a = ap.parse_args()
n_sms = torch.cuda.get_device_properties(0).multi_processor_count
rows = []
for lq, kv, s in ((128, 1024, 0.1), (128, 1024, 0.5), (256, 2048, 0.1), (256, 2048, 0.5), (256, 4096, 0.9)):
    w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
    x = w.make("cuda")
    flops = x.flops("fwd")
    row = {"workload": w.label, "flops": flops}
    for schedule in ("lpt", "dynamic"):
        def call(wl=None, schedule=schedule):
            return fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, lq, sm_scale=1 / math.sqrt(w.D), window=None,
                              causal=False, broadcast_q=True, schedule=schedule, work=wl)[0]

        wl = fwd_work_list(x.kv_offsets, None, lq, w.H, lq, block_m=fwd.BLOCK_M, window=None,
                           causal=False, schedule=schedule, n_ctas=n_sms)
        ref = call()
        replay = cuda_graphed(call)
        assert torch.equal(replay(), ref), "the graph replay must compute the same output"
        for name, fn in (("eager", call), ("planned", lambda: call(wl)), ("graph", replay)):
            ms = triton.testing.do_bench(fn, warmup=50, rep=200, return_mode="median")
            row[f"{schedule}_{name}"] = {"ms": ms, "tflops": flops / ms / 1e9}
    rows.append(row)
    print(w.label, {k: round(v["tflops"]) for k, v in row.items() if isinstance(v, dict)}, flush=True)
meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python"] + sys.argv), "timer": "triton.testing.do_bench median"}
json.dump({"meta": meta, "results": rows}, open(a.out, "w"), indent=1)
