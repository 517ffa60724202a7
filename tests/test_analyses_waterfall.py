"""Waterfall decomposition on hand-made timings. Times are sums of powers of two, so every
difference is exact in floating point and the checks use ==."""
from __future__ import annotations

import pytest

from jfa_prof.analyses.waterfall import AblationTiming, WaterfallTimings, waterfall


def _timings(cumulative=True, repeat=0.96875):
    # baseline 1.0 ms, repeat 1/32 ms away: noise 0.03125 ms.
    a = [AblationTiming("no_o_store", "stores", alone_ms=0.875, cumulative_ms=0.875 if cumulative else None, bit=1),
         AblationTiming("no_exp", "exp", alone_ms=0.75, cumulative_ms=0.5 if cumulative else None, bit=2),
         AblationTiming("reuse_kv", "loads", alone_ms=0.984375, cumulative_ms=0.25 if cumulative else None, bit=4),
         AblationTiming("no_mask", "mask", alone_ms=1.0625, cumulative_ms=0.28125 if cumulative else None, bit=8)]
    return WaterfallTimings(baseline_ms=1.0, baseline_repeat_ms=repeat, ablations=tuple(a))


def test_cumulative_steps_add_up_exactly():
    wf = waterfall(_timings())
    assert wf.basis == "cumulative"
    assert wf.noise_ms == 0.03125
    steps = [c.step_saving_ms for c in wf.components]
    assert steps == [0.125, 0.375, 0.25, -0.03125]
    assert wf.remainder_ms == 0.28125
    assert wf.baseline_ms - sum(steps) == wf.remainder_ms
    assert [c.step_share for c in wf.components] == [0.125, 0.375, 0.25, -0.03125]
    assert wf.remainder_share == 0.28125
    # |-1/32| is not above the 1/32 noise: a step at the noise is not significant.
    assert [c.step_significant for c in wf.components] == [True, True, True, False]
    assert wf.savings() == steps


def test_alone_savings_and_overlap():
    wf = waterfall(_timings())
    assert [c.alone_saving_ms for c in wf.components] == [0.125, 0.25, 0.015625, -0.0625]
    assert [c.alone_significant for c in wf.components] == [True, True, False, True]
    # Σ alone = 0.328125; Σ steps = 0.71875: removing exp and loads together saves more than alone.
    assert wf.overlap_ms == 0.328125 - 0.71875


def test_alone_basis_when_not_cumulative():
    wf = waterfall(_timings(cumulative=False))
    assert wf.basis == "alone" and wf.overlap_ms is None
    assert wf.remainder_ms == 1.0 - 0.328125
    assert all(c.step_saving_ms is None and c.step_significant is None for c in wf.components)
    assert wf.savings() == [0.125, 0.25, 0.015625, -0.0625]
    assert any("indicative" in n for n in wf.notes)


def test_noise_override_and_zero_noise():
    wf = waterfall(_timings(), noise_ms=0.5)
    assert [c.step_significant for c in wf.components] == [False, False, False, False]
    wf = waterfall(_timings(repeat=1.0))
    assert wf.noise_ms == 0.0 and all(c.alone_significant for c in wf.components)


def test_a_gap_in_the_cumulative_series_falls_back_to_alone():
    t = _timings()
    a = list(t.ablations)
    a[1] = AblationTiming("no_exp", "exp", alone_ms=0.75, cumulative_ms=None)
    wf = waterfall(WaterfallTimings(1.0, 0.96875, tuple(a)))
    assert wf.basis == "alone"
    # The step after the gap has no predecessor.
    assert [c.step_saving_ms for c in wf.components] == [0.125, None, None, -0.03125]


def test_round_trip_and_bad_baseline():
    t = _timings()
    assert WaterfallTimings.from_dict(t.to_dict()) == t
    d = waterfall(t).to_dict()
    assert d["basis"] == "cumulative" and d["components"][1]["step_saving_ms"] == 0.375
    assert d["noise_frac"] == 0.03125
    with pytest.raises(ValueError, match="positive"):
        waterfall(WaterfallTimings(0.0, 0.0, ()))


def test_no_ablations():
    wf = waterfall(WaterfallTimings(2.0, 2.0, ()))
    assert wf.components == () and wf.remainder_ms == 2.0 and wf.basis == "alone"
