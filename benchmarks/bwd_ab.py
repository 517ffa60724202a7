"""Builds of the backward kernel side by side in one process: one or more other `kernels/bwd.py`
files (e.g. from `git show REV:kernels/bwd.py`) against the checkout's, on HSP points and the dense
shape. Each is checked against the fp32 reference, then the main kernel alone (CUPTI durations of
`_jfa_bwd`) is timed in rounds that alternate the builds; a build's figure is the median of its
rounds, and each other build's `speedup` is its time over the checkout's.

    git show 8f96150:kernels/bwd.py > /tmp/bwd_before.py
    python benchmarks/bwd_ab.py --before /tmp/bwd_before.py --label-before 8f96150 --out bwd_ab.json
"""
import argparse
import contextlib
import importlib.util
import json
import math
import sys

import jfa_prof.kernels as kernels_pkg
from jfa_prof import bench, timing
from jfa_prof.inputs import hsp_point, select_workload, upstream_grad
from jfa_prof.kernels import bwd as checkout
from jfa_prof.kernels.attention import bwd_launch, fwd_launch

POINTS = (("hsp", 256, 2048, 0.5), ("hsp", 128, 1024, 0.1), ("hsp", 256, 4096, 0.9), ("hsp", 128, 4096, 0.9),
          ("dense", None, None, None))

ap = argparse.ArgumentParser()
ap.add_argument("--before", required=True, action="append", help="another kernels/bwd.py (repeatable)")
ap.add_argument("--label-before", action="append", help="a name for each --before, in order")
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--points", nargs="+", metavar="LQ,MAX_KV,SPARSITY|dense",
                help="HSP points and / or the dense shape (default: four HSP points and dense)")
args = ap.parse_args()


def parse_point(text):
    if text == "dense":
        return ("dense", None, None, None)
    return ("hsp", *hsp_point(text))


points = [parse_point(p) for p in args.points] if args.points else POINTS
device = timing.require_gpu("the backward A/B benchmark")
labels = args.label_before or [f"before{i + 1}" if len(args.before) > 1 else "before" for i in range(len(args.before))]
if len(labels) != len(args.before) or "checkout" in labels:
    ap.error("give one --label-before per --before, none of them 'checkout'")
others = {}
for i, (label, path) in enumerate(zip(labels, args.before)):
    spec = importlib.util.spec_from_file_location(f"jfa_prof.kernels.bwd_before{i}", path)
    others[label] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(others[label])


@contextlib.contextmanager
def build(module):
    """bwd_launch imports `jfa_prof.kernels.bwd` when called: point that name at `module` meanwhile."""
    kernels_pkg.bwd = sys.modules["jfa_prof.kernels.bwd"] = module
    try:
        yield
    finally:
        kernels_pkg.bwd = sys.modules["jfa_prof.kernels.bwd"] = checkout


rows = []
for grid, lq, kv, s in points:
    w = select_workload(grid, Lq=lq, max_kv=kv, sparsity=s)
    x = w.make(device)
    scale = 1 / math.sqrt(w.D)
    q_off = None if w.broadcast_q else x.q_offsets
    o, lse, _, _ = fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=scale, window=None,
                              causal=False, broadcast_q=w.broadcast_q)
    do = upstream_grad(x, o)
    ref = bench.reference_output(x, "bwd")

    def run():
        return bwd_launch(x.q, x.k, x.v, o, lse, do, q_off, x.kv_offsets, x.max_seq_len_q, x.max_seq_len_kv,
                          sm_scale=scale, window=None, causal=False, broadcast_q=w.broadcast_q)

    def run_with(module):
        with build(module):
            return run()

    builds = {**others, "checkout": checkout}
    calls = {name: (lambda m=m: run_with(m)) for name, m in builds.items()}
    row = {"workload": w.label, "flops": x.flops("bwd"), "builds": {}}
    for name, fn in calls.items():
        row["builds"][name] = {"rel_err_vs_ref": bench.rel_err(fn(), ref)}
    for name, rounds in timing.alternated(calls, args.rounds, timer=lambda fn: timing.kernel_median_ms(fn, "_jfa_bwd")).items():
        row["builds"][name].update(timing.rounds_summary(rounds, row["flops"]))
    row["speedup"] = {n: row["builds"][n]["ms"] / row["builds"]["checkout"]["ms"] for n in others}
    rows.append(row)
    print(f"{w.label:28s} " + "  ".join(f"{n} {timing.format_rounds(e)}" for n, e in row["builds"].items())
          + "  checkout " + " ".join(f"x{r:.3f} vs {n}" for n, r in row["speedup"].items()), flush=True)
meta = timing.measurement_meta(command=" ".join(["python"] + sys.argv))
meta["timer"] = "CUPTI durations of _jfa_bwd, median of 10 per round, median of alternated rounds"
with open(args.out, "w") as fh:
    json.dump({"meta": meta, "results": rows}, fh, indent=1)
