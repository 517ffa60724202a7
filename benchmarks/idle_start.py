"""Does the forward kernel run slower when it starts on an idle GPU? Kernel-only CUPTI durations of
the same level-0 launch, back to back, and after a step that makes the host wait for the GPU:
`torch.cuda.synchronize()`, or a word of a device tensor set from Python (`t[i] = value`, a copy
from pageable host memory); beside a word set by a fill kernel (`fill_`, which does not wait), and
the level-1 launch, whose record buffer set its header words with `t[i] = value` until that was
found this way. Rounds alternate the calls; figures are medians. Kernel only: a diagnostic.

    python benchmarks/idle_start.py --out idle_start.json --points 256,1024,0.1 128,2048,0.1
"""
import argparse
import json
import math
import statistics
import sys

import torch

from jfa_prof import timing
from jfa_prof.inputs import hsp_point, select_workload
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import fwd_launch
from jfa_prof.schedule import DEFAULT_SCHEDULE, fwd_work_list

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--points", nargs="+", metavar="LQ,MAX_KV,SPARSITY", default=["256,1024,0.1", "128,2048,0.1"])
args = ap.parse_args()
device = timing.require_gpu("the idle-start benchmark")
n_ctas = torch.cuda.get_device_properties(device).multi_processor_count
word = torch.zeros(2, dtype=torch.int64, device=device)
rows = []
for text in args.points:
    lq, kv, s = hsp_point(text)
    w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
    x = w.make(device)
    wl = fwd_work_list(x.kv_offsets, None, w.Lq, w.H, w.Lq, block_m=fwd.BLOCK_M, window=None, causal=False,
                       schedule=DEFAULT_SCHEDULE, n_ctas=n_ctas)

    def run(level=0):
        return fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, w.Lq, sm_scale=1 / math.sqrt(w.D), window=None,
                          causal=False, broadcast_q=True, profile=level, work=wl)[0]

    def after_sync():
        torch.cuda.synchronize()
        return run()

    def after_setitem():
        word[0] = 5
        return run()

    def after_fill():
        word[0:1].fill_(5)
        return run()

    calls = {"back_to_back": run, "after_synchronize": after_sync, "after_setitem": after_setitem,
             "after_fill": after_fill, "level1": lambda: run(1), "back_to_back_again": run}
    for fn in calls.values():
        fn()
    rounds = timing.alternated(calls, args.rounds, timer=lambda fn: timing.kernel_median_ms(fn, "_jfa_fwd"))
    ms = {name: statistics.median(r) for name, r in rounds.items()}
    rows.append({"workload": w.label, "rounds_ms": rounds, "ms": ms,
                 "vs_back_to_back": {n: v / ms["back_to_back"] for n, v in ms.items()}})
    print(f"{w.label:28s} " + "  ".join(f"{n} {v:.4f} x{v / ms['back_to_back']:.3f}" for n, v in ms.items()),
          flush=True)
meta = timing.measurement_meta(command=" ".join(["python"] + sys.argv))
meta["timer"] = "CUPTI durations of _jfa_fwd, median of 10 per round, median of alternated rounds (kernel only)"
with open(args.out, "w") as fh:
    json.dump({"meta": meta, "results": rows}, fh, indent=1)
