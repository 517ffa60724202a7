"""The SM clock and board power while each implementation runs back to back, as do_bench runs it
(L2 flushed before each call): whether one implementation's time under sustained load is set by the
clock the card's power limit leaves it, rather than by its work. A kernel that is faster in short
bursts (`gpu_ms`) but slower under do_bench than a peer points there.

Each implementation runs for --seconds per round, the implementations in turn for --rounds rounds;
a sampler thread reads the clock and the power every --period-ms (NVML through torch, or
nvidia-smi where torch cannot reach NVML). Samples from the first --settle-ms of each run are left
out. Per implementation: the median ms per call over the rounds and the median clock, power and
energy per call.

    python benchmarks/clocks_under_load.py --out FILE [--points dense 256,2048,0.5] [--passes fwd bwd]
"""
import argparse
import json
import statistics
import subprocess
import sys
import threading
import time

import torch
import triton

from jfa_prof import timing
from jfa_prof.bench.impls import jfa_impls
from jfa_prof.bench.peers import peer_impls, peer_status
from kernel_ab import point_workload  # this folder is on the path when a script here runs

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--points", nargs="+", default=["dense", "256,2048,0.5"])
ap.add_argument("--passes", nargs="+", default=["fwd", "bwd"])
ap.add_argument("--peers", default="fa4")
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--seconds", type=float, default=1.5)
ap.add_argument("--period-ms", type=float, default=50)
ap.add_argument("--settle-ms", type=float, default=300)
args = ap.parse_args()


def nvml_reader():
    """(SM MHz, watts) now: torch's NVML calls, else one nvidia-smi query."""
    try:
        torch.cuda.clock_rate(), torch.cuda.power_draw()
        return "nvml", lambda: (float(torch.cuda.clock_rate()), torch.cuda.power_draw() / 1000.0)
    except Exception:
        def smi():
            line = subprocess.run(["nvidia-smi", "-i", str(torch.cuda.current_device()),
                                   "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            mhz, watts = line.split(",")
            return float(mhz), float(watts)
        return "nvidia-smi", smi


class Sampler(threading.Thread):
    def __init__(self, read, period_s):
        super().__init__(daemon=True)
        self.read, self.period_s, self.samples, self.stop = read, period_s, [], threading.Event()

    def run(self):
        while not self.stop.is_set():
            t = time.perf_counter()
            self.samples.append((t, *self.read()))
            self.stop.wait(max(0.0, self.period_s - (time.perf_counter() - t)))

    def between(self, t0, t1):
        return [(mhz, w) for t, mhz, w in self.samples if t0 <= t <= t1]


def sustained(fn, seconds):
    """Run fn back to back (L2 flushed before each call) for about `seconds`; per call ms, and the
    host window [t0, t1] in which the GPU ran them."""
    cache = triton.runtime.driver.active.get_empty_cache_for_benchmark()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t_probe = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    n = max(5, int(seconds / max(time.perf_counter() - t_probe, 1e-5)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    t0 = time.perf_counter()
    for i in range(n):
        triton.runtime.driver.active.clear_cache(cache)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)], t0, t1


source, read = nvml_reader()
sampler = Sampler(read, args.period_ms / 1000)
sampler.start()
status = peer_status([k for k in args.peers.split(",") if k])
usable = [k for k, s in status.items() if s.available]
results = {}
for text in args.points:
    w = point_workload(text)
    x = w.make("cuda")
    for pass_ in args.passes:
        impls = [i for i in jfa_impls(x, pass_=pass_) if not i.name.endswith("-planned")] + peer_impls(x, usable, pass_)
        rows = {i.name: {"rounds_ms": [], "mhz": [], "watts": []} for i in impls}
        for _ in range(args.rounds):
            for impl in impls:
                run, _ = impl.build()
                per_call, t0, t1 = sustained(run, args.seconds)
                got = sampler.between(t0 + args.settle_ms / 1000, t1)
                row = rows[impl.name]
                row["rounds_ms"].append(statistics.median(per_call))
                row["mhz"] += [m for m, _ in got]
                row["watts"] += [p for _, p in got]
                del run
                torch.cuda.empty_cache()
        for name, row in rows.items():
            ms = statistics.median(row["rounds_ms"])
            watts = statistics.median(row["watts"]) if row["watts"] else None
            row.update(ms=ms, median_mhz=statistics.median(row["mhz"]) if row["mhz"] else None,
                       min_mhz=min(row["mhz"], default=None), median_watts=watts,
                       mj_per_call=watts * ms if watts else None, samples=len(row["mhz"]))
            del row["mhz"], row["watts"]
            key = f"{pass_} {w.label} {name}"
            results[key] = row
            print(f"{key:48s} {ms:8.3f} ms  {row['median_mhz']} MHz (min {row['min_mhz']})  "
                  f"{watts} W  {row['mj_per_call'] and round(row['mj_per_call'], 1)} mJ/call  rounds {row['rounds_ms']}",
                  flush=True)
    del x
sampler.stop.set()
meta = timing.measurement_meta(" ".join(["python"] + sys.argv),
                               flash_attn_4=status["fa4"].version if "fa4" in usable else None)
meta["timer"] = (f"per call: CUDA events around each call run back to back for {args.seconds} s (L2 flushed before "
                 f"each, as do_bench does), median; {args.rounds} rounds alternating the implementations")
meta["sampler"] = f"{source} every {args.period_ms} ms, the first {args.settle_ms} ms of each run left out"
with open(args.out, "w") as f:
    json.dump({"meta": meta, "results": results}, f, indent=1)
