"""Registers, spills and local memory per compiled kernel variant, and how its code waits (wgmma
groups in flight, barriers): the data behind ``jfa-prof spills``.

Inputs are compile results (``jfa_prof.compile.CompileResult``, or anything with the same
attributes) reduced to ``VariantResources``; outputs are a DataFrame with one row per variant and
``SpillComparison`` for two variants side by side (e.g. peeled against unpeeled masking: the
difference is what the peeling freed).

Spill bytes are ptxas's static count of spill instructions' bytes, not traffic: a spill inside the
KV loop costs on every block, one in the prologue once. The LDL/STL counts and their sites (from
SASS) are the way to tell the two apart.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, TypeVar

import pandas as pd

from jfa_prof.analyses.compare import MetricDelta

__all__ = [
    "METRICS",
    "MetricDelta",
    "SpillComparison",
    "VariantResources",
    "compare",
    "failed",
    "from_result",
    "select_variants",
    "spill_table",
]


@dataclass(frozen=True)
class VariantResources:
    variant: str
    kernel: str
    tags: Mapping[str, str] = field(default_factory=dict)
    registers: int | None = None
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_bytes: int = 0  # per-thread local memory: stack frame, where spills go
    smem_bytes: int = 0  # dynamic shared memory per CTA
    ldl: int = 0  # local-memory load instructions in SASS
    stl: int = 0  # local-memory store instructions in SASS
    # The most wgmma groups the SASS issues before a wait (1: every matmul waited for right away) and
    # its barrier instructions; both static counts (`jfa_prof.ptxas.count_waits`).
    wgmma_in_flight: int = 0
    barriers: int = 0
    # One iteration of the innermost wgmma loop, its slowest copy (`jfa_prof.ptxas.matmul_loops`):
    # instructions, byte permutes, proxy fences, local-memory accesses, and the share of its MUFU
    # (exp2) issued while a matmul is in flight.
    loop_instructions: int = 0
    loop_shuffles: int = 0
    loop_fences: int = 0
    loop_local: int = 0
    mufu_overlap: float | None = None  # None: no MUFU in the loop
    mufu_wait: str | None = None  # what the wait holding those exponentials back sits next to (ptxas.MUFU_WAITS)
    compile_seconds: float | None = None
    cached: bool = False
    warnings: tuple[str, ...] = ()
    error: str | None = None  # set when the variant did not compile; the numbers are then empty

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes


def from_result(result: Any) -> VariantResources:
    """Reduce a compile result to the numbers this analysis uses."""
    stats = result.stats
    local = result.local_memory
    waits = result.waits
    loops = result.loops
    warnings = tuple(dict.fromkeys(w for f in result.functions for w in f.warnings))
    return VariantResources(
        variant=result.variant or result.kernel, kernel=result.kernel, tags=dict(result.tags),
        registers=result.metadata.n_regs, spill_store_bytes=stats.spill_store_bytes,
        spill_load_bytes=stats.spill_load_bytes, stack_bytes=result.metadata.local_bytes,
        smem_bytes=result.metadata.shared, ldl=local.loads, stl=local.stores,
        wgmma_in_flight=waits.wgmma_in_flight, barriers=waits.barriers,
        loop_instructions=loops.instructions, loop_shuffles=loops.shuffles, loop_fences=loops.fences,
        loop_local=loops.local, mufu_overlap=loops.mufu_overlap, mufu_wait=loops.mufu_wait,
        compile_seconds=result.compile_seconds, cached=result.cached, warnings=warnings)


def failed(variant: str, kernel: str, error: str, tags: Mapping[str, str] | None = None) -> VariantResources:
    return VariantResources(variant=variant, kernel=kernel, tags=dict(tags or {}), error=error)


# The numeric columns of the table, in display order; also what compare() reports on.
METRICS: tuple[str, ...] = ("registers", "spill_store_bytes", "spill_load_bytes", "spill_bytes",
                            "stack_bytes", "smem_bytes", "ldl", "stl", "wgmma_in_flight", "barriers",
                            "loop_instructions", "loop_shuffles", "loop_fences", "loop_local", "mufu_overlap")

_COLUMNS = ("variant", "kernel") + METRICS + ("mufu_wait", "compile_seconds", "cached", "warnings", "error")


def spill_table(resources: Iterable[VariantResources]) -> pd.DataFrame:
    """One row per variant, in the given order: the tag values as columns (union of all tag keys,
    in first-seen order; "" where a variant lacks one) between the names and the numbers."""
    rows = list(resources)
    tag_keys = list(dict.fromkeys(k for r in rows for k in r.tags))
    # Tags named like a metric column would shadow it.
    tag_keys = [k for k in tag_keys if k not in _COLUMNS]
    records = []
    for r in rows:
        rec: dict[str, Any] = {"variant": r.variant, "kernel": r.kernel}
        rec.update({k: r.tags.get(k, "") for k in tag_keys})
        ok = r.error is None
        rec.update({
            **{m: getattr(r, m) if ok else None for m in METRICS},
            "mufu_wait": r.mufu_wait,
            "compile_seconds": r.compile_seconds,
            "cached": r.cached,
            "warnings": list(r.warnings),
            "error": r.error,
        })
        records.append(rec)
    columns = ["variant", "kernel", *tag_keys, *_COLUMNS[2:]]
    df = pd.DataFrame.from_records(records, columns=columns)
    # Nullable integers: a failed variant leaves holes without turning every count into a float.
    for col in METRICS:
        df[col] = df[col].astype("Float64" if col == "mufu_overlap" else "Int64")
    df["compile_seconds"] = df["compile_seconds"].astype("Float64")
    return df


@dataclass(frozen=True)
class SpillComparison:
    a: VariantResources
    b: VariantResources
    deltas: tuple[MetricDelta, ...]
    warnings_only_in_a: tuple[str, ...]
    warnings_only_in_b: tuple[str, ...]

    def delta(self, metric: str) -> int | None:
        for d in self.deltas:
            if d.metric == metric:
                return d.delta
        raise KeyError(metric)

    @property
    def tag_differences(self) -> dict[str, tuple[str, str]]:
        """The tags that tell the two variants apart: name -> (value in A, value in B)."""
        keys = dict.fromkeys([*self.a.tags, *self.b.tags])
        return {k: (self.a.tags.get(k, ""), self.b.tags.get(k, "")) for k in keys
                if self.a.tags.get(k, "") != self.b.tags.get(k, "")}


def compare(a: VariantResources, b: VariantResources) -> SpillComparison:
    """B against A, metric by metric. Use the baseline as A: with A unpeeled and B peeled, a
    negative spill delta is what peeling freed."""
    def value(r: VariantResources, metric: str) -> int | None:
        return None if r.error is not None else getattr(r, metric)

    deltas = tuple(MetricDelta(m, value(a, m), value(b, m)) for m in METRICS)
    return SpillComparison(
        a=a, b=b, deltas=deltas,
        warnings_only_in_a=tuple(w for w in a.warnings if w not in b.warnings),
        warnings_only_in_b=tuple(w for w in b.warnings if w not in a.warnings))


T = TypeVar("T")


def _kernel_names(v: Any) -> set[str]:
    names = {str(v.name).split("/", 1)[0]}
    tags = getattr(v, "tags", None) or {}
    if "pass" in tags:
        names.add(str(tags["pass"]))
    fn = getattr(v, "kernel", None)
    fn_name = getattr(fn, "__name__", None) if not isinstance(fn, str) else fn
    if fn_name:
        names.add(fn_name)
    return names


def select_variants(variants: Sequence[T], kernel: str | None = None, pattern: str | None = None) -> list[T]:
    """The variants (anything with ``.name``, ``.tags`` and ``.kernel``) that match both filters.

    ``kernel`` matches the first segment of the variant name ("fwd" in "fwd/bcast/..."), its
    ``pass`` tag, or the name of the jitted function. ``pattern`` is a shell glob over the full
    name, where ``*`` also crosses "/" ("fwd/*/peel/*"); a pattern without glob characters
    matches a name exactly or as a prefix of whole segments ("fwd/bcast").
    """
    out = list(variants)
    if kernel is not None:
        out = [v for v in out if kernel in _kernel_names(v)]
    if pattern is not None:
        if any(c in pattern for c in "*?["):
            out = [v for v in out if fnmatch.fnmatchcase(v.name, pattern)]
        else:
            prefix = pattern.rstrip("/") + "/"
            out = [v for v in out if v.name == pattern or v.name.startswith(prefix)]
    return out
