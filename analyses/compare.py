"""One metric of variant A against variant B, shared by the comparisons (spills, ncu)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MetricDelta:
    metric: str
    a: float | None
    b: float | None

    @property
    def delta(self) -> float | None:
        """``b - a`` (with A the baseline: negative when B needs less); None when either is missing."""
        if self.a is None or self.b is None:
            return None
        return self.b - self.a

    @property
    def relative(self) -> float | None:
        """``(b - a) / a``; None when either is missing or A is zero."""
        if self.delta is None or self.a == 0:
            return None
        return self.delta / self.a
