"""What each instrumentation level costs, kernel against kernel, at every HSP point, both passes.

Per point and pass, the op's own launch (its default schedule, a prebuilt work list for the
forward) at PROFILE level 0, 1 (tile records and role spans), 2 (+ barrier-wait totals), 3 (+ an
event record per tile and warp role) and 0 again (the repeat gives the noise). Kernel alone:
CUPTI durations (medians of `--launches` launches) in `--rounds` rounds that alternate all five,
so a clock drifting over the run spreads over every level; a level's figure is the median of its
rounds, its cost the ratio to the faster level-0 figure. Where the clock drifts within a run (long
kernels on a power-capped GPU: the two level-0 figures then differ by several percent), the paired
figure is the steadier one: per round, the level over the mean of the two level-0 figures that
bracket it in that round, median over rounds (`paired_cost_*_pct`); many rounds of few launches
interleave the levels finest. Every level's output is checked bit for bit against level 0's (dK and
dV in the backward; dQ's reduce-adds may add in any order).

    python benchmarks/roles_cost.py --out benchmarks/results/instrumentation/roles_cost.json
    python benchmarks/roles_cost.py --rounds 21 --launches 1 --points 256,4096,0.9 --out FILE
"""
import argparse
import json
import math
import statistics

import torch

from jfa_prof import bench, timing
from jfa_prof.inputs import GRIDS, hsp_point, select_workload, upstream_grad
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import bwd_launch_recorded, fwd_launch
from jfa_prof.schedule import DEFAULT_SCHEDULE, fwd_work_list

LEVELS = (("off", 0), ("tiles", 1), ("waits", 2), ("roles", 3), ("off_again", 0))

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--passes", nargs="+", choices=("fwd", "bwd"), default=["fwd", "bwd"])
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--launches", type=int, default=10)
ap.add_argument("--points", nargs="+", metavar="LQ,MAX_KV,SPARSITY", help="HSP points (default: all 18)")
ap.add_argument("--sample", type=int, default=None, help="also level 3 recording every Nth tile only")
args = ap.parse_args()
if args.sample:
    LEVELS = LEVELS[:4] + ((f"roles_sample{args.sample}", 3),) + LEVELS[4:]
if args.points:
    points = [hsp_point(p) for p in args.points]
else:
    points = [(w.Lq, w.max_kv, w.sparsity) for w in GRIDS["hsp"]]
device = timing.require_gpu("the instrumentation cost benchmark")
n_ctas = torch.cuda.get_device_properties(device).multi_processor_count


def pct(a: float, b: float) -> float:
    return 100 * (a / b - 1)


def paired_pct(rounds: dict[str, list[float]], name: str) -> float:
    """The level's cost round by round against the mean of that round's two level-0 figures, median."""
    bracket = [(a + b) / 2 for a, b in zip(rounds["off"], rounds["off_again"])]
    return 100 * (timing.paired_rounds(rounds[name], bracket)["ratio"] - 1)


def fwd_runner(w, x):
    wl = fwd_work_list(x.kv_offsets, None, w.Lq, w.H, w.Lq, block_m=fwd.BLOCK_M, window=None, causal=False,
                       schedule=DEFAULT_SCHEDULE, n_ctas=n_ctas)

    def run(level, sample=1):
        return fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, w.Lq, sm_scale=1 / math.sqrt(w.D), window=None,
                          causal=False, broadcast_q=True, profile=level, work=wl, sample=sample)[0]
    return run, "_jfa_fwd"


def bwd_runner(w, x):
    o, lse, _, _ = fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, w.Lq, sm_scale=1 / math.sqrt(w.D), window=None,
                              causal=False, broadcast_q=True)
    do = upstream_grad(x, o)

    def run(level, sample=1):
        return bwd_launch_recorded(x.q, x.k, x.v, o, lse, do, None, x.kv_offsets, w.Lq, w.max_kv,
                                   sm_scale=1 / math.sqrt(w.D), window=None, causal=False, broadcast_q=True,
                                   profile=level, sample=sample)[1:3]
    return run, "_jfa_bwd"


command = (f"python benchmarks/roles_cost.py --out {args.out} --passes {' '.join(args.passes)} --rounds {args.rounds}"
           f" --launches {args.launches}" + (" --points " + " ".join(args.points) if args.points else "")
           + (f" --sample {args.sample}" if args.sample else ""))
meta = timing.measurement_meta(command=command)
meta["timer"] = "CUPTI kernel durations: median of --launches per round, median of alternated rounds"
meta["note"] = ("levels: 1 tile records + role spans, 2 + barrier-wait totals, 3 + an event record per (tile, warp "
                "role); the op's default schedules (forward dynamic with a prebuilt list, backward static); "
                "cost = level / faster of the two level-0 figures - 1")


def save(rows) -> None:
    # After every point: a run cut short keeps what it measured.
    with open(args.out, "w") as fh:
        json.dump({"meta": meta, "results": rows}, fh, indent=1)


rows = []
for pass_ in args.passes:
    for lq, kv, s in points:
        w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
        x = w.make(device)
        run, kernel = (fwd_runner if pass_ == "fwd" else bwd_runner)(w, x)
        base = run(0)
        calls = {name: (lambda p=p, n=name: run(p, args.sample if n.startswith("roles_sample") else 1))
                 for name, p in LEVELS}
        row = {"pass": pass_, "workload": w.label,
               "bitwise_equal_levels": all(bench.bitwise_equal(calls[name](), base) for name, p in LEVELS if p)}
        rounds = timing.alternated(calls, args.rounds,
                                   timer=lambda fn: timing.kernel_median_ms(fn, kernel, n=args.launches))
        k = {name: statistics.median(r) for name, r in rounds.items()}
        k0 = min(k["off"], k["off_again"])
        row.update(kernel_ms=k, kernel_rounds=rounds, noise_pct=100 * abs(k["off"] / k["off_again"] - 1),
                   **{f"cost_{name}_pct": pct(k[name], k0) for name, p in LEVELS if p},
                   **{f"paired_cost_{name}_pct": paired_pct(rounds, name) for name, p in LEVELS if p})
        rows.append(row)
        print(f"{pass_} {w.label:28s} {k0:.3f} ms  level 1 {row['cost_tiles_pct']:+.1f}%  level 2 "
              f"{row['cost_waits_pct']:+.1f}%  level 3 {row['cost_roles_pct']:+.1f}%"
              + (f" (every {args.sample}th tile {row[f'cost_roles_sample{args.sample}_pct']:+.1f}%)"
                 if args.sample else "")
              + f"  (noise {row['noise_pct']:.1f}%; paired: level 1 {row['paired_cost_tiles_pct']:+.1f}%, level 2 "
                f"{row['paired_cost_waits_pct']:+.1f}%, level 3 {row['paired_cost_roles_pct']:+.1f}%)"
              f"{'' if row['bitwise_equal_levels'] else '  OUTPUTS DIFFER'}", flush=True)
        save(rows)

