"""Where each SM was busy, and when: the data behind the heatmap.

Inputs are tile tables with the columns of ``Trace.tiles`` (``smid``, ``cta``, ``role``,
``start_ns``, ``end_ns``, ...), measured or predicted. An SM counts as busy while at least one
tile runs on it: two consumer warp groups working on different tiles of one CTA, or two CTAs
sharing an SM, do not make it "twice busy". Rows are keyed by ``smid`` (0 .. n_sms-1, idle SMs
included), never by CTA, since a CTA's SM is decided by the hardware.

Everything is vectorized over tiles; a 100k-tile trace takes milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

__all__ = [
    "Occupancy",
    "busy_intervals",
    "occupancy_matrix",
    "per_sm_busy",
    "role_utilization",
]


def busy_intervals(key: np.ndarray, start: np.ndarray, end: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Union of intervals per key: (key, start, end) of disjoint intervals, sorted by key then start."""
    key = np.asarray(key, dtype=np.int64)
    start = np.asarray(start, dtype=np.float64)
    end = np.maximum(np.asarray(end, dtype=np.float64), start)
    if key.size == 0:
        return key, start, end
    order = np.lexsort((start, key))
    k, s, e = key[order], start[order], end[order]
    # Running max of the end within each key: offset every key's times past the previous key's
    # so one global maximum.accumulate never carries an end across keys.
    lo = min(s.min(), 0.0)
    stride = e.max() - lo + 1.0
    shifted = (e - lo) + (k - k.min()) * stride
    reach = np.maximum.accumulate(shifted)
    prev_reach = np.concatenate(([-np.inf], reach[:-1]))
    first = np.ones(k.size, dtype=bool)
    first[1:] = (k[1:] != k[:-1]) | ((s[1:] - lo) + (k[1:] - k.min()) * stride > prev_reach[1:])
    idx = np.flatnonzero(first)
    merged_end = np.maximum.reduceat(e, idx)
    return k[idx], s[idx], merged_end


def _bin_overlaps(key: np.ndarray, start: np.ndarray, end: np.ndarray, n_bins: int, width: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every (interval, bin) pair an interval touches on uniform bins from 0: the interval's
    index, its key, the bin and the overlap in ns. Intervals are clipped to [0, n_bins·width]."""
    hi = n_bins * width
    s = np.clip(np.asarray(start, dtype=np.float64), 0.0, hi)
    e = np.clip(np.asarray(end, dtype=np.float64), 0.0, hi)
    e = np.maximum(e, s)
    b0 = np.minimum((s // width).astype(np.int64), n_bins - 1)
    b1 = np.maximum(np.minimum(np.ceil(e / width).astype(np.int64) - 1, n_bins - 1), b0)
    counts = b1 - b0 + 1
    src = np.repeat(np.arange(s.size), counts)
    first = np.cumsum(counts) - counts
    bins = b0[src] + (np.arange(src.size) - first[src])
    overlap = np.minimum(e[src], (bins + 1) * width) - np.maximum(s[src], bins * width)
    return src, np.asarray(key)[src], bins, np.maximum(overlap, 0.0)


@dataclass
class Occupancy:
    """SM × time occupancy.

    ``busy[smid, b]``: fraction (0..1) of bin ``b`` during which SM ``smid`` ran at least one
    tile. ``edges_ns``: the ``n_bins + 1`` bin edges, ns from the kernel's first tile start.
    ``dominant[smid, b]``: row position in ``tiles`` of the tile covering more than half of
    the bin (the longest-overlapping one if several do), or -1: what a hover can name.
    """

    busy: np.ndarray
    edges_ns: np.ndarray
    dominant: np.ndarray
    tiles: pd.DataFrame

    @property
    def n_sms(self) -> int:
        return self.busy.shape[0]

    @property
    def n_bins(self) -> int:
        return self.busy.shape[1]

    @property
    def smids(self) -> np.ndarray:
        return np.arange(self.n_sms)

    @property
    def bin_ns(self) -> float:
        return float(self.edges_ns[1] - self.edges_ns[0])

    @property
    def centers_ns(self) -> np.ndarray:
        return 0.5 * (self.edges_ns[:-1] + self.edges_ns[1:])


def _n_sms(tiles: pd.DataFrame, n_sms: int | None) -> int:
    seen = int(tiles["smid"].max()) + 1 if len(tiles) else 0
    return max(seen, int(n_sms or 0), 1)


def occupancy_matrix(tiles: pd.DataFrame, n_sms: int | None = None, *, n_bins: int = 400,
                     t_end_ns: float | None = None) -> Occupancy:
    """Bin [0, t_end_ns] (default: the makespan) into ``n_bins`` columns per SM.

    Pass the same ``t_end_ns`` to panels that are compared side by side, so equal widths
    mean equal times.
    """
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    rows = _n_sms(tiles, n_sms)
    makespan = float(tiles["end_ns"].max()) if len(tiles) else 0.0
    t_end = float(t_end_ns) if t_end_ns is not None else makespan
    if t_end <= 0:
        t_end = 1.0  # an empty or instantaneous trace still gets a drawable axis
    width = t_end / n_bins
    edges = np.linspace(0.0, t_end, n_bins + 1)

    sm = tiles["smid"].to_numpy(np.int64)
    start = tiles["start_ns"].to_numpy(np.float64)
    end = tiles["end_ns"].to_numpy(np.float64)

    mk, ms, me = busy_intervals(sm, start, end)
    _, k, b, ov = _bin_overlaps(mk, ms, me, n_bins, width)
    busy = np.bincount(k * n_bins + b, weights=ov, minlength=rows * n_bins).reshape(rows, n_bins)
    busy = np.clip(busy / width, 0.0, 1.0)

    dominant = np.full(rows * n_bins, -1, dtype=np.int64)
    src, k, b, ov = _bin_overlaps(sm, start, end, n_bins, width)
    big = ov > 0.5 * width
    if big.any():
        cell = k[big] * n_bins + b[big]
        src, ov = src[big], ov[big]
        order = np.lexsort((src, -ov, cell))
        cell, src = cell[order], src[order]
        head = np.ones(cell.size, dtype=bool)
        head[1:] = cell[1:] != cell[:-1]
        dominant[cell[head]] = src[head]
    return Occupancy(busy=busy, edges_ns=edges, dominant=dominant.reshape(rows, n_bins),
                     tiles=tiles.reset_index(drop=True))


def per_sm_busy(tiles: pd.DataFrame, n_sms: int | None = None) -> pd.DataFrame:
    """One row per SM (index ``smid``, idle SMs included).

    Columns: ``n_tiles``, ``n_ctas``; ``busy_ns`` (time with at least one tile running);
    ``work_ns`` (sum of tile durations: above busy_ns when tiles overlap on the SM);
    ``first_start_ns`` and ``finish_ns`` (NaN on an idle SM).
    """
    rows = _n_sms(tiles, n_sms)
    sm = tiles["smid"].to_numpy(np.int64)
    start = tiles["start_ns"].to_numpy(np.float64)
    end = tiles["end_ns"].to_numpy(np.float64)
    mk, ms, me = busy_intervals(sm, start, end)
    first = np.full(rows, np.inf)
    finish = np.full(rows, -np.inf)
    np.minimum.at(first, sm, start)
    np.maximum.at(finish, sm, end)
    n_tiles = np.bincount(sm, minlength=rows)
    idle = n_tiles == 0
    first[idle] = np.nan
    finish[idle] = np.nan
    if len(tiles):
        n_ctas = tiles.groupby("smid")["cta"].nunique().reindex(range(rows), fill_value=0).to_numpy()
    else:
        n_ctas = np.zeros(rows, dtype=np.int64)
    out = pd.DataFrame({
        "n_tiles": n_tiles,
        "n_ctas": n_ctas.astype(np.int64),
        "busy_ns": np.bincount(mk, weights=me - ms, minlength=rows),
        "work_ns": np.bincount(sm, weights=end - start, minlength=rows),
        "first_start_ns": first,
        "finish_ns": finish,
    }, index=pd.RangeIndex(rows, name="smid"))
    return out


def role_utilization(tiles: pd.DataFrame, spans: pd.DataFrame, roles: Sequence[str], *,
                     n_ctas: int | None = None, n_bins: int = 100,
                     t_end_ns: float | None = None) -> pd.DataFrame:
    """Per warp role, over time (long table: ``role``, ``bin``, ``t0_ns``, ``t1_ns``, ``active``, ``busy``).

    ``active``: fraction of the CTAs whose role is between its first and last tile (from the
    role spans). ``busy``: fraction of the CTAs whose role is running a tile it recorded (from
    the tile records, written by the consumer replica that ran the tile); NaN for a role that
    records no tiles, such as the producer.
    """
    if n_ctas is None:
        seen = pd.concat([tiles["cta"], spans["cta"]]) if len(spans) else tiles["cta"]
        n_ctas = int(seen.max()) + 1 if len(seen) else 1
    n_ctas = max(int(n_ctas), 1)
    ends = [float(tiles["end_ns"].max()) if len(tiles) else 0.0,
            float(spans["end_ns"].max()) if len(spans) else 0.0]
    t_end = float(t_end_ns) if t_end_ns is not None else max(ends)
    if t_end <= 0:
        t_end = 1.0
    width = t_end / n_bins
    edges = np.linspace(0.0, t_end, n_bins + 1)
    n_roles = len(roles)
    norm = n_ctas * width

    def per_role(df: pd.DataFrame, id_col: str) -> np.ndarray:
        if not len(df):
            return np.zeros((n_roles, n_bins))
        ids = df[id_col].to_numpy(np.int64)
        ok = (ids >= 0) & (ids < n_roles)
        _, k, b, ov = _bin_overlaps(ids[ok], df["start_ns"].to_numpy(np.float64)[ok],
                                    df["end_ns"].to_numpy(np.float64)[ok], n_bins, width)
        return np.bincount(k * n_bins + b, weights=ov, minlength=n_roles * n_bins).reshape(n_roles, n_bins) / norm

    active = per_role(spans, "role_id")
    busy = per_role(tiles, "role")
    busy[~np.isin(np.arange(n_roles), tiles["role"].to_numpy(np.int64))] = np.nan
    return pd.DataFrame({
        "role": np.repeat(np.asarray(roles, dtype=object), n_bins),
        "bin": np.tile(np.arange(n_bins), n_roles),
        "t0_ns": np.tile(edges[:-1], n_roles),
        "t1_ns": np.tile(edges[1:], n_roles),
        "active": active.ravel(),
        "busy": busy.ravel(),
    })
