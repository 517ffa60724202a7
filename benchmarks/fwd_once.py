"""Launch one forward workload a few times, uninstrumented: the target of `ncu` runs.

    ncu --clock-control none -k regex:_jfa_fwd -s 2 -c 1 -o fwd python benchmarks/fwd_once.py --schedule lpt
"""
import argparse
import math

import torch

from jfa_prof.inputs import select_workload
from jfa_prof.kernels.attention import fwd_launch

ap = argparse.ArgumentParser()
ap.add_argument("--schedule", default="lpt")
ap.add_argument("--grid", default="hsp")
ap.add_argument("--lq", type=int)
ap.add_argument("--max-kv", type=int)
ap.add_argument("--sparsity", type=float)
ap.add_argument("--no-peel", action="store_true")
ap.add_argument("--launches", type=int, default=3)
a = ap.parse_args()
w = select_workload(a.grid, Lq=a.lq, max_kv=a.max_kv, sparsity=a.sparsity)
x = w.make("cuda")
for _ in range(a.launches):
    fwd_launch(x.q, x.k, x.v, None if w.broadcast_q else x.q_offsets, x.kv_offsets, x.max_seq_len_q,
               sm_scale=1 / math.sqrt(w.D), window=w.window, causal=w.causal, broadcast_q=w.broadcast_q,
               schedule=a.schedule, peel=not a.no_peel)
torch.cuda.synchronize()
print(w.label, a.schedule, "done")
