"""Simulate a persistent kernel's schedule on the CPU, to predict its SM heatmap.

The model: ``G`` persistent CTAs, each running its tiles one after another, a tile costing
``a + b · n_blocks`` ns (``n_blocks``: KV blocks the tile visits). How tiles reach CTAs:

- ``static`` and ``lpt``: CTA ``c`` takes list positions ``c, c+G, c+2G, ...``. The two differ
  only in the list: grid order, or :func:`lpt_order` (longest first, dealt zigzag).
- ``dynamic``: each next list entry goes to the CTA that frees first (the atomic tile queue):
  a heap, ties going to the lower CTA.

Simulated tile tables carry the columns of ``Trace.tiles`` (with ``smid = cta``), so the
occupancy and imbalance analyses and the heatmap render predictions exactly like recordings.
Numpy in, pandas out: building the work list from offsets is the caller's business.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import numpy as np
import pandas as pd

from jfa_prof.analyses.occupancy import per_sm_busy
from jfa_prof.trace import TILE_COLUMNS

__all__ = [
    "CostModel",
    "FitSums",
    "PredictionComparison",
    "SCHEDULES",
    "WORK_COLUMNS",
    "compare_prediction",
    "fit_cost_model",
    "Prediction",
    "lpt_order",
    "predict_trace",
    "simulate",
    "tile_pitch",
    "work_list_from_tiles",
]

SCHEDULES = ("static", "lpt", "dynamic")
WORK_COLUMNS = ("tile", "batch", "head", "block", "kv_len", "n_blocks")


@dataclass(frozen=True)
class FitSums:
    """What a least-squares fit of ``y = a + b·x`` needs from its samples; sums of two sample
    sets are the sums of their union."""

    count: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    syy: float = 0.0

    @classmethod
    def of(cls, x: Any, y: Any) -> "FitSums":
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        return cls(float(x.size), float(x.sum()), float(y.sum()), float((x * x).sum()), float((x * y).sum()),
                   float((y * y).sum()))

    def __add__(self, other: "FitSums") -> "FitSums":
        return FitSums(*(u + v for u, v in zip(asdict(self).values(), asdict(other).values())))

    @property
    def separable(self) -> bool:
        """Whether the samples tell ``a`` from ``b``: more than one value of ``x``."""
        return self.count > 0 and self.sxx - self.sx * self.sx / self.count > 1e-9 * max(self.sxx, 1.0)

    def fit(self, *, nonnegative: bool = True) -> tuple[float, float, float]:
        """``(a, b, r2)``. Samples that are not :attr:`separable` get the fit through the origin:
        all of ``y`` per ``x``. ``nonnegative``: a negative intercept (no tile costs less than
        nothing) gives way to the fit through the origin too, a negative slope to the mean.
        ``r2`` is nan where ``y`` does not vary."""
        if self.count <= 0:
            raise ValueError("cannot fit without samples")
        a = 0.0
        if self.separable:
            b = (self.sxy - self.sx * self.sy / self.count) / (self.sxx - self.sx * self.sx / self.count)
            a = (self.sy - b * self.sx) / self.count
            if nonnegative and b < 0:
                a, b = self.sy / self.count, 0.0
        if not self.separable or (nonnegative and a < 0):
            a, b = (0.0, self.sxy / self.sxx) if self.sxx > 0 else (self.sy / self.count, 0.0)
        sse = self.syy - 2 * a * self.sy - 2 * b * self.sxy + a * a * self.count + 2 * a * b * self.sx + b * b * self.sxx
        sst = self.syy - self.sy * self.sy / self.count
        r2 = 1.0 - sse / sst if sst > 1e-9 * max(self.syy, 1.0) else math.nan
        return float(a), float(b), float(r2)


@dataclass(frozen=True)
class CostModel:
    """``time_ns = a_ns + b_ns · n_blocks``; ``basis`` says which measured time it was fit to."""

    a_ns: float
    b_ns: float
    r2: float = math.nan
    n_tiles: int = 0
    basis: str = "given"

    def __call__(self, n_blocks: Any) -> np.ndarray:
        return self.a_ns + self.b_ns * np.asarray(n_blocks, dtype=np.float64)

    def to_dict(self) -> dict[str, Any]:
        return {"a_ns": self.a_ns, "b_ns": self.b_ns,
                "r2": None if math.isnan(self.r2) else self.r2, "n_tiles": self.n_tiles, "basis": self.basis}


def tile_pitch(tiles: pd.DataFrame) -> np.ndarray:
    """Per tile, the time until the next tile of its CTA starts (its own duration for the last).

    That is what a tile costs a serial CTA, overheads and overlap with its neighbours included,
    which the tile's own duration misses."""
    order = np.lexsort((tiles["start_ns"].to_numpy(), tiles["cta"].to_numpy()))
    cta = tiles["cta"].to_numpy()[order]
    start = tiles["start_ns"].to_numpy(np.float64)[order]
    dur = tiles["dur_ns"].to_numpy(np.float64)[order]
    pitch = dur.copy()
    same = cta[1:] == cta[:-1]
    pitch[:-1][same] = (start[1:] - start[:-1])[same]
    out = np.empty_like(pitch)
    out[order] = pitch
    return out


def fit_cost_model(tiles: pd.DataFrame, *, basis: str = "pitch") -> CostModel:
    """Least-squares ``a``, ``b`` from measured tiles.

    ``basis="pitch"`` (default) fits the start-to-start time of consecutive tiles on a CTA,
    the throughput a schedule simulation needs; ``basis="duration"`` fits ``dur_ns``.
    """
    if basis not in ("pitch", "duration"):
        raise ValueError(f"basis must be 'pitch' or 'duration', got {basis!r}")
    if not len(tiles):
        raise ValueError("cannot fit a cost model to an empty tile table")
    y = tile_pitch(tiles) if basis == "pitch" else tiles["dur_ns"].to_numpy(np.float64)
    # One tile size leaves only the total per tile identifiable: the fit calls it all per-block cost.
    a, b, r2 = FitSums.of(tiles["n_blocks"].to_numpy(np.float64), y).fit(nonnegative=False)
    return CostModel(a_ns=float(a), b_ns=float(b), r2=r2, n_tiles=int(len(tiles)), basis=basis)


def lpt_order(n_blocks: Any, n_ctas: int) -> np.ndarray:
    """The LPT work list as a permutation of the tiles: sorted by cost, longest first (ties
    keep grid order), then every odd round of ``n_ctas`` reversed, so that dealing position
    ``p`` to CTA ``p % n_ctas`` gives a zigzag (CTA 0 takes the 1st and the 2G-th longest, ...).

    Only full rounds are reversed (as ``jfa_prof.schedule.zigzag`` does on the GPU): a list dealt
    by stride cannot hand a partial last round to the last CTAs.
    """
    if n_ctas < 1:
        raise ValueError(f"n_ctas must be >= 1, got {n_ctas}")
    cost = np.asarray(n_blocks)
    n = cost.size
    ranked = np.argsort(-cost, kind="stable")
    pos = np.arange(n)
    rnd, j = pos // n_ctas, pos % n_ctas
    full = (rnd + 1) * n_ctas <= n
    dest = np.where((rnd % 2 == 1) & full, rnd * n_ctas + (n_ctas - 1 - j), pos)
    out = np.empty(n, dtype=np.int64)
    out[dest] = ranked
    return out


def _as_work(work: pd.DataFrame | Mapping[str, Any]) -> pd.DataFrame:
    df = work if isinstance(work, pd.DataFrame) else pd.DataFrame(dict(work))
    if "n_blocks" not in df.columns:
        raise ValueError("the work list needs an 'n_blocks' column")
    df = df.reset_index(drop=True)
    out = pd.DataFrame({"slot": np.arange(len(df), dtype=np.int64)})
    for c in WORK_COLUMNS:
        out[c] = df[c].to_numpy(np.int64) if c in df.columns else (
            out["slot"].to_numpy() if c == "tile" else np.full(len(df), -1, dtype=np.int64))
    return out


def simulate(work: pd.DataFrame | Mapping[str, Any], n_ctas: int, schedule: str,
             cost: CostModel | None = None, *, durations: Any = None,
             clock_khz: float | None = None) -> pd.DataFrame:
    """Tile table of ``work`` (rows in list order; columns from WORK_COLUMNS, ``n_blocks``
    required) run by ``n_ctas`` persistent CTAs under ``schedule``.

    Tile times come from ``durations`` (ns per list entry) or ``cost(n_blocks)``. ``clock_khz``
    fills the cycle columns; without it they are 0.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if n_ctas < 1:
        raise ValueError(f"n_ctas must be >= 1, got {n_ctas}")
    df = _as_work(work)
    n = len(df)
    if durations is not None:
        dur = np.asarray(durations, dtype=np.float64)
        if dur.shape != (n,):
            raise ValueError(f"durations must have one entry per tile ({n}), got shape {dur.shape}")
    elif cost is not None:
        dur = cost(df["n_blocks"].to_numpy())
    else:
        raise ValueError("give a cost model or durations")
    dur = np.maximum(dur, 0.0)

    if schedule == "dynamic":
        cta, start = _deal_dynamic(dur, n_ctas)
    else:
        cta, start = _deal_strided(dur, n_ctas)
    end = start + dur

    df["cta"] = cta
    df["smid"] = cta
    cycles_per_ns = (clock_khz or 0.0) / 1e6
    df["t_start"] = np.rint(start).astype(np.int64)
    df["t_end"] = np.rint(end).astype(np.int64)
    df["c_start"] = np.rint(start * cycles_per_ns).astype(np.int64)
    df["c_end"] = np.rint(end * cycles_per_ns).astype(np.int64)
    df["role"] = 0
    df["valid"] = 1
    df["role_name"] = "cta"
    df["start_ns"] = start
    df["end_ns"] = end
    df["dur_ns"] = dur
    df["dur_cycles"] = df["c_end"] - df["c_start"]
    return df[list(TILE_COLUMNS)]


def _deal_strided(dur: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    n = dur.size
    rounds = -(-n // g)
    grid = np.zeros(rounds * g)
    grid[:n] = dur
    grid = grid.reshape(rounds, g)
    start = (np.cumsum(grid, axis=0) - grid).ravel()[:n]
    return np.arange(n, dtype=np.int64) % g, start


def _deal_dynamic(dur: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    n = dur.size
    cta = np.empty(n, dtype=np.int64)
    start = np.empty(n, dtype=np.float64)
    free = [(0.0, c) for c in range(g)]  # (time the CTA frees, CTA): a heap
    for i, d in enumerate(dur.tolist()):
        t, c = heapq.heappop(free)
        cta[i] = c
        start[i] = t
        heapq.heappush(free, (t + d, c))
    return cta, start


def work_list_from_tiles(tiles: pd.DataFrame) -> pd.DataFrame:
    """The work list a measured trace ran, in list order (its slots), as simulate takes it."""
    return tiles.sort_values("slot")[["slot", *WORK_COLUMNS]].reset_index(drop=True)


@dataclass
class PredictionComparison:
    """Prediction against measurement, per CTA (a predicted CTA has no real SM).

    ``makespan_error``: (predicted - measured) / measured. ``busy_corr``: Pearson correlation of
    per-CTA busy time (NaN when either side is constant). ``cta_agreement``: fraction of the
    tiles the prediction put on the CTA that actually ran them.
    """

    makespan_pred_ns: float
    makespan_meas_ns: float
    makespan_error: float
    busy_corr: float
    busy_mae_ns: float
    cta_agreement: float
    n_tiles: int

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in self.__dict__.items()}


def compare_prediction(pred: pd.DataFrame, measured: pd.DataFrame) -> PredictionComparison:
    def span(t: pd.DataFrame) -> float:
        return float(t["end_ns"].max() - t["start_ns"].min()) if len(t) else 0.0

    def by_cta(t: pd.DataFrame, n: int) -> np.ndarray:
        keyed = t.assign(smid=t["cta"])
        return per_sm_busy(keyed, n)["busy_ns"].to_numpy()

    n = int(max(pred["cta"].max() if len(pred) else -1, measured["cta"].max() if len(measured) else -1)) + 1
    p_busy, m_busy = by_cta(pred, n), by_cta(measured, n)
    corr = float(np.corrcoef(p_busy, m_busy)[0, 1]) if n > 1 and p_busy.std() > 0 and m_busy.std() > 0 else math.nan
    mp, mm = span(pred), span(measured)
    joined = pred[["slot", "cta"]].merge(measured[["slot", "cta"]], on="slot", suffixes=("_p", "_m"))
    agree = float((joined["cta_p"] == joined["cta_m"]).mean()) if len(joined) else math.nan
    return PredictionComparison(
        makespan_pred_ns=mp,
        makespan_meas_ns=mm,
        makespan_error=(mp - mm) / mm if mm > 0 else math.nan,
        busy_corr=corr,
        busy_mae_ns=float(np.abs(p_busy - m_busy).mean()) if n else math.nan,
        cta_agreement=agree,
        n_tiles=int(len(joined)),
    )


@dataclass
class Prediction:
    tiles: pd.DataFrame  # simulated, columns of Trace.tiles, smid = cta
    cost_model: CostModel
    comparison: PredictionComparison
    schedule: str


def predict_trace(tiles: pd.DataFrame, n_ctas: int, schedule: str, *, clock_khz: float | None = None,
                  basis: str = "pitch") -> Prediction:
    """Re-run a measured trace's own work list under ``schedule`` with a cost model fitted to it,
    and compare: how much of the measured picture the schedule alone explains."""
    model = fit_cost_model(tiles, basis=basis)
    pred = simulate(work_list_from_tiles(tiles), n_ctas, schedule, model, clock_khz=clock_khz)
    return Prediction(tiles=pred, cost_model=model, comparison=compare_prediction(pred, tiles), schedule=schedule)
