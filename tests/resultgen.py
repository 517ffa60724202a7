"""Result files as the GPU commands write them, with invented times, for tests that need one
that was never recorded (a second waterfall, a newer date)."""
from __future__ import annotations

import json
from pathlib import Path

from jfa_prof.ablations import WaterfallRecord
from jfa_prof.analyses.waterfall import AblationTiming, WaterfallTimings

# (ablation, time saved alone, time saved cumulatively) in ms
STEPS = (("no_o_store", 0.031, 0.031), ("no_exp", 0.102, 0.128), ("reuse_kv", 0.214, 0.371),
         ("no_mask", 0.012, 0.380))


def write_waterfall(path: Path, *, date: str = "2026-11-30T06:00:00+00:00", baseline: float = 1.2898,
                    steps=STEPS) -> Path:
    """A cumulative forward waterfall as `jfa-prof waterfall --save` writes it."""
    timings = WaterfallTimings(
        baseline_ms=baseline, baseline_repeat_ms=baseline + 0.0021, pass_="fwd",
        ablations=tuple(AblationTiming(name, f"removes {name}", baseline - alone, baseline - cum, 1 << i)
                        for i, (name, alone, cum) in enumerate(steps)))
    rec = WaterfallRecord(timings=timings, workload={"label": "hsp Lq=256 max=2048 s=0.5", "B": 1024},
                          schedule="lpt", meta={"gpu": "NVIDIA H200", "date": date}, flops=536800133120.0)
    path.write_text(json.dumps(rec.to_dict()))
    return path
