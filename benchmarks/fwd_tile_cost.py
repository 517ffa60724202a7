"""What one forward tile costs besides its KV blocks, and what one block costs, uninstrumented.

Every sequence of a launch gets the same KV length, so all tiles are alike; the launch has a
whole number of rounds of tiles per CTA, so its kernel time (CUPTI) is ``rounds · (a + b · n)``
with ``n`` the KV blocks per tile (plus the launch's ramp and drain, which land in ``a`` divided by
``--rounds-per-cta``: the same for every build, so comparisons hold). Timing it over several lengths
and fitting the per-tile time against ``n`` gives ``a`` (decode, Q load, first wait, epilogue, output stores) and ``b`` (one
steady block: two matmuls and the softmax) with no tile records in the kernel: the split that
`jfa-prof bench --limits` reads from a recording, checked on the kernel that runs unobserved,
and comparable between builds (run the script from each build's tree, alternating processes).

Each length is run as a multiple of the block (every block full, no mask) and ``--short`` keys
less (the last block masked): the gap between the two fits is what the masked block adds.
``--o-buf on|off`` times the output staged in its own buffers or through the Q buffer;
``--profile`` times an instrumented build (what the records cost per tile and per block);
``--ablate`` times a build without one piece of work (the waterfall's ablations; wrong outputs on
purpose): the change in ``a`` and ``b`` is what that piece costs per tile and per block.

    python benchmarks/fwd_tile_cost.py --out benchmarks/results/fwd_tile_cost.json [--build LABEL]
"""
import argparse
import json
import math

import torch

from jfa_prof import timing
from jfa_prof.analyses.limits import FitSums
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import fwd_launch
from jfa_prof.schedule import fwd_work_list

KERNEL = "_jfa_fwd"


def launch(lq: int, kv_len: int, heads: int, batch: int, device, n_ctas: int, ablate: int = 0, profile: int = 0,
           o_buf: bool | None = None):
    """A call of the planned forward over `batch` broadcast-Q sequences of `kv_len` keys each."""
    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(lq, heads, 128, generator=gen, device=device, dtype=torch.bfloat16)
    k, v = (torch.randn(batch * kv_len, heads, 128, generator=gen, device=device, dtype=torch.bfloat16)
            for _ in range(2))
    kv_offsets = torch.arange(batch + 1, device=device, dtype=torch.int32) * kv_len
    wl = fwd_work_list(kv_offsets, None, lq, heads, lq, block_m=fwd.BLOCK_M, window=None, causal=False,
                       schedule="dynamic", n_ctas=n_ctas)
    out = torch.full((batch * lq, heads, 128), float("nan"), device=device, dtype=torch.bfloat16)

    def run():
        return fwd_launch(q, k, v, None, kv_offsets, lq, sm_scale=1 / math.sqrt(128), window=None, causal=False,
                          broadcast_q=True, schedule="dynamic", work=wl, out=out, ablate=ablate, profile=profile,
                          o_buf=o_buf)

    if not ablate:
        # The first and the last sequence against fp32 attention: a launch that skipped work is not timed.
        run()
        for b in (0, batch - 1):
            kb, vb = (t[b * kv_len:(b + 1) * kv_len].float() for t in (k, v))
            s = torch.einsum("qhd,khd->hqk", q.float(), kb) / math.sqrt(128)
            ref = torch.einsum("hqk,khd->qhd", s.softmax(-1), vb)
            err = ((out[b * lq:(b + 1) * lq].float() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                raise SystemExit(f"wrong output for sequence {b} of {kv_len} keys: relative error {err:.3g}")
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--build", default="", help="which kernel build ran (kept in meta)")
    ap.add_argument("--lq", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--rounds-per-cta", type=int, default=8, help="tiles per CTA in every launch")
    ap.add_argument("--lengths", default="256,512,1024,2048,4096")
    ap.add_argument("--short", type=int, default=37, help="keys fewer than a whole block for the masked runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ablate", choices=sorted(fwd.ABLATIONS), help="time the kernel without this piece of work "
                    "(the waterfall's ablations): what it adds per tile and per block")
    ap.add_argument("--profile", type=int, choices=(0, 1, 2), default=0,
                    help="instrumentation level: what tile records (1) and barrier waits (2) add per tile and block")
    ap.add_argument("--o-buf", choices=("on", "off"), help="stage the output in its own buffers or through the Q "
                    "buffer (default: the op's choice, kernels/fwd.py O_BUF)")
    a = ap.parse_args()
    o_buf = None if a.o_buf is None else a.o_buf == "on"
    ablate = fwd.ABLATIONS[a.ablate][0] if a.ablate else 0
    device = timing.require_gpu("the tile-cost sweep")
    n_ctas = torch.cuda.get_device_properties(device).multi_processor_count
    tiles_per_seq = a.heads * -(-a.lq // fwd.BLOCK_M)
    batch = n_ctas * a.rounds_per_cta // tiles_per_seq
    if batch * tiles_per_seq != n_ctas * a.rounds_per_cta:
        raise SystemExit(f"{n_ctas} CTAs x {a.rounds_per_cta} rounds is not a whole number of sequences "
                         f"({tiles_per_seq} tiles each): pick --rounds-per-cta")
    points = [(int(n), short) for n in a.lengths.split(",") for short in (0, a.short)]
    calls = {}
    for n, short in points:
        kv_len = n - short
        run = launch(a.lq, kv_len, a.heads, batch, device, n_ctas, ablate, a.profile, o_buf)
        run()
        calls[(n, short)] = run
    timed = timing.alternated({f"{n}-{s}": run for (n, s), run in calls.items()}, a.rounds,
                              timer=lambda fn: timing.kernel_median_ms(fn, KERNEL))
    rows, fits = [], {}
    for (n, short), run in calls.items():
        ms = sorted(timed[f"{n}-{short}"])[len(timed[f"{n}-{short}"]) // 2]
        block_n = run()[3].block_n
        blocks = -(-(n - short) // block_n)
        per_tile_ns = ms * 1e6 / a.rounds_per_cta
        rows.append({"kv_len": n - short, "masked": short > 0, "block_n": block_n, "blocks": blocks,
                     "rounds_ms": timed[f"{n}-{short}"], "ms": ms, "per_tile_ns": per_tile_ns})
        key = "masked" if short else "full"
        fits[key] = fits.get(key, FitSums()) + FitSums.of([blocks], [per_tile_ns])
    summary = {}
    for key, sums in fits.items():
        a_ns, b_ns, r2 = sums.fit()
        flops = 4 * fwd.BLOCK_M * rows[0]["block_n"] * 128
        summary[key] = {"a_ns": a_ns, "b_ns": b_ns, "r2": r2, "block_tflops_per_sm": flops / b_ns / 1e3,
                        "block_tflops": flops / b_ns / 1e3 * n_ctas}
        print(f"{key:6s} per tile {a_ns:7.0f} ns  per block {b_ns:6.0f} ns  (r2 {r2:.4f}; a block at "
              f"{summary[key]['block_tflops']:.0f} TFLOPS over {n_ctas} SMs)", flush=True)
    meta = timing.measurement_meta(command="python benchmarks/fwd_tile_cost.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items() if v not in ("", None)))
    meta.update(timer="CUPTI kernel duration, median of 10 launches per round, median of rounds", build=a.build,
                ablate=a.ablate, profile=a.profile, lengths=a.lengths,
                batch=batch, lq=a.lq, heads=a.heads, tiles=batch * tiles_per_seq)
    with open(a.out, "w") as fh:
        json.dump({"meta": meta, "points": rows, "fit": summary}, fh, indent=1)


if __name__ == "__main__":
    main()
