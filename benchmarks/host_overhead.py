"""Where a short call's host time goes: microseconds of CPU per call for the public op (forward
and backward) and for each piece under it, plus a cProfile of each op. A call whose host time
exceeds its kernel time leaves the GPU idle, so on short shapes this, not the kernel, sets speed.

    python benchmarks/host_overhead.py --out benchmarks/results/host_overhead.json
"""
import argparse
import collections
import cProfile
import datetime
import io
import json
import math
import os
import pstats
import statistics
import sys
import threading
import time

import torch
import triton
import triton.testing
from triton.runtime.jit import JITFunction

from jfa_prof.inputs import select_workload
from jfa_prof.kernels import C_CACHE, attention, fwd
from jfa_prof.kernels.attention import _descriptor, bwd_launch, fwd_launch, jagged_flash_attention, plan_attention
from jfa_prof.schedule import fwd_work_list

CALLS = 200
launches = collections.defaultdict(list)  # kernel name -> host seconds of each launch


def _timed_run(run):
    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = run(self, *args, **kwargs)
        launches[self.__name__].append(time.perf_counter() - t0)
        return out
    return timed


JITFunction.run = _timed_run(JITFunction.run)


def host_us(fns, rounds=CALLS):
    """Median CPU microseconds of one call of each of `fns` (name -> callable), each started on an
    idle GPU (a queue full of earlier work would block the host and time the GPU instead). The
    calls are interleaved round by round, so drift of a busy host spreads over all of them alike.
    Also, per name, the median host time of each Triton launch inside ("launch:<kernel>") and of
    the bwd_launch the op's backward runs on autograd's thread ("inner:bwd_launch")."""
    for fn in fns.values():
        for _ in range(5):
            fn()
    times = collections.defaultdict(list)
    inner = collections.defaultdict(list)
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            launches.clear()
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
            for what, spent in launches.items():
                inner[name, what if ":" in what else f"launch:{what}"] += spent
    torch.cuda.synchronize()
    out = {name: {"call": round(statistics.median(t) * 1e6, 1)} for name, t in times.items()}
    for (name, key), spent in inner.items():
        out[name][key] = round(statistics.median(spent) * 1e6, 1)
    return out


def profile_text(fn, calls=50, top=25):
    fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--quick", action="store_true", help="only the op calls and their GPU times, no profiles")
a = ap.parse_args()
w = select_workload("hsp", Lq=128, max_kv=1024, sparsity=0.1)
x = w.make("cuda")
scale = 1 / math.sqrt(w.D)
n_sms = torch.cuda.get_device_properties(0).multi_processor_count
plan = plan_attention(x.kv_offsets, max_seq_len_q=x.max_seq_len_q, H=w.H, broadcast_q=True)


def op(plan=None):
    return jagged_flash_attention(x.q, x.k, x.v, None, x.kv_offsets, x.max_seq_len_q, x.max_seq_len_kv,
                                  broadcast_q=True, validate=False, plan=plan)


def work_list():
    return fwd_work_list(x.kv_offsets, None, x.max_seq_len_q, w.H, x.max_seq_len_q, block_m=fwd.BLOCK_M,
                         block_n=fwd.BLOCK_N, window=None, causal=False, schedule="lpt", n_ctas=n_sms)


def launch_planned():
    return fwd_launch(x.q, x.k, x.v, None, x.kv_offsets, x.max_seq_len_q, sm_scale=scale, window=None, causal=False,
                      broadcast_q=True, work=plan.work)[0]


def descriptors():
    return [_descriptor(t, fwd.BLOCK_N, w.D) for t in (x.q, x.k, x.v, x.q)]


def raw_op():
    return torch.ops.jfa_prof.jfa_fwd(x.q, x.k, x.v, x.kv_offsets, x.kv_offsets, x.max_seq_len_q, scale, -1, False,
                                      True, "lpt", x.max_seq_len_kv, plan.work.tiles, plan.work.n_work,
                                      plan.work.n_m_blocks)


@triton.jit
def _empty_kernel(x):
    pass


qg = x.q.detach().requires_grad_()
kg = x.k.detach().requires_grad_()
vg = x.v.detach().requires_grad_()
o = jagged_flash_attention(qg, kg, vg, None, x.kv_offsets, x.max_seq_len_q, x.max_seq_len_kv, broadcast_q=True,
                           validate=False, return_lse=True)
o, lse = o
do = torch.randn_like(o)


def backward():
    return torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)


def raw_bwd_op():
    return torch.ops.jfa_prof.jfa_bwd(x.q, x.k, x.v, o.detach(), lse, do, x.kv_offsets, x.kv_offsets,
                                      x.max_seq_len_q, x.max_seq_len_kv, scale, -1, False, True)


def on_a_thread(fn):
    t = threading.Thread(target=fn)
    t.start()
    t.join()


def backward_launch():
    return bwd_launch(x.q, x.k, x.v, o.detach(), lse, do, None, x.kv_offsets, x.max_seq_len_q, x.max_seq_len_kv,
                      sm_scale=scale, window=None, causal=False, broadcast_q=True)


def _timed_bwd_launch(real_launch):
    """bwd_launch as the op's backward calls it (a module global, on autograd's device thread),
    timed into `launches` like a kernel."""
    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = real_launch(*args, **kwargs)
        launches["inner:bwd_launch"].append(time.perf_counter() - t0)
        return out
    return timed


attention.bwd_launch = _timed_bwd_launch(attention.bwd_launch)


def synchronizing_calls():
    """Each op with CUDA's sync debug mode set to raise: a host sync would stall the launch queue."""
    found = {}
    for name, fn in (("fwd_op", op), ("bwd_op", backward), ("bwd_launch", backward_launch)):
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
            found[name] = "no synchronizing call"
        except RuntimeError as e:
            found[name] = str(e).splitlines()[0]
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return found


fns = {"fwd_op": op, "bwd_op": backward}
extra = {}
if not a.quick:
    fns.update({
        "fwd_op_planned": lambda: op(plan),
        "fwd_custom_op_planned": raw_op,
        "fwd_launch_planned": launch_planned,
        "fwd_work_list": work_list,
        "fwd_descriptors": descriptors,
        "empty_triton_launch": lambda: _empty_kernel[(1, )](x.q),
        "torch_empty": lambda: torch.empty(16, device="cuda"),
        "bwd_custom_op": raw_bwd_op,
        "bwd_launch": backward_launch,
        "bwd_launch_on_a_thread": lambda: on_a_thread(backward_launch),
    })
    extra["syncs"] = synchronizing_calls()
rows = host_us(fns)
gpu_ms = {name: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
          for name, fn in (("fwd_op", op), ("fwd_launch_planned", launch_planned), ("bwd_op", backward),
                           ("bwd_launch", backward_launch))}
for name, us in rows.items():
    print(f"{name:24s}", us, flush=True)
print("do_bench ms:", {k: round(v, 4) for k, v in gpu_ms.items()}, extra, flush=True)
if not a.quick:
    extra["profiles"] = {"fwd_op": profile_text(op), "bwd_launch": profile_text(backward_launch)}
meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "python": sys.version.split()[0],
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python"] + sys.argv), "workload": w.label,
        "c_cache": C_CACHE, "env": {k: os.environ.get(k) for k in ("JFA_PROF_C_CACHE", "TRITON_USE_C_DISPATCHER")},
        "timer": "time.perf_counter per call, median of 200 interleaved rounds (host); triton.testing.do_bench median (GPU)"}
with open(a.out, "w") as f:
    json.dump({"meta": meta, "host_us": rows, "do_bench_ms": gpu_ms, **extra}, f, indent=1)
