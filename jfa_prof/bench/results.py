"""The result-file format: writing it (:func:`results_document`) and reading it
(:func:`load_results`, :class:`BenchResults`).

Result files are JSON: ``{"meta": {...}, "peers": {...}, "results": [record, ...]}``. A record
(SPEC §6) holds the pass, the workload, ``flops`` (SPEC §2 convention), per implementation
``ms`` / ``tflops`` / ``ratio_vs_fa4`` (FA4 time over this time: above 1 is faster than FA4) /
``ratio_vs_best_peer`` / ``peak_mem_mb`` / relative errors or ``error``, the best peer, and
(where FA4 and an implementation were timed in the same alternated rounds) ``ratio_vs_fa4_paired``
(the median of the per-round ratios) and ``rounds_faster_than_fa4``, and
the machine, versions, date and command (``meta``, also at the top). A run with ``limits`` also
keeps per implementation ``gpu_ms`` (GPU work per call) and per point ``time_split`` (our kernel's
recorded time, split: `jfa_prof.analyses.limits`). :func:`load_results` reads these and the earlier
files that kept ``meta`` only at the top.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from jfa_prof import timing
from jfa_prof.bench.impls import impl_kind
from jfa_prof.bench.limits import TARGETS
from jfa_prof.errors import BadInputError, read_json_file

if TYPE_CHECKING:
    from jfa_prof.bench.peers import PeerStatus

__all__ = ["FORMAT", "FRAME_COLUMNS", "BenchResults", "load_results", "results_document"]

FORMAT = "jfa-prof bench 1"


def _derive(impls: dict[str, dict[str, Any]], flops: float) -> str | None:
    """Fill tflops and the ratios in place; returns the best peer's name."""
    timed = {n: e for n, e in impls.items() if isinstance(e.get("ms"), (int, float)) and e["ms"] > 0}
    for e in timed.values():
        e.setdefault("tflops", flops / e["ms"] / 1e9)
    peers = {n: e["ms"] for n, e in timed.items() if impl_kind(n) == "peer"}
    best = min(peers, key=peers.get) if peers else None
    fa4 = timed.get("fa4")
    for e in timed.values():
        if fa4 is not None:
            e["ratio_vs_fa4"] = fa4["ms"] / e["ms"]
            rounds, fa4_rounds = e.get("rounds_ms") or (), fa4.get("rounds_ms") or ()
            if e is not fa4 and len(rounds) > 1 and len(rounds) == len(fa4_rounds):
                # Round by round: a clock moving between rounds (the power cap) moves both calls.
                paired = timing.paired_rounds(rounds, fa4_rounds)
                e["ratio_vs_fa4_paired"] = 1.0 / paired["ratio"]
                e["rounds_faster_than_fa4"] = paired["faster_rounds"]
        if best is not None:
            e["ratio_vs_best_peer"] = peers[best] / e["ms"]
    return best


def results_document(records: list[dict[str, Any]], meta: dict[str, Any],
                     peers: dict[str, PeerStatus] | None = None) -> dict[str, Any]:
    """The file :func:`load_results` reads: meta at the top and in each record (SPEC §6)."""
    return {"format": FORMAT, "meta": meta, "peers": {k: s.to_dict() for k, s in (peers or {}).items()},
            "results": [{**r, "meta": meta} for r in records]}


def _tb_s(nbytes: float | None, ms: Any) -> float | None:
    """The unavoidable bytes of a point over a call's time, in decimal TB/s: the HBM rate the
    call reached at the least (whatever it moved beyond them is its own)."""
    return nbytes / ms / 1e9 if nbytes and isinstance(ms, (int, float)) and ms > 0 else None


FRAME_COLUMNS = ("pass", "grid", "label", "B", "H", "H_kv", "D", "Lq", "max_kv", "sparsity", "broadcast_q",
                 "total_q", "total_kv", "flops", "impl", "kind", "ms", "ms_repeat", "tflops", "ratio_vs_fa4",
                 "ratio_vs_best_peer", "ratio_vs_fa4_paired", "rounds_faster_than_fa4", "rounds", "best_peer",
                 "rel_err", "peak_mem_mb", "host_us", "gpu_ms", "error", "bound",
                 "floor_ms", "roof", "hbm_tb_s")


@dataclass
class BenchResults:
    """A result file: its top-level ``meta`` and its records, each with its own ``meta``.
    ``pool``: the records time splits are fit over (:meth:`splits`), the whole file's even after
    :meth:`filter` (None: ``records``)."""

    meta: dict[str, Any]
    records: list[dict[str, Any]]
    peers: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    pool: list[dict[str, Any]] | None = None

    @property
    def gpu(self) -> str:
        return str(self.meta.get("gpu") or "an unknown GPU")

    @property
    def date(self) -> str:
        """The day of the measurement, ``YYYY-MM-DD``."""
        return str(self.meta.get("date") or "an unknown date")[:10]

    def provenance(self) -> str:
        """How charts and tables label these numbers: where and when they were measured."""
        return f"recorded on {self.gpu} on {self.date}"

    @property
    def baseline(self) -> str | None:
        """The implementation the run compared everything with (it was timed twice)."""
        return next((r["baseline"] for r in self.records if r.get("baseline")), None)

    def impl_names(self) -> list[str]:
        """Every implementation in the file, ours first, in order of first appearance."""
        names = list(dict.fromkeys(n for r in self.records for n in r["impls"]))
        return sorted(names, key=lambda n: (impl_kind(n) != "jfa", names.index(n)))

    def spec(self):
        """The measuring GPU's entry in `jfa_prof.hardware`, or None for a GPU it does not know."""
        from jfa_prof.hardware import lookup

        return lookup(self.meta.get("gpu"))

    def _measured(self, name: str, field_: str) -> float | None:
        value = (self.meta.get(name) or {}).get(field_)
        return float(value) if isinstance(value, (int, float)) and value > 0 else None

    @property
    def stream_tb_s(self) -> float | None:
        """The streaming read's TB/s measured in the same run (files since 2026-12-02), else None."""
        return self._measured("stream_read", "tb_s")

    @property
    def matmul_tflops(self) -> float | None:
        """The bf16 matrix product's TFLOPS measured in the same run (files since 2026-12-02), else None."""
        return self._measured("matmul_peak", "tflops")

    def ceilings(self) -> str:
        """Where the rooflines' two ceilings come from, for the tables to say."""
        spec = self.spec()
        if spec is None:
            return "an unknown GPU"
        hbm = (f"HBM at this run's streaming read, {self.stream_tb_s:.2f} TB/s" if self.stream_tb_s
               else f"HBM at the datasheet's {spec.hbm_bandwidth_tb_s:g} TB/s")
        mma = (f"tensor cores at this run's matrix product, {self.matmul_tflops:.0f} TFLOPS" if self.matmul_tflops
               else "tensor cores at the datasheet's peak")
        return f"{hbm}; {mma}"

    def rooflines(self) -> list:
        """Per record, its `jfa_prof.analyses.roofline.Roofline` on the measuring GPU (None where
        the GPU or the record's shape is unknown), with the HBM floor at the streaming read and the
        compute floor at the matrix product measured in the same run where the file has them (the
        datasheet's figures are never reached)."""
        from dataclasses import replace

        from jfa_prof.analyses.roofline import roofline_of_record

        spec = self.spec()
        if spec and self.stream_tb_s:
            spec = replace(spec, hbm_bandwidth_tb_s=self.stream_tb_s)
        # The product is timed in bf16; fp16 runs the same instructions at the same rate on Hopper.
        peak = self.matmul_tflops * 1e12 if self.matmul_tflops else None
        return [roofline_of_record(r, spec, peak_flops=peak) if spec else None for r in self.records]

    def frame(self):
        """One row per (point, implementation); see :data:`FRAME_COLUMNS`. ``bound``, ``floor_ms``
        and ``roof`` (the share of the roofline reached) are empty for a GPU the hardware table
        does not know."""
        import pandas as pd

        rows = []
        for r, roof in zip(self.records, self.rooflines()):
            w = r["workload"]
            for name, e in r["impls"].items():
                rows.append({
                    "pass": r.get("pass", "fwd"), "grid": w.get("grid"), "label": w.get("label"),
                    **{k: w.get(k) for k in ("B", "H", "H_kv", "D", "Lq", "max_kv", "sparsity", "broadcast_q",
                                             "total_q", "total_kv")},
                    "flops": r.get("flops"), "impl": name, "kind": impl_kind(name),
                    "ms": e.get("ms"), "ms_repeat": e.get("ms_repeat"), "tflops": e.get("tflops"),
                    "ratio_vs_fa4": e.get("ratio_vs_fa4"), "ratio_vs_best_peer": e.get("ratio_vs_best_peer"),
                    "ratio_vs_fa4_paired": e.get("ratio_vs_fa4_paired"),
                    "rounds_faster_than_fa4": e.get("rounds_faster_than_fa4"), "rounds": len(e.get("rounds_ms") or ()),
                    "best_peer": r.get("best_peer"),
                    "rel_err": e.get("rel_err_vs_ref", e.get("rel_err_vs_first")),
                    "peak_mem_mb": e.get("peak_mem_mb"), "host_us": e.get("host_us"), "gpu_ms": e.get("gpu_ms"),
                    "error": e.get("error"),
                    "bound": roof.bound if roof else None, "floor_ms": roof.floor_ms if roof else None,
                    "roof": roof.fraction(e.get("ms")) if roof else None,
                    "hbm_tb_s": _tb_s(roof.min_bytes if roof else None, e.get("ms")),
                })
        df = pd.DataFrame(rows, columns=list(FRAME_COLUMNS))
        for c in ("ms", "ms_repeat", "tflops", "ratio_vs_fa4", "ratio_vs_best_peer", "ratio_vs_fa4_paired",
                  "rounds_faster_than_fa4", "rel_err", "peak_mem_mb",
                  "host_us", "gpu_ms", "floor_ms", "roof", "hbm_tb_s"):
            df[c] = pd.to_numeric(df[c], errors="coerce")
        return df

    def labels(self) -> list[str | None]:
        """Each record's workload label, in order."""
        return [r["workload"].get("label") for r in self.records]

    def splits(self) -> list:
        """Per record, the `jfa_prof.analyses.limits.TimeSplit` recorded with ``--limits``, or None;
        fit over every point of :attr:`pool` (the whole file) that ran the same compiled kernel, so
        a filtered view splits its points as the whole file does."""
        from jfa_prof.analyses.limits import TimeSplit, pooled

        pool = self.pool if self.pool is not None else self.records
        raw = [r.get("time_split") for r in pool]
        ok = [isinstance(s, dict) and "error" not in s for s in raw]
        fitted = pooled([TimeSplit.from_dict(s) if good else None for s, good in zip(raw, ok)],
                        [(r.get("pass", "fwd"), s.get("variant") if good else None)
                         for r, s, good in zip(pool, raw, ok)])
        by_record = {id(r): s for r, s in zip(pool, fitted)}
        return [by_record.get(id(r)) for r in self.records]

    def limits(self, splits: list | None = None) -> list:
        """Per record, `jfa_prof.analyses.limits.PointLimit` of our fastest implementation of the
        recorded schedule against FA4 at the grid's target (:data:`~jfa_prof.bench.limits.TARGETS`),
        from :meth:`splits` (or the ``splits`` given); None where the record has no split, no FA4
        time or no target.
        GPU times per call where the run took them: a short call's median is otherwise the host's."""
        from jfa_prof.analyses.limits import point_limit

        out = []
        for r, split in zip(self.records, self.splits() if splits is None else splits):
            target = TARGETS.get((r.get("pass", "fwd"), r["workload"].get("grid")))
            fa4_entry = r["impls"].get("fa4") or {}
            key = "gpu_ms" if fa4_entry.get("gpu_ms") else "ms"
            schedule = (r.get("time_split") or {}).get("schedule")
            ours = [e[key] for n, e in r["impls"].items()
                    if n in (f"jfa-{schedule}", f"jfa-{schedule}-planned") and e.get(key)]
            fa4 = fa4_entry.get(key)
            out.append(point_limit(split, min(ours), fa4, target, timer=key) if split and ours and fa4 and target
                       else None)
        return out

    def filter(self, *, grid: str | None = None, labels: Sequence[str] | None = None,
               pass_: str | None = None) -> BenchResults:
        keep = [r for r in self.records
                if (grid is None or r["workload"].get("grid") == grid)
                and (not labels or r["workload"].get("label") in labels)
                and (pass_ is None or r.get("pass", "fwd") == pass_)]
        return BenchResults(self.meta, keep, self.peers, self.path, self.pool if self.pool is not None else self.records)

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "peers": self.peers, "results": self.records}


def _check_impls(path: Path, i: int, record: dict[str, Any]) -> None:
    """Each implementation's entry must be an object with a numeric (or absent) time: a point
    with none, or a null entry, would drop out of every table without a word."""
    where = f"{path}: record {i} ({record['workload'].get('label') or 'no label'})"
    if not record["impls"]:
        raise BadInputError(f"{where} times no implementation (\"impls\" is empty)")
    for name, e in record["impls"].items():
        if not isinstance(e, dict):
            shown = "null" if e is None else type(e).__name__
            raise BadInputError(f"{where}: implementation {name!r} is {shown}, not an object with its time")
        ms = e.get("ms")
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float))):
            raise BadInputError(f"{where}: implementation {name!r} has ms {ms!r}, not a number")


def load_results(path: str | Path) -> BenchResults:
    """A bench result file, of this module's format or the earlier one (``meta`` at the top
    only, no best peer): records get the top-level ``meta``, and TFLOPS and ratios are
    filled in where the file lacks them, so both read the same."""
    path = Path(path)
    doc = read_json_file(path, "a bench result file")
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise BadInputError(f"{path} is not a bench result file (no \"results\" list)",
                            hint="write one with `jfa-prof bench --out FILE`")
    meta = dict(doc.get("meta") or {})
    records = []
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict) or not isinstance(r.get("workload"), dict) or not isinstance(r.get("impls"), dict):
            raise BadInputError(f"{path}: record {i} lacks a workload or impls")
        _check_impls(path, i, r)
        r = {**r, "impls": {n: dict(e) for n, e in r["impls"].items()}}
        r.setdefault("meta", meta)
        r.setdefault("pass", "fwd")
        best = _derive(r["impls"], float(r.get("flops") or 0.0)) if r.get("flops") else None
        if r.get("best_peer") is None:
            r["best_peer"] = best
        # Earlier files name no baseline; theirs is the implementation they timed twice.
        r.setdefault("baseline", next((n for n, e in r["impls"].items() if "ms_repeat" in e), None))
        records.append(r)
    return BenchResults(meta=meta, records=records, peers=dict(doc.get("peers") or {}), path=path)
