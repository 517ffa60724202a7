"""Where a kernel's time goes, from ablations: switch one piece of work off, see what it saved.

An ablation removes one component (the output stores, the exponentials, K/V reloads, the mask
arithmetic) from an otherwise unchanged kernel. Timing the baseline and each ablated kernel
gives a component's *share*: ``baseline_ms - ablated_ms``, also as a fraction of the baseline.

Two ways to take the differences:

- **alone**: each ablation on its own against the baseline. Simple, but the savings overlap:
  in a pipelined kernel, removing the exponentials alone may save little because the matrix
  units hide them, while removing them after the loads are gone saves a lot. Their sum need
  not equal anything, so the remainder ``baseline - Σ alone`` is only indicative.
- **cumulative**: ablations applied one after another in the given order; step k's saving is
  ``t(1..k-1) - t(1..k)``. The steps add up exactly to ``baseline - t(all)``, and ``t(all)``
  is the remainder: what is left once every listed component is gone (Q loads, matrix
  products, barriers, scheduling). Their values depend on the order, which is recorded.

When both are measured, ``overlap_ms = Σ alone - Σ steps``: positive when components hide
each other (work in parallel), negative when removing one exposes another.

Noise: the baseline is timed twice; ``noise_ms`` is the gap between the two medians. A saving
whose magnitude is not above it is flagged as within noise; each step compares two timings, so
the same threshold applies to steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = ["AblationTiming", "Component", "Waterfall", "WaterfallTimings", "waterfall"]


@dataclass(frozen=True)
class AblationTiming:
    """One ablation's measurements: alone against the baseline, and with every earlier
    ablation of the list applied too (None when not measured)."""

    name: str
    removes: str = ""
    alone_ms: float | None = None
    cumulative_ms: float | None = None
    bit: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "bit": self.bit, "removes": self.removes,
                "alone_ms": self.alone_ms, "cumulative_ms": self.cumulative_ms}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AblationTiming:
        return cls(name=d["name"], removes=d.get("removes", ""), alone_ms=d.get("alone_ms"),
                   cumulative_ms=d.get("cumulative_ms"), bit=d.get("bit"))


@dataclass(frozen=True)
class WaterfallTimings:
    """What was measured, in milliseconds; ablations in the order they were applied."""

    baseline_ms: float
    baseline_repeat_ms: float
    ablations: tuple[AblationTiming, ...]
    pass_: str = "fwd"

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.pass_, "baseline_ms": self.baseline_ms, "baseline_repeat_ms": self.baseline_repeat_ms,
                "ablations": [a.to_dict() for a in self.ablations]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WaterfallTimings:
        return cls(baseline_ms=float(d["baseline_ms"]), baseline_repeat_ms=float(d["baseline_repeat_ms"]),
                   ablations=tuple(AblationTiming.from_dict(a) for a in d["ablations"]),
                   pass_=d.get("pass", "fwd"))


@dataclass(frozen=True)
class Component:
    """One ablated component's share of the baseline time. ``*_significant`` is whether the
    saving's magnitude exceeds the noise; None where that timing was not made."""

    name: str
    removes: str
    alone_ms: float | None
    alone_saving_ms: float | None
    alone_share: float | None
    alone_significant: bool | None
    cumulative_ms: float | None
    step_saving_ms: float | None
    step_share: float | None
    step_significant: bool | None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Waterfall:
    """The decomposition. ``basis`` says which savings the bars use: "cumulative" when every
    cumulative timing is there (then the bars add up exactly), else "alone"."""

    pass_: str
    baseline_ms: float
    baseline_repeat_ms: float
    noise_ms: float
    components: tuple[Component, ...]
    basis: str
    remainder_ms: float
    remainder_significant: bool
    overlap_ms: float | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def noise_frac(self) -> float:
        return self.noise_ms / self.baseline_ms if self.baseline_ms > 0 else math.nan

    @property
    def remainder_share(self) -> float:
        return self.remainder_ms / self.baseline_ms if self.baseline_ms > 0 else math.nan

    def savings(self) -> list[float]:
        """The bar heights of the basis, one per component (0 where not measured)."""
        key = "step_saving_ms" if self.basis == "cumulative" else "alone_saving_ms"
        return [getattr(c, key) or 0.0 for c in self.components]

    def to_dict(self) -> dict[str, Any]:
        return {"pass": self.pass_, "baseline_ms": self.baseline_ms, "baseline_repeat_ms": self.baseline_repeat_ms,
                "noise_ms": self.noise_ms, "noise_frac": self.noise_frac, "basis": self.basis,
                "components": [c.to_dict() for c in self.components],
                "remainder_ms": self.remainder_ms, "remainder_share": self.remainder_share,
                "remainder_significant": self.remainder_significant,
                "overlap_ms": self.overlap_ms, "notes": list(self.notes)}


def _share(saving: float | None, baseline: float) -> float | None:
    return None if saving is None else saving / baseline


def _significant(saving: float | None, noise: float) -> bool | None:
    return None if saving is None else abs(saving) > noise


def waterfall(timings: WaterfallTimings, *, noise_ms: float | None = None) -> Waterfall:
    """Decompose ``timings`` (see the module docstring). ``noise_ms`` overrides the spread of
    the two baseline timings, e.g. with a noise floor measured over many runs."""
    base = float(timings.baseline_ms)
    if not base > 0:
        raise ValueError(f"baseline must be a positive time, got {base} ms")
    noise = abs(base - float(timings.baseline_repeat_ms)) if noise_ms is None else float(noise_ms)
    abl: Sequence[AblationTiming] = timings.ablations
    cumulative = bool(abl) and all(a.cumulative_ms is not None for a in abl)

    components = []
    prev = base
    for a in abl:
        alone_saving = None if a.alone_ms is None else base - a.alone_ms
        step = None
        if a.cumulative_ms is not None and prev is not None:
            step = prev - a.cumulative_ms
        # A gap in the cumulative series breaks every later step: they have no predecessor.
        prev = a.cumulative_ms
        components.append(Component(
            name=a.name, removes=a.removes,
            alone_ms=a.alone_ms, alone_saving_ms=alone_saving, alone_share=_share(alone_saving, base),
            alone_significant=_significant(alone_saving, noise),
            cumulative_ms=a.cumulative_ms, step_saving_ms=step, step_share=_share(step, base),
            step_significant=_significant(step, noise)))

    notes = []
    overlap = None
    if cumulative:
        basis = "cumulative"
        remainder = float(abl[-1].cumulative_ms)
        if all(c.alone_saving_ms is not None for c in components):
            overlap = sum(c.alone_saving_ms for c in components) - (base - remainder)
        notes.append("steps add up: each ablation is applied on top of the ones before it, in this order")
    else:
        basis = "alone"
        remainder = base - sum(c.alone_saving_ms or 0.0 for c in components)
        if len(components) > 1:
            notes.append("each ablation measured alone: savings can overlap, so the remainder is indicative "
                         "(measure cumulatively for an exact split)")
    if any(c.alone_ms is None for c in components) and basis == "alone":
        notes.append("some ablations were not measured: their bars are missing")
    return Waterfall(pass_=timings.pass_, baseline_ms=base, baseline_repeat_ms=float(timings.baseline_repeat_ms),
                     noise_ms=noise, components=tuple(components), basis=basis, remainder_ms=remainder,
                     remainder_significant=abs(remainder) > noise, overlap_ms=overlap, notes=tuple(notes))
