"""Imbalance figures on a hand-made trace, and their invariants on generated and recorded ones."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tracegen
from jfa_prof.analyses.imbalance import imbalance
from jfa_prof.trace import read_trace, trace_from_buffer

# SM 0: [0,100) then [100,300); SM 1: [0,200); SM 2 idle. Times in ns.
ROWS = [
    {"cta": 0, "smid": 0, "start": 0, "end": 100, "tile": 7, "batch": 3, "head": 1, "kv_len": 128},
    {"cta": 0, "smid": 0, "start": 100, "end": 300, "tile": 8, "batch": 4, "head": 2, "kv_len": 2048},
    {"cta": 1, "smid": 1, "start": 0, "end": 200, "tile": 9, "batch": 5, "head": 0, "kv_len": 1024},
]


def test_figures_by_hand():
    tr = tracegen.hand_trace(ROWS, n_sms=3)
    im = imbalance(tr.tiles, tr.n_sms)
    assert im.n_sms == 3 and im.n_tiles == 3 and im.n_idle_sms == 1
    assert im.makespan_ns == 300
    assert im.mean_busy_ns == pytest.approx(500 / 3)  # the idle SM counts as 0 busy
    assert im.max_busy_ns == 300 and im.min_busy_ns == 0
    assert im.max_over_mean == pytest.approx(1.8)
    assert im.mean_finish_ns == 250  # over the SMs that ran something
    assert im.tail_ns == 50
    assert im.idle_fraction == pytest.approx(1 - 500 / 900)
    assert im.critical_sms["smid"].tolist() == [0]
    assert im.critical_sms["over_mean_ns"].tolist() == [50]
    assert im.last_tiles["tile"].tolist() == [8, 9, 7]
    assert im.last_tiles.iloc[0][["batch", "head", "kv_len", "smid"]].tolist() == [4, 2, 2048, 0]


def test_overlapping_tiles_do_not_count_twice():
    rows = [{"cta": 0, "smid": 0, "start": 0, "end": 100, "role": 1},
            {"cta": 0, "smid": 0, "start": 0, "end": 100, "role": 2},
            {"cta": 1, "smid": 1, "start": 0, "end": 100}]
    im = imbalance(tracegen.hand_trace(rows, n_sms=2).tiles, 2)
    assert im.max_over_mean == 1.0 and im.idle_fraction == 0.0 and im.tail_ns == 0


def test_balanced_run_has_no_tail():
    buf, meta, _ = tracegen.persistent_run([3] * 40, n_ctas=8, n_sms=8)
    tr = trace_from_buffer(buf, meta)
    im = imbalance(tr.tiles, tr.n_sms)
    assert im.tail_ns == 0 and im.max_over_mean == 1.0 and im.idle_fraction == 0.0
    assert len(im.critical_sms) == 0


def test_lpt_beats_grid_order_on_skewed_lengths():
    lengths = np.ones(64, dtype=int)
    lengths[::8] = 16  # grid order deals every long tile to CTA 0
    static = imbalance(trace_from_buffer(*tracegen.persistent_run(lengths, n_ctas=8, schedule="static")[:2]).tiles, 8)
    lpt = imbalance(trace_from_buffer(*tracegen.persistent_run(lengths, n_ctas=8, schedule="lpt")[:2]).tiles, 8)
    assert static.critical_sms["smid"].tolist() == [tracegen.cta_to_sm(8, 8)[0]]
    # tiles cost 2000 + 500·n_blocks ns: CTA 0 runs 8 long (10 µs) and the others 8 short (2.5 µs)
    assert static.makespan_ns == 80_000 and static.max_over_mean == pytest.approx(80_000 / 27_500)
    assert static.tail_ns == 80_000 - 27_500
    # LPT gives every CTA one long tile and seven short ones
    assert lpt.makespan_ns == 27_500 and lpt.tail_ns == 0 and lpt.max_over_mean == 1.0


def test_to_dict_is_json_ready():
    tr = tracegen.hand_trace(ROWS, n_sms=3)
    d = imbalance(tr.tiles, tr.n_sms, dropped=4).to_dict()
    text = json.dumps(d, allow_nan=False)
    assert d["dropped"] == 4 and d["makespan_ns"] == 300
    assert d["critical_sms"][0]["smid"] == 0 and d["last_tiles"][0]["tile"] == 8
    assert "NaN" not in text


def test_empty_tiles():
    im = imbalance(tracegen.hand_trace([], n_sms=4).tiles, 4)
    assert im.makespan_ns == 0 and im.n_idle_sms == 4 and math.isnan(im.idle_fraction)


@pytest.mark.parametrize("path", tracegen.recorded_traces(), ids=tracegen.recorded_id)
def test_recorded_trace_imbalance(path):
    tr = read_trace(path)
    im = imbalance(tr.tiles, tr.n_sms, dropped=tr.dropped)
    assert 0 < im.makespan_ns
    assert 0 <= im.idle_fraction < 1
    assert im.max_busy_ns <= im.makespan_ns + 1e-6
    assert im.max_over_mean >= 1
    assert 0 <= im.tail_ns <= im.makespan_ns
    if tr.kernel_ms:
        # the tiles run inside the launch: their makespan cannot exceed the CUDA-event time by much
        assert im.makespan_ns <= tr.kernel_ms * 1e6 * 1.05
