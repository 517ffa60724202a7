"""What the schedules and the instrumentation levels cost, kernel against kernel.

Per HSP point and schedule (static, lpt, dynamic) the same launch with a prebuilt work list at
PROFILE level 0, 1 (tile records + role spans), 2 (+ barrier waits) and 0 again (the repeat
gives the noise). Two timings:

- the kernel alone: CUPTI durations (medians of `--launches` launches) in `--rounds` rounds that
  alternate all twelve (schedule, level) calls, so a clock drifting over the run spreads over all
  of them; a call's figure is the median of its rounds. Schedules are compared at level 0.
- the whole call (triton.testing.do_bench median): includes allocating and zeroing the record
  buffer on the host side.

Every level's output is checked bit for bit against level 0's, and level 0's against the fp32
reference.

    python benchmarks/profile_overhead.py --out benchmarks/results/profile_overhead.json
"""
import argparse
import json
import math
import statistics

import torch

from jfa_prof import bench, timing
from jfa_prof.inputs import hsp_point, select_workload
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import fwd_launch
from jfa_prof.schedule import SCHEDULES, fwd_work_list

# Every sparsity-0.1 point of the HSP grid (where the schedules differ most and tiles are
# shortest, so instrumentation weighs most), and three denser ones.
POINTS = ((128, 1024, 0.1), (128, 2048, 0.1), (128, 4096, 0.1), (256, 1024, 0.1), (256, 2048, 0.1),
          (256, 4096, 0.1), (128, 1024, 0.5), (256, 2048, 0.5), (256, 4096, 0.9))
LEVELS = (("off", 0), ("tiles", 1), ("waits", 2), ("off_again", 0))

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--launches", type=int, default=20)
ap.add_argument("--points", nargs="+", metavar="LQ,MAX_KV,SPARSITY",
                help="HSP points to measure (default: the nine above), e.g. 128,1024,0.1")
ap.add_argument("--schedules", nargs="+", choices=SCHEDULES, default=list(SCHEDULES))
args = ap.parse_args()
try:
    points = [hsp_point(p) for p in args.points] if args.points else POINTS
except ValueError:
    ap.error("--points takes LQ,MAX_KV,SPARSITY triples such as 128,1024,0.1")
schedules = tuple(args.schedules)
device = timing.require_gpu("the instrumentation overhead benchmark")
n_ctas = torch.cuda.get_device_properties(device).multi_processor_count


def kernel_ms(fn) -> float:
    """Median CUPTI duration of the forward kernel over the launches of one round."""
    return timing.kernel_median_ms(fn, "_jfa_fwd", n=args.launches)


def pct(a: float, b: float) -> float:
    return 100 * (a / b - 1)


def level0(times: dict) -> float:
    """The faster of the two uninstrumented timings: what overheads and schedules are measured from."""
    return min(times["off"], times["off_again"])


rows = []
for lq, kv, s in points:
    w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
    x = w.make(device)
    ref = bench.reference_output(x, "fwd")
    row = {"workload": w.label, "flops": x.flops("fwd")}
    calls = {}
    for schedule in schedules:
        wl = fwd_work_list(x.kv_offsets, None, lq, w.H, lq, block_m=fwd.BLOCK_M, window=None, causal=False,
                           schedule=schedule, n_ctas=n_ctas)

        def run(profile, schedule=schedule, wl=wl):
            return fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, lq, sm_scale=1 / math.sqrt(w.D), window=None,
                              causal=False, broadcast_q=True, schedule=schedule, profile=profile, work=wl)

        base = run(0)[0]
        t = {"rel_err_vs_ref": bench.rel_err(base, ref)}
        t["bitwise_equal_levels"] = all(torch.equal(run(p)[0], base) for _, p in LEVELS[1:3])
        rec = run(2)[2]
        t["dropped_records"] = int(rec[0].item())
        t.update({name: timing.bench(lambda p=p, run=run: run(p)) for name, p in LEVELS})
        call_base = level0(t)
        t["overhead_tiles_pct"] = pct(t["tiles"], call_base)
        t["overhead_waits_pct"] = pct(t["waits"], call_base)
        t["noise_pct"] = 100 * abs(t["off"] / t["off_again"] - 1)
        row[schedule] = t
        for name, p in LEVELS:
            calls[(schedule, name)] = lambda p=p, run=run: run(p)
    rounds = timing.alternated(calls, args.rounds, timer=kernel_ms)
    for schedule in schedules:
        t = row[schedule]
        k = {name: statistics.median(rounds[(schedule, name)]) for name, _ in LEVELS}
        kbase = level0(k)
        t["kernel_ms"] = k
        t["kernel_rounds"] = {name: rounds[(schedule, name)] for name, _ in LEVELS}
        t["kernel_overhead_tiles_pct"] = pct(k["tiles"], kbase)
        t["kernel_overhead_waits_pct"] = pct(k["waits"], kbase)
        t["kernel_noise_pct"] = 100 * abs(k["off"] / k["off_again"] - 1)
        t["tflops"] = row["flops"] / kbase / 1e9
    for schedule in (sch for sch in schedules if sch != "static" and "static" in schedules):
        row[f"{schedule}_speedup_vs_static"] = level0(row["static"]["kernel_ms"]) / level0(row[schedule]["kernel_ms"])
    rows.append(row)
    print(f"{w.label:28s} " + "  ".join(
        f"{sch} {level0(row[sch]['kernel_ms']):.3f} ms "
        f"+{row[sch]['kernel_overhead_tiles_pct']:.1f}%/+{row[sch]['kernel_overhead_waits_pct']:.1f}% "
        f"(noise {row[sch]['kernel_noise_pct']:.1f}%)" for sch in schedules), flush=True)
command = f"python benchmarks/profile_overhead.py --out {args.out} --rounds {args.rounds} --launches {args.launches}"
if args.points:
    command += " --points " + " ".join(args.points)
if schedules != tuple(SCHEDULES):
    command += " --schedules " + " ".join(schedules)
meta = timing.measurement_meta(command=command)
meta["timer"] = ("kernel: CUPTI durations, median per round, median of alternated rounds; call: "
                 "triton.testing.do_bench median")
meta["note"] = ("level 1 records tiles and spans, level 2 adds barrier waits; work lists prebuilt; "
                "<schedule>_speedup_vs_static compares level-0 kernels")
with open(args.out, "w") as fh:
    json.dump({"meta": meta, "results": rows}, fh, indent=1)
