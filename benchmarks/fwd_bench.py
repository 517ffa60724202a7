"""Forward benchmark, side by side in one process: this kernel per schedule and peers.

    python benchmarks/fwd_bench.py --grid hsp --out benchmarks/results/fwd_hsp.json [--fa4]

Times with triton.testing.do_bench (median, warm-up first); every implementation's output is
checked against the first one's before it is timed. The baseline is timed twice to show noise.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import sys

import torch


def _peers(x, fa4: bool):
    """Implementations to time: name -> zero-argument callable returning the output [rows, H, D]."""
    from jfa_prof.kernels.attention import fwd_launch

    w = x.workload
    scale = 1.0 / math.sqrt(w.D)
    q_off = None if w.broadcast_q else x.q_offsets
    out = {}
    for schedule in ("static", "lpt", "dynamic"):
        out[f"jfa-{schedule}"] = (lambda s=schedule: fwd_launch(
            x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=scale, window=w.window,
            causal=w.causal, broadcast_q=w.broadcast_q, schedule=s)[0])
    # The work list depends only on the offsets, so a model builds it once per batch and reuses it
    # in every attention layer: time the kernel with a list built beforehand too.
    from jfa_prof.kernels import fwd
    from jfa_prof.schedule import fwd_work_list

    for schedule in ("lpt", "dynamic"):
        wl = fwd_work_list(x.kv_offsets, q_off, x.q.shape[0] if w.broadcast_q else None, w.H, x.max_seq_len_q,
                           block_m=fwd.BLOCK_M, block_n=fwd.BLOCK_N, window=w.window, causal=w.causal,
                           schedule=schedule, n_ctas=torch.cuda.get_device_properties(0).multi_processor_count)
        out[f"jfa-{schedule}-planned"] = (lambda s=schedule, wl=wl: fwd_launch(
            x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=scale, window=w.window, causal=w.causal,
            broadcast_q=w.broadcast_q, schedule=s, work=wl)[0])
    out["jfa-lpt-nopeel"] = lambda: fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=scale,
                                               window=w.window, causal=w.causal, broadcast_q=w.broadcast_q,
                                               schedule="lpt", peel=False)[0]
    B = w.B
    if w.broadcast_q:
        q_rep = x.q.unsqueeze(0).expand(B, *x.q.shape).reshape(B * x.q.shape[0], *x.q.shape[1:])
    else:
        q_rep = x.q
    cu_q = x.q_offsets
    try:
        from torch.nn.attention.varlen import varlen_attn

        out["torch-varlen"] = lambda: varlen_attn(q_rep, x.k, x.v, cu_q, x.kv_offsets, x.max_seq_len_q,
                                                  x.max_seq_len_kv)
    except ImportError:
        pass
    if fa4:
        from flash_attn.cute import flash_attn_varlen_func

        if w.broadcast_q:
            qb = x.q.unsqueeze(0).expand(B, *x.q.shape)
            out["fa4"] = lambda: flash_attn_varlen_func(q=qb, k=x.k, v=x.v, cu_seqlens_k=x.kv_offsets,
                                                        max_seqlen_k=x.max_seq_len_kv)[0].reshape(q_rep.shape)
        else:
            out["fa4"] = lambda: flash_attn_varlen_func(q=x.q, k=x.k, v=x.v, cu_seqlens_q=x.q_offsets,
                                                        cu_seqlens_k=x.kv_offsets, max_seqlen_q=x.max_seq_len_q,
                                                        max_seqlen_k=x.max_seq_len_kv)[0]
    return out


def _host_breakdown(x, n: int = 20) -> dict:
    """Wall time per call of the work-list build and of the whole launch, synchronized: how much
    of a call is host-side work when kernels are short."""
    import time

    from jfa_prof.kernels import fwd
    from jfa_prof.kernels.attention import fwd_launch
    from jfa_prof.schedule import fwd_work_list

    w = x.workload
    q_off = None if w.broadcast_q else x.q_offsets
    n_sms = torch.cuda.get_device_properties(0).multi_processor_count

    def build():
        return fwd_work_list(x.kv_offsets, q_off, x.q.shape[0] if w.broadcast_q else None, w.H, x.max_seq_len_q,
                             block_m=fwd.BLOCK_M, block_n=fwd.BLOCK_N, window=w.window, causal=w.causal,
                             schedule="lpt", n_ctas=n_sms)

    def launch(wl):
        return fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=0.1, window=w.window,
                          causal=w.causal, broadcast_q=w.broadcast_q, schedule="lpt", work=wl)

    wl = build()
    launch(wl)
    out = {}
    for name, fn in (("work_list", build), ("launch_with_list", lambda: launch(wl)), ("full_call", lambda: launch(None))):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        enqueue = (time.perf_counter() - t) / n * 1e3
        torch.cuda.synchronize()
        out[name] = {"enqueue_ms": enqueue, "synced_ms": (time.perf_counter() - t) / n * 1e3}
    return out


def run(grid: str, fa4: bool, labels: list[str] | None, rep_ms: int) -> list[dict]:
    import triton.testing

    from jfa_prof.inputs import GRIDS

    results = []
    for w in GRIDS[grid]:
        if labels and w.label not in labels:
            continue
        x = w.make("cuda")
        flops = x.flops("fwd")
        impls = _peers(x, fa4)
        ref = None
        row = {"pass": "fwd", "workload": {**w.__dict__, "label": w.label, "total_q": x.total_q,
                                           "total_kv": x.total_kv}, "flops": flops, "impls": {}}
        for name, fn in impls.items():
            try:
                o = fn().float()
                if ref is None:
                    ref = o
                err = float((o - ref).norm() / ref.norm())
                ms = triton.testing.do_bench(fn, warmup=50, rep=rep_ms, return_mode="median")
                row["impls"][name] = {"ms": ms, "tflops": flops / ms / 1e9, "rel_err_vs_first": err}
            except Exception as e:  # a peer that fails is reported, not fatal
                row["impls"][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
        row["host_ms"] = _host_breakdown(x)
        base = impls.get("jfa-lpt")
        if base is not None:
            row["impls"]["jfa-lpt"]["ms_repeat"] = triton.testing.do_bench(base, warmup=50, rep=rep_ms,
                                                                           return_mode="median")
        if "fa4" in row["impls"] and "ms" in row["impls"]["fa4"]:
            for r in row["impls"].values():
                if "ms" in r:
                    r["ratio_vs_fa4"] = row["impls"]["fa4"]["ms"] / r["ms"]
        results.append(row)
        print(w.label, " ".join(f"{n}={r.get('tflops', float('nan')):.0f}" for n, r in row["impls"].items()),
              flush=True)
        del x
        torch.cuda.empty_cache()
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", default="hsp")
    ap.add_argument("--label", action="append")
    ap.add_argument("--fa4", action="store_true")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import triton

    results = run(a.grid, a.fa4, a.label, a.rep_ms)
    meta = {"gpu": torch.cuda.get_device_name(), "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python"] + sys.argv), "timer": "triton.testing.do_bench median"}
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
