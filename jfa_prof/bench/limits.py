"""What keeps a point from its target: the targets against FA4, and the split of our kernel's
recorded time that ``bench --limits`` keeps per point (`jfa_prof.analyses.limits` reads both).
"""
from __future__ import annotations

from typing import Any

__all__ = ["TARGETS", "record_split"]

# The speed-up over FA4 each pass aims for per grid (SPEC §8); grids not named here have none.
TARGETS = {("fwd", "hsp"): 1.15, ("fwd", "dense"): 1.0, ("bwd", "hsp"): 1.5, ("bwd", "dense"): 1.0}


def record_split(workload, pass_: str, schedule: str) -> dict[str, Any]:
    """Record one launch of our kernel on ``workload`` with tile records only (level 1, the
    cheapest) and split its time (`jfa_prof.analyses.limits.time_split`)."""
    from jfa_prof.analyses.limits import time_split
    from jfa_prof.recording import record_bwd_workload, record_workload

    trace = (record_workload(workload, schedule, level=1) if pass_ == "fwd"
             else record_bwd_workload(workload, schedule, level=1))
    if trace.dropped:
        raise RuntimeError(f"{trace.dropped} tile records dropped: the split would miss them")
    split = time_split(trace.tiles, trace.n_ctas, trace.makespan_ns)
    return {"schedule": schedule, "profile_level": 1, "variant": trace.meta["kernel"]["variant"],
            "kernel_ms": trace.kernel_ms, **split.to_dict()}
