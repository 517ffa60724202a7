"""Where each backward consumer's time goes at the tile boundary, read from a breakdown build.

The build (`benchmarks/results/patches/bwd_epilogue_breakdown.diff` applied to `kernels/bwd.py`, saved
as its own file) times, at PROFILE level 2 and in both consumers, every phase of a tile with clock
reads: the K/V wait, the wait for the previous tile's dK/dV copies, the step loop (and inside it the
turn, step, dS^T-pair and dQ-staging waits), the warpgroup barrier after the loop, the epilogue
barrier, the dK/dV staging, the fence and barrier before the copies, their issue, and the rest up to
the next tile. It writes the sums where the wait totals go (consumer 0 in the compute role's row,
consumer 1 in the producer's), so the record's layout is unchanged. Each phase is printed as a share
of the compute role's span (consumer 0's first tile to its last, which both consumers work through),
summed over the CTAs. Clock reads move the kernel: its level-2 time is printed beside the level-0 time
of the checkout's kernel.

    python benchmarks/bwd_epilogue_breakdown.py --build BREAKDOWN_bwd.py --out FILE
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import kernel_ab  # noqa: E402

from jfa_prof import timing  # noqa: E402
from jfa_prof.inputs import select_workload  # noqa: E402
from jfa_prof.records import Span  # noqa: E402

# (name, site, word) where the breakdown build writes each sum: word 0 holds cycles, word 1 counts.
PHASES = (("kv_full", 0, 0), ("copies_read", 1, 0), ("step_loop", 2, 0), ("wg_bar", 3, 0), ("epi_bar", 4, 0),
          ("staging", 5, 0), ("fence_bar", 6, 0), ("copies_issue", 7, 0), ("to_next_tile", 8, 0))
IN_LOOP = (("step_full", 0, 1), ("dq_stage", 1, 1), ("ds_pair", 2, 1), ("turn", 3, 1))
# The copies' issue, store by store (whole half blocks), and the masked thread stores of the others.
ISSUE = (("dk_copy", 5, 1), ("dv_copy_0", 6, 1), ("dv_copy_1", 7, 1), ("thread_stores", 8, 1))
TILES = (4, 1)  # (site, word) of the tile count


def shares(waits, spans, role):
    """Each phase's cycles over the compute role's span cycles, summed over the CTAs, for the
    consumer whose sums are in row `role` (1: consumer 0, 0: consumer 1)."""
    total = float((spans[:, 1, Span.C_END] - spans[:, 1, Span.C_START]).sum())
    row = waits[:, role]
    out = {name: float(row[:, site, word].astype(np.uint64).sum()) / total
           for name, site, word in PHASES + IN_LOOP + ISSUE}
    out["tiles"] = int(row[:, TILES[0], TILES[1]].sum())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="kernels/bwd.py with the breakdown patch")
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", nargs="+", default=list(kernel_ab.POINTS))
    args = ap.parse_args()
    breakdown = kernel_ab.load_builds("bwd", [f"breakdown={args.build}"])["breakdown"]
    device = timing.require_gpu("the epilogue breakdown")
    rows = []
    for grid, lq, kv, s in (kernel_ab.parse_point(p) for p in args.points):
        w = select_workload(grid, Lq=lq, max_kv=kv, sparsity=s)
        x = w.make(device)
        call = kernel_ab.bwd_call(w, x)
        ms0 = timing.kernel_median_ms(lambda: call(0), "_jfa_bwd")
        with kernel_ab.build("bwd", breakdown):
            ms2 = timing.kernel_median_ms(lambda: call(2), "_jfa_bwd")
            *_, rec, launch = call(2)
        parts = launch.layout.split(rec.cpu().numpy())
        row = {"workload": w.label, "kernel_ms_checkout_level0": ms0, "kernel_ms_breakdown_level2": ms2,
               "consumer0": shares(parts["waits"], parts["spans"], 1),
               "consumer1": shares(parts["waits"], parts["spans"], 0)}
        rows.append(row)
        print(f"{w.label:28s} level 0 {ms0:.4f} ms, breakdown build at level 2 {ms2:.4f} ms", flush=True)
        for c in ("consumer0", "consumer1"):
            print(f"  {c}: " + "  ".join(f"{k} {v:.1%}" if k != "tiles" else f"{k} {v}" for k, v in row[c].items()),
                  flush=True)
    meta = timing.measurement_meta(command=" ".join(["python"] + sys.argv))
    meta["timer"] = "CUPTI durations of _jfa_bwd, median of 10 (kernel only: a diagnostic); phases from SM clock reads"
    with open(args.out, "w") as fh:
        json.dump({"meta": meta, "phases": [p[0] for p in PHASES + IN_LOOP + ISSUE], "results": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
