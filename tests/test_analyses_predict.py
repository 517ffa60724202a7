"""The CPU schedule simulator: hand-made schedules, the LPT deal, cost-model fits, and agreement
with independently generated kernel runs."""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest

import tracegen
from jfa_prof.analyses.imbalance import imbalance
from jfa_prof.analyses.occupancy import occupancy_matrix
from jfa_prof.analyses.predict import (CostModel, compare_prediction, fit_cost_model, lpt_order, predict_trace,
                                       simulate, work_list_from_tiles)
from jfa_prof.trace import TILE_COLUMNS, read_trace, trace_from_buffer

UNIT = CostModel(a_ns=0.0, b_ns=1.0)  # a tile costs its n_blocks, in ns


def _work(n_blocks):
    return pd.DataFrame({"n_blocks": n_blocks})


def test_static_vs_dynamic_by_hand():
    # costs 4 1 4 1 1 1 on 2 CTAs
    work = _work([4, 1, 4, 1, 1, 1])
    static = simulate(work, 2, "static", UNIT)
    # CTA 0 takes positions 0, 2, 4 (4 + 4 + 1); CTA 1 takes 1, 3, 5 (1 + 1 + 1)
    assert static["cta"].tolist() == [0, 1, 0, 1, 0, 1]
    assert static["start_ns"].tolist() == [0, 0, 4, 1, 8, 2]
    assert static["end_ns"].max() == 9
    dynamic = simulate(work, 2, "dynamic", UNIT)
    # the next entry goes to whichever CTA frees first (CTA 0 on a tie)
    assert dynamic["cta"].tolist() == [0, 1, 1, 0, 0, 1]
    assert dynamic["start_ns"].tolist() == [0, 0, 1, 4, 5, 5]
    assert dynamic["end_ns"].max() == 6
    assert imbalance(static, 2).makespan_ns == 9 and imbalance(dynamic, 2).makespan_ns == 6


def test_lpt_zigzag_by_hand():
    costs = np.array([1, 5, 3, 8, 2, 7, 4, 6])
    order = lpt_order(costs, 3)
    # sorted: 3(8) 5(7) 7(6) | 1(5) 6(4) 2(3) | 4(2) 0(1); the second round is reversed, the
    # partial last round is not
    assert order.tolist() == [3, 5, 7, 2, 6, 1, 4, 0]
    pred = simulate(_work(costs[order]), 3, "lpt", UNIT)
    per_cta = pred.groupby("cta")["n_blocks"].apply(list).to_dict()
    assert per_cta == {0: [8, 3, 2], 1: [7, 4, 1], 2: [6, 5]}
    assert pred.groupby("cta")["dur_ns"].sum().tolist() == [13, 12, 11]


def test_lpt_order_matches_a_hand_written_deal():
    rng = np.random.default_rng(0)
    for n, g in ((1, 4), (7, 3), (100, 8), (1000, 132)):
        costs = rng.integers(0, 20, size=n)
        assert lpt_order(costs, g).tolist() == tracegen.zigzag_list(costs, g).tolist()


def test_lpt_order_is_a_permutation():
    order = lpt_order(np.zeros(10), 4)
    assert sorted(order.tolist()) == list(range(10))
    with pytest.raises(ValueError):
        lpt_order([1, 2], 0)


@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
def test_simulation_reproduces_a_generated_run(schedule):
    rng = np.random.default_rng(1)
    buf, meta, truth = tracegen.persistent_run(rng.integers(1, 12, size=300), n_ctas=12, schedule=schedule,
                                               a_ns=2000, b_ns=500)
    tr = trace_from_buffer(buf, meta)
    pred = simulate(work_list_from_tiles(tr.tiles), 12, schedule, CostModel(2000, 500), clock_khz=1_980_000)
    assert tuple(pred.columns) == TILE_COLUMNS
    m = tr.tiles.sort_values("slot")
    np.testing.assert_array_equal(pred["cta"], m["cta"])
    np.testing.assert_allclose(pred["start_ns"], m["start_ns"])
    np.testing.assert_allclose(pred["end_ns"], m["end_ns"])
    np.testing.assert_allclose(pred["dur_cycles"], m["dur_cycles"], atol=2)
    cmp = compare_prediction(pred, tr.tiles)
    assert cmp.makespan_error == pytest.approx(0.0)
    assert cmp.cta_agreement == 1.0 and cmp.n_tiles == 300
    # the CTAs' busy times differ here, so the correlation is defined and must be exact
    assert cmp.busy_corr == pytest.approx(1.0)


def test_predicted_tiles_feed_the_analyses():
    pred = simulate(_work([3, 1, 2, 2]), 2, "dynamic", UNIT)
    assert (pred["smid"] == pred["cta"]).all() and (pred["valid"] == 1).all()
    occ = occupancy_matrix(pred, 2, n_bins=4)
    assert occ.busy.shape == (2, 4)
    assert imbalance(pred, 2).makespan_ns == 5  # CTA 1: 1 then 2; CTA 0: 3 then 2 (wins the tie at 3)


def test_durations_override_the_cost_model():
    pred = simulate({"n_blocks": [1, 1]}, 1, "static", durations=[10.0, 5.0])
    assert pred["end_ns"].tolist() == [10, 15]
    with pytest.raises(ValueError):
        simulate({"n_blocks": [1, 1]}, 1, "static", durations=[1.0])
    with pytest.raises(ValueError):
        simulate({"n_blocks": [1]}, 1, "round-robin", UNIT)
    with pytest.raises(ValueError):
        simulate({"n_blocks": [1]}, 1, "static")


def test_fit_recovers_the_cost_model():
    buf, meta, _ = tracegen.persistent_run(np.arange(1, 41) % 9 + 1, n_ctas=4, a_ns=1500, b_ns=700, gap_ns=100)
    tiles = trace_from_buffer(buf, meta).tiles
    by_dur = fit_cost_model(tiles, basis="duration")
    assert by_dur.a_ns == pytest.approx(1500) and by_dur.b_ns == pytest.approx(700) and by_dur.r2 == pytest.approx(1)
    # the pitch (start to next start on a CTA) includes the 100 ns between tiles, except after the last tile
    by_pitch = fit_cost_model(tiles)
    assert by_pitch.basis == "pitch"
    assert by_pitch.b_ns == pytest.approx(700, rel=0.01) and by_pitch.a_ns == pytest.approx(1600, rel=0.02)


def test_fit_with_one_tile_size():
    tiles = pd.DataFrame({"cta": [0, 0], "start_ns": [0, 10], "dur_ns": [10, 10], "n_blocks": [2, 2]})
    model = fit_cost_model(tiles)
    assert model.a_ns == 0 and model(2) == pytest.approx(10)
    with pytest.raises(ValueError):
        fit_cost_model(tiles.iloc[:0])


def test_comparison_of_a_worse_prediction():
    measured = simulate(_work([4, 1, 4, 1, 1, 1]), 2, "dynamic", UNIT)
    pred = simulate(_work([4, 1, 4, 1, 1, 1]), 2, "static", UNIT)
    cmp = compare_prediction(pred, measured)
    assert cmp.makespan_pred_ns == 9 and cmp.makespan_meas_ns == 6
    assert cmp.makespan_error == pytest.approx(0.5)
    assert cmp.cta_agreement == pytest.approx(4 / 6)
    assert cmp.busy_mae_ns == pytest.approx(3.0)  # busy 9/3 predicted against 6/6
    assert cmp.to_dict()["makespan_error"] == pytest.approx(0.5)


def test_predict_trace_of_a_run_with_gaps():
    buf, meta, _ = tracegen.persistent_run(np.arange(60) % 7 + 1, n_ctas=5, schedule="lpt", gap_ns=300)
    tr = trace_from_buffer(buf, meta)
    p = predict_trace(tr.tiles, tr.n_ctas, "lpt", clock_khz=tr.clock_khz)
    assert p.schedule == "lpt" and p.cost_model.basis == "pitch"
    assert p.comparison.cta_agreement == 1.0
    # the fitted per-tile cost absorbs the gaps between tiles: the makespan comes out close
    assert abs(p.comparison.makespan_error) < 0.02


@pytest.mark.parametrize("path", tracegen.recorded_traces(), ids=tracegen.recorded_id)
def test_recorded_trace_prediction(path):
    tr = read_trace(path)
    sched = tr.schedule if tr.schedule in ("static", "lpt", "dynamic") else "dynamic"
    p = predict_trace(tr.tiles, tr.n_ctas, sched)
    assert p.cost_model.b_ns > 0
    assert abs(p.comparison.makespan_error) < 0.5
    if sched in ("static", "lpt") and not tr.dropped:
        assert p.comparison.cta_agreement == 1.0  # CTA c takes slots c, c+G, ...


def _backward_cost_model(rev):
    """Tile durations of two H200 recordings of one backward build, 2-step tiles (Lq=128) and 4-step
    tiles (Lq=256), fit together: a fixed part per tile plus a part per step."""
    tiles = [read_trace(tracegen.DATA_DIR / "traces" / f"h200_bwd_hsp_{p}_static_{rev}.jfatrace").tiles
             for p in ("lq128_kv1024_s0.1", "lq256_kv2048_s0.5")]
    assert [sorted(t["n_blocks"].unique()) for t in tiles] == [[2], [4]]
    # Durations, not pitches: the two recordings share CTA numbers but not a clock origin.
    return fit_cost_model(pd.concat(tiles), basis="duration")


@pytest.mark.parametrize("rev", ["ceea4e8", "70476de"])
def test_backward_recordings_show_a_fixed_cost_per_tile(rev):
    """Before (ceea4e8) and after (70476de) warp specialization: a tile costs a fixed part beyond its
    steps (its K / V load, the dK / dV stores) that is over a quarter of a 2-step tile."""
    m = _backward_cost_model(rev)
    assert m.r2 > 0.8 and 1000 < m.a_ns < 6000 and m.b_ns > 0
    assert m.a_ns > 0.25 * m(2)


def test_warp_specialization_made_the_steps_cheaper_not_the_tile_boundary():
    """The producer warpgroup took the copies and the dQ reduce-adds off the consumers: a step got
    over 10% cheaper, while the fixed cost per tile stayed within 10%."""
    before, after = _backward_cost_model("ceea4e8"), _backward_cost_model("70476de")
    assert after.b_ns < 0.9 * before.b_ns
    assert abs(after.a_ns - before.a_ns) < 0.1 * before.a_ns
