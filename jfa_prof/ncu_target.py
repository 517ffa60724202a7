"""The program ``jfa-prof ncu`` runs under Nsight Compute: a few uninstrumented forward (or
backward) launches of one benchmark workload.

    python -m jfa_prof.ncu_target --schedule lpt --grid hsp --lq 128 --max-kv 1024 --sparsity 0.5
    python -m jfa_prof.ncu_target --pass bwd --dq tma1 --schedule static --lq 256 --max-kv 2048

A module of the package rather than a script beside it, so that ``jfa-prof ncu`` works from an
installed wheel. ncu skips the first ``WARMUP_LAUNCHES`` launches of the kernel and profiles the
next ``PROFILED_LAUNCHES``; ``jfa_prof.ncu_live`` builds ``-s``/``-c`` from the same constants,
so the profiled launch always exists and is never the first (which pays for module loading and
starts with cold caches).

Errors go to stderr as one line and set the exit code of the matching ``JfaProfError``; the
caller shows the tail of ncu's output, which then ends with that line.
"""
from __future__ import annotations

import argparse
import math
import sys

WARMUP_LAUNCHES = 2
PROFILED_LAUNCHES = 1
# The kernels' PROFILE levels (jfa_prof/kernels/profiling.py).
PROFILE_LEVELS = (0, 1, 2)
PROFILE_LEVELS_HELP = "0 off, 1 tile records and role spans, 2 also barrier waits"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m jfa_prof.ncu_target", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pass", dest="pass_", default="fwd", help="fwd or bwd")
    ap.add_argument("--schedule", default=None, help="fwd: static, lpt (default) or dynamic; bwd: static "
                                                     "(broadcast-Q's default) or dynamic (jagged Q's)")
    ap.add_argument("--dq", default=None, help="bwd: the dQ reduction, tma, tma1 or atomic (default: the op's)")
    ap.add_argument("--grid", default="hsp", help="workload grid: hsp, jagged, dense, long")
    ap.add_argument("--lq", type=int, help="queries per sequence (hsp grid)")
    ap.add_argument("--max-kv", type=int, help="longest KV sequence")
    ap.add_argument("--sparsity", type=float, help="mean length / max")
    ap.add_argument("--seed", type=int, help="seed of the sequence lengths")
    ap.add_argument("--causal", action="store_true", help="the workload with the causal mask (jagged-Q grids)")
    ap.add_argument("--no-peel", action="store_true", help="mask every KV block (no peeled mask tail)")
    ap.add_argument("--profile", type=int, default=0, help=f"instrumentation level: {PROFILE_LEVELS_HELP}")
    ap.add_argument("--launches", type=int, default=WARMUP_LAUNCHES + PROFILED_LAUNCHES,
                    help="forward launches in total (default: the ones ncu skips plus the profiled one)")
    return ap


def check_profile_level(level: int) -> None:
    from jfa_prof.errors import BadInputError

    if level not in PROFILE_LEVELS:
        raise BadInputError(f"unknown instrumentation level {level}", hint=PROFILE_LEVELS_HELP)


def run(args: argparse.Namespace) -> str:
    """Launch the workload ``args.launches`` times; returns what ran, for the last line of output."""
    import torch

    from jfa_prof import ablations
    from jfa_prof.commands.options import resolve_workload
    from jfa_prof.errors import BadInputError, NoGpuError, TlxUnavailableError

    ablations.pass_options(args.pass_, args.schedule, args.dq)
    if args.launches < 1:
        raise BadInputError(f"--launches must be at least 1, got {args.launches}")
    check_profile_level(args.profile)
    workload = resolve_workload(args.grid, args.lq, args.max_kv, args.sparsity, args.seed, args.causal)
    schedule = ablations.pass_options(args.pass_, args.schedule, args.dq, broadcast_q=workload.broadcast_q)
    if not torch.cuda.is_available():
        raise NoGpuError("no CUDA GPU is visible: the forward kernel needs an sm_90 GPU")
    try:
        from jfa_prof.kernels.attention import fwd_launch
    except ImportError as err:
        raise TlxUnavailableError(f"cannot import the kernels: {err}", hint="jfa-prof doctor says why") from None

    x = workload.make("cuda")
    if args.pass_ == "bwd":
        # The ablation launcher with no ablation: one forward first, then the backward alone.
        launch = ablations.make_launcher(x, "bwd", schedule, args.dq, profile=args.profile)(0)
    else:
        def launch():
            fwd_launch(x.q, x.k, x.v, None if workload.broadcast_q else x.q_offsets, x.kv_offsets, x.max_seq_len_q,
                       sm_scale=1 / math.sqrt(workload.D), window=workload.window, causal=workload.causal,
                       broadcast_q=workload.broadcast_q, schedule=schedule, peel=not args.no_peel,
                       profile=args.profile)
    for _ in range(args.launches):
        launch()
    torch.cuda.synchronize()
    return (f"{args.pass_} {workload.label} {schedule}{' no-peel' if args.no_peel else ''}"
            f"{f' dq {args.dq}' if args.dq else ''}{f' profile {args.profile}' if args.profile else ''}: "
            f"{args.launches} launches")


def main(argv: list[str] | None = None) -> int:
    from jfa_prof.errors import JfaProfError

    args = build_parser().parse_args(argv)
    try:
        done = run(args)
    except JfaProfError as err:
        print(f"jfa_prof.ncu_target: error: {err}", file=sys.stderr)
        return err.exit_code
    print(f"jfa_prof.ncu_target: {done}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
