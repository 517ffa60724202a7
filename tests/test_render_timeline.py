"""Trace-event JSON and the Gantt: structure, units and downsampling."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tracegen
from jfa_prof.render.timeline import chrome_trace, gantt_bars, gantt_figure, write_chrome_trace
from jfa_prof.trace import trace_from_buffer


@pytest.fixture
def tr():
    waits = np.zeros((2, 3, len(tracegen.FWD_SITES), 2), dtype=np.int64)
    waits[0, 0, 1] = (700, 7)  # the producer of CTA 0 waited at k_empty
    waits[1, 1, 4] = (900, 3)  # consumer0 of CTA 1 waited at k_full
    rows = [
        {"cta": 0, "smid": 4, "start": 0, "end": 2_000, "tile": 5, "batch": 1, "head": 1, "kv_len": 640, "n_blocks": 5},
        {"cta": 0, "smid": 4, "start": 2_000, "end": 3_500, "tile": 6, "batch": 1, "head": 2, "role": 2},
        {"cta": 1, "smid": 9, "start": 500, "end": 4_000, "tile": 7, "batch": 2, "head": 0},
    ]
    spans = [{"cta": 0, "role": 0, "smid": 4, "start": -300, "end": 3_400, "n_tiles": 2},
             {"cta": 1, "role": 0, "smid": 9, "start": 200, "end": 3_900, "n_tiles": 1},
             {"cta": 1, "role": 1, "smid": 9, "start": 500, "end": 4_000, "n_tiles": 1}]
    return tracegen.hand_trace(rows, n_sms=16, n_ctas=2, spans=spans, waits=waits)


def _events(doc, ph, **match):
    return [e for e in doc["traceEvents"] if e["ph"] == ph and all(e.get(k) == v for k, v in match.items())]


def test_processes_threads_and_tiles(tr):
    doc = chrome_trace(tr.tiles, tr.spans, tr.waits, roles=tr.roles, meta=tr.meta)
    json.dumps(doc)
    names = {e["pid"]: e["args"]["name"] for e in _events(doc, "M", name="process_name")}
    assert names == {4: "SM 4", 9: "SM 9"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in _events(doc, "M", name="thread_name")}
    # tid = cta * n_roles + role
    assert threads == {(4, 0): "CTA 0 producer", (4, 1): "CTA 0 consumer0", (4, 2): "CTA 0 consumer1",
                       (9, 3): "CTA 1 producer", (9, 4): "CTA 1 consumer0"}
    tiles = _events(doc, "X", cat="tile")
    assert len(tiles) == 3
    first = next(e for e in tiles if e["name"] == "tile 5")
    assert (first["pid"], first["tid"], first["ts"], first["dur"]) == (4, 1, 0.0, 2.0)  # µs
    assert first["args"]["kv_len"] == 640 and first["args"]["n_blocks"] == 5 and first["args"]["batch"] == 1
    second = next(e for e in tiles if e["name"] == "tile 6")
    assert second["tid"] == 2  # consumer1 wrote it
    assert doc["metadata"]["schedule"] == "static" and doc["metadata"]["gpu"]["name"] == "NVIDIA H200"


def test_producer_spans_carry_their_waits(tr):
    doc = chrome_trace(tr.tiles, tr.spans, tr.waits, roles=tr.roles)
    spans = _events(doc, "X", cat="role")
    # consumer roles record tiles, so only the producers get span events
    assert sorted((e["pid"], e["tid"]) for e in spans) == [(4, 0), (9, 3)]
    p0 = next(e for e in spans if e["pid"] == 4)
    assert p0["ts"] == -0.3 and p0["dur"] == pytest.approx(3.7)
    assert p0["args"]["wait k_empty"] == {"cycles": 700, "count": 7} and p0["args"]["n_tiles"] == 2
    inst = _events(doc, "i", cat="waits")
    assert [(e["pid"], e["tid"], e["args"]) for e in inst] == [(9, 4, {"wait k_full": {"cycles": 900, "count": 3}})]


def test_sm_range_filters(tr):
    doc = chrome_trace(tr.tiles, tr.spans, tr.waits, roles=tr.roles, sm_range=(0, 5))
    assert {e["pid"] for e in doc["traceEvents"]} == {4}


def test_write_chrome_trace(tmp_path, tr):
    path = write_chrome_trace(chrome_trace(tr.tiles, roles=tr.roles), tmp_path / "t.json")
    doc = json.loads(path.read_text())
    assert len(_events(doc, "X", cat="tile")) == 3 and doc["displayTimeUnit"] == "ns"


def test_gantt_without_merging(tr):
    bars = gantt_bars(tr.tiles, sm_range=(0, 16))
    assert len(bars) == 3 and (bars["n_merged"] == 1).all()
    assert bars["lane"].tolist() == ["SM 4 · CTA 0 · consumer0", "SM 4 · CTA 0 · consumer1", "SM 9 · CTA 1 · consumer0"]
    d = gantt_figure(bars, title="g").to_dict()
    (bar,) = d["data"]
    assert bar["type"] == "bar" and bar["orientation"] == "h"
    assert d["layout"]["yaxis"]["categoryarray"] == bars["lane"].tolist()
    assert gantt_bars(tr.tiles, sm_range=(5, 9)).empty


def test_gantt_downsamples_long_lanes():
    buf, meta, truth = tracegen.persistent_run(np.full(4000, 2), n_ctas=4, a_ns=100, b_ns=0)
    tiles = trace_from_buffer(buf, meta).tiles
    bars = gantt_bars(tiles, sm_range=(0, 4), max_bars=200)
    lanes = tiles.groupby(["smid", "cta", "role"]).ngroups
    assert len(bars) <= 200 + lanes
    assert bars["n_merged"].sum() == 4000
    # a merged bar spans its tiles
    assert bars["start_ns"].min() == 0 and bars["end_ns"].max() == tiles["end_ns"].max()


def test_gantt_with_role_utilization(tr):
    from jfa_prof.analyses.occupancy import role_utilization

    util = role_utilization(tr.tiles, tr.spans, tr.roles, n_ctas=tr.n_ctas, n_bins=8)
    d = gantt_figure(gantt_bars(tr.tiles), util=util).to_dict()
    bar, *lines = d["data"]
    assert bar["type"] == "bar" and bar["xaxis"] == "x"
    # the producer records no tiles: only its span ("active") is drawn
    assert [t["name"] for t in lines] == ["producer active", "consumer0 busy", "consumer0 active",
                                          "consumer1 busy", "consumer1 active"]
    assert {t["yaxis"] for t in lines} == {"y2"} and d["layout"]["xaxis"]["matches"] == "x2"
