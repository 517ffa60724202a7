"""Two bench runs of the same points side by side: how the op as called changed between them,
and whether the two runs can be compared at all.

A change between two result files mixes the kernel's change with the machine's: another GPU,
another host, or the same GPU under another power state moves every figure. Each file records the
GPU and, since 2026-12-02, the run's own streaming read and matrix product; where those differ
more than the noise of one run, the comparison says so, and names the points it would mislead on
(compute-bound points when the matrix product moved, memory-bound ones when the read did).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

# Within one run, the matrix product timed before and after the points differs by up to about 3%
# (H100, bench files of 2026-12-06): a larger gap between two runs is the machine, not noise.
CEILING_TOLERANCE = 0.03


@dataclass(frozen=True)
class PointChange:
    """One point in both runs: the op as called (each file's baseline implementation)."""

    label: str
    bound: str | None  # "compute" or "memory" in the later run, None where its GPU is unknown
    ms_before: float | None
    ms_after: float | None
    fa4_before: float | None  # ÷fa4 per call: FA4's time over ours
    fa4_after: float | None
    ahead_after: int | None  # rounds of the later run in which ours beat FA4
    rounds_after: int | None

    @property
    def time_change(self) -> float | None:
        """ms after / ms before - 1 (negative: faster); None where either is missing."""
        if not self.ms_before or self.ms_after is None:
            return None
        return self.ms_after / self.ms_before - 1


@dataclass(frozen=True)
class RunsChange:
    before: str  # provenance of each run
    after: str
    ours_before: str | None
    ours_after: str | None
    points: list[PointChange]
    only_before: list[str] = field(default_factory=list)
    only_after: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)

    def geomean_fa4(self, which: str) -> float | None:
        """The geometric mean of ÷fa4 over the points both runs have (``which``: before or after)."""
        values = [getattr(p, f"fa4_{which}") for p in self.points]
        return statistics.geometric_mean(values) if values and all(values) else None

    def at_least_fa4(self, which: str) -> int:
        """Points at which ours was at least FA4's speed per call."""
        return sum(1 for p in self.points if (getattr(p, f"fa4_{which}") or 0) >= 1.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for p, point in zip(d["points"], self.points):
            p["time_change"] = point.time_change
        d.update(geomean_fa4_before=self.geomean_fa4("before"), geomean_fa4_after=self.geomean_fa4("after"),
                 at_least_fa4_before=self.at_least_fa4("before"), at_least_fa4_after=self.at_least_fa4("after"))
        return d


def _by_label(frame, ours: str | None) -> dict[str, Any]:
    rows = frame[frame["impl"] == ours] if ours else frame.iloc[0:0]
    return {r.label: r for r in rows.itertuples(index=False)}


def _value(row, column: str) -> float | None:
    v = getattr(row, column, None) if row is not None else None
    return float(v) if isinstance(v, (int, float)) and not math.isnan(v) else None


def _count(row, column: str) -> int | None:
    v = _value(row, column)
    return int(v) if v is not None else None


def _ceiling_caveat(name: str, unit: str, before: float | None, after: float | None, affected: str) -> str | None:
    if before is None or after is None:
        missing = "either file" if before is None and after is None else ("the earlier file" if before is None
                                                                           else "the later file")
        return f"{name}: not recorded in {missing}, so a change of machine cannot be ruled out at {affected} points"
    gap = after / before - 1
    if abs(gap) <= CEILING_TOLERANCE:
        return None
    return (f"{name} {before:.{2 if unit == 'TB/s' else 0}f} -> {after:.{2 if unit == 'TB/s' else 0}f} {unit} "
            f"({gap:+.1%}): the {affected} points moved with the machine, not only with the kernel; "
            "compare builds kernel against kernel in one run (benchmarks/kernel_ab.py) to attribute a change")


def compare_runs(after, before) -> RunsChange:
    """``after`` against ``before`` (both `jfa_prof.bench.BenchResults`) at the points both hold."""
    fa, fb = after.frame(), before.frame()
    ours_a, ours_b = after.baseline, before.baseline
    rows_a, rows_b = _by_label(fa, ours_a), _by_label(fb, ours_b)
    points = []
    for label, ra in rows_a.items():
        rb = rows_b.get(label)
        if rb is None:
            continue
        bound = getattr(ra, "bound", None)
        points.append(PointChange(
            label=str(label), bound=bound if isinstance(bound, str) else None,
            ms_before=_value(rb, "ms"), ms_after=_value(ra, "ms"),
            fa4_before=_value(rb, "ratio_vs_fa4"), fa4_after=_value(ra, "ratio_vs_fa4"),
            ahead_after=_count(ra, "rounds_faster_than_fa4"), rounds_after=_count(ra, "rounds")))
    caveats = []
    if after.gpu != before.gpu:
        caveats.append(f"other GPUs: {before.gpu} -> {after.gpu}; every figure moved with the GPU")
    bounds = {p.bound for p in points}
    for name, unit, b, a, kind in (("matrix product", "TFLOPS", before.matmul_tflops, after.matmul_tflops, "compute"),
                                   ("streaming read", "TB/s", before.stream_tb_s, after.stream_tb_s, "memory")):
        if kind in bounds or None in bounds:
            c = _ceiling_caveat(name, unit, b, a, f"{kind}-bound")
            if c:
                caveats.append(c)
    if ours_a != ours_b:
        caveats.append(f"the op as called is {ours_b} in the earlier file and {ours_a} in the later one")
    return RunsChange(before=before.provenance(), after=after.provenance(), ours_before=ours_b, ours_after=ours_a,
                      points=points, only_before=[str(x) for x in rows_b if x not in rows_a],
                      only_after=[str(x) for x in rows_a if x not in rows_b], caveats=caveats)
