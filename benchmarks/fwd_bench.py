"""Forward benchmark, side by side in one process: this kernel per schedule and peers.

    python benchmarks/fwd_bench.py --grid hsp --out benchmarks/results/fwd_hsp.json [--fa4]

A thin wrapper over :func:`jfa_prof.bench.run_bench` (the same measurement as `jfa-prof bench`)
that times more variants of this kernel. Medians from triton.testing.do_bench after a warm-up;
every output is checked against the fp32 reference on the first point and against the first
implementation's on every point; jfa-lpt is timed twice to show the noise.
"""
from __future__ import annotations

import argparse
import json
import math
import sys


def _jfa_variants(x):
    """This kernel's variants to time, first to last; the first is what the others' outputs are
    compared with."""
    import torch

    from jfa_prof.bench import Impl
    from jfa_prof.kernels import fwd
    from jfa_prof.kernels.attention import fwd_launch
    from jfa_prof.schedule import fwd_work_list

    w = x.workload
    scale = 1.0 / math.sqrt(w.D)
    q_off = None if w.broadcast_q else x.q_offsets

    def launcher(schedule, **kw):
        def build():
            def run():
                return fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=scale, window=w.window,
                                  causal=w.causal, broadcast_q=w.broadcast_q, schedule=schedule, **kw)
            return run, lambda r: r[0]
        return build

    def planned(schedule):
        # The work list depends only on the offsets, so a model builds it once per batch and reuses
        # it in every attention layer: time the kernel with a list built beforehand too.
        def build():
            wl = fwd_work_list(x.kv_offsets, q_off, x.q.shape[0] if w.broadcast_q else None, w.H, x.max_seq_len_q,
                               block_m=fwd.BLOCK_M, window=w.window, causal=w.causal,
                               schedule=schedule,
                               n_ctas=torch.cuda.get_device_properties(0).multi_processor_count)
            return launcher(schedule, work=wl)()
        return build

    impls = [Impl(f"jfa-{s}", launcher(s)) for s in ("static", "lpt", "dynamic")]
    impls += [Impl(f"jfa-{s}-planned", planned(s)) for s in ("lpt", "dynamic")]
    impls.append(Impl("jfa-lpt-nopeel", launcher("lpt", peel=False)))
    return impls


def run(grid: str, fa4: bool, labels: list[str] | None, rep_ms: int) -> list[dict]:
    from jfa_prof import bench

    peers = ["varlen"] + (["fa4"] if fa4 else [])
    usable = [k for k, s in bench.peer_status(peers).items() if s.available]

    def on_point(row):
        print(row["workload"]["label"],
              " ".join(f"{n}={r.get('tflops', float('nan')):.0f}" for n, r in row["impls"].items()), flush=True)

    return bench.run_bench(bench.select_workloads(grid, labels),
                           impls=lambda x: _jfa_variants(x) + bench.peer_impls(x, usable),
                           baseline="jfa-lpt", rep_ms=rep_ms, on_point=on_point)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grid", default="hsp")
    ap.add_argument("--label", action="append")
    ap.add_argument("--fa4", action="store_true")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    from jfa_prof import bench, timing

    results = run(a.grid, a.fa4, a.label, a.rep_ms)
    status = bench.peer_status(["varlen"] + (["fa4"] if a.fa4 else []))
    fa4 = status.get("fa4")
    meta = timing.measurement_meta(command=" ".join(["python"] + sys.argv),
                                   flash_attn_4=fa4.version if fa4 and fa4.available else None)
    with open(a.out, "w") as f:
        json.dump(bench.results_document(results, meta, status), f, indent=1)


if __name__ == "__main__":
    main()
