"""Where each warp role's time went, tile by tile, and how long the tensor cores sat idle: the
critical path of a level-3 recording (the event records of ``Trace.events``).

The kernel's time is its window ``[t_begin, t_end]``: the first record of any role to the last one
(``t_begin`` can be before the first tile's start: the producer starts early). ``kernel_ns`` is its
length, and every *lane* (one warp role of one CTA) lives for all of it, so a lane's parts add up
to ``kernel_ns`` exactly:

- ``wait_<site>_ns``: what the role's event records say it waited at each barrier site;
- ``epilogue_ns`` (consumers, backward compute): mark to end, the stores after the inner loop;
- ``compute_ns``: the rest of its records' windows (for the producer: decoding tiles, issuing loads);
- ``gap_ns``: outside its records before its last one ends (before the first, between records);
- ``tail_ns``: its last record's end to ``t_end`` (imbalance: other CTAs still work).

A role's shares are its parts over ``kernel_ns × lanes`` (every CTA runs every role).

**Tensor cores idle (an estimate).** Forward, per CTA: the two consumers take turns on the tensor
cores, so they are idle when both consumers are out of their KV loop (the intersection of their
epilogue intervals, gaps and tails, exact from the intervals) or wait for data (``k_full``,
``v_full``, ``q_full``, and the mailbox ``queue``: the mean of the two consumers per tile, as both
wait for the same blocks). ``mma_turn`` is *not* idle: a consumer waits there while the other one
computes. Backward: the compute role's waits (``kv_full``, ``step_full``, ``dq_stage``,
``ds_pair``), epilogue, gaps and tail. Shares are of ``kernel_ns × CTAs``, which for the forward
equals a share of the two consumers' lane time.

**Critical role per tile.** A tile whose data waits (the producer-side sites, ``DATA_SITES``)
exceed half of its non-compute time (waits and epilogue, mean of the consumers) had the producer
on its critical path, else the consumers (backward: the compute role). Its dominant site is the
site it waited at longest.

**Sampling.** A trace that records every Nth tile (or dropped records when its buffer was full)
has holes between its records; those are taken to look like the recorded tiles: a lane's recorded
parts are scaled to cover them, up to its CTA's last tile end from the tile records, and its gaps
keep only the time before its first record.

Below level 3 (no events) the same tables come from the wait totals and role spans: no epilogue,
no per-tile table, and a note that says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from jfa_prof.analyses.jsonable import plain, records
from jfa_prof.errors import BadInputError

__all__ = [
    "DATA_SITES",
    "BUSY_SITES",
    "IDLE_OTHER",
    "IDLE_SITES",
    "LANE_PARTS",
    "PRODUCER_LOOP",
    "TENSOR_ROLES",
    "CriticalPath",
    "critical_path",
    "critical_path_from_totals",
    "critical_path_of",
    "lane_breakdown",
]

# The roles that drive the tensor cores: the forward's two consumer warpgroups (ping-pong), the
# backward's compute role (the first of its two consumers).
TENSOR_ROLES = {"fwd": ("consumer0", "consumer1"), "bwd": ("compute",)}
# Where the tensor roles wait for the producer: data not loaded, a tile not handed over, dQ
# staging buffers the producer's reduce-adds have not freed.
DATA_SITES = {"fwd": ("k_full", "v_full", "q_full", "queue"), "bwd": ("kv_full", "step_full", "dq_stage")}
# Waits that leave the tensor cores idle (mma_turn is not one: the other consumer computes then).
IDLE_SITES = {"fwd": ("k_full", "v_full", "q_full", "queue"), "bwd": ("kv_full", "step_full", "dq_stage", "ds_pair")}
# The backward producer's step loop (mark to end): the sites it waits at there, and the one that is
# not a wait but its time in dQ reduce-adds. The rest of the loop is its own work (the loads).
PRODUCER_LOOP = {"bwd": {"waits": ("step_empty", "dq_full"), "reduce": "dq_reduce"}}
# Sites that time work, not a wait.
BUSY_SITES = ("dq_reduce",)
# The idle parts besides the waits, in display order.
IDLE_OTHER = ("epilogue", "gaps", "tail")
LANE_PARTS = ("epilogue", "compute", "gaps", "tail")

_WHY = {"k_full": "producer late", "v_full": "producer late", "q_full": "producer late",
        "queue": "tile not handed over yet", "kv_full": "K/V not loaded yet", "step_full": "producer late",
        "dq_stage": "dQ reduce-adds behind", "ds_pair": "waiting for the other consumer"}


@dataclass
class CriticalPath:
    """The breakdowns of one recording (see the module docstring); times in ns.

    ``lanes``: one row per (CTA, role): ``n_records``, ``wait_<site>_ns``, ``epilogue_ns``,
    ``compute_ns``, ``gap_ns``, ``tail_ns``, ``total_ns`` (= ``kernel_ns``).
    ``roles``: per role and part (a site or a LANE_PARTS name), summed ns and share of
    ``kernel_ns × lanes``.
    ``idle``: per CTA, the tensor-core idle estimate's parts (the IDLE_SITES, epilogue, gaps,
    tail), their sum ``idle``, ``mma_turn`` (forward; not idle) and ``unrecorded`` (sampled traces:
    time between recorded tiles, shared out over the other parts).
    ``tiles``: per (CTA, tile position), the tensor roles' mean waits per site, epilogue, compute,
    ``data_ns``, ``noncompute_ns``, ``critical`` and ``dominant``, and in the backward what the
    producer's step loop spent on reduce-adds and on its loads (``producer_reduce_ns``,
    ``producer_busy_ns``; NaN without its record); empty below level 3.
    """

    pass_: str
    level: int
    kernel_ns: float
    t_begin_ns: float
    n_ctas: int
    lanes: pd.DataFrame
    roles: pd.DataFrame
    idle: pd.DataFrame
    tiles: pd.DataFrame
    sample: int = 1
    notes: tuple[str, ...] = ()

    @property
    def tensor_roles(self) -> tuple[str, ...]:
        return TENSOR_ROLES[self.pass_]

    @property
    def has_events(self) -> bool:
        return self.level >= 3 and len(self.tiles) > 0

    @property
    def basis_ns(self) -> float:
        """``kernel_ns × CTAs``: what the idle parts are shares of."""
        return self.kernel_ns * self.n_ctas

    def idle_ns(self, part: str) -> float:
        """A part of the idle table summed over CTAs (NaN where it is unknown: the epilogue below level 3)."""
        if part not in self.idle.columns:
            return 0.0
        col = self.idle[part]
        return math.nan if col.isna().all() and len(col) else float(col.sum())

    def idle_shares(self) -> dict[str, float]:
        """Each idle part's share of ``kernel_ns × CTAs``, in display order (NaN: unknown)."""
        parts = [s for s in IDLE_SITES[self.pass_] if s in self.idle.columns] + list(IDLE_OTHER)
        return {p: self.idle_ns(p) / self.basis_ns if self.basis_ns > 0 else math.nan for p in parts}

    @property
    def idle_share(self) -> float:
        return float(np.nansum(list(self.idle_shares().values())))

    @property
    def turns_share(self) -> float:
        """The consumers' mma_turn waits (forward), the same basis: serialized turns, not idle time."""
        return self.idle_ns("mma_turn") / self.basis_ns if self.basis_ns > 0 else math.nan

    def role_shares(self, role: str) -> dict[str, float]:
        rows = self.roles[self.roles["role"] == role]
        return dict(zip(rows["part"], rows["share"]))

    def critical_counts(self) -> dict[str, int]:
        """Tiles per role on their critical path."""
        if not len(self.tiles):
            return {}
        return {str(k): int(v) for k, v in self.tiles["critical"].value_counts().items()}

    def dominant_counts(self) -> dict[str, int]:
        """Tiles per dominant wait site."""
        if not len(self.tiles):
            return {}
        return {str(k): int(v) for k, v in self.tiles["dominant"].value_counts().items()}

    @property
    def summary(self) -> str:
        """One line: the idle estimate and its largest parts."""
        shares = self.idle_shares()
        who = "consumers" if self.pass_ == "fwd" else "the compute role"
        items: list[str] = []
        done: list[str] = []
        for part, share in sorted(shares.items(), key=lambda kv: -(kv[1] if not math.isnan(kv[1]) else -1)):
            if math.isnan(share) or share < 0.005 or len(items) == 4:
                continue
            if part in _WHY:
                first_wait = not any(p in _WHY for p in done)
                items.append(f"{who + ' waiting on' if first_wait else 'on'} {part} {_pct(share)} ({_WHY[part]})")
            else:
                items.append({"epilogue": "in the epilogue", "gaps": "between tiles",
                              "tail": "idle at the end"}[part] + f" {_pct(share)}")
            done.append(part)
        line = f"tensor cores idle {_pct(self.idle_share)} of the kernel (estimate)"
        if items:
            line += ": " + ", ".join(items)
        if self.pass_ == "fwd" and self.turns_share >= 0.005:
            line += (f"; mma_turn {_pct(self.turns_share)} is not idle (the other consumer is on the "
                     "tensor cores)")
        if math.isnan(shares.get("epilogue", 0.0)):
            line += f"; epilogue unknown (level-{self.level} trace)"
        return line

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.pass_, "level": self.level, "kernel_ns": self.kernel_ns, "t_begin_ns": self.t_begin_ns,
                "n_ctas": self.n_ctas, "sample": self.sample, "summary": self.summary,
                "idle_share": plain(self.idle_share),
                "idle_shares": {k: plain(v) for k, v in self.idle_shares().items()},
                "turns_share": plain(self.turns_share),
                "roles": records(self.roles), "critical_counts": self.critical_counts(),
                "dominant_counts": self.dominant_counts(), "notes": list(self.notes)}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if abs(x) < 0.01 else f"{100 * x:.0f}%"




def _sites_of(events: pd.DataFrame) -> list[str]:
    return [c[len("wait_"):-len("_ns")] for c in events.columns if c.startswith("wait_") and c.endswith("_ns")]


# ---------------------------------------------------------------------------------------------
# per lane
# ---------------------------------------------------------------------------------------------

def lane_breakdown(events: pd.DataFrame, *, pass_: str, t_begin_ns: float, t_end_ns: float,
                   ctas: Sequence[int] | None = None, sampled: bool = False,
                   cta_end: Mapping[int, float] | None = None,
                   cta_start: Mapping[int, float] | None = None) -> pd.DataFrame:
    """Per (CTA, role) of ``events`` (the columns of ``Trace.events``): its parts, adding up to
    ``t_end_ns - t_begin_ns``. ``ctas``: every CTA of the launch; a CTA with no record of a role
    gets a lane that is all tail. ``sampled``: not every tile has records (sampling, dropped
    records), so the time between records is unrecorded work; ``cta_start`` / ``cta_end``: each
    CTA's first tile start and last tile end (tile records), which then begin and end its tensor
    roles' work where its first or last tiles went unrecorded."""
    sites = _sites_of(events)
    wait_cols = [f"wait_{s}_ns" for s in sites]
    ev = events.sort_values(["cta", "role_id", "start_ns"], kind="stable")
    start = ev["start_ns"].to_numpy(np.float64)
    end = ev["end_ns"].to_numpy(np.float64)
    dur = end - start
    waits = ev[wait_cols].to_numpy(np.float64) if wait_cols else np.zeros((len(ev), 0))
    waited = waits.sum(axis=1)
    has_epilogue = ev["role"].isin(TENSOR_ROLES[pass_]).to_numpy()
    epilogue = np.where(has_epilogue, end - ev["mark_ns"].to_numpy(np.float64), 0.0)
    # Waits are measured, the mark→end split is not exclusive of them: keep the waits whole.
    epilogue = np.clip(epilogue, 0.0, np.maximum(dur - waited, 0.0))
    compute = dur - waited - epilogue

    # Time before each record that no earlier record of its lane covers.
    lane = ev[["cta", "role_id"]].to_numpy()
    first = np.ones(len(ev), dtype=bool)
    first[1:] = (lane[1:] != lane[:-1]).any(axis=1)
    prev_end = np.empty(len(ev))
    if len(ev):
        prev_end[1:] = end[:-1]
        prev_end[first] = t_begin_ns
        # an earlier, longer record of the lane still covers this one's start
        reach = pd.Series(prev_end).groupby(np.cumsum(first)).cummax().to_numpy()
    else:
        reach = prev_end
    gap = np.maximum(start - reach, 0.0)

    frame = pd.DataFrame({"cta": ev["cta"].to_numpy(), "role_id": ev["role_id"].to_numpy(),
                          "role": ev["role"].to_numpy(), "n_records": 1, "recorded": dur,
                          "lead": np.where(first, gap, 0.0), "between": np.where(first, 0.0, gap),
                          "epilogue_ns": epilogue, "compute_ns": compute, "start": start, "end": end})
    for c, col in zip(wait_cols, waits.T):
        frame[c] = col
    sums = {c: "sum" for c in ["n_records", "recorded", "lead", "between", "epilogue_ns", "compute_ns", *wait_cols]}
    lanes = frame.groupby(["cta", "role_id", "role"], sort=True).agg({**sums, "start": "min", "end": "max"})
    lanes = lanes.reset_index()

    if sampled and len(lanes):
        # The holes between records are unrecorded tiles: share them out like the recorded ones.
        tensor = lanes["role"].isin(TENSOR_ROLES[pass_]).to_numpy()
        if cta_end is not None:
            done = lanes["cta"].map(cta_end).fillna(-math.inf).to_numpy(np.float64)
            late = np.where(tensor, np.maximum(done - lanes["end"], 0.0), 0.0)
            lanes["between"] += late
            lanes["end"] += late
        if cta_start is not None:
            # Unrecorded first tiles: work, not a gap, from the CTA's first tile on.
            begun = lanes["cta"].map(cta_start).fillna(math.inf).to_numpy(np.float64)
            early = np.where(tensor, np.clip(lanes["start"] - begun, 0.0, lanes["lead"]), 0.0)
            lanes["lead"] -= early
            lanes["between"] += early
        scale = np.where(lanes["recorded"] > 0, (lanes["recorded"] + lanes["between"]) / lanes["recorded"], 1.0)
        for c in ["epilogue_ns", "compute_ns", *wait_cols]:
            lanes[c] = lanes[c] * scale
        lanes["between"] = 0.0
    lanes["gap_ns"] = lanes["lead"] + lanes["between"]
    lanes["tail_ns"] = t_end_ns - lanes["end"]

    if ctas is not None and len(lanes):
        # Every role of every CTA lived for the whole kernel: one that ran nothing was idle throughout.
        roles = lanes[["role_id", "role"]].drop_duplicates()
        grid = pd.MultiIndex.from_product([sorted(set(ctas)), roles["role_id"]], names=["cta", "role_id"])
        missing = grid.difference(pd.MultiIndex.from_frame(lanes[["cta", "role_id"]]))
        if len(missing):
            names = dict(zip(roles["role_id"], roles["role"]))
            idle = pd.DataFrame({"cta": missing.get_level_values(0), "role_id": missing.get_level_values(1)})
            idle["role"] = idle["role_id"].map(names)
            idle["tail_ns"] = t_end_ns - t_begin_ns
            lanes = pd.concat([lanes, idle], ignore_index=True).fillna(0.0)
            lanes = lanes.sort_values(["cta", "role_id"]).reset_index(drop=True)
            lanes["n_records"] = lanes["n_records"].astype(np.int64)
    return _finish_lanes(lanes, wait_cols)


def _finish_lanes(lanes: pd.DataFrame, wait_cols: Sequence[str]) -> pd.DataFrame:
    cols = ["cta", "role_id", "role", "n_records", *wait_cols, "epilogue_ns", "compute_ns", "gap_ns", "tail_ns"]
    lanes = lanes[cols].copy()
    lanes["total_ns"] = lanes[[*wait_cols, "epilogue_ns", "compute_ns", "gap_ns", "tail_ns"]].sum(axis=1)
    return lanes.reset_index(drop=True)


def _role_table(lanes: pd.DataFrame, kernel_ns: float, pass_: str) -> pd.DataFrame:
    """Long format: role, part, lanes, ns, share of kernel_ns × lanes; the waits first."""
    waits = [c for c in lanes.columns if c.startswith("wait_")]
    parts = {c: c[len("wait_"):-len("_ns")] for c in waits}
    parts.update({"epilogue_ns": "epilogue", "compute_ns": "compute", "gap_ns": "gaps", "tail_ns": "tail"})
    rows = []
    for (_, role), g in lanes.groupby(["role_id", "role"], sort=True):
        n = g["cta"].nunique()
        for col, part in parts.items():
            ns = float(g[col].sum())
            if (col in waits and ns == 0) or (part == "epilogue" and role not in TENSOR_ROLES[pass_]):
                continue  # a site this role never waits at; an epilogue it does not have
            rows.append({"role": role, "part": part, "lanes": n, "ns": ns,
                         "share": ns / (kernel_ns * n) if kernel_ns > 0 and n else math.nan})
    return pd.DataFrame(rows, columns=["role", "part", "lanes", "ns", "share"])


# ---------------------------------------------------------------------------------------------
# the tensor cores' idle time, per CTA
# ---------------------------------------------------------------------------------------------

def _out_of_loop(lanes: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray, float, float]], t_begin: float,
                 t_end: float, *, sampled: bool = False) -> dict[str, float]:
    """How long all the given lanes (each: sorted starts, marks and ends of its records, and the
    start and end of its work) were out of their loops together, by what kept them out: an
    epilogue (any lane in one), the tail (all done), or gaps (before the first record: ``lead``;
    between two: ``between``). In a ``sampled`` trace a lane between the start of its work and its
    end, outside its records, works on an unrecorded tile: it counts as in its loop."""
    points = [np.array([t_begin, t_end])] + [np.concatenate([s, m, e, [begun, done]])
                                             for s, m, e, begun, done in lanes]
    cuts = np.unique(np.clip(np.concatenate([p[np.isfinite(p)] for p in points]), t_begin, t_end))
    if len(cuts) < 2:
        return {"epilogue": 0.0, "tail": 0.0, "lead": 0.0, "between": 0.0}
    mid = (cuts[:-1] + cuts[1:]) / 2
    width = np.diff(cuts)
    all_out = np.ones(len(mid), dtype=bool)
    any_epi = np.zeros(len(mid), dtype=bool)
    all_tail = np.ones(len(mid), dtype=bool)
    any_between = np.zeros(len(mid), dtype=bool)
    for starts, marks, ends, begun, done in lanes:
        if not len(starts):
            continue  # never worked: out, and in its tail, throughout
        i = np.searchsorted(starts, mid, side="right") - 1
        j = np.clip(i, 0, None)
        inside = (i >= 0) & (mid < ends[j])
        loop = inside & (mid < marks[j])
        tail = mid >= done
        between = ~inside & ~tail & ((i >= 0) | (mid >= begun))
        all_out &= ~(loop | between) if sampled else ~loop
        any_epi |= inside & ~loop
        all_tail &= tail
        any_between |= between
    out = all_out & ~any_epi
    return {"epilogue": float(width[all_out & any_epi].sum()), "tail": float(width[out & all_tail].sum()),
            "between": float(width[out & ~all_tail & any_between].sum()),
            "lead": float(width[out & ~all_tail & ~any_between].sum())}


def _idle_table(events: pd.DataFrame, *, pass_: str, t_begin: float, t_end: float, ctas: Sequence[int],
                sampled: bool, cta_end: Mapping[int, float] | None = None,
                cta_start: Mapping[int, float] | None = None) -> pd.DataFrame:
    roles = TENSOR_ROLES[pass_]
    sites = [s for s in IDLE_SITES[pass_] if f"wait_{s}_ns" in events.columns]
    turns = ["mma_turn"] if pass_ == "fwd" and "wait_mma_turn_ns" in events.columns else []
    ev = events[events["role"].isin(roles)].sort_values(["cta", "role_id", "start_ns"], kind="stable")
    by_cta = dict(tuple(ev.groupby("cta")))
    rows = []
    for cta in ctas:
        mine = by_cta.get(cta, ev.iloc[:0])
        lanes, scales = [], []
        for role in roles:
            r = mine[mine["role"] == role]
            starts, ends = r["start_ns"].to_numpy(np.float64), r["end_ns"].to_numpy(np.float64)
            done = _last_end(ends, cta_end, cta, sampled)
            begun = _first_start(starts, cta_start, cta, sampled)
            lanes.append((starts, r["mark_ns"].to_numpy(np.float64), ends, begun, done))
            if sampled and len(starts):
                recorded = float((ends - starts).sum())
                scales.append((done - begun) / recorded if recorded > 0 else 1.0)
        out = _out_of_loop(lanes, t_begin, t_end, sampled=sampled)
        # Both consumers wait for the same blocks: the mean of the two is the tensor cores' wait.
        row = {"cta": cta, **{s: float(mine[f"wait_{s}_ns"].sum()) / len(roles) for s in (*sites, *turns)},
               "epilogue": out["epilogue"], "gaps": out["lead"] + out["between"], "tail": out["tail"],
               "unrecorded": 0.0}
        if scales:
            # The recorded tiles stand for the unrecorded ones between them.
            scale = float(np.mean(scales))
            for k in (*sites, *turns, "epilogue"):
                row[k] *= scale
            row["unrecorded"] = float(np.mean([d - b - (e - s).sum() for s, _, e, b, d in lanes if len(s)]))
        rows.append(row)
    return _finish_idle(pd.DataFrame(rows), sites, turns)


def _first_start(starts: np.ndarray, cta_start: Mapping[int, float] | None, cta: int, sampled: bool) -> float:
    """When a lane's work began: its first record's start, or in a sampled trace its CTA's first
    tile's (tile records), when earlier: unrecorded tiles ran from then."""
    first = float(starts.min()) if len(starts) else math.inf
    if sampled and cta_start is not None and cta in cta_start:
        first = min(first, float(cta_start[cta]))
    return first


def _last_end(ends: np.ndarray, cta_end: Mapping[int, float] | None, cta: int, sampled: bool) -> float:
    """When a lane's work ended: its last record's end, or in a sampled trace its CTA's last tile's
    (from the tile records, which every tile writes), when later: unrecorded tiles ran until then."""
    last = float(ends.max()) if len(ends) else -math.inf
    if sampled and cta_end is not None and cta in cta_end:
        last = max(last, float(cta_end[cta]))
    return last


def _finish_idle(idle: pd.DataFrame, sites: Sequence[str], turns: Sequence[str]) -> pd.DataFrame:
    parts = [*sites, *IDLE_OTHER]
    for c in [*parts, *turns, "unrecorded"]:
        if c not in idle.columns:
            idle[c] = 0.0
    idle["idle"] = idle[parts].sum(axis=1, min_count=1)
    return idle[["cta", *parts, "idle", *turns, "unrecorded"]]


# ---------------------------------------------------------------------------------------------
# per tile
# ---------------------------------------------------------------------------------------------

def _tile_table(events: pd.DataFrame, *, pass_: str) -> pd.DataFrame:
    roles = TENSOR_ROLES[pass_]
    ev = events[events["role"].isin(roles)]
    if not len(ev):
        return pd.DataFrame(columns=["cta", "pos", "critical", "dominant"])
    sites = _sites_of(ev)
    wait_cols = [f"wait_{s}_ns" for s in sites]
    frame = ev[["cta", "pos", "tile", "batch", "head", "block", "kv_len", "n_blocks", "start_ns", "end_ns",
                *wait_cols]].copy()
    dur = (ev["end_ns"] - ev["start_ns"]).to_numpy(np.float64)
    waited = ev[wait_cols].to_numpy(np.float64).sum(axis=1)
    frame["epilogue_ns"] = np.clip((ev["end_ns"] - ev["mark_ns"]).to_numpy(np.float64), 0.0,
                                   np.maximum(dur - waited, 0.0))
    frame["compute_ns"] = dur - waited - frame["epilogue_ns"].to_numpy()
    frame["n_roles"] = 1
    agg = {c: "first" for c in ("tile", "batch", "head", "block", "kv_len", "n_blocks")}
    agg.update({"start_ns": "min", "end_ns": "max", "n_roles": "sum", "epilogue_ns": "mean", "compute_ns": "mean",
                **{c: "mean" for c in wait_cols}})
    tiles = frame.groupby(["cta", "pos"], sort=True).agg(agg).reset_index()
    data = [f"wait_{s}_ns" for s in DATA_SITES[pass_] if f"wait_{s}_ns" in tiles.columns]
    tiles["data_ns"] = tiles[data].sum(axis=1)
    tiles["noncompute_ns"] = tiles[wait_cols].sum(axis=1) + tiles["epilogue_ns"]
    own = "consumers" if pass_ == "fwd" else "compute"
    tiles["critical"] = np.where(tiles["data_ns"] > 0.5 * tiles["noncompute_ns"], "producer", own)
    w = tiles[wait_cols].to_numpy(np.float64)
    names = np.array(sites, dtype=object)
    tiles["dominant"] = np.where(w.max(axis=1, initial=0.0) > 0, names[w.argmax(axis=1)] if len(sites) else "none",
                                 "none")
    if pass_ in PRODUCER_LOOP:
        tiles = tiles.merge(_producer_loop(events, PRODUCER_LOOP[pass_]), on=["cta", "pos"], how="left")
    return tiles


def _producer_loop(events: pd.DataFrame, loop: Mapping[str, Any]) -> pd.DataFrame:
    """Per tile, what the producer's step loop (mark to end) spent its time on besides waiting:
    ``producer_reduce_ns`` (its reduce-adds) and ``producer_busy_ns`` (the rest: its loads)."""
    ev = events[events["role"] == "producer"]
    col = f"wait_{loop['reduce']}_ns"
    reduce = ev[col].to_numpy(np.float64) if col in ev.columns else np.zeros(len(ev))
    waited = sum((ev[f"wait_{w}_ns"].to_numpy(np.float64) for w in loop["waits"] if f"wait_{w}_ns" in ev.columns),
                 np.zeros(len(ev)))
    loop_ns = (ev["end_ns"] - ev["mark_ns"]).to_numpy(np.float64)
    return pd.DataFrame({"cta": ev["cta"].to_numpy(), "pos": ev["pos"].to_numpy(), "producer_reduce_ns": reduce,
                         "producer_busy_ns": np.maximum(loop_ns - waited - reduce, 0.0)})


# ---------------------------------------------------------------------------------------------
# entry points
# ---------------------------------------------------------------------------------------------

def _window(starts: Sequence[float], ends: Sequence[float], makespan_ns: float | None) -> tuple[float, float]:
    lo = min([0.0, *starts])
    hi = max([float(makespan_ns or 0.0), *ends])
    return lo, hi


def critical_path(events: pd.DataFrame, *, pass_: str = "fwd", makespan_ns: float | None = None,
                  n_ctas: int | None = None, sample: int = 1, events_dropped: int = 0,
                  tiles: pd.DataFrame | None = None) -> CriticalPath:
    """The breakdowns of a level-3 recording's ``events``. ``makespan_ns``: the kernel's end on
    the events' clock (``Trace.makespan_ns``; default the last record's end); ``n_ctas``: CTAs of
    the launch (default those with records); ``sample``: every Nth tile was recorded; ``tiles``
    (``Trace.tiles``, every tile's record): where a sampled trace's CTAs really ended."""
    if pass_ not in TENSOR_ROLES:
        raise ValueError(f"unknown pass {pass_!r}: fwd or bwd")
    if not len(events):
        raise ValueError("no event records: a level-3 recording is needed (see critical_path_from_totals)")
    t_begin, t_end = _window([float(events["start_ns"].min())], [float(events["end_ns"].max())], makespan_ns)
    ctas = list(range(n_ctas)) if n_ctas else sorted(events["cta"].unique().tolist())
    have_tiles = tiles is not None and len(tiles)
    cta_end = tiles.groupby("cta")["end_ns"].max().to_dict() if have_tiles else None
    cta_start = tiles.groupby("cta")["start_ns"].min().to_dict() if have_tiles else None
    # Records missing for some tiles (sampling, a full buffer): the time between them is unrecorded work.
    sampled = sample > 1 or events_dropped > 0
    if sampled and have_tiles:
        unseen = sorted(set(cta_end) - set(events["cta"].unique().tolist()))
        if unseen:
            # Their work has no record to stand for it: counted idle, they would make a wrong answer.
            raise BadInputError(f"{len(unseen)} CTA(s) ran tiles of which none has an event record (every "
                                f"{sample}th tile recorded{', some dropped' if events_dropped else ''}): the "
                                "breakdown would count their work as idle time",
                                hint="record with a smaller --sample (1 records every tile)")
    lanes = lane_breakdown(events, pass_=pass_, t_begin_ns=t_begin, t_end_ns=t_end, ctas=ctas, sampled=sampled,
                           cta_end=cta_end, cta_start=cta_start)
    kernel = t_end - t_begin
    notes = []
    if sample > 1:
        notes.append(f"every {sample}th tile recorded: the time between recorded tiles is shared out like theirs")
    if events_dropped:
        notes.append(f"{events_dropped} event record(s) dropped (buffer full): the tiles without records are taken "
                     "to look like the recorded ones")
    missing = set(ctas) - set(events["cta"].unique().tolist())
    if missing:
        notes.append(f"{len(missing)} CTA(s) have no event record: idle for the whole kernel")
    return CriticalPath(pass_=pass_, level=3, kernel_ns=kernel, t_begin_ns=t_begin, n_ctas=len(ctas), lanes=lanes,
                        roles=_role_table(lanes, kernel, pass_),
                        idle=_idle_table(events, pass_=pass_, t_begin=t_begin, t_end=t_end, ctas=ctas,
                                         sampled=sampled, cta_end=cta_end, cta_start=cta_start),
                        tiles=_tile_table(events, pass_=pass_), sample=sample, notes=tuple(notes))


def critical_path_from_totals(waits: pd.DataFrame, spans: pd.DataFrame, *, pass_: str = "fwd",
                              makespan_ns: float | None = None, n_ctas: int | None = None,
                              clock_khz: float | None = None, level: int = 2,
                              tiles: pd.DataFrame | None = None) -> CriticalPath:
    """The same breakdowns from a level-1/2 recording: per (CTA, role) wait totals (``Trace.waits``)
    and spans (``Trace.spans``; without them, each CTA's tiles stand for every role). No epilogue
    (NaN in ``idle``), no per-tile table."""
    if pass_ not in TENSOR_ROLES:
        raise ValueError(f"unknown pass {pass_!r}: fwd or bwd")
    if spans is not None and len(spans):
        lanes = spans[["cta", "role_id", "role", "start_ns", "end_ns", "dur_ns", "dur_cycles"]].copy()
        lanes["n_records"] = spans["n_tiles"].to_numpy()
    elif tiles is not None and len(tiles):
        per = tiles.groupby("cta").agg(start_ns=("start_ns", "min"), end_ns=("end_ns", "max"),
                                       n_records=("slot", "size")).reset_index()
        roles = list(dict.fromkeys(waits["role"])) or list(TENSOR_ROLES[pass_])
        lanes = pd.concat([per.assign(role_id=i, role=r) for i, r in enumerate(roles)], ignore_index=True)
        lanes["dur_ns"] = lanes["end_ns"] - lanes["start_ns"]
        lanes["dur_cycles"] = 0
    else:
        raise ValueError("no spans and no tiles: nothing to break down")
    t_begin, t_end = _window([float(lanes["start_ns"].min())], [float(lanes["end_ns"].max())], makespan_ns)
    kernel = t_end - t_begin
    ctas = list(range(n_ctas)) if n_ctas else sorted(lanes["cta"].unique().tolist())

    # Wait cycles to ns at each lane's own clock (its span's), else the SM clock of the metadata.
    per_cycle = np.where(lanes["dur_cycles"] > 0, lanes["dur_ns"] / lanes["dur_cycles"].clip(lower=1),
                         1e6 / clock_khz if clock_khz else math.nan)
    rate = pd.Series(per_cycle, index=pd.MultiIndex.from_frame(lanes[["cta", "role_id"]]))
    sites = list(dict.fromkeys(waits["site"])) if level >= 2 and len(waits) else []
    w = waits[waits["site"].isin(sites)]
    key = pd.MultiIndex.from_frame(w[["cta", "role_id"]])
    ns = w["cycles"].to_numpy(np.float64) * rate.reindex(key).fillna(0.0).to_numpy()
    table = pd.DataFrame({"cta": w["cta"].to_numpy(), "role_id": w["role_id"].to_numpy(),
                          "site": w["site"].to_numpy(), "ns": ns})
    table = table.pivot_table(index=["cta", "role_id"], columns="site", values="ns", aggfunc="sum", fill_value=0.0)
    wait_cols = [f"wait_{s}_ns" for s in sites]
    table.columns = [f"wait_{s}_ns" for s in table.columns]
    lanes = lanes.merge(table.reset_index(), on=["cta", "role_id"], how="left")
    for c in wait_cols:
        lanes[c] = lanes[c].fillna(0.0) if c in lanes.columns else 0.0
    lanes["epilogue_ns"] = 0.0  # unknown without events: part of compute here
    lanes["compute_ns"] = lanes["dur_ns"] - lanes[wait_cols].sum(axis=1)
    lanes["gap_ns"] = lanes["start_ns"] - t_begin
    lanes["tail_ns"] = t_end - lanes["end_ns"]
    lanes = _finish_lanes(lanes.sort_values(["cta", "role_id"]), wait_cols)

    tensor = lanes[lanes["role"].isin(TENSOR_ROLES[pass_])]
    idle_sites = [s for s in IDLE_SITES[pass_] if s in sites]
    turns = ["mma_turn"] if pass_ == "fwd" and "mma_turn" in sites else []
    rows = []
    for cta in ctas:
        mine = tensor[tensor["cta"] == cta]
        n_roles = len(TENSOR_ROLES[pass_])
        row = {"cta": cta, **{s: float(mine[f"wait_{s}_ns"].sum()) / n_roles for s in idle_sites + turns}}
        # Without events only the spans' ends are known: idle while no tensor role had started, or all were done.
        row.update(gaps=float(mine["gap_ns"].min()) if len(mine) else 0.0,
                   tail=float(mine["tail_ns"].min()) if len(mine) else kernel, epilogue=math.nan)
        rows.append(row)
    idle = _finish_idle(pd.DataFrame(rows), idle_sites, turns)

    what = "tile records and spans only: no barrier waits" if level < 2 else "wait totals per CTA and role"
    notes = (f"level-{level} trace ({what}): no per-tile events, so the epilogue and which tiles waited are "
             "unknown; a level-3 recording has them",)
    return CriticalPath(pass_=pass_, level=level, kernel_ns=kernel, t_begin_ns=t_begin, n_ctas=len(ctas),
                        lanes=lanes, roles=_role_table(lanes, kernel, pass_), idle=idle,
                        tiles=pd.DataFrame(columns=["cta", "pos", "critical", "dominant"]), notes=notes)


def critical_path_of(trace: Any) -> CriticalPath:
    """The breakdowns of a ``jfa_prof.trace.Trace``: from its events at level 3, else from its
    wait totals and spans."""
    level = int(trace.level)
    if level >= 3 and len(trace.events):
        return critical_path(trace.events, pass_=trace.pass_, makespan_ns=trace.makespan_ns, n_ctas=trace.n_ctas,
                             sample=int(trace.sample), events_dropped=int(trace.events_dropped), tiles=trace.tiles)
    cp = critical_path_from_totals(trace.waits, trace.spans, pass_=trace.pass_, makespan_ns=trace.makespan_ns,
                                   n_ctas=trace.n_ctas, clock_khz=trace.clock_khz, level=min(level, 2),
                                   tiles=trace.tiles)
    if level >= 3:
        cp.notes = cp.notes + ("a level-3 trace without event records: read as level 2",)
    return cp
