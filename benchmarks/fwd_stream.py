"""How close the forward streams K/V to the chip's bandwidth at the HBM-bound points, and why not.

At Lq=128 a broadcast-Q forward does 128 FLOP per byte of K/V, below the H200's break-even, so
its time is the K/V bytes over the bandwidth it reaches. Per point this times, kernel alone
(CUPTI, medians of `--launches` launches, `--rounds` alternated rounds), the same K/V bytes read:

- `op`: the op's launch (dynamic schedule, prebuilt list) on the point's inputs;
- `static`, `lpt`: the other schedules;
- `n128`: 128-key blocks (two stages) instead of 64 (four);
- `ringS_qQ`: a K/V ring S deep with Q Q-buffers per consumer (the shared memory allows 5 x 2
  and 6 x 1 with 64-key blocks, 3 x 1 with 128);
- `equal`: every sequence as long as the point's mean (same bytes, tiles alike);
- `head_major`: K and V laid out per head (`[H, keys, D]`), so each block's copy reads one
  contiguous 16 KB run instead of 64 runs of 256 bytes 1 KB apart: the same work as jagged Q
  over B*H one-head sequences (Q repeated per sequence, 1.7% more bytes at max=4096);
- `read`: a streaming read of the same K/V bytes (`torch.sum`), the ceiling in this run.

Each variant's output is checked against the op's (bitwise where the work is the same).

    python benchmarks/fwd_stream.py --out benchmarks/results/fwd_loop/fwd_stream.json
"""
import argparse
import json
import math
import statistics
import sys

import torch

from jfa_prof import timing
from jfa_prof.inputs import hsp_point, offsets_from_lengths, select_workload
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import fwd_launch
from jfa_prof.schedule import fwd_work_list

KERNEL = "_jfa_fwd"

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--points", nargs="+", default=["128,4096,0.9", "128,2048,0.9", "128,4096,0.5", "256,4096,0.9"],
                metavar="LQ,MAX_KV,SPARSITY")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--launches", type=int, default=10)
args = ap.parse_args()
dev = timing.require_gpu("fwd_stream")
n_ctas = torch.cuda.get_device_properties(dev).multi_processor_count


def planned(q, k, v, q_off, kv_off, max_q, *, broadcast_q, schedule="dynamic", block_n=None, kv_stages=None,
            q_bufs=None):
    lq = q.shape[0] if broadcast_q else None
    work = fwd_work_list(kv_off, None if broadcast_q else q_off, lq, q.shape[1], max_q, block_m=fwd.BLOCK_M,
                         block_n=block_n, window=None, causal=False, schedule=schedule, n_ctas=n_ctas)
    out = torch.full(((kv_off.numel() - 1) * q.shape[0] if broadcast_q else q.shape[0], q.shape[1], q.shape[2]),
                     float("nan"), device=dev, dtype=q.dtype)

    def run():
        return fwd_launch(q, k, v, None if broadcast_q else q_off, kv_off, max_q, sm_scale=1 / math.sqrt(q.shape[2]),
                          window=None, causal=False, broadcast_q=broadcast_q, schedule=schedule, work=work, out=out,
                          block_n=block_n, kv_stages=kv_stages, q_bufs=q_bufs)[0]
    return run


def point(lq: int, max_kv: int, s: float) -> dict:
    w = select_workload("hsp", Lq=lq, max_kv=max_kv, sparsity=s)
    x = w.make(dev)
    B, H, D = w.B, w.H, w.D
    kv_bytes = 2 * x.k.numel() * x.k.element_size()
    calls = {"op": planned(x.q, x.k, x.v, None, x.kv_offsets, lq, broadcast_q=True),
             "static": planned(x.q, x.k, x.v, None, x.kv_offsets, lq, broadcast_q=True, schedule="static"),
             "lpt": planned(x.q, x.k, x.v, None, x.kv_offsets, lq, broadcast_q=True, schedule="lpt"),
             "n128": planned(x.q, x.k, x.v, None, x.kv_offsets, lq, broadcast_q=True, block_n=fwd.BLOCK_N)}
    # Deeper K/V rings in the shared memory left (both fit the 227 KB with the 64-key blocks; with
    # 128-key blocks three stages fit with one Q buffer per consumer).
    rings = ((5, 2), (6, 1)) if lq <= fwd.BLOCK_M else ((3, 1), )
    for stages, q_bufs in rings:
        calls[f"ring{stages}_q{q_bufs}"] = planned(x.q, x.k, x.v, None, x.kv_offsets, lq, broadcast_q=True,
                                                   kv_stages=stages, q_bufs=q_bufs)
    # Equal lengths: the point's mean, the same keys in all.
    mean = x.total_kv // B
    eq_off = offsets_from_lengths(torch.full((B, ), mean, dtype=torch.int64)).to(dev)
    keq, veq = x.k[:B * mean], x.v[:B * mean]
    calls["equal"] = planned(x.q, keq, veq, None, eq_off, lq, broadcast_q=True)
    # Head-major: sequence (h, b) is head h of sequence b, its keys contiguous.
    k_hm = x.k.permute(1, 0, 2).contiguous().view(H * x.total_kv, 1, D)
    v_hm = x.v.permute(1, 0, 2).contiguous().view(H * x.total_kv, 1, D)
    lens = x.kv_lens.repeat(H)
    hm_off = offsets_from_lengths(lens).to(dev)
    q_hm = x.q.permute(1, 0, 2).contiguous()  # [H, Lq, D]
    q_rep = q_hm[:, None].expand(H, B, lq, D).reshape(H * B * lq, 1, D)
    q_off = (torch.arange(H * B + 1, dtype=torch.int32) * lq).to(dev)
    calls["head_major"] = planned(q_rep, k_hm, v_hm, q_off, hm_off, lq, broadcast_q=False)
    flat = torch.cat([x.k.view(-1), x.v.view(-1)])
    calls["read"] = lambda: flat.sum()

    # Checks: every variant that does the op's work gives its bits back.
    ref = calls["op"]().clone()
    for name in ("static", "lpt", *(n for n in calls if n.startswith("ring"))):
        assert torch.equal(calls[name](), ref), name
    err = ((calls["n128"]().float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 1e-2, f"n128 differs from the op's output: {err}"
    o_hm = calls["head_major"]().view(H, B, lq, D).permute(1, 2, 0, 3).reshape(B * lq, H, D)
    err = ((o_hm.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < 1e-3, f"head_major differs from the op's output: {err}"
    calls["equal"]()

    rounds = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, fn in calls.items():
            rounds[name].append(_kernel_ms(fn, None if name == "read" else KERNEL))
    res = {"workload": w.label, "kv_bytes": kv_bytes, "total_kv": x.total_kv, "mean_kv": mean, "variants": {}}
    for name, r in rounds.items():
        ms = statistics.median(r)
        nbytes = kv_bytes * (B * mean / x.total_kv if name == "equal" else 1)
        res["variants"][name] = {"rounds_ms": r, "ms": ms, "kv_tb_s": nbytes / ms / 1e9}
    return res


def _kernel_ms(fn, name: str) -> float:
    import torch.profiler as tp

    fn()
    torch.cuda.synchronize()
    with tp.profile(activities=[tp.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.launches):
            fn()
        torch.cuda.synchronize()
    ds = [e.time_range.elapsed_us() / 1e3 for e in prof.events()
          if e.device_type == torch.autograd.DeviceType.CUDA and (name is None or e.name.split("(")[0] == name)]
    # The read: every kernel of its launches (a reduction may take more than one), per launch.
    return sum(ds) / args.launches if name is None else statistics.median(ds)


results = []
for p in args.points:
    r = point(*hsp_point(p))
    results.append(r)
    print(r["workload"], "  ".join(f"{n} {v['ms']:.3f} ms {v['kv_tb_s']:.2f} TB/s" for n, v in r["variants"].items()),
          flush=True)
    meta = {**timing.measurement_meta(command=" ".join(["python", *sys.argv])),
            "timer": "CUPTI kernel durations: median of --launches per round, median of alternated rounds"}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)
