"""What the instrumentation's building blocks cost a warp, in SM cycles, on the GPU at hand.

Two small kernels, timed by the SM clock inside them (the median over CTAs of cycles per iteration):
- `timers`: one read of %globaltimer, %clock64, %clock (an S2UR) and %smid per iteration, its value
  either folded into a register (xor) or stored; one warpgroup alone, one per SM, three per SM.
- `stores`: N scalar 8-byte stores, then a load whose value the next iteration's address needs, so
  whatever the stores hold the warp up shows in the loop's time; new addresses or the same ones.

    python benchmarks/record_costs.py --out benchmarks/results/instrumentation/record_costs.json
"""
import argparse
import json

import torch
import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jfa_prof import timing

READS = ("globaltimer", "clock64", "clock_s2ur", "smid")


@triton.jit
def _read(MODE: tl.constexpr):
    if MODE == 0:
        x = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    elif MODE == 1:
        x = tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)
    elif MODE == 2:
        x = tl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r", [], dtype=tl.int32, is_pure=False,
                                      pack=1).to(tl.int64)
    else:
        x = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False,
                                      pack=1).to(tl.int64)
    return x


@triton.jit
def _timer_reads(out, sink, N: tl.constexpr, MODE: tl.constexpr, STORE: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([], tl.int64)
    c0 = tlx.clock64()
    for i in range(N):
        x = _read(MODE)
        if STORE:
            tl.store(sink + pid * N + i, x)
        else:
            acc = acc ^ x
    c1 = tlx.clock64()
    tl.store(out + pid, c1 - c0)
    tl.store(sink + pid * N, acc, mask=not STORE)


@triton.jit
def _stores_then_load(out, sink, src, N_ST: tl.constexpr, ITERS: tl.constexpr, SAME: tl.constexpr):
    pid = tl.program_id(0)
    idx = tl.zeros([], tl.int32)
    c0 = tlx.clock64()
    for it in range(ITERS):
        for j in tl.static_range(N_ST):
            if SAME:
                tl.store(sink + pid * 64 + j, c0)
            else:
                tl.store(sink + (pid * ITERS + it) * 32 + j, c0)
        idx = tl.load(src + idx + pid * 4)
    c1 = tlx.clock64()
    tl.store(out + pid, c1 - c0)
    tl.store(out + 4096 + pid, idx)


def per_iteration(launch, grid: int, iters: int, out) -> float:
    for _ in range(3):  # the first launch compiles and warms up
        launch()
    torch.cuda.synchronize()
    return (out[:grid].double() / iters).median().item()


def timers(n: int = 256) -> dict[str, float]:
    res = {}
    for grid in (1, 132, 396):
        for mode, name in enumerate(READS):
            for store in (False, True):
                out = torch.zeros(grid, dtype=torch.int64, device="cuda")
                sink = torch.zeros(grid * n, dtype=torch.int64, device="cuda")
                key = f"grid{grid} {name} {'store' if store else 'xor'}"
                res[key] = per_iteration(lambda: _timer_reads[(grid,)](out, sink, n, mode, store, num_warps=4),
                                         grid, n, out)
                print(f"{key:32s} {res[key]:8.1f} cycles per read", flush=True)
    # %globaltimer's step: the differences between 4096 reads in a row.
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    sink = torch.zeros(4096, dtype=torch.int64, device="cuda")
    _timer_reads[(1,)](out, sink, 4096, 0, True, num_warps=4)
    steps = sink.cpu().diff()
    res["globaltimer_steps_ns"] = sorted(set(steps[steps > 0].tolist()))[:10]
    print("globaltimer steps (ns):", res["globaltimer_steps_ns"], flush=True)
    return res


def stores(iters: int = 256) -> dict[str, float]:
    res = {}
    for grid in (1, 132):
        for same in (False, True):
            for n in (0, 1, 4, 8, 16):
                out = torch.zeros(8192, dtype=torch.int64, device="cuda")
                sink = torch.zeros(132 * iters * 32 + 132 * 64, dtype=torch.int64, device="cuda")
                src = torch.zeros(4096, dtype=torch.int32, device="cuda")
                key = f"grid{grid} {'same' if same else 'new'} stores={n}"
                res[key] = per_iteration(
                    lambda: _stores_then_load[(grid,)](out, sink, src, n, iters, same, num_warps=4), grid, iters, out)
                print(f"{key:32s} {res[key]:8.1f} cycles per (stores + dependent load)", flush=True)
    return res


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", nargs="+", choices=("timers", "stores"), default=["timers", "stores"])
    args = ap.parse_args()
    timing.require_gpu("the record-cost microbenchmark")
    meta = timing.measurement_meta(command=f"python benchmarks/record_costs.py --out {args.out} --parts "
                                           + " ".join(args.parts))
    meta["timer"] = "the SM clock inside the kernel: cycles per iteration, median over CTAs (4 warps each)"
    results = {part: {"timers": timers, "stores": stores}[part]() for part in args.parts}
    with open(args.out, "w") as fh:
        json.dump({"meta": meta, "results": results}, fh, indent=1)
