"""SM × time occupancy, per-SM busy time and per-role utilization on inputs small enough to
work out by hand."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tracegen
from jfa_prof.analyses.occupancy import busy_intervals, occupancy_matrix, per_sm_busy, role_utilization
from jfa_prof.trace import read_trace

# SM 0: A [0,100) then B [100,300). SM 1: two consumers overlap, C [0,150) and D [50,200).
# SM 2: idle.
ROWS = [
    {"cta": 0, "smid": 0, "start": 0, "end": 100, "tile": 10, "batch": 0, "head": 1, "kv_len": 256},
    {"cta": 0, "smid": 0, "start": 100, "end": 300, "tile": 11, "batch": 1, "head": 2, "kv_len": 512},
    {"cta": 1, "smid": 1, "start": 0, "end": 150, "tile": 12, "batch": 2, "head": 3, "kv_len": 384, "role": 1},
    {"cta": 1, "smid": 1, "start": 50, "end": 200, "tile": 13, "batch": 3, "head": 0, "kv_len": 384, "role": 2},
]


@pytest.fixture
def tiles():
    return tracegen.hand_trace(ROWS, n_sms=3).tiles


def test_busy_intervals_merge_overlaps_per_key():
    k, s, e = busy_intervals(np.array([1, 0, 1, 0, 1]), np.array([50, 100, 0, 0, 300]),
                             np.array([200, 300, 150, 100, 310]))
    assert k.tolist() == [0, 1, 1]
    assert s.tolist() == [0, 0, 300]
    assert e.tolist() == [300, 200, 310]


def test_busy_intervals_contained_interval():
    k, s, e = busy_intervals(np.array([0, 0, 0]), np.array([0, 10, 50]), np.array([100, 20, 60]))
    assert (k.tolist(), s.tolist(), e.tolist()) == ([0], [0], [100])


def test_per_sm_busy(tiles):
    per = per_sm_busy(tiles, 3)
    assert per.index.tolist() == [0, 1, 2]
    assert per["busy_ns"].tolist() == [300, 200, 0]
    assert per["work_ns"].tolist() == [300, 300, 0]  # overlapping consumers: work > busy
    assert per["n_tiles"].tolist() == [2, 2, 0]
    assert per["n_ctas"].tolist() == [1, 1, 0]
    assert per["finish_ns"].tolist()[:2] == [300, 200] and np.isnan(per["finish_ns"][2])
    assert per["first_start_ns"].tolist()[:2] == [0, 0]


def test_occupancy_three_bins(tiles):
    occ = occupancy_matrix(tiles, 3, n_bins=3)
    assert occ.edges_ns.tolist() == [0, 100, 200, 300]
    np.testing.assert_allclose(occ.busy, [[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    # row positions in the tile table: A=0, B=1, C=2, D=3
    assert occ.dominant.tolist() == [[0, 1, 1], [2, 3, -1], [-1, -1, -1]]
    assert occ.tiles["tile"].iloc[occ.dominant[1, 1]] == 13


def test_occupancy_partial_bins(tiles):
    occ = occupancy_matrix(tiles, 3, n_bins=4)  # 75 ns bins
    np.testing.assert_allclose(occ.busy[0], [1, 1, 1, 1])
    np.testing.assert_allclose(occ.busy[1], [1, 1, 50 / 75, 0])
    # bin [75,150): A covers 25, B 50 -> B. SM 1: C and D both cover all of [75,150), a tie
    # that goes to the earlier slot; [150,225): D covers 50 > 37.5
    assert occ.dominant[0].tolist() == [0, 1, 1, 1]
    assert occ.dominant[1].tolist() == [2, 2, 3, -1]


def test_occupancy_common_time_axis(tiles):
    occ = occupancy_matrix(tiles, 3, n_bins=6, t_end_ns=600)
    np.testing.assert_allclose(occ.busy[0], [1, 1, 1, 0, 0, 0])
    assert occ.bin_ns == 100 and occ.centers_ns[0] == 50


def test_occupancy_rows_cover_every_sm_seen():
    # the trace is of a 6-SM GPU; the analysis is asked for fewer rows than the tiles need
    tr = tracegen.hand_trace([{"cta": 0, "smid": 5, "start": 0, "end": 10}], n_sms=6)
    occ = occupancy_matrix(tr.tiles, 2, n_bins=2)
    assert occ.n_sms == 6 and occ.busy[5].tolist() == [1, 1]


def test_occupancy_empty_and_zero_length():
    empty = tracegen.hand_trace([], n_sms=3).tiles
    occ = occupancy_matrix(empty, 3, n_bins=4)
    assert occ.busy.shape == (3, 4) and occ.busy.sum() == 0
    point = tracegen.hand_trace([{"cta": 0, "smid": 0, "start": 0, "end": 0},
                                 {"cta": 0, "smid": 0, "start": 0, "end": 40}], n_sms=1).tiles
    occ = occupancy_matrix(point, 1, n_bins=4)
    np.testing.assert_allclose(occ.busy, [[1, 1, 1, 1]])


def test_role_utilization_by_hand():
    tiles = pd.DataFrame({"cta": [0], "role": [1], "start_ns": [0.0], "end_ns": [100.0]})
    spans = pd.DataFrame({"cta": [0, 1, 0], "role_id": [0, 0, 1],
                          "start_ns": [0.0, 0.0, 0.0], "end_ns": [200.0, 100.0, 100.0]})
    util = role_utilization(tiles, spans, ("producer", "consumer0", "consumer1"), n_ctas=2, n_bins=2)
    by = util.set_index(["role", "bin"])
    assert by.loc[("producer", 0), "active"] == 1.0 and by.loc[("producer", 1), "active"] == 0.5
    assert by.loc[("consumer0", 0), "active"] == 0.5 and by.loc[("consumer0", 1), "active"] == 0.0
    assert by.loc[("consumer0", 0), "busy"] == 0.5 and by.loc[("consumer0", 1), "busy"] == 0.0
    assert np.isnan(by.loc[("producer", 0), "busy"])  # records no tiles
    assert np.isnan(by.loc[("consumer1", 0), "busy"])
    assert util["t1_ns"].max() == 200


def test_role_utilization_of_a_run():
    buf, meta, truth = tracegen.persistent_run([4] * 12, n_ctas=3, a_ns=0, b_ns=100)
    from jfa_prof.trace import trace_from_buffer

    tr = trace_from_buffer(buf, meta)
    util = role_utilization(tr.tiles, tr.spans, tr.roles, n_ctas=tr.n_ctas, n_bins=4)
    consumers = util[util["role"] != "producer"].groupby("bin")["busy"].sum()
    # tiles run back to back on every CTA, one consumer at a time: one consumer lane per CTA busy
    np.testing.assert_allclose(consumers.to_numpy(), 1.0)


@pytest.mark.parametrize("path", tracegen.recorded_traces(), ids=tracegen.recorded_id)
def test_recorded_trace_occupancy(path):
    tr = read_trace(path)
    occ = occupancy_matrix(tr.tiles, tr.n_sms, n_bins=200)
    per = per_sm_busy(tr.tiles, tr.n_sms)
    assert occ.busy.min() >= 0 and occ.busy.max() <= 1
    # the matrix integrates to the busy time of each SM
    np.testing.assert_allclose(occ.busy.sum(axis=1) * occ.bin_ns, per["busy_ns"], rtol=1e-6, atol=1.0)
    assert (per["busy_ns"] <= per["work_ns"] + 1e-6).all()
