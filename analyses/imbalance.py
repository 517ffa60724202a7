"""How unevenly the work landed on the SMs: the figures printed under the heatmap.

Definitions (times in ns from the kernel's first tile start; an SM is busy while at least one
tile runs on it, see :mod:`jfa_prof.analyses.occupancy`):

- ``makespan``: first tile start to last tile end.
- busy statistics (mean, max, min, max/mean) are over all ``n_sms`` SMs of the GPU; an SM that
  ran nothing counts as 0 busy, because it is capacity the schedule left unused.
- ``mean_finish``: mean over the SMs that ran at least one tile of their last tile end.
- ``tail = makespan - mean_finish``: how long the last SMs run after a typical SM is done.
- ``idle_fraction = 1 - sum(busy) / (n_sms * makespan)``.
- critical SMs: the SMs still running after ``mean_finish`` (the tail window), latest first.
- last tiles: the tiles that end last, with what made them long (batch, head, kv_len).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from jfa_prof.analyses.jsonable import plain, records

from jfa_prof.analyses.occupancy import per_sm_busy

__all__ = ["Imbalance", "LAST_TILE_COLUMNS", "imbalance"]

LAST_TILE_COLUMNS = ("slot", "cta", "smid", "tile", "batch", "head", "block", "kv_len", "n_blocks",
                     "start_ns", "end_ns", "dur_ns")


@dataclass
class Imbalance:
    n_sms: int
    n_tiles: int
    n_idle_sms: int
    makespan_ns: float
    mean_busy_ns: float
    max_busy_ns: float
    min_busy_ns: float
    max_over_mean: float
    mean_finish_ns: float
    tail_ns: float
    idle_fraction: float
    dropped: int = 0
    per_sm: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    critical_sms: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    last_tiles: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)

    FIGURES = ("n_sms", "n_tiles", "n_idle_sms", "makespan_ns", "mean_busy_ns", "max_busy_ns",
               "min_busy_ns", "max_over_mean", "mean_finish_ns", "tail_ns", "idle_fraction", "dropped")

    def figures(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in self.FIGURES}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the figures, the critical SMs and the last tiles (NaN becomes null)."""
        out: dict[str, Any] = {k: plain(v) for k, v in self.figures().items()}
        out["critical_sms"] = records(self.critical_sms)
        out["last_tiles"] = records(self.last_tiles)
        return out




def imbalance(tiles: pd.DataFrame, n_sms: int | None = None, *, dropped: int = 0,
              n_critical: int = 8, n_last: int = 10) -> Imbalance:
    """Imbalance figures of one (measured or predicted) tile table on ``n_sms`` SMs."""
    per_sm = per_sm_busy(tiles, n_sms)
    rows = len(per_sm)
    busy = per_sm["busy_ns"].to_numpy()
    ran = per_sm["n_tiles"].to_numpy() > 0
    last_end = float(tiles["end_ns"].max()) if len(tiles) else 0.0
    makespan = last_end - float(tiles["start_ns"].min()) if len(tiles) else 0.0
    mean_busy = float(busy.mean())
    mean_finish = float(per_sm["finish_ns"][ran].mean()) if ran.any() else 0.0

    critical = per_sm[per_sm["finish_ns"] > mean_finish].copy()
    critical["over_mean_ns"] = critical["finish_ns"] - mean_finish
    critical = critical.sort_values(["finish_ns", "busy_ns"], ascending=False).head(n_critical)
    critical = critical.reset_index()[["smid", "finish_ns", "over_mean_ns", "busy_ns", "n_tiles"]]

    cols = [c for c in LAST_TILE_COLUMNS if c in tiles.columns]
    last = tiles.sort_values(["end_ns", "slot" if "slot" in tiles.columns else "end_ns"],
                             ascending=[False, True]).head(n_last)[cols].reset_index(drop=True)

    return Imbalance(
        n_sms=rows,
        n_tiles=int(len(tiles)),
        n_idle_sms=int((~ran).sum()),
        makespan_ns=makespan,
        mean_busy_ns=mean_busy,
        max_busy_ns=float(busy.max()),
        min_busy_ns=float(busy.min()),
        max_over_mean=float(busy.max() / mean_busy) if mean_busy > 0 else math.nan,
        mean_finish_ns=mean_finish,
        tail_ns=last_end - mean_finish if ran.any() else 0.0,
        idle_fraction=float(1.0 - busy.sum() / (rows * makespan)) if makespan > 0 else math.nan,
        dropped=int(dropped),
        per_sm=per_sm,
        critical_sms=critical,
        last_tiles=last,
    )
