"""Level-3 recordings (every warp role, tile by tile) of one HSP point per pass, as built and with
a known cause planted or a piece of work removed, for `jfa-prof diagnose` to be checked against.

Builds per pass (`meta["build"]` names each; `meta["build_note"]` says what it changes):
- forward: the op's build; `fwd.PLANTS` (a slow producer, a slow epilogue); a K/V ring one stage
  deep; the `reuse_kv` and `no_o_store` ablations (less memory traffic, no output stores);
- backward: the op's build; `bwd.PLANTS` (a slow producer, a slow dQ reduce-add); the `no_dq`
  ablation.

    python benchmarks/roles_record.py --out-dir out/traces
"""
import argparse
import shlex
import sys
from pathlib import Path

from jfa_prof.inputs import hsp_point, select_workload
from jfa_prof.kernels import bwd, fwd
from jfa_prof.recording import record_bwd_workload, record_workload
from jfa_prof.trace import write_trace

ap = argparse.ArgumentParser()
ap.add_argument("--out-dir", type=Path, required=True)
ap.add_argument("--point", default="256,2048,0.5", metavar="LQ,MAX_KV,SPARSITY")
ap.add_argument("--tag", default="", help="suffix of the file names, e.g. the commit")
ap.add_argument("--builds", nargs="+", metavar="PASS:BUILD", help="only these, e.g. fwd:op bwd:plant-slow_dq")
args = ap.parse_args()
lq, kv, s = hsp_point(args.point)
w = select_workload("hsp", Lq=lq, max_kv=kv, sparsity=s)
args.out_dir.mkdir(parents=True, exist_ok=True)
command = shlex.join(["python", *sys.argv])

FWD_BUILDS = {"op": ({}, "the op's build")}
FWD_BUILDS.update({f"plant-{name}": ({"ablate": bit}, note) for name, (bit, note) in fwd.PLANTS.items()})
FWD_BUILDS["plant-kv_ring_1"] = ({"kv_stages": 1}, "a K/V ring one stage deep: no block loads while another computes")
FWD_BUILDS.update({f"ablate-{name}": ({"ablate": fwd.ABLATIONS[name][0]}, fwd.ABLATIONS[name][1])
                   for name in ("reuse_kv", "no_o_store")})
BWD_BUILDS = {"op": ({}, "the op's build")}
BWD_BUILDS.update({f"plant-{name}": ({"ablate": bit}, note) for name, (bit, note) in bwd.PLANTS.items()})
BWD_BUILDS["ablate-no_dq"] = ({"ablate": bwd.ABLATIONS["no_dq"][0]}, bwd.ABLATIONS["no_dq"][1])

point = f"hsp_lq{lq}_kv{kv}_s{s}"
for pass_, builds in (("fwd", FWD_BUILDS), ("bwd", BWD_BUILDS)):
    for build, (kw, note) in builds.items():
        if args.builds and f"{pass_}:{build}" not in args.builds:
            continue
        if pass_ == "fwd":
            tr = record_workload(w, "dynamic", level=3, **kw)
        else:
            tr = record_bwd_workload(w, "static", level=3, **kw)
        tr.meta.update(build=build, build_note=note, command=command)
        name = f"h200_{pass_}_{point}_{build}_level3{('_' + args.tag) if args.tag else ''}.jfatrace"
        write_trace(args.out_dir / name, tr.buffer, tr.meta)
        lanes = tr.events.groupby("cta").agg(t0=("t_start", "min"), t1=("t_end", "max"))
        busiest = float((lanes["t1"] - lanes["t0"]).max()) / 1e6
        print(f"{pass_} {build:26s} kernel {tr.kernel_ms:.3f} ms, busiest CTA's records {busiest:.3f} ms "
              f"({100 * (busiest / tr.kernel_ms - 1):+.1f}%), {len(tr.events)} events, dropped {tr.events_dropped}",
              flush=True)
