"""Why the kernel is slow: a ranked list of causes, each with its evidence and the experiment
that would confirm it.

Every cause with a time share is a part of the same whole, the tensor roles' lane time (the
forward's two consumers, the backward's compute role: ``kernel × CTAs × lanes``), so shares
compare and add up to 1 with the remainder, ``compute``:

forward
    ``kv_late``   the consumers wait on ``k_full`` / ``v_full``: K/V not loaded yet (producer or
                  memory late; a shallow ring when the producer itself waits for free slots)
    ``q_late``    on ``q_full``: the tile's Q not loaded yet
    ``handoff``   on the mailbox (``queue``): the producer had not posted the tile
    ``mma_turn``  on the other consumer's turn: serialized ping-pong (not idle tensor cores,
                  but time a consumer does not compute)
    ``epilogue``  both consumers out of their KV loop, at least one in its epilogue
backward (the compute role; its waits for data are blamed on what kept the producer)
    ``step_late`` on ``step_full``, and on ``kv_full`` in the tiles with the producer on their
                  critical path: the producer late with its loads
    ``kv_late``   on ``kv_full`` in the other tiles: the K/V reload after the previous epilogue
    ``dq_reduce`` on ``dq_stage`` (no free dQ staging buffer), and the producer-late waits above in
                  the share of the producer's step loop spent in its reduce-adds (site ``dq_reduce``)
    ``ds_pair``   on the other consumer's half of dS^T
    ``epilogue``  dK/dV staged and stored after the step loop
both
    ``tail``      CTAs done while others still work (imbalance)
    ``gaps``      between records and before the first (launch ramp; unrecorded work)
    ``compute``   the rest: the tensor roles computing (ncu's tensor-pipe activity says how well)

and two findings without a time share, from other inputs: ``spills`` (a compile report with spill
bytes) and ``memory_bound`` (ncu's DRAM throughput near its peak).

Ranking: the losses by share, largest first; then ``compute``, which is what a kernel should
spend its time on, whatever its share; then the findings. A loss under ``MIN_SHARE`` is left to
the remainder.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from jfa_prof.analyses.critical_path import BUSY_SITES, CriticalPath, critical_path_of
from jfa_prof.analyses.jsonable import plain

__all__ = ["CAUSES", "DRAM_BOUND_PCT", "Cause", "Diagnosis", "Evidence", "diagnose", "rank_causes", "workload_flags"]

# Every cause by pass, in the order ties are broken.
CAUSES = {
    "fwd": ("kv_late", "q_late", "handoff", "mma_turn", "epilogue", "tail", "gaps", "compute", "spills",
            "memory_bound"),
    "bwd": ("step_late", "kv_late", "dq_reduce", "ds_pair", "epilogue", "tail", "gaps", "compute", "spills"),
}
# The wait sites behind each waiting cause.
_SITES = {
    "fwd": {"kv_late": ("k_full", "v_full"), "q_late": ("q_full",), "handoff": ("queue",), "mma_turn": ("mma_turn",)},
    "bwd": {"step_late": ("step_full",), "kv_late": ("kv_full",), "dq_reduce": ("dq_stage",), "ds_pair": ("ds_pair",)},
}
# ncu's DRAM throughput (% of peak) from which the loads are taken to be at the bandwidth limit.
DRAM_BOUND_PCT = 70.0
# When the consumers wait on K/V at least KV_LATE_SHARE of their time, the producer's own time says
# why: waiting for free ring slots (k_empty, v_empty) at least RING_FULL_SHARE of it, it issues each
# load as soon as it may and the ring is too shallow to hide the loads (or memory is the limit);
# busy at least PRODUCER_BUSY_SHARE of it, it is slow to issue them. (A producer blocked on a full
# ring is otherwise the healthy case: it is ahead; on the H200, 75% of its time.)
KV_LATE_SHARE = 0.05
RING_FULL_SHARE = 0.5
PRODUCER_BUSY_SHARE = 0.5
# ... and between its tiles at least PRODUCER_BETWEEN_SHARE of it, finding the next tile (the queue's
# counter, the list entry, the offsets: dependent global round trips) holds it. On the H100 at hsp
# Lq=128 max=1024 s=0.1 the build that found each tile between two tiles spent 45% of its time
# there, the one that decodes a tile ahead 5% (tests/data/traces/h100_fwd_*_decode_*).
PRODUCER_BETWEEN_SHARE = 0.2
# Causes below this share are left to the remainder (compute).
MIN_SHARE = 0.001

_WHAT = {
    "kv_late": "K/V blocks not in shared memory when the consumers need them: the producer, or memory behind it, "
               "is late (every K wait; of the V waits the tile's last, the others are not timed)",
    "q_late": "the tile's Q not loaded when the consumers start it",
    "handoff": "the consumers wait in the mailbox: the producer had not posted the next tile",
    "mma_turn": "a consumer waits for the other's turn on the tensor cores: the ping-pong serializes",
    "epilogue": "both consumers out of their KV loop, one or both in the epilogue (output stores)",
    "tail": "CTAs done while others still work: the schedule leaves SMs idle at the end",
    "gaps": "the tensor roles between their records or before the first: launch ramp, unrecorded work",
    "compute": "the rest: the tensor roles computing",
    "spills": "the compiled kernel spills registers to local memory",
    "memory_bound": "HBM bandwidth near its peak: the K/V bytes set the pace",
    "step_late": "a step's Q/dO not loaded when the compute role needs it: the producer is late",
    "dq_reduce": "no free dQ staging buffer: the producer's dQ reduce-adds are behind",
    "ds_pair": "the compute role waits for the other consumer's half of dS^T",
}
_WHAT_BWD = {"kv_late": "the tile's K/V not loaded when the compute role starts it: they are reloaded once both "
                        "consumers are done with the previous tile's (its step loop; with two dQ staging buffers, "
                        "its dK/dV stores, which go through the K/V buffers)",
             "epilogue": "the compute role's epilogue: dK/dV staged and stored after the step loop"}


@dataclass(frozen=True)
class Evidence:
    """One signal behind a cause: what was measured, its value, and where it comes from."""

    signal: str
    figure: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return {"signal": self.signal, "figure": self.figure, "source": self.source}


@dataclass(frozen=True)
class Cause:
    """``share``: of the tensor roles' lane time (None for a finding without one)."""

    name: str
    share: float | None
    what: str
    evidence: tuple[Evidence, ...]
    experiment: str  # what to run
    expect: str  # what it shows if this is the cause

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "share": plain(self.share), "what": self.what,
                "evidence": [e.to_dict() for e in self.evidence], "experiment": self.experiment,
                "expect": self.expect}


@dataclass
class Diagnosis:
    pass_: str
    source: str  # where the trace came from, in the words the commands print
    causes: list[Cause]
    critical: CriticalPath
    notes: tuple[str, ...] = field(default=())

    @property
    def basis(self) -> str:
        return ("the two consumers' time (kernel × CTAs × 2)" if self.pass_ == "fwd"
                else "the compute role's time (kernel × CTAs)")

    @property
    def summary(self) -> str:
        return self.critical.summary

    @property
    def top(self) -> Cause | None:
        return self.causes[0] if self.causes else None

    def cause(self, name: str) -> Cause:
        for c in self.causes:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.pass_, "source": self.source, "level": self.critical.level, "basis": self.basis,
                "summary": self.summary, "causes": [c.to_dict() for c in self.causes],
                "critical_path": self.critical.to_dict(), "notes": list(self.notes)}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def workload_flags(workload: Mapping[str, Any] | None) -> str:
    """The command-line options that name a recorded workload (``meta["workload"]``)."""
    w = workload or {}
    parts = [f"--grid {w['grid']}"] if w.get("grid") else []
    if w.get("broadcast_q", w.get("grid") == "hsp") and w.get("Lq") is not None:
        parts.append(f"--lq {w['Lq']}")
    for key, flag in (("max_kv", "--max-kv"), ("sparsity", "--sparsity")):
        if w.get(key) is not None:
            parts.append(f"{flag} {w[key]}")
    if w.get("seed"):  # the grids' lengths are drawn with seed 0 unless --seed says otherwise
        parts.append(f"--seed {w['seed']}")
    if w.get("causal"):
        parts.append("--causal")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------
# what to run to confirm each cause
# ---------------------------------------------------------------------------------------------

def _cmd(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _experiment(name: str, share: float, ctx: Mapping[str, Any]) -> tuple[str, str]:
    """(what to run or change, what it shows if the cause is real). ``ctx``: pass, flags (the
    workload's options), trace (``--trace FILE``), schedule, config, reading (``_kv_reading``)."""
    bwd = ctx["pass"] == "bwd"
    # The waterfall must time the kernel that was recorded: same workload, same schedule.
    wf = _cmd("jfa-prof waterfall", "--pass bwd" if bwd else "", ctx["flags"],
              f"--schedule {ctx['schedule']}" if ctx["schedule"] else "")
    timeline = _cmd("jfa-prof timeline", ctx["trace"])
    x = _pct(share)
    if name == "kv_late" and not bwd:
        # At least: without the loads the consumers also stop sharing bandwidth with them (on the H200
        # recordings reuse_kv saved 9% where this share was 3%).
        expect = (f"reuse_kv loads K/V once per tile: at least −{x} of the consumers' time if late K/V is the wait "
                  "(more where the loads also slow the compute down)")
        if ctx["reading"] == "ring":
            expect += (f"; a deeper K/V ring (NUM_STAGES {ctx['config'].get('NUM_STAGES', '?')} now) lets the "
                       "loads run further ahead")
        elif ctx["reading"] == "producer":
            expect += "; a producer that issues them sooner (less work between two loads) gets the same"
        elif ctx["reading"] == "between":
            expect += "; a producer that finds each next tile while the current one's loads are in flight gets the same"
        return f"{wf} --ablate reuse_kv", expect
    if name == "kv_late":
        return timeline, f"up to −{x} with the next tile's K/V loaded while this one still computes"
    if name == "memory_bound":  # share: the K/V waits it would explain
        return (f"{wf} --ablate reuse_kv",
                f"about −{x} (the K/V waits): fewer bytes, not a faster producer, shorten it")
    if name == "q_late":
        return timeline, f"up to −{x} once each tile's Q is loaded ahead of the tile (no ablation removes Q loads)"
    if name == "handoff" and ctx["schedule"] == "dynamic":
        return (_cmd("jfa-prof diagnose", ctx["flags"], "--schedule lpt"),
                f"a fixed deal takes no counter before each tile: up to −{x} if the queue is the delay")
    if name == "handoff":
        return timeline, (f"up to −{x} once the producer posts each tile sooner: it posts the next tile after this "
                          "one's last K/V load, which waits for a free ring slot")
    if name == "mma_turn":
        return (f"{wf} --ablate no_exp",
                f"no_exp shortens the softmax between turns: the mma_turn waits ({x}) shrink if it serializes them")
    if name == "epilogue" and not bwd:
        return f"{wf} --ablate no_o_store", f"no_o_store skips the output stores: about −{x} of the consumers' time"
    if name == "epilogue":
        # The epilogue also waits for the other consumer's last dQ^T and stages dK / dV in shared
        # memory; the ablation removes only the global stores, so what it saves splits the share.
        return (f"{wf} --ablate no_dkv_store",
                f"no_dkv_store skips the dK/dV global stores: up to −{x} if the stores are the epilogue's "
                "time; what is left is the staging and the wait for the other consumer")
    if name == "tail" and bwd:
        other = "dynamic" if ctx["schedule"] != "dynamic" else "static"
        return (_cmd("jfa-prof diagnose --pass bwd", ctx["flags"], f"--schedule {other}"),
                f"another schedule evens the CTAs' finish: up to −{x}")
    if name == "tail":
        return (_cmd("jfa-prof heatmap", ctx["flags"], "--clc both"),
                f"another schedule (lpt, dynamic) evens the SMs' finish: up to −{x}")
    if name == "gaps":
        return timeline, f"up to −{x}: what the tensor roles do between their records"
    if name == "compute":
        what = "masks" if bwd else "softmax and masks"
        return (f"{wf} --ablate {'no_mask' if bwd else 'no_exp,no_mask --cumulative'}",
                f"what the {what} hold of the {x}; the rest is the matmuls")
    if name == "step_late":
        return (_cmd("jfa-prof barriers", ctx["trace"]),
                f"the producer's own sites say what holds it (step_empty: both Q/dO slots in use; dq_reduce: its "
                f"reduce-adds; neither: its loads); up to −{x} once each step's Q/dO arrive in time")
    if name == "dq_reduce":
        return (f"{wf} --ablate dq_no_reduce,no_dq",
                f"dq_no_reduce (plain stores, nothing summed): about −{x} if the contended reduce-adds hold the "
                "staging buffers; no_dq bounds all of dQ")
    if name == "ds_pair":
        return timeline, f"up to −{x} with the two consumers' halves of the work balanced"
    raise KeyError(name)


# The ablations whose waterfall bars bear on a cause.
_ABLATIONS = {"fwd": {"kv_late": ("reuse_kv",), "epilogue": ("no_o_store",), "mma_turn": ("no_exp",),
                      "compute": ("no_exp", "no_mask")},
              "bwd": {"dq_reduce": ("dq_no_reduce", "no_dq"), "epilogue": ("no_dkv_store",), "compute": ("no_mask",)}}


# ---------------------------------------------------------------------------------------------
# the ranking
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Blame:
    """The backward compute role's waits for data (ns) by cause (see :func:`_backward_blame`), and
    what the split rests on: the tiles with the producer on their critical path, and the share of
    the producer's busy step loop spent in reduce-adds there."""

    kv_late: float
    step_late: float
    dq_reduce: float
    dq_stage: float = 0.0  # the part of dq_reduce that the dq_stage waits are
    n_critical: int = 0
    reduce_fraction: float = 0.0
    split: bool = False  # False: each site to its own cause (no per-tile events)


def _backward_blame(cp: CriticalPath) -> _Blame:
    """The compute role's kv_full, step_full and dq_stage waits by what kept the producer. On the
    tiles with the producer on their critical path the kv_full and step_full waits are the
    producer's lateness, shared between its reduce-adds (``dq_reduce``) and its loads
    (``step_late``) as its busy step loop was; elsewhere kv_full is the K/V reload after the
    epilogue (``kv_late``) and step_full the step loads'. The dq_stage waits are the reduce-adds'.
    The three parts add up to the three waits."""
    kv, step, dq = cp.idle_ns("kv_full"), cp.idle_ns("step_full"), cp.idle_ns("dq_stage")
    t = cp.tiles
    if not cp.has_events or "producer_reduce_ns" not in t.columns:
        return _Blame(kv_late=kv, step_late=step, dq_reduce=dq, dq_stage=dq)
    crit = (t["critical"] == "producer").to_numpy()
    reduce, busy = t["producer_reduce_ns"].fillna(0.0).to_numpy(), t["producer_busy_ns"].fillna(0.0).to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        by_reduce = np.where(crit & (reduce + busy > 0), reduce / (reduce + busy), 0.0)

    def parts(site: str) -> tuple[float, float]:
        """Of the site's waits, the fractions on producer-critical tiles and due to the reduce-adds."""
        w = t[f"wait_{site}_ns"].to_numpy(np.float64) if f"wait_{site}_ns" in t.columns else np.zeros(len(t))
        total = w.sum()
        return (float(w[crit].sum() / total), float((w * by_reduce).sum() / total)) if total > 0 else (0.0, 0.0)

    kv_crit, kv_reduce = parts("kv_full")
    _, step_reduce = parts("step_full")  # every step_full wait is the producer's, critical or not
    on_crit = reduce[crit].sum() + busy[crit].sum()
    # The idle table's totals (scaled where records were sampled), split by the per-tile fractions.
    return _Blame(kv_late=kv * (1 - kv_crit), step_late=step * (1 - step_reduce) + kv * (kv_crit - kv_reduce),
                  dq_reduce=dq + kv * kv_reduce + step * step_reduce, dq_stage=dq, n_critical=int(crit.sum()),
                  reduce_fraction=float(reduce[crit].sum() / on_crit) if on_crit > 0 else 0.0, split=True)


def _time_shares(cp: CriticalPath, blame: _Blame | None) -> dict[str, float]:
    """Each loss's share of the tensor roles' time; waits only where they were recorded (level 2+),
    the epilogue only where it is known (level 3)."""
    basis = cp.basis_ns
    shares = {}
    if cp.level >= 2:
        for name, sites in _SITES[cp.pass_].items():
            ns = getattr(blame, name, None) if blame is not None else None
            ns = sum(cp.idle_ns(s) for s in sites) if ns is None else ns
            shares[name] = ns / basis if basis > 0 else 0.0
    for name in ("epilogue", "tail", "gaps"):
        ns = cp.idle_ns(name)
        if not math.isnan(ns):
            shares[name] = ns / basis if basis > 0 else 0.0
    return shares


def _trace_evidence(cp: CriticalPath, shares: Mapping[str, float], blame: _Blame | None,
                    src: str) -> dict[str, list[Evidence]]:
    """What the recording itself says for each loss."""
    n_tiles = len(cp.tiles)
    dominant = cp.dominant_counts()
    level_tag = "" if cp.has_events else f" (wait totals of a level-{cp.level} trace)"
    who, mean = ("consumers'", " (mean of the two)") if cp.pass_ == "fwd" else ("compute role's", "")
    # Every share is of the same whole: the tensor roles' time (Diagnosis.basis).
    of = "of the consumers' time" if cp.pass_ == "fwd" else "of the compute role's time"
    out: dict[str, list[Evidence]] = {}
    for name, sites in _SITES[cp.pass_].items():
        if name not in shares:
            continue
        figure = f"{_pct(shares[name])} {of}"
        longest = sum(dominant.get(s, 0) for s in sites)
        if longest and name != "mma_turn":
            figure += f"; the longest wait in {longest} of {n_tiles} tiles"
        out[name] = [Evidence(f"{who} {' + '.join(sites)} waits{mean}{level_tag}", figure, src)]
    if blame is not None and blame.split:
        basis, crit = cp.basis_ns, f"the {blame.n_critical} of {n_tiles} tiles with the producer on their critical path"
        out["kv_late"] = [Evidence("compute role's kv_full waits on the other tiles: the K/V reload after the epilogue",
                                   f"{_pct(blame.kv_late / basis)} {of}", src)]
        out["step_late"] = [Evidence(f"compute role's step_full waits, and its kv_full waits on {crit}, less the "
                                     "reduce-adds' part", f"{_pct(blame.step_late / basis)} {of}", src)]
        out["dq_reduce"] = [
            Evidence("compute role's dq_stage waits (no free staging buffer)", f"{_pct(blame.dq_stage / basis)}", src),
            Evidence(f"its kv_full + step_full waits on {crit}, as the producer's step loop was busy with reduce-adds",
                     f"{_pct((blame.dq_reduce - blame.dq_stage) / basis)}; reduce-adds "
                     f"{_pct(blame.reduce_fraction)} of that loop's work", src)]
    signals = {"epilogue": "both consumers out of their KV loop, one in its epilogue" if cp.pass_ == "fwd"
               else "the compute role's epilogue (mark to end)",
               "tail": "tensor roles done before the kernel ends, summed over CTAs",
               "gaps": "tensor roles between records or before the first"}
    for name, signal in signals.items():
        if name in shares:
            out[name] = [Evidence(signal, f"{_pct(shares[name])} {of}", src)]
    critical = cp.critical_counts()
    if cp.pass_ == "fwd" and critical.get("producer") and "kv_late" in out:
        out["kv_late"].append(Evidence("tiles with the producer on their critical path",
                                       f"{critical['producer']} of {n_tiles}", src))
    producer = cp.role_shares("producer")
    if cp.pass_ == "fwd" and "kv_late" in out:
        ring = producer.get("k_empty", 0.0) + producer.get("v_empty", 0.0)
        out["kv_late"].append(Evidence("the producer's own k_empty + v_empty waits (ring full), and its busy time",
                                       f"{_pct(ring)} and {_pct(producer.get('compute', 0.0))} of its time", src))
    if cp.pass_ == "fwd" and producer:
        # Between its tile records the producer finds the next tile: a late K/V, Q or hand-off may be that.
        between = Evidence("the producer's own time between its tiles (finding and decoding the next)",
                           f"{_pct(producer.get('gaps', 0.0))} of its time", src)
        for name in ("kv_late", "q_late", "handoff"):
            if name in out:
                out[name].append(between)
    if cp.pass_ == "bwd" and producer:
        waited = sum(v for k, v in producer.items() if k not in ("compute", "gaps", "tail", "epilogue", *BUSY_SITES))
        busy = ", ".join(f"{k} {_pct(producer[k])}" for k in BUSY_SITES if k in producer)
        for name in ("step_late", "dq_reduce"):
            if name in out:
                out[name].append(Evidence("the producer's own time", f"waiting {_pct(waited)}, busy "
                                          f"{_pct(producer.get('compute', 0.0))}" + (f", {busy}" if busy else ""), src))
    return out


def _waterfall_evidence(waterfall: Any, names: tuple[str, ...], source: str) -> list[Evidence]:
    """The measured savings of the ablations that bear on a cause, from a waterfall of the same pass."""
    if waterfall is None:
        return []
    out = []
    for c in waterfall.components:
        if c.name in names and c.alone_share is not None:
            within = "" if c.alone_significant else ", within the noise"
            out.append(Evidence(f"waterfall: {c.name} alone", f"saved {_pct(c.alone_share)} of the baseline "
                                f"({c.alone_saving_ms:+.4f} ms{within})", source))
    return out


def _kv_reading(cp: CriticalPath, kv_share: float) -> str | None:
    """Why the forward's K/V arrive late, from the producer's own time (see RING_FULL_SHARE):
    "ring", "producer", "between" (its tiles), or None when they are not late enough to say or the
    producer says none of these."""
    if cp.pass_ != "fwd" or kv_share < KV_LATE_SHARE:
        return None
    producer = cp.role_shares("producer")
    if producer.get("k_empty", 0.0) + producer.get("v_empty", 0.0) >= RING_FULL_SHARE:
        return "ring"
    if producer.get("compute", 0.0) >= PRODUCER_BUSY_SHARE:
        return "producer"
    return "between" if producer.get("gaps", 0.0) >= PRODUCER_BETWEEN_SHARE else None


def _findings(pass_: str, shares: Mapping[str, float], ctx: Mapping[str, Any], spills: Any, spills_source: str,
              ncu: Mapping[str, float | None] | None, ncu_source: str) -> list[Cause]:
    """The causes without a time share: spills in the compiled kernel, HBM at its limit."""
    out = []
    if spills is not None and spills.spill_store_bytes + spills.spill_load_bytes > 0:
        variant = getattr(spills, "variant", "?")
        ev = [Evidence("spill stores + loads (ptxas, static bytes)",
                       f"{spills.spill_store_bytes} + {spills.spill_load_bytes} B in {variant}", spills_source)]
        if ncu and (ncu.get("local_load_bytes") or ncu.get("local_store_bytes")):
            ev.append(Evidence("local-memory traffic", f"{(ncu.get('local_load_bytes') or 0) / 1e6:.2f} MB loaded, "
                               f"{(ncu.get('local_store_bytes') or 0) / 1e6:.2f} MB stored", ncu_source))
        out.append(Cause("spills", None, _WHAT["spills"], tuple(ev), f"jfa-prof spills --variant {variant}",
                         "LDL/STL inside the inner loop cost on every block: fewer live registers there save part "
                         "of compute"))
    dram = ncu.get("dram_throughput") if ncu else None
    if pass_ == "fwd" and dram is not None and dram >= DRAM_BOUND_PCT:
        exp, expect = _experiment("memory_bound", shares.get("kv_late", 0.0), ctx)
        out.append(Cause("memory_bound", None, _WHAT["memory_bound"],
                         (Evidence("DRAM throughput, of peak", f"{dram:.1f}%", ncu_source),), exp, expect))
    return out


def rank_causes(cp: CriticalPath, *, source: str = "trace", trace_file: str | None = None,
                workload: Mapping[str, Any] | None = None, schedule: str | None = None,
                config: Mapping[str, Any] | None = None, spills: Any = None, spills_source: str = "ptxas",
                ncu: Mapping[str, float | None] | None = None, ncu_source: str = "ncu report",
                waterfall: Any = None, waterfall_source: str = "waterfall") -> Diagnosis:
    """The causes of ``cp``'s lost time, ranked (see the module docstring).

    ``spills``: a compile report (``analyses.spills.VariantResources`` or anything with
    ``spill_store_bytes``, ``spill_load_bytes`` and ``variant``); ``ncu``: metric short names to
    values (``analyses.ncu.NcuKernel.metrics``); ``waterfall``: an ``analyses.waterfall.Waterfall``
    of the same pass. ``workload`` (``meta["workload"]``), ``schedule``, ``config`` (the kernel's
    constexprs) and ``trace_file`` make the experiments runnable as printed.
    """
    pass_ = cp.pass_
    src = Path(trace_file).name if trace_file else "trace"  # the file, as the evidence names it
    blame = _backward_blame(cp) if pass_ == "bwd" else None
    shares = _time_shares(cp, blame)
    evidence = _trace_evidence(cp, shares, blame, src)
    what = dict(_WHAT, **(_WHAT_BWD if pass_ == "bwd" else {}))
    ctx = {"pass": pass_, "flags": workload_flags(workload), "trace": f"--trace {trace_file}" if trace_file else "",
           "schedule": schedule or "", "config": dict(config or {}),
           "reading": _kv_reading(cp, shares.get("kv_late", 0.0))}
    if ctx["reading"] == "ring":
        what["kv_late"] = ("K/V blocks arrive late though the producer issues each load as soon as a ring slot frees: "
                           "the ring is too shallow to hide the loads, or memory is the limit")
    elif ctx["reading"] == "producer":
        what["kv_late"] = "K/V blocks arrive late and the producer is busy, not held by the ring: it is slow to issue"
    elif ctx["reading"] == "between":
        what["kv_late"] = ("K/V blocks arrive late and the producer spends its time between tiles, finding the next "
                           "one (dependent global round trips), not held by the ring")

    # Losses too small to act on are left to the remainder, so the shares still add up to 1.
    shares = {k: v for k, v in shares.items() if v >= MIN_SHARE}
    shares["compute"] = max(1.0 - sum(shares.values()), 0.0)
    if not cp.has_events:
        what["compute"] += " (and the epilogue: no per-tile events)"
    evidence["compute"] = [Evidence("the rest of the tensor roles' time", _pct(shares["compute"]), src)]
    if ncu and ncu.get("tensor_pipe") is not None:
        evidence["compute"].append(Evidence("tensor pipe active, of the SM's active cycles",
                                            f"{ncu['tensor_pipe']:.1f}%", ncu_source))
    dram = ncu.get("dram_throughput") if ncu else None
    if dram is not None and "kv_late" in evidence:
        bound = "at the bandwidth limit" if dram >= DRAM_BOUND_PCT else "not at the bandwidth limit"
        evidence["kv_late"].append(Evidence("DRAM throughput, of peak", f"{dram:.1f}% ({bound})", ncu_source))

    causes = []
    for name in CAUSES[pass_]:
        if name in shares:
            exp, expect = _experiment(name, shares[name], ctx)
            ev = evidence[name] + _waterfall_evidence(waterfall, _ABLATIONS[pass_].get(name, ()), waterfall_source)
            causes.append(Cause(name, shares[name], what[name], tuple(ev), exp, expect))
    causes += _findings(pass_, shares, ctx, spills, spills_source, ncu, ncu_source)
    order = {n: i for i, n in enumerate(CAUSES[pass_])}
    tier = {"compute": 1, "spills": 2, "memory_bound": 2}
    causes.sort(key=lambda c: (tier.get(c.name, 0), -(c.share or 0.0), order[c.name]))
    return Diagnosis(pass_=pass_, source=source, causes=causes, critical=cp, notes=cp.notes)


def diagnose(trace: Any, *, spills: Any = None, spills_source: str = "ptxas",
             ncu: Mapping[str, float | None] | None = None, ncu_source: str = "ncu report", waterfall: Any = None,
             waterfall_source: str = "waterfall") -> Diagnosis:
    """The ranked causes of a ``jfa_prof.trace.Trace`` (level 3 for every cause; a level-1/2 trace
    gives the idle CTAs and, at level 2, the wait totals), with the optional compile report, ncu
    metrics and waterfall of :func:`rank_causes`."""
    cp = critical_path_of(trace)
    kernel = trace.meta.get("kernel") or {}
    diag = rank_causes(cp, source=trace.describe_origin(), trace_file=str(trace.path) if trace.path else None,
                       workload=trace.meta.get("workload"),
                       schedule=None if trace.schedule == "unknown" else trace.schedule, config=kernel.get("config"),
                       spills=spills, spills_source=spills_source, ncu=ncu, ncu_source=ncu_source,
                       waterfall=waterfall, waterfall_source=waterfall_source)
    diag.notes = diag.notes + tuple(w for w in trace.warnings if w not in diag.notes)
    return diag
