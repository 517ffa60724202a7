"""Builds of one pass's kernel side by side in one process, at chosen instrumentation levels: other
`kernels/fwd.py` or `kernels/bwd.py` files (e.g. from `git show REV:kernels/fwd.py`, or the
checkout's with one change) against the checkout's, on HSP points, the jagged self-attention grid
(causal or not) and the dense shape; the backward under each schedule asked for.

Every (build, level) is checked against the fp32 reference (where it fits in memory) and bit for bit
against the checkout at level 0 (the forward's O; the backward's dK and dV, since dQ's reduce-adds may
add in any order), then the main kernel alone (CUPTI durations) is timed in rounds that alternate all of them; a
figure is the median of its rounds, and `vs_checkout` is each one's time over the checkout's at
level 0 (under the first schedule or work-list order); `paired_vs_checkout` compares each round with the
checkout's in the same round (the median ratio and the rounds it was faster in), which a clock moving
between rounds (the power cap) leaves standing. Kernel-only figures: a diagnostic, not the op's
time as called. The forward's `--orders`: `op` is the op's work list (`jfa_prof.schedule`), `tile` the
same tiles by each one's own cost, longest first (the op's order before 2026-12-04), `sequence` by
their sequence, longest first, without the op's groups, `split` the op's groups by query block, then
list position, `wavesK` the op's grouping with groups of K waves instead of two.

    git show 8f96150:kernels/fwd.py > /tmp/fwd_before.py
    python benchmarks/kernel_ab.py --pass fwd --build before=/tmp/fwd_before.py --levels 0 1 --out ab.json
    python benchmarks/kernel_ab.py --pass bwd --schedules static dynamic --points jagged,2048,1,causal --out ab.json
    python benchmarks/kernel_ab.py --pass fwd --orders op tile sequence --points jagged,2048,1,causal --out ab.json
"""
import argparse
import contextlib
import importlib.util
import json
import math
import sys
from dataclasses import replace

import torch

import jfa_prof.kernels as kernels_pkg
from jfa_prof import bench, timing
from jfa_prof.inputs import hsp_point, select_workload, upstream_grad
from jfa_prof.kernels import bwd as checkout_bwd
from jfa_prof.kernels import fwd as checkout_fwd
from jfa_prof.kernels.attention import bwd_launch_recorded, fwd_launch
from jfa_prof.schedule import DEFAULT_SCHEDULE, GROUP_WAVES, by_cost_in_groups, fwd_work_list, sequence_blocks

POINTS = ("256,2048,0.5", "128,1024,0.1", "256,4096,0.9", "128,4096,0.9", "dense")
CHECKOUT = {"fwd": checkout_fwd, "bwd": checkout_bwd}
KERNEL = {"fwd": "_jfa_fwd", "bwd": "_jfa_bwd"}


def point_workload(text):
    """A point as given on the command line: "LQ,MAX_KV,SPARSITY" (HSP), "jagged,MAX_KV,SPARSITY"
    with an optional ",causal" or ",window=W" (W keys on each side), or "dense"."""
    if text == "dense":
        return select_workload("dense")
    if text.startswith("jagged,"):
        _, max_kv, sparsity, *mask = text.split(",")
        window = mask[0].removeprefix("window=") if len(mask) == 1 and mask[0].startswith("window=") else None
        if mask not in ([], ["causal"]) and not (window or "").isdigit():
            raise SystemExit(f"--points {text!r}: a jagged point is jagged,MAX_KV,SPARSITY[,causal|,window=W]")
        w = select_workload("jagged", max_kv=int(max_kv), sparsity=float(sparsity))
        return replace(w, causal=mask == ["causal"], window=int(window) if window else None)
    lq, max_kv, sparsity = hsp_point(text)
    return select_workload("hsp", Lq=lq, max_kv=max_kv, sparsity=sparsity)


def load_builds(pass_name, specs):
    """`LABEL=PATH` each: the kernel module at PATH, by label; 'checkout' is the tree's own."""
    builds = {}
    for i, spec in enumerate(specs):
        label, sep, path = spec.partition("=")
        if not sep or not label or label == "checkout" or label in builds:
            raise SystemExit(f"--build {spec!r}: give LABEL=PATH, a new label other than 'checkout'")
        mod_spec = importlib.util.spec_from_file_location(f"jfa_prof.kernels.{pass_name}_ab{i}", path)
        builds[label] = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(builds[label])
    return {**builds, "checkout": CHECKOUT[pass_name]}


@contextlib.contextmanager
def build(pass_name, module):
    """The launchers import `jfa_prof.kernels.<pass>` when called: point that name at `module` meanwhile."""
    name = f"jfa_prof.kernels.{pass_name}"
    setattr(kernels_pkg, pass_name, module)
    sys.modules[name] = module
    try:
        yield
    finally:
        setattr(kernels_pkg, pass_name, CHECKOUT[pass_name])
        sys.modules[name] = CHECKOUT[pass_name]


def runner(pass_name, w, x, n_ctas):
    """A call of the pass's kernel at a profile level and in a mode (the forward: the op's default
    schedule on a prebuilt work list, the mode its order, None for the op's; the backward: the mode a
    schedule, None for its default), returning the outputs compared bit for bit, and the reference's."""
    q_off = None if w.broadcast_q else x.q_offsets
    common = _common(w)
    if pass_name == "fwd":
        wl = fwd_work_list(x.kv_offsets, q_off, x.q.shape[0] if w.broadcast_q else None, w.H, x.max_seq_len_q,
                           block_m=checkout_fwd.BLOCK_M, window=w.window, causal=w.causal,
                           schedule=DEFAULT_SCHEDULE, n_ctas=n_ctas)
        by_seq = by_sequence(wl, x.kv_offsets, w.H)
        lists = {None: wl, "op": wl, "tile": by_tile_cost(wl), "sequence": by_seq, "split": split_blocks(wl, n_ctas),
                 **{f"waves{k}": in_groups(by_seq, k * n_ctas) for k in (1, 4)}}

        def run(level, order=None):
            return fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, profile=level, work=lists[order],
                              **common)[0]
        return run, _reference(x, "fwd"), lambda out: out
    call = bwd_call(w, x)
    return (lambda level, schedule=None: call(level, schedule)[:3]), _reference(x, "bwd"), lambda out: out[1:3]


def _reordered(wl, key):
    """`wl` with its listed tiles sorted by key(tiles, costs) ascending, the unlisted tail kept; each
    launch then gets a fresh queue (`fwd_launch` with a reused list)."""
    n = int(wl.n_work)
    tiles, costs = wl.tiles[:n].long(), wl.costs[:n].long()
    order = torch.argsort(key(tiles, costs))
    return replace(wl, tiles=torch.cat([tiles[order].to(wl.tiles.dtype), wl.tiles[n:]]),
                   costs=torch.cat([costs[order].to(wl.costs.dtype), wl.costs[n:]]), queue=None)


def by_sequence(wl, kv_offsets, H):
    """`wl`'s listed tiles by their sequence's KV blocks, longest first, in grid order within: the
    op's order without its groups."""
    blocks = sequence_blocks(kv_offsets, H, wl.n_m_blocks, checkout_fwd.kv_block_n(wl.n_m_blocks))
    return _reordered(wl, lambda tiles, costs: -blocks[tiles] * (blocks.numel() + 1) + tiles)


def in_groups(wl, size):
    """`wl` with each group of `size` list positions by tile cost, longest first: the op's grouping
    with groups of another size, from the whole-sequence order."""
    n = int(wl.n_work)
    rank = torch.empty(n, dtype=torch.long, device=wl.tiles.device)
    rank[by_cost_in_groups(torch.arange(n, device=wl.tiles.device), wl.costs[:n], wl.n_work, size)] = torch.arange(
        n, device=wl.tiles.device)
    return _reordered(wl, lambda tiles, costs: rank)


def split_blocks(wl, n_ctas):
    """`wl` with each group of two waves (`jfa_prof.schedule.GROUP_WAVES`) by query block, then list
    position: the query blocks of one (batch, head) about a wave apart instead of side by side."""
    n = int(wl.n_work)
    size = GROUP_WAVES * n_ctas
    pos = torch.arange(n, device=wl.tiles.device)
    return _reordered(wl, lambda tiles, costs: ((pos // size) * wl.n_m_blocks + tiles % wl.n_m_blocks) * (n + 1) + pos)


def by_tile_cost(wl):
    """`wl`'s listed tiles by each one's own cost (KV blocks visited), longest first, ties in grid
    order: the op's order before 2026-12-04."""
    return _reordered(wl, lambda tiles, costs: -costs * (int(tiles.max()) + 1 if tiles.numel() else 1) + tiles)


def _reference(x, pass_name):
    """The fp32 reference, or None where it does not fit in memory (the reference pads every sequence to
    the longest: the jagged grid's long points need tens of GiB); those points are checked bit for bit
    against the checkout only."""
    try:
        return bench.reference_output(x, pass_name)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


def _common(w):
    return dict(sm_scale=1 / math.sqrt(w.D), window=w.window, causal=w.causal, broadcast_q=w.broadcast_q)


def bwd_call(w, x):
    """`bwd_launch_recorded` at a profile level, its whole result, on the gradient of one forward."""
    q_off = None if w.broadcast_q else x.q_offsets
    common = _common(w)
    o, lse, _, _ = fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, **common)
    do = upstream_grad(x, o)

    def call(level, schedule=None):
        return bwd_launch_recorded(x.q, x.k, x.v, o, lse, do, q_off, x.kv_offsets, x.max_seq_len_q,
                                   x.max_seq_len_kv, profile=level, **({"schedule": schedule} if schedule else {}),
                                   **common)
    return call


def main(argv=None, default_pass=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    if default_pass is None:
        ap.add_argument("--pass", dest="pass_name", choices=("fwd", "bwd"), required=True)
    ap.add_argument("--build", action="append", default=[], metavar="LABEL=PATH",
                    help="another kernel file of the pass, by label (repeatable)")
    ap.add_argument("--levels", nargs="+", type=int, default=[0], help="profile levels to time each build at")
    ap.add_argument("--build-levels", nargs="+", type=int,
                    help="levels for the --build files only (default: --levels); the checkout is always timed at 0")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--points", nargs="+", metavar="LQ,MAX_KV,SPARSITY|jagged,MAX_KV,SPARSITY[,causal|,window=W]|dense",
                    help="HSP points, jagged self-attention points and / or the dense shape (default: four HSP "
                         "points and dense)")
    ap.add_argument("--schedules", nargs="+", choices=checkout_bwd.SCHEDULES,
                    help="backward: time every build under each of these schedules (default: the op's own)")
    ap.add_argument("--orders", nargs="+", choices=("op", "tile", "sequence", "split", "waves1", "waves4"),
                    help="forward: time every build on the work list in each of these orders (default: the op's)")
    args = ap.parse_args(argv)
    pass_name = default_pass or args.pass_name
    if args.schedules and pass_name != "bwd":
        ap.error("--schedules is for the backward; the forward's work list brings its schedule")
    if args.orders and pass_name != "fwd":
        ap.error("--orders is for the forward's work list")
    modes = args.schedules or args.orders or [None]
    builds = load_builds(pass_name, args.build)
    device = timing.require_gpu("the kernel A/B benchmark")
    n_ctas = torch.cuda.get_device_properties(device).multi_processor_count
    levels = {name: sorted(set(args.levels) | {0}) if name == "checkout" else (args.build_levels or args.levels)
              for name in builds}
    rows = []
    for w in (point_workload(p) for p in (args.points or POINTS)):
        x = w.make(device)
        run, ref, compared = runner(pass_name, w, x, n_ctas)

        def call(module, level, mode=None):
            with build(pass_name, module):
                return run(level, mode)

        # Named name@level, and name@level/mode when more than one schedule or order is timed.
        calls = {f"{name}@{level}" + (f"/{mode}" if len(modes) > 1 else ""):
                 (lambda m=m, lv=level, md=mode: call(m, lv, md))
                 for name, m in builds.items() for level in levels[name] for mode in modes}
        base = compared(call(builds["checkout"], 0, modes[0]))
        row = {"workload": w.label, "flops": x.flops(pass_name), "builds": {}}
        for name, fn in calls.items():
            out = fn()
            row["builds"][name] = {"rel_err_vs_ref": None if ref is None else bench.rel_err(out, ref),
                                   "bitwise_equal_checkout_level0": bench.bitwise_equal(compared(out), base)}
        timed = timing.alternated(calls, args.rounds,
                                  timer=lambda fn: timing.kernel_median_ms(fn, KERNEL[pass_name]))
        for name, rounds in timed.items():
            row["builds"][name].update(timing.rounds_summary(rounds, row["flops"]))
        ref = "checkout@0" + (f"/{modes[0]}" if len(modes) > 1 else "")
        row["vs_checkout"] = {n: e["ms"] / row["builds"][ref]["ms"] for n, e in row["builds"].items()}
        row["paired_vs_checkout"] = {n: timing.paired_rounds(r, timed[ref]) for n, r in timed.items()}
        rows.append(row)
        print(f"{w.label:28s} " + "  ".join(
            f"{n} {e['ms']:.4f} x{row['vs_checkout'][n]:.3f}"
            + ("" if n == ref else " (paired x{ratio:.3f}, faster in {faster_rounds}/{rounds})".format(
                **row["paired_vs_checkout"][n]))
            + ("" if e["bitwise_equal_checkout_level0"] else " (differs)") for n, e in row["builds"].items()),
            flush=True)
    meta = timing.measurement_meta(command=" ".join(["python"] + sys.argv))
    meta["timer"] = (f"CUPTI durations of {KERNEL[pass_name]}, median of 10 per round, median of alternated rounds "
                     "(kernel only: a diagnostic)")
    meta["builds"] = {label: getattr(m, "__file__", None) for label, m in builds.items()}
    meta["schedules"] = modes if args.schedules else "the op's default"
    if args.orders:
        meta["orders"] = args.orders
    with open(args.out, "w") as fh:
        json.dump({"meta": meta, "pass": pass_name, "levels": levels, "results": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
