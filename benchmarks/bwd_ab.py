"""Builds of the backward kernel side by side in one process: one or more other `kernels/bwd.py`
files (e.g. from `git show REV:kernels/bwd.py`) against the checkout's, kernel-only at level 0.
`kernel_ab.py --pass bwd` with the options of earlier runs; result files written before it moved
there keep each other build's `speedup` (its time over the checkout's), later ones `vs_checkout`.

    git show 8f96150:kernels/bwd.py > /tmp/bwd_before.py
    python benchmarks/bwd_ab.py --before /tmp/bwd_before.py --label-before 8f96150 --out bwd_ab.json
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import kernel_ab  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--before", required=True, action="append", help="another kernels/bwd.py (repeatable)")
ap.add_argument("--label-before", action="append", help="a name for each --before, in order")
ap.add_argument("--out", required=True)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--points", nargs="+", metavar="LQ,MAX_KV,SPARSITY|dense")
args = ap.parse_args()
labels = args.label_before or [f"before{i + 1}" if len(args.before) > 1 else "before" for i in range(len(args.before))]
if len(labels) != len(args.before):
    ap.error("give one --label-before per --before")
argv = [a for label, path in zip(labels, args.before) for a in ("--build", f"{label}={path}")]
argv += ["--out", args.out, "--rounds", str(args.rounds)] + (["--points", *args.points] if args.points else [])
kernel_ab.main(argv, default_pass="bwd")
