"""Barrier-wait attribution: sums, means and shares worked out by hand."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import tracegen
from jfa_prof.analyses.barriers import barrier_attribution
from jfa_prof.trace import read_trace, trace_from_buffer

ROLES = ("producer", "consumer")
SITES = ("full", "empty")


def _trace(with_spans=True):
    waits = np.zeros((2, 2, 2, 2), dtype=np.int64)  # [cta, role, site, (cycles, count)]
    waits[0, 1, 0] = (300, 3)  # consumer waits for "full"
    waits[1, 1, 0] = (100, 1)
    waits[0, 0, 1] = (50, 5)  # producer waits for "empty"
    spans = [{"cta": c, "role": r, "start": 0, "end": 500, "cycles": 1000} for c in (0, 1) for r in (0, 1)]
    return tracegen.hand_trace([], n_sms=2, n_ctas=2, spans=spans if with_spans else (), waits=waits,
                               roles=ROLES, sites=SITES)


def test_attribution_by_hand():
    tr = _trace()
    attr = barrier_attribution(tr.waits, tr.spans)
    assert attr.basis == "role spans"
    assert attr.total_cycles == 4000  # 2 CTAs x 2 roles x 1000 cycles
    assert attr.role_cycles == {"producer": 2000, "consumer": 2000}
    t = attr.table
    assert t[["site", "role"]].values.tolist() == [["full", "consumer"], ["empty", "producer"]]
    full, empty = t.iloc[0], t.iloc[1]
    assert (full.cycles, full["count"], full.mean_wait_cycles) == (400, 4, 100)
    assert full.share == pytest.approx(0.1) and full.share_of_role == pytest.approx(0.2)
    assert (full.n_ctas, full.worst_cta, full.worst_cta_cycles) == (2, 0, 300)
    assert (empty.cycles, empty["count"], empty.mean_wait_cycles) == (50, 5, 10)
    assert empty.share == pytest.approx(50 / 4000) and empty.share_of_role == pytest.approx(50 / 2000)
    assert empty.n_ctas == 1
    assert attr.wait_fraction == pytest.approx(450 / 4000)
    assert t["share"].sum() == pytest.approx(attr.wait_fraction)


def test_kernel_time_basis_without_spans():
    tr = _trace(with_spans=False)
    attr = barrier_attribution(tr.waits, tr.spans, kernel_cycles=1000)
    assert attr.basis == "kernel time" and attr.total_cycles == 4000
    assert attr.table.iloc[0].share == pytest.approx(0.1)


def test_no_basis_gives_unknown_shares():
    tr = _trace(with_spans=False)
    attr = barrier_attribution(tr.waits, tr.spans)
    assert attr.basis == "none" and attr.table["share"].isna().all()
    assert attr.table.iloc[0].cycles == 400
    assert json.loads(json.dumps(attr.to_dict()))["sites"][0]["share"] is None


def test_no_waits():
    tr = tracegen.hand_trace([], n_sms=1, n_ctas=1, roles=ROLES, sites=SITES)
    attr = barrier_attribution(tr.waits, tr.spans)
    assert len(attr.table) == 0 and attr.wait_cycles == 0


def test_dynamic_run_waits_at_the_queue():
    buf, meta, truth = tracegen.persistent_run(np.arange(1, 25), n_ctas=4, schedule="dynamic")
    tr = trace_from_buffer(buf, meta)
    by = barrier_attribution(tr.waits, tr.spans).table.set_index(["site", "role"])
    assert by.loc[("queue", "producer"), "count"] == 24 and by.loc[("queue", "consumer1"), "cycles"] == 30 * 24


def test_generated_run_totals():
    buf, meta, truth = tracegen.persistent_run(np.arange(1, 25), n_ctas=4)
    tr = trace_from_buffer(buf, meta)
    attr = barrier_attribution(tr.waits, tr.spans)
    blocks = int(truth["n_blocks"].sum())
    by = attr.table.set_index(["site", "role"])["cycles"]
    assert by[("k_empty", "producer")] == 40 * blocks
    assert by[("k_full", "consumer0")] == 100 * blocks and by[("k_full", "consumer1")] == 80 * blocks
    assert ("queue", "producer") not in by.index  # no tile queue without the dynamic schedule
    assert attr.table["cycles"].is_monotonic_decreasing
    assert attr.total_cycles == tr.spans["dur_cycles"].sum()
    assert 0 < attr.wait_fraction < 1
    assert not math.isnan(json.loads(json.dumps(attr.to_dict()))["wait_fraction"])


@pytest.mark.parametrize("path", tracegen.recorded_traces(), ids=tracegen.recorded_id)
def test_recorded_trace_barriers(path):
    tr = read_trace(path)
    if tr.meta.get("profile_level") == 1:
        # Recorded with tile records only: the kernel never touched the wait accumulators.
        assert (tr.waits["cycles"] == 0).all() and (tr.waits["count"] == 0).all()
        return
    attr = barrier_attribution(tr.waits, tr.spans)
    assert len(attr.table) > 0
    assert set(attr.table["site"]) <= set(tr.sites) and set(attr.table["role"]) <= set(tr.roles)
    # a role cannot wait longer than it lives; a few percent of slack for waits just before the
    # span's first timestamp
    assert (attr.table["share_of_role"].dropna() <= 1.05).all()
