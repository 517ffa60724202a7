"""Nsight Compute reports, reduced to the metrics of ``jfa_prof.ncu_metrics``: the data behind
``jfa-prof ncu``.

``read_report`` opens an ``.ncu-rep`` with NVIDIA's ``ncu_report`` module (imported on first use,
so this module loads without it) and keeps, per profiled kernel, the value of every table metric
that exists on the kernel's architecture, or None where the report lacks it: a missing metric
is listed as missing, never filled in. ``compare`` puts two kernels side by side;
``stall_breakdown`` splits a warp's cycles between issued instructions into its states.

Everything here is pure once the report is read: dataclasses and DataFrames in and out.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from jfa_prof import ncu_metrics
from jfa_prof.analyses import compare
from jfa_prof.errors import BadInputError, ToolMissingError

__all__ = [
    "DERIVED",
    "DerivedMetric",
    "MetricDelta",
    "MetricInfo",
    "NcuComparison",
    "NcuKernel",
    "NcuReport",
    "compare",
    "describe",
    "read_report",
    "stall_breakdown",
]

# Every .ncu-rep starts with these bytes. ncu_report itself opens any file (garbage, a text
# file, a directory) as a report with no kernels, so the check is ours.
_MAGIC = b"NVR\x00"


# ---- derived metrics -----------------------------------------------------------------------

@dataclass(frozen=True)
class DerivedMetric:
    """A number computed from table metrics; None whenever one of its inputs is missing."""

    short: str
    label: str
    unit: str
    inputs: tuple[str, ...]
    fn: Callable[..., float]
    better: str | None = None
    doc: str = ""
    group: str = "derived"

    def compute(self, values: Mapping[str, float | None]) -> float | None:
        args = [values.get(k) for k in self.inputs]
        if any(a is None for a in args):
            return None
        try:
            return float(self.fn(*args))
        except ZeroDivisionError:
            return None


DERIVED: tuple[DerivedMetric, ...] = (
    # With one persistent CTA per SM the kernel ends when the slowest SM does: max/avg is the
    # time a perfectly balanced schedule would save (1.10 = the slowest SM works 10% longer).
    DerivedMetric("sm_imbalance", "SM imbalance", "max/avg",
                  ("sm_cycles_max", "sm_cycles_avg"), lambda mx, avg: mx / avg, better="lower",
                  doc="slowest SM's active cycles over the mean; 1.0 is perfect balance", group="imbalance"),
    # Per thread, so the number reads like ptxas's per-thread spill bytes: a few bytes is a
    # one-off prologue spill, hundreds or more a spill inside the KV loop.
    DerivedMetric("local_load_per_thread", "local loads/thread", "B/thread",
                  ("local_load_bytes", "threads"), lambda b, t: b / t, better="lower", group="memory"),
    DerivedMetric("local_store_per_thread", "local stores/thread", "B/thread",
                  ("local_store_bytes", "threads"), lambda b, t: b / t, better="lower", group="memory"),
)
_DERIVED_BY_SHORT = {d.short: d for d in DERIVED}


@dataclass(frozen=True)
class MetricInfo:
    short: str
    label: str
    unit: str
    group: str
    better: str | None
    doc: str
    ncu_name: str | None = None


def describe(short: str, arch: str | None = None) -> MetricInfo:
    """Label, unit, group and direction of a table metric, a derived one or a stall reason."""
    if short in _DERIVED_BY_SHORT:
        d = _DERIVED_BY_SHORT[short]
        return MetricInfo(d.short, d.label, d.unit, d.group, d.better, d.doc)
    try:
        m = ncu_metrics.metric(short)
    except KeyError:
        if ncu_metrics.is_stall(short):  # a reason the report has and the table lacks
            reason = short[len("stall_"):]
            return MetricInfo(short, f"stall: {reason.replace('_', ' ')}", "cycles", "stalls", "lower", "",
                              ncu_metrics.stall_metric(reason))
        raise
    return MetricInfo(m.short, m.label, m.unit, m.group, m.better, m.doc, m.name_for(arch) if arch else None)


# ---- reading -------------------------------------------------------------------------------

@dataclass(frozen=True)
class NcuKernel:
    """One profiled kernel launch (an ncu "action")."""

    name: str
    source: str  # the report file
    range_index: int
    action_index: int
    arch: str | None  # "sm_90", from the device attributes; None if the report lacks them
    device: str | None
    sm_count: int | None
    # Every table metric that exists on `arch`, in table order, then the derived ones; a
    # measured metric the report lacks is None here and named in `missing`.
    metrics: Mapping[str, float | None]
    # Warp cycles per issued instruction by warp state, largest first ("selected" included:
    # it is the issuing state); reasons the report lacks are in `missing` as stall_<reason>.
    stalls: Mapping[str, float]
    missing: tuple[str, ...] = ()
    ncu_names: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def arch_known(self) -> bool:
        return self.arch in ncu_metrics.ARCHS

    @property
    def arch_verified(self) -> bool:
        return self.arch_known and ncu_metrics.ARCHS[self.arch].verified

    @property
    def label(self) -> str:
        return f"{Path(self.source).name}: {self.name}"

    def value(self, short: str) -> float | None:
        if ncu_metrics.is_stall(short):
            return self.stalls.get(short[len("stall_"):])
        return self.metrics.get(short)

    @property
    def top_stalls(self) -> list[tuple[str, float]]:
        """The real stalls, largest first (without the issuing state)."""
        return [(r, v) for r, v in self.stalls.items() if r not in ncu_metrics.NOT_A_STALL]


@dataclass(frozen=True)
class NcuReport:
    path: str
    kernels: tuple[NcuKernel, ...]

    def select(self, pattern: str | None) -> "NcuReport":
        """The kernels whose name contains a match of ``pattern`` (a regular expression); all
        of them for None. BadInputError when none matches, naming the kernels there are."""
        if pattern is None:
            return self
        try:
            rx = re.compile(pattern)
        except re.error as err:
            raise BadInputError(f"bad kernel pattern {pattern!r}: {err}") from None
        chosen = tuple(k for k in self.kernels if rx.search(k.name))
        if not chosen:
            raise BadInputError(f"{Path(self.path).name}: no kernel matches {pattern!r}",
                                hint=f"kernels: {self._names()}")
        return NcuReport(self.path, chosen)

    def kernel(self, pattern: str | None = None) -> NcuKernel:
        """The one kernel matching ``pattern`` (see ``select``), or the only kernel when no
        pattern is given; BadInputError when that is not exactly one."""
        chosen = self.select(pattern).kernels
        if len(chosen) != 1:
            match = f" match {pattern!r}" if pattern is not None else ""
            raise BadInputError(f"{Path(self.path).name}: {len(chosen)} kernels{match}; pick one with --kernel",
                                hint=f"kernels: {self._names()}")
        return chosen[0]

    def _names(self) -> str:
        return ", ".join(dict.fromkeys(k.name for k in self.kernels))


def _import_ncu_report():
    try:
        import ncu_report
    except ImportError as err:
        raise ToolMissingError(f"cannot read .ncu-rep files: the ncu_report module does not import ({err})",
                               hint="pip install ncu-report") from None
    return ncu_report


def _check_file(path: Path) -> None:
    if not path.exists():
        raise BadInputError(f"no such report: {path}")
    if not path.is_file():
        raise BadInputError(f"not a file: {path}", hint="pass an .ncu-rep file written by ncu -o")
    try:
        with path.open("rb") as fh:
            head = fh.read(len(_MAGIC))
    except OSError as err:
        raise BadInputError(f"cannot read {path}: {err.strerror or err}") from None
    if head != _MAGIC:
        raise BadInputError(f"{path} is not an Nsight Compute report (.ncu-rep)",
                            hint="corrupt, or another tool's file; write one with `ncu -o`")


def _number(action: Any, name: str) -> float | None:
    m = action.metric_by_name(name)
    if m is None:
        return None
    try:
        if m.kind() == m.ValueKind_STRING:
            return None
        value = m.as_double()
    except Exception:  # a metric ncu recorded without a value
        return None
    return None if value is None or math.isnan(value) else float(value)


def _string(action: Any, name: str) -> str | None:
    m = action.metric_by_name(name)
    if m is None:
        return None
    try:
        text = m.as_string()
    except Exception:
        return None
    return text or None


def _read_action(action: Any, *, source: str, range_index: int, action_index: int) -> NcuKernel:
    attrs = ncu_metrics.DEVICE_ATTRIBUTES
    major, minor = _number(action, attrs["cc_major"]), _number(action, attrs["cc_minor"])
    arch = ncu_metrics.arch_from_capability(major, minor) if None not in (major, minor) else None
    sm_count = _number(action, attrs["sm_count"])

    metrics: dict[str, float | None] = {}
    stalls: dict[str, float] = {}
    names: dict[str, str] = {}
    missing: list[str] = []
    for m, ncu_name in ncu_metrics.metrics_for(arch):
        value = _number(action, ncu_name)
        names[m.short] = ncu_name
        if value is None:
            missing.append(m.short)
        if ncu_metrics.is_stall(m.short):
            if value is not None:
                stalls[m.short[len("stall_"):]] = value
        else:
            metrics[m.short] = value
    # A warp state newer than the table is still a measured number under the same scheme.
    for ncu_name in action.metric_names():
        reason = ncu_metrics.stall_reason_of(ncu_name)
        if reason is not None and f"stall_{reason}" not in names:
            value = _number(action, ncu_name)
            if value is not None:
                stalls[reason] = value
                names[f"stall_{reason}"] = ncu_name
    for d in DERIVED:
        metrics[d.short] = d.compute(metrics)

    return NcuKernel(
        name=action.name() or _string(action, "launch__kernel_name") or "?",
        source=source, range_index=range_index, action_index=action_index,
        arch=arch, device=_string(action, attrs["name"]),
        sm_count=int(sm_count) if sm_count is not None else None,
        metrics=metrics,
        stalls=dict(sorted(stalls.items(), key=lambda kv: -kv[1])),
        missing=tuple(missing), ncu_names=names)


def read_report(path: str | Path) -> NcuReport:
    """Every profiled kernel in an ``.ncu-rep``, in the order ncu recorded them.

    BadInputError for a missing, unreadable, corrupt or foreign file, or one without kernels;
    ToolMissingError when the ``ncu_report`` module is not installed.
    """
    path = Path(path)
    _check_file(path)
    ncu_report = _import_ncu_report()
    try:
        ctx = ncu_report.load_report(str(path))
    except Exception as err:
        raise BadInputError(f"ncu_report cannot open {path}: {err}",
                            hint="the file may be truncated, or written by a newer Nsight Compute") from None
    kernels = []
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for a in range(rng.num_actions()):
            kernels.append(_read_action(rng.action_by_idx(a), source=str(path), range_index=r, action_index=a))
    if not kernels:
        raise BadInputError(f"{path} holds no profiled kernel",
                            hint="truncated, or ncu matched no kernel (check -k and -c)")
    for k in kernels:
        # ncu_report reads a damaged record as an action without a name, device or any value; a
        # real profile always has its kernel's name and device attributes.
        if (k.name == "?" and k.device is None and k.arch is None
                and all(v is None for v in k.metrics.values()) and not k.stalls):
            raise BadInputError(f"{path} is corrupt: profiled kernel {k.action_index} of range {k.range_index} "
                                "has no name, no device and no metric value",
                                hint="the file is damaged; profile again")
    return NcuReport(path=str(path), kernels=tuple(kernels))


# ---- analyses ------------------------------------------------------------------------------

def stall_breakdown(kernel: NcuKernel) -> pd.DataFrame:
    """One row per warp state, largest first: ``cycles`` per issued instruction and ``share``
    of the cycles between two issues, ``stall`` False for the issuing state.

    The total is ncu's "warp cycles per issued instruction" when the report has it, as in ncu's
    own wording ("this stall represents 35% of the 8.6 cycles between issues"); else the sum.
    """
    rows = list(kernel.stalls.items())
    total = kernel.metrics.get("warp_cycles_per_issue") or sum(v for _, v in rows)
    df = pd.DataFrame({
        "reason": [r for r, _ in rows],
        "cycles": [float(v) for _, v in rows],
        "share": [v / total if total else float("nan") for _, v in rows],
        "stall": [r not in ncu_metrics.NOT_A_STALL for r, _ in rows],
    }, columns=["reason", "cycles", "share", "stall"])
    return df.reset_index(drop=True)


@dataclass(frozen=True)
class MetricDelta(compare.MetricDelta):
    """A metric delta that knows which direction is better for that ncu metric."""

    @property
    def improved(self) -> bool | None:
        """True when B is better by the metric's direction, False when worse, None when equal,
        missing or directionless."""
        better = describe(self.metric).better
        if better is None or not self.delta:
            return None
        return (self.delta < 0) == (better == "lower")


@dataclass(frozen=True)
class NcuComparison:
    a: NcuKernel
    b: NcuKernel
    deltas: tuple[MetricDelta, ...]  # metrics then derived, in table order
    stall_deltas: tuple[MetricDelta, ...]  # warp states, largest in A or B first
    label_a: str = ""
    label_b: str = ""

    def delta(self, metric: str) -> MetricDelta:
        for d in (*self.deltas, *self.stall_deltas):
            if d.metric == metric:
                return d
        raise KeyError(metric)

    @property
    def same_arch(self) -> bool:
        return self.a.arch == self.b.arch


def _one_kernel(x: NcuKernel | NcuReport) -> NcuKernel:
    return x.kernel() if isinstance(x, NcuReport) else x


def compare(a: NcuKernel | NcuReport, b: NcuKernel | NcuReport, *, label_a: str | None = None,
            label_b: str | None = None) -> NcuComparison:
    """B against A, metric by metric. A report stands for its only kernel.

    Only metrics that exist for A or B appear; one missing on a side has no delta. Stall
    reasons are ordered by the larger of the two values, so the top rows are what matters on
    either side.
    """
    ka, kb = _one_kernel(a), _one_kernel(b)
    shorts = list(dict.fromkeys([*ka.metrics, *kb.metrics]))
    deltas = tuple(MetricDelta(s, ka.metrics.get(s), kb.metrics.get(s)) for s in shorts)
    reasons = sorted(set(ka.stalls) | set(kb.stalls),
                     key=lambda r: -max(ka.stalls.get(r, 0.0), kb.stalls.get(r, 0.0)))
    stall_deltas = tuple(MetricDelta(f"stall_{r}", ka.stalls.get(r), kb.stalls.get(r)) for r in reasons)
    return NcuComparison(ka, kb, deltas, stall_deltas,
                         label_a=label_a or ka.label, label_b=label_b or kb.label)
