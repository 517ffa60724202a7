"""The one table of Nsight Compute metrics: short names -> ncu metric names, per architecture.

Code, tests and reports say ``tensor_pipe`` or ``local_load_bytes``; only this module spells
``sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active...``. ncu renames metrics between
architectures (Hopper's wgmma pipe is Blackwell's tcgen05 ``tc`` pipe), so each entry lists a
name per architecture, and an architecture without a name simply does not have that metric.

Provenance, so nobody has to wonder which names were seen on hardware:

- ``sm_90``: every name was collected by ncu 2025.3.1 on an H200 (the reports under
  ``tests/data/ncu/``; ``tests/test_ncu.py`` checks the table against them).
- ``sm_100``: names taken from Nsight Compute's documentation and public Blackwell profiling
  scripts, **not verified on hardware** (``ARCHS["sm_100"].verified`` is False and the reports
  say so). A wrong name shows up as a missing metric, never as a made-up value.

Standard library only: the CLI imports this without ncu_report, torch or triton.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterator, Mapping

from jfa_prof.errors import BadInputError

__all__ = [
    "ARCHS",
    "DEVICE_ATTRIBUTES",
    "METRICS",
    "STALL_PREFIX",
    "ArchInfo",
    "Metric",
    "arch_from_capability",
    "is_stall",
    "metric",
    "metric_list",
    "metrics_for",
    "normalize_arch",
    "stall_metric",
    "stall_reason_of",
]


@dataclass(frozen=True)
class ArchInfo:
    arch: str
    family: str
    verified: bool  # every name for this arch seen in a report recorded on that hardware
    note: str = ""


ARCHS: Mapping[str, ArchInfo] = MappingProxyType({
    "sm_90": ArchInfo("sm_90", "hopper", True, "names verified with ncu 2025.3.1 on an H200"),
    "sm_100": ArchInfo("sm_100", "blackwell", False,
                       "Blackwell names come from Nsight Compute documentation, not verified on hardware"),
})

_HOPPER, _BLACKWELL = "sm_90", "sm_100"


@dataclass(frozen=True)
class Metric:
    short: str
    label: str
    # Unit of the value as ncu reports it (renderers rescale, e.g. ns to µs).
    unit: str
    group: str
    names: Mapping[str, str]  # arch -> full ncu metric name; absent arch: no such metric there
    # Which way is an improvement when two runs are compared: "lower", "higher", or None where
    # a change is neither good nor bad by itself (registers, DRAM traffic, grid size).
    better: str | None = None
    doc: str = ""

    def name_for(self, arch: str) -> str | None:
        return self.names.get(arch)

    @property
    def portable(self) -> bool:
        """Same ncu name on every architecture in the table: safe to read from a report of an
        architecture the table does not know."""
        return set(self.names) == set(ARCHS) and len(set(self.names.values())) == 1


def _all(name: str) -> Mapping[str, str]:
    return MappingProxyType({arch: name for arch in ARCHS})


def _m(short: str, label: str, unit: str, group: str, names: Mapping[str, str] | str, *,
       better: str | None = None, doc: str = "") -> Metric:
    if isinstance(names, str):
        names = _all(names)
    return Metric(short, label, unit, group, MappingProxyType(dict(names)), better, doc)


# ---- the table -----------------------------------------------------------------------------
# Order is display order. Percentages are "of peak sustained": `_active` divides by the cycles
# the SM was active (how well a busy SM is used), `_elapsed` by the whole kernel's cycles (so an
# idle SM tail lowers it).

_GENERAL: tuple[Metric, ...] = (
    _m("duration", "duration", "ns", "time", "gpu__time_duration.sum", better="lower",
       doc="kernel time as ncu measured it (one replayed launch, clocks not locked)"),
    _m("sm_busy", "SM throughput", "%", "throughput", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
       better="higher", doc="busiest SM sub-unit relative to its peak, over the whole kernel"),
    _m("tensor_pipe", "tensor pipe active", "%", "throughput", {
        # wgmma (HGMMA/QGMMA) and legacy mma share this pipe on Hopper.
        _HOPPER: "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active",
        # tcgen05.mma (UTCMMA) runs on the separate `tc` pipe on Blackwell.
        _BLACKWELL: "sm__pipe_tc_cycles_active.avg.pct_of_peak_sustained_active",
    }, better="higher", doc="cycles the tensor cores were busy, of the SM's active cycles"),
    _m("tmem_pipe", "TMEM pipe active", "%", "throughput", {
        _BLACKWELL: "sm__pipe_tmem_cycles_active.avg.pct_of_peak_sustained_active",
    }, better=None, doc="tensor-memory traffic (tcgen05.ld/st/cp); Blackwell only"),
    _m("tensor_inst", "tensor instructions", "inst", "throughput", {
        _HOPPER: "sm__inst_executed_pipe_tensor.sum",
        _BLACKWELL: "sm__inst_executed_pipe_tc.sum",
    }, doc="tensor-pipe instructions executed: equal counts mean equal work"),
    _m("issue_active", "issue slots busy", "%", "throughput", "smsp__issue_active.avg.pct_of_peak_sustained_active",
       better="higher", doc="cycles a scheduler issued an instruction, of its active cycles"),
    _m("occupancy", "achieved occupancy", "%", "throughput", "sm__warps_active.avg.pct_of_peak_sustained_active",
       doc="resident warps of the SM's maximum; a warp-specialized kernel sits low by design"),
    _m("dram_throughput", "DRAM throughput", "%", "memory", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
       doc="HBM bandwidth used, of peak"),
    _m("local_load_bytes", "local loads", "B", "memory", "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum",
       better="lower", doc="bytes read from local memory: spills and stack at run time"),
    _m("local_store_bytes", "local stores", "B", "memory", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
       better="lower", doc="bytes written to local memory: spills and stack at run time"),
    _m("registers", "registers", "reg/thread", "launch", "launch__registers_per_thread"),
    _m("threads", "threads", "threads", "launch", "launch__thread_count"),
    _m("grid_size", "grid", "CTAs", "launch", "launch__grid_size"),
    _m("block_size", "block", "threads/CTA", "launch", "launch__block_size"),
    _m("dynamic_smem", "dynamic smem", "B/CTA", "launch", "launch__shared_mem_per_block_dynamic"),
    # min/max/avg over SMs of the cycles each had a CTA resident: their spread is load imbalance.
    _m("sm_cycles_min", "SM cycles min", "cycles", "imbalance", "sm__cycles_active.min"),
    _m("sm_cycles_avg", "SM cycles avg", "cycles", "imbalance", "sm__cycles_active.avg"),
    _m("sm_cycles_max", "SM cycles max", "cycles", "imbalance", "sm__cycles_active.max",
       better="lower", doc="the slowest SM: with persistent CTAs it sets the kernel time"),
    _m("warp_cycles_per_issue", "warp cycles/issue", "cycles", "stalls",
       "smsp__average_warp_latency_per_inst_issued.ratio", better="lower",
       doc="average cycles between two instructions of one warp; the stall reasons split it"),
)

# Warp states of the WarpStateStats section, as `smsp__average_warps_issue_stalled_<reason>
# _per_issue_active.ratio`: warp cycles spent in that state per issued instruction. "selected"
# is the issuing state itself, kept because ncu's breakdown includes it.
STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
NOT_A_STALL = frozenset({"selected"})

_COMMON_STALLS = (
    "barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle",
    "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction",
    "not_selected", "selected", "short_scoreboard", "sleeping", "tex_throttle", "wait",
)
_STALLS_BY_ARCH: Mapping[str, tuple[str, ...]] = MappingProxyType({
    # gmma: waiting on a wgmma operand or result; Hopper's asynchronous MMA only.
    _HOPPER: _COMMON_STALLS + ("gmma",),
    _BLACKWELL: _COMMON_STALLS,
})

_STALL_DOCS = {
    "barrier": "waiting at a CTA or named barrier (bar.sync) for the other warps",
    "long_scoreboard": "waiting on global/local memory (L1TEX) results, or an mbarrier try_wait",
    "short_scoreboard": "waiting on shared memory or MUFU results",
    "wait": "fixed-latency dependency (a fixed wait count)",
    "gmma": "waiting on wgmma operands or results",
    "no_instruction": "instruction cache miss or branch target not yet fetched",
    "math_pipe_throttle": "the math pipe the next instruction needs is busy",
    "mio_throttle": "the memory input/output queue is full (shared memory, special math)",
    "lg_throttle": "the local/global memory queue is full",
    "membar": "waiting on a memory barrier (fence)",
    "sleeping": "nanosleep or warp-wide yield",
    "dispatch_stall": "the dispatcher held an already selected instruction",
    "not_selected": "eligible, but another warp was picked",
    "selected": "issuing (not a stall)",
}


def stall_metric(reason: str) -> str:
    """The ncu name of one warp state's cycles per issued instruction."""
    return f"{STALL_PREFIX}{reason}{STALL_SUFFIX}"


def stall_reason_of(ncu_name: str) -> str | None:
    """``long_scoreboard`` for its ncu name, None for any other metric."""
    if ncu_name.startswith(STALL_PREFIX) and ncu_name.endswith(STALL_SUFFIX):
        reason = ncu_name[len(STALL_PREFIX):-len(STALL_SUFFIX)]
        return reason or None
    return None


def _stall_entries() -> tuple[Metric, ...]:
    reasons = list(dict.fromkeys(r for rs in _STALLS_BY_ARCH.values() for r in rs))
    return tuple(
        _m(f"stall_{r}", f"stall: {r.replace('_', ' ')}", "cycles", "stalls",
           {arch: stall_metric(r) for arch, rs in _STALLS_BY_ARCH.items() if r in rs},
           better=None if r in NOT_A_STALL else "lower", doc=_STALL_DOCS.get(r, ""))
        for r in reasons)


METRICS: tuple[Metric, ...] = _GENERAL + _stall_entries()
_BY_SHORT: Mapping[str, Metric] = MappingProxyType({m.short: m for m in METRICS})

# Device facts every report carries, whatever metrics were asked for.
DEVICE_ATTRIBUTES: Mapping[str, str] = MappingProxyType({
    "cc_major": "device__attribute_compute_capability_major",
    "cc_minor": "device__attribute_compute_capability_minor",
    "name": "device__attribute_display_name",
    "sm_count": "device__attribute_multiprocessor_count",
})


# ---- lookups -------------------------------------------------------------------------------

def metric(short: str) -> Metric:
    try:
        return _BY_SHORT[short]
    except KeyError:
        raise KeyError(f"no ncu metric with short name {short!r}") from None


def is_stall(short: str) -> bool:
    return short.startswith("stall_")


_ALIASES = {"hopper": _HOPPER, "h100": _HOPPER, "h200": _HOPPER,
            "blackwell": _BLACKWELL, "b200": _BLACKWELL}


def normalize_arch(arch: str) -> str:
    """``sm_90`` for "sm_90a", "90", "9.0", "hopper"; the same for Blackwell (sm_100).
    Raises BadInputError for anything else."""
    text = str(arch).strip().lower()
    key = _ALIASES.get(text)
    if key is None:
        m = re.fullmatch(r"(?:sm_?)?(\d+)(?:\.(\d))?[af]?", text)
        if m:
            key = f"sm_{m.group(1)}{m.group(2) or ''}"
    if key not in ARCHS:
        raise BadInputError(f"no ncu metric names for architecture {arch!r}",
                            hint="known: " + ", ".join(ARCHS))
    return key


def arch_from_capability(major: int, minor: int) -> str:
    """``sm_90`` for (9, 0): the name ncu's device attributes imply, known to the table or not."""
    return f"sm_{int(major)}{int(minor)}"


def metrics_for(arch: str | None) -> Iterator[tuple[Metric, str]]:
    """(metric, ncu name) for every entry that exists on ``arch``, in table order.

    An architecture the table does not know (or None: the report did not say) gets only the
    portable entries, whose name is the same everywhere; the rest would be a guess.
    """
    for m in METRICS:
        if arch in ARCHS:
            name = m.name_for(arch)
        else:
            name = next(iter(m.names.values())) if m.portable else None
        if name is not None:
            yield m, name


def metric_list(arch: str, *, stalls: bool = True) -> str:
    """The comma-separated list for ``ncu --metrics`` on ``arch`` (normalized first).

    Launch and device attributes are always in a report and cost nothing to name. Stall ratios
    also come with ``--section WarpStateStats``; naming them here as well keeps a run that
    drops the section complete.
    """
    key = normalize_arch(arch)
    names = [name for m, name in metrics_for(key) if stalls or not is_stall(m.short)]
    return ",".join(dict.fromkeys(names))
