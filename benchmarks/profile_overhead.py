"""What instrumentation costs: the same launch with a prebuilt work list at PROFILE level 0, 1
(tile records + role spans), 2 (+ barrier waits) and 0 again (the repeat shows the noise),
medians of triton.testing.do_bench.

    python benchmarks/profile_overhead.py --out benchmarks/results/profile_overhead.json
"""
import argparse
import datetime
import json
import math
import sys

import torch
import triton
import triton.testing

from jfa_prof.inputs import select_workload
from jfa_prof.kernels import fwd
from jfa_prof.kernels.attention import fwd_launch
from jfa_prof.schedule import fwd_work_list
from jfa_prof.timing import kernel_durations_ms

def kernel_ms(fn, n: int = 20) -> float:
    """Median device duration of the forward kernel over n launches, after one warm-up."""
    fn()
    times = sorted(kernel_durations_ms(fn, "_jfa_fwd", n=n)[0])
    return times[len(times) // 2]


ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
a = ap.parse_args()
rows = []
for lq, kv, s in ((256, 2048, 0.1), (256, 2048, 0.5), (128, 1024, 0.5), (256, 4096, 0.9)):
    w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
    x = w.make("cuda")
    row = {"workload": w.label}
    for schedule in ("lpt", "dynamic"):
        wl = fwd_work_list(x.kv_offsets, None, lq, w.H, lq, block_m=fwd.BLOCK_M, window=None,
                           causal=False, schedule=schedule, n_ctas=torch.cuda.get_device_properties(0).multi_processor_count)

        def run(profile, schedule=schedule, wl=wl):
            return fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, lq, sm_scale=1 / math.sqrt(w.D), window=None,
                              causal=False, broadcast_q=True, schedule=schedule, profile=profile, work=wl)

        levels = (("off", 0), ("tiles", 1), ("waits", 2), ("off_again", 0))
        # The whole call (do_bench): includes allocating and zeroing the record buffer on the host side.
        t = {name: triton.testing.do_bench(lambda p=p: run(p), warmup=50, rep=200, return_mode="median")
             for name, p in levels}
        base = min(t["off"], t["off_again"])
        t["overhead_tiles_pct"] = 100 * (t["tiles"] / base - 1)
        t["overhead_waits_pct"] = 100 * (t["waits"] / base - 1)
        t["noise_pct"] = 100 * abs(t["off"] / t["off_again"] - 1)
        # The kernel alone: CUPTI durations of 20 launches each, medians.
        k = {name: kernel_ms(lambda p=p: run(p)) for name, p in levels}
        kbase = min(k["off"], k["off_again"])
        t["kernel_ms"] = k
        t["kernel_overhead_tiles_pct"] = 100 * (k["tiles"] / kbase - 1)
        t["kernel_overhead_waits_pct"] = 100 * (k["waits"] / kbase - 1)
        t["kernel_noise_pct"] = 100 * abs(k["off"] / k["off_again"] - 1)
        row[schedule] = t
    rows.append(row)
    print(row, flush=True)
meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python"] + sys.argv),
        "note": "times include the host launch (work list prebuilt); level 1 records tiles and spans, level 2 adds "
                "barrier waits"}
json.dump({"meta": meta, "results": rows}, open(a.out, "w"), indent=1)
