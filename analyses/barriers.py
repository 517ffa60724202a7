"""Which barrier waits the kernel's warp roles spend their time in.

Each (CTA, role, site) accumulator holds the ``clock64`` cycles a role spent blocked in one
``barrier_wait`` call site, and how many waits it made. Attribution sums them over CTAs per
(site, role) and sets them against the time the roles existed:

- ``share = cycles / total_cycles`` where ``total_cycles`` is the sum over every (CTA, role) of
  that role's span in cycles (first tile start to last tile end of the role, from the span
  records). So ``share`` is the fraction of all warp-role time in the kernel spent blocked at
  this site, and the shares of all rows add up to the kernel's overall wait fraction.
- ``share_of_role = cycles / role_cycles[role]`` where ``role_cycles`` sums that role's spans
  over CTAs: the fraction of that role's own time spent at this site.

Without span records, pass ``kernel_cycles`` (the kernel's duration in SM cycles): every
(CTA, role) is then taken to have lived for the whole kernel (``basis == "kernel time"``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from jfa_prof.analyses.jsonable import plain, records

__all__ = ["BarrierAttribution", "barrier_attribution"]

TABLE_COLUMNS = ("site", "role", "cycles", "count", "mean_wait_cycles", "share", "share_of_role",
                 "n_ctas", "worst_cta", "worst_cta_cycles")


@dataclass
class BarrierAttribution:
    """``table``: one row per (site, role) that waited at least once, most cycles first."""

    table: pd.DataFrame
    total_cycles: float
    role_cycles: dict[str, float] = field(default_factory=dict)
    basis: str = "role spans"  # or "kernel time", or "none" when no denominator is known

    @property
    def wait_cycles(self) -> float:
        return float(self.table["cycles"].sum()) if len(self.table) else 0.0

    @property
    def wait_fraction(self) -> float:
        return self.wait_cycles / self.total_cycles if self.total_cycles > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "share_basis": self.basis,
            "total_cycles": plain(self.total_cycles),
            "wait_cycles": plain(self.wait_cycles),
            "wait_fraction": plain(self.wait_fraction),
            "role_cycles": {k: plain(v) for k, v in self.role_cycles.items()},
            "sites": records(self.table),
        }


def barrier_attribution(waits: pd.DataFrame, spans: pd.DataFrame | None = None, *,
                        kernel_cycles: float | None = None) -> BarrierAttribution:
    """Attribute wait cycles to (site, role); see the module docstring for ``share``."""
    live = waits[(waits["count"] > 0) | (waits["cycles"] > 0)]
    roles = list(dict.fromkeys(waits["role"]))

    if spans is not None and len(spans) and spans["dur_cycles"].sum() > 0:
        basis = "role spans"
        per_role = spans.groupby("role")["dur_cycles"].sum()
        role_cycles = {r: float(per_role.get(r, 0.0)) for r in roles}
    elif kernel_cycles:
        basis = "kernel time"
        lanes = waits.groupby("role")["cta"].nunique()
        role_cycles = {r: float(kernel_cycles) * int(lanes.get(r, 0)) for r in roles}
    else:
        basis = "none"
        role_cycles = {r: math.nan for r in roles}
    total = float(sum(role_cycles.values())) if basis != "none" else math.nan

    if not len(live):
        return BarrierAttribution(table=pd.DataFrame(columns=list(TABLE_COLUMNS)), total_cycles=total,
                                  role_cycles=role_cycles, basis=basis)

    grouped = live.groupby(["site", "role"], sort=False)
    table = grouped.agg(cycles=("cycles", "sum"), count=("count", "sum"), site_id=("site_id", "first"),
                        role_id=("role_id", "first"),
                        n_ctas=("count", lambda c: int((c > 0).sum()))).reset_index()
    worst = live.loc[grouped["cycles"].idxmax().to_numpy(), ["site", "role", "cta", "cycles"]]
    worst = worst.rename(columns={"cta": "worst_cta", "cycles": "worst_cta_cycles"})
    table = table.merge(worst, on=["site", "role"], how="left")

    cycles = table["cycles"].to_numpy(np.float64)
    count = table["count"].to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        table["mean_wait_cycles"] = np.where(count > 0, cycles / count, np.nan)
        table["share"] = cycles / total if total and total > 0 else np.nan
        denom = table["role"].map(role_cycles).to_numpy(np.float64)
        table["share_of_role"] = np.where(denom > 0, cycles / denom, np.nan)
    table = table.sort_values(["cycles", "site_id", "role_id"], ascending=[False, True, True])
    table = table[list(TABLE_COLUMNS)].reset_index(drop=True)
    return BarrierAttribution(table=table, total_cycles=total, role_cycles=role_cycles, basis=basis)
