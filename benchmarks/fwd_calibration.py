"""The forward's steady KV loop against the TLX Hopper tutorial kernel it learned from, on dense
shapes where both do the same work: every sequence full, no mask, 128 x 128 tiles, persistent,
ping-pong consumers. What is left between them is how each runs its loop and its tiles, so this
says how much of the distance to FlashAttention-4 is the TLX design and how much is ours.

    python benchmarks/fwd_calibration.py --out benchmarks/results/fwd_calibration.json
    ncu ... python benchmarks/fwd_calibration.py --ncu-target tutorial   # a few launches of one kernel

Kernel time alone (CUPTI, the median of 10 launches per round), in rounds that alternate the
kernels; each kernel's figure is the median of its rounds. The tutorial is imported from the
installed fbtriton wheel as shipped (its one autotuning config), never copied; its inputs are the
same tensors in its [batch, head, sequence, dim] layout, and its output is checked against ours.
"""
import argparse
import importlib.util
import json
import math
from pathlib import Path

import torch
import triton

from jfa_prof import bench, timing
from jfa_prof.inputs import Workload
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import fwd_launch
from jfa_prof.schedule import fwd_work_list

TUTORIAL = "hopper_fa_ws_pipelined_pingpong_persistent"
TUTORIAL_KERNEL = "_attn_fwd_ws_pipelined_pingpong_persistent"
OUR_KERNEL = "_jfa_fwd"
# (batch, heads, length): the SPEC's dense calibration shape, and one whose tiles visit 8 KV blocks
# like the HSP grid's max=1024 points.
SHAPES = ((8, 16, 4096), (32, 16, 1024))
NCU_LAUNCHES = 3  # the ncu command skips 2 and profiles the third


def load_tutorial():
    path = Path(triton.__file__).parent / "language" / "extra" / "tlx" / "tutorials" / f"{TUTORIAL}.py"
    if not path.exists():
        raise SystemExit(f"this fbtriton ships no {TUTORIAL}.py under {path.parent}")
    spec = importlib.util.spec_from_file_location(f"tlx_tutorial_{TUTORIAL}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def calls(tut, batch, heads, n, device, n_ctas):
    """(workload, its inputs, {name: call}, {name: the kernel each call launches}); `tut` is the
    tutorial's module."""
    w = Workload(grid="dense", B=batch, H=heads, H_kv=heads, D=128, Lq=n, max_kv=n, sparsity=1.0, broadcast_q=False)
    x = w.make(device)
    scale = 1 / math.sqrt(w.D)
    # Ours is packed [tokens, head, dim]; the tutorial wants [batch, head, sequence, dim].
    q4, k4, v4 = (t.view(batch, n, heads, w.D).transpose(1, 2).contiguous() for t in (x.q, x.k, x.v))

    def ours(**kw):
        wl = fwd_work_list(x.kv_offsets, x.q_offsets, None, heads, n, block_m=fwd.BLOCK_M, window=None,
                           causal=False, schedule="static", n_ctas=n_ctas)
        return lambda: fwd_launch(x.q, x.k, x.v, x.q_offsets, x.kv_offsets, n, sm_scale=scale, window=None,
                                  causal=False, broadcast_q=False, schedule="static", work=wl, **kw)[0]

    # Every sequence is full here, so the mask is never needed: jfa-nomask (the waterfall's
    # no_mask ablation) is the same output without the per-block mask test.
    runs = {"jfa": ours(), "jfa-q1": ours(q_bufs=1), "jfa-nomask": ours(ablate=fwd.ABLATIONS["no_mask"][0]),
            "tutorial": lambda: tut.attention(q4, k4, v4, scale).transpose(1, 2).reshape(batch * n, heads, w.D)}
    kernels = {name: OUR_KERNEL for name in runs} | {"tutorial": TUTORIAL_KERNEL}
    return w, x, runs, kernels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ncu-target", choices=("jfa", "jfa-q1", "jfa-nomask", "tutorial"),
                    help=f"launch this kernel {NCU_LAUNCHES} times on the first shape and exit (for ncu)")
    a = ap.parse_args()
    device = timing.require_gpu("the forward calibration")
    n_ctas = torch.cuda.get_device_properties(device).multi_processor_count
    tut = load_tutorial()
    if a.ncu_target:
        _, _, runs, _ = calls(tut, *SHAPES[0], device, n_ctas)
        for _ in range(NCU_LAUNCHES):
            runs[a.ncu_target]()
        torch.cuda.synchronize()
        return
    if not a.out:
        ap.error("--out is required unless --ncu-target is given")
    rows = []
    for shape in SHAPES:
        w, x, runs, kernels = calls(tut, *shape, device, n_ctas)
        ref = bench.reference_output(x, "fwd") if shape[2] <= 1024 else None
        first = runs["jfa"]().float()
        row = {"workload": dict(B=w.B, H=w.H, D=w.D, N=shape[2]), "flops": x.flops("fwd"), "impls": {}}
        for name, run in runs.items():
            out = run().float()
            row["impls"][name] = {"kernel": kernels[name], "rel_err_vs_jfa": bench.rel_err(out, first)}
            if ref is not None:
                row["impls"][name]["rel_err_vs_ref"] = bench.rel_err(out, ref)
        kernel_of = {run: kernels[name] for name, run in runs.items()}
        timed = timing.alternated(runs, a.rounds, timer=lambda fn: timing.kernel_median_ms(fn, kernel_of[fn]))
        for name, rounds in timed.items():
            entry = row["impls"][name]
            entry.update(timing.rounds_summary(rounds, row["flops"]))
            print(f"B={w.B} H={w.H} N={shape[2]} {name:9s} {timing.format_rounds(entry)} "
                  f"err vs jfa {entry['rel_err_vs_jfa']:.1e}", flush=True)
        row["jfa_over_tutorial_time"] = row["impls"]["jfa"]["ms"] / row["impls"]["tutorial"]["ms"]
        rows.append(row)
    meta = timing.measurement_meta(command=f"python benchmarks/fwd_calibration.py --out {a.out} --rounds {a.rounds}")
    meta["timer"] = "CUPTI kernel duration, median of 10 launches per round, median of rounds"
    meta["tutorial"] = f"triton/language/extra/tlx/tutorials/{TUTORIAL}.py (fbtriton {triton.__version__})"
    with open(a.out, "w") as fh:
        json.dump({"meta": meta, "results": rows}, fh, indent=1)
    print(json.dumps({r["workload"]["N"]: round(r["jfa_over_tutorial_time"], 3) for r in rows}))


if __name__ == "__main__":
    main()
