"""What limits one benchmark point: a recording's time split into blocks, per-tile work and idle.

A persistent kernel's CTAs run tiles one after another. A tile's *pitch* is the time from its
start to the next tile's start on its CTA (`jfa_prof.analyses.predict.tile_pitch`): what it
costs a serial CTA. All CTA time, ``G · makespan``, is then

- **busy**: the pitches summed, split by a fit ``pitch ≈ a + b · n`` (``n``: the blocks a tile
  walks: KV blocks in the forward, query blocks in the backward) into
  - **blocks**: the ``b · n`` parts, the steady inner loop (two matmuls and the softmax per
    block in the forward);
  - **tile**: the ``a`` parts, what a tile costs besides its blocks: decoding it, the first
    loads and their wait, the epilogue and its stores;
- **idle**: the rest, measured, not fitted: CTAs waiting before their first tile and after
  their last (the schedule's imbalance and the launch's ramp).

One point alone often cannot tell ``a`` from ``b``: where its tiles walk nearly the same number
of blocks (dense shapes, high sparsity, the backward's broadcast-Q tiles) the intercept is
ill-conditioned and can even come out negative. So each split keeps the sums a least-squares fit
needs (`FitSums`), and the points that ran the same compiled kernel are fit together
(:func:`pooled`), which spreads ``n`` over the grid; a fit whose intercept is still negative is
replaced by the best one through the origin (all busy time per block), and so is one whose points
all walk the same number of blocks (a dense shape on its own): then the split is not
``separable`` and its "blocks" hold the per-tile work too. Pooled fits assume every point of a
kernel pays the same per tile and per block; the backward's broadcast-Q tiles walk Lq / 64 query
blocks at every point of a query length, so there its ``a`` and ``b`` come from the two query
lengths of the grid alone.

How well ``a`` and ``b`` are told apart is checked without instrumentation by
``benchmarks/fwd_tile_cost.py`` (equal lengths, kernel time against blocks per tile).

The shares come from an instrumented launch (tile records cost a few percent), so they are
applied to the uninstrumented time of the same point as fractions: its GPU time per call where the
benchmark took it (a short call's median otherwise times the host's launch path, not the kernel).
A call's GPU time can hold other kernels than the recorded one (the backward's delta kernel and its
dQ initialisation; a work list built in the call), which the fractions share out in proportion.

Against a peer and a target ratio, a point is then **met**, or limited by its **blocks** (the blocks' share of our time alone
is over what the target allows: only a faster inner loop helps; **busy** where the fit could not
tell per-tile from per-block time, so that share holds both), or, when the blocks fit, by its
per-tile work (**tile**) or its **idle** CTAs, whichever is larger.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Hashable, Mapping, Sequence

import pandas as pd

from jfa_prof.analyses.predict import FitSums, tile_pitch

__all__ = ["LIMITS", "FitSums", "PointLimit", "TimeSplit", "point_limit", "pooled", "time_split"]

LIMITS = ("met", "blocks", "busy", "tile", "idle")


@dataclass(frozen=True)
class TimeSplit:
    """One recording's CTA time, split (see the module notes); the three shares add up to 1.

    ``a_ns`` / ``b_ns`` / ``r2``: the fit the split uses, this recording's own unless
    :func:`pooled` replaced it; ``sums``: this recording's samples, for pooling."""

    n_ctas: int
    makespan_ns: float
    n_tiles: int
    n_blocks: int  # summed over tiles
    busy_ns: float  # the pitches, summed over tiles
    a_ns: float  # per tile
    b_ns: float  # per block
    r2: float
    sums: FitSums
    pooled_over: int = 1  # recordings the fit was made from
    separable: bool = True  # whether the fit's samples told a from b (else all busy time is on the blocks)

    @property
    def idle_share(self) -> float:
        return 1.0 - self.busy_ns / (self.n_ctas * self.makespan_ns)

    @property
    def blocks_share(self) -> float:
        return (1.0 - self.idle_share) * self._blocks_part()

    @property
    def tile_share(self) -> float:
        return (1.0 - self.idle_share) * (1.0 - self._blocks_part())

    def _blocks_part(self) -> float:
        blocks, tiles = self.b_ns * self.n_blocks, self.a_ns * self.n_tiles
        return blocks / (blocks + tiles) if blocks + tiles > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {**d, "r2": None if math.isnan(self.r2) else self.r2, "blocks_share": self.blocks_share,
                "tile_share": self.tile_share, "idle_share": self.idle_share}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TimeSplit":
        r2 = d.get("r2")
        return cls(n_ctas=int(d["n_ctas"]), makespan_ns=float(d["makespan_ns"]), n_tiles=int(d["n_tiles"]),
                   n_blocks=int(d["n_blocks"]), busy_ns=float(d["busy_ns"]), a_ns=float(d["a_ns"]),
                   b_ns=float(d["b_ns"]), r2=math.nan if r2 is None else float(r2), sums=FitSums(**d["sums"]),
                   pooled_over=int(d.get("pooled_over", 1)), separable=bool(d.get("separable", True)))


def time_split(tiles: pd.DataFrame, n_ctas: int, makespan_ns: float | None = None) -> TimeSplit:
    """Split a recording's tile table (``Trace.tiles``: one row per tile, ``cta``, ``start_ns``,
    ``end_ns``, ``dur_ns``, ``n_blocks``) run by ``n_ctas`` persistent CTAs. ``makespan_ns``
    defaults to the first start to the last end."""
    if n_ctas < 1:
        raise ValueError(f"n_ctas must be >= 1, got {n_ctas}")
    if not len(tiles):
        raise ValueError("cannot split the time of a recording without tiles")
    if makespan_ns is None:
        makespan_ns = float(tiles["end_ns"].max() - tiles["start_ns"].min())
    if not makespan_ns > 0:
        raise ValueError(f"makespan must be positive, got {makespan_ns}")
    pitch = tile_pitch(tiles)
    sums = FitSums.of(tiles["n_blocks"].to_numpy(), pitch)
    a, b, r2 = sums.fit()
    return TimeSplit(n_ctas=int(n_ctas), makespan_ns=float(makespan_ns), n_tiles=int(len(tiles)),
                     n_blocks=int(tiles["n_blocks"].sum()), busy_ns=float(pitch.sum()), a_ns=a, b_ns=b, r2=r2,
                     sums=sums, separable=sums.separable)


def pooled(splits: Sequence[TimeSplit | None], keys: Sequence[Hashable]) -> list[TimeSplit | None]:
    """Each split refit over every split with the same key (the compiled kernel that ran):
    its own busy and idle time, the group's ``a`` and ``b``. None entries stay None."""
    groups: dict[Hashable, FitSums] = {}
    counts: dict[Hashable, int] = {}
    for s, k in zip(splits, keys):
        if s is not None:
            groups[k] = groups.get(k, FitSums()) + s.sums
            counts[k] = counts.get(k, 0) + 1
    fits = {k: g.fit() for k, g in groups.items()}
    return [None if s is None else replace(s, a_ns=fits[k][0], b_ns=fits[k][1], r2=fits[k][2], pooled_over=counts[k],
                                           separable=groups[k].separable)
            for s, k in zip(splits, keys)]


@dataclass(frozen=True)
class PointLimit:
    """A point's time against a peer's: what the target allows and which part stands over it."""

    ours_ms: float
    peer_ms: float
    target: float
    blocks_ms: float
    tile_ms: float
    idle_ms: float
    limit: str  # one of LIMITS
    timer: str = "ms"  # which time of the bench record: "ms" (the call's median) or "gpu_ms" (GPU work)

    @property
    def ratio(self) -> float:
        return self.peer_ms / self.ours_ms

    @property
    def allowed_ms(self) -> float:
        return self.peer_ms / self.target

    @property
    def blocks_speedup_needed(self) -> float:
        """How many times faster the blocks must get for the target, the per-tile work and idle
        time unchanged (1.0 when met; inf when those two alone are over what the target allows)."""
        if self.ours_ms <= self.allowed_ms:
            return 1.0
        room = self.allowed_ms - self.tile_ms - self.idle_ms
        return self.blocks_ms / room if room > 0 else math.inf

    @property
    def excess_ms(self) -> float:
        """How much the whole call must lose to meet the target (0 when met)."""
        return max(self.ours_ms - self.allowed_ms, 0.0)

    def to_dict(self) -> dict[str, Any]:
        speedup = self.blocks_speedup_needed
        return {**asdict(self), "ratio": self.ratio, "allowed_ms": self.allowed_ms,
                "blocks_speedup_needed": None if math.isinf(speedup) else speedup, "excess_ms": self.excess_ms}


def point_limit(split: TimeSplit, ours_ms: float, peer_ms: float, target: float, *, timer: str = "ms") -> PointLimit:
    """Which part of ``ours_ms`` keeps it from being ``target`` times faster than ``peer_ms``."""
    if not (ours_ms > 0 and peer_ms > 0 and target > 0):
        raise ValueError(f"times and target must be positive, got ours {ours_ms}, peer {peer_ms}, target {target}")
    blocks, tile, idle = (s * ours_ms for s in (split.blocks_share, split.tile_share, split.idle_share))
    allowed = peer_ms / target
    if ours_ms <= allowed:
        limit = "met"
    elif blocks > allowed:
        # Without a separable fit the "blocks" are all busy time, per-tile work included.
        limit = "blocks" if split.separable else "busy"
    else:
        limit = "tile" if tile >= idle else "idle"
    return PointLimit(ours_ms=ours_ms, peer_ms=peer_ms, target=target, blocks_ms=blocks, tile_ms=tile,
                      idle_ms=idle, limit=limit, timer=timer)
