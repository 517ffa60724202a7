"""Trace-event JSON and the Gantt: structure, units and downsampling; level-3 role rows and flows."""
from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pandas as pd
import pytest

import tracegen
from jfa_prof.records import BWD_ROLES, BWD_SITES, FWD_ROLES, FWD_SITES, ROLE_SITES
from jfa_prof.render import timeline
from jfa_prof.render.timeline import chrome_trace, event_counts, gantt_bars, gantt_figure, write_chrome_trace
from jfa_prof.trace import SPAN_COLUMNS, TILE_COLUMNS, WAIT_COLUMNS, trace_from_buffer


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


# ---------------------------------------------------------------------------------------------
# level 3: event records per (tile, role)
# ---------------------------------------------------------------------------------------------

EVENT_FIELDS = ("slot", "pos", "cta", "smid", "role_id", "role", "t_start", "t_mark", "t_end", "c_start", "c_end",
                "start_ns", "mark_ns", "end_ns", "dur_ns", "dur_cycles", "tile", "batch", "head", "block", "kv_len",
                "n_blocks")
EPOCH = tracegen.GLOBALTIMER_EPOCH


def role_events(pos, cta, smid, role_id, start, mark, end, waits_ns, *, roles=FWD_ROLES, sites=FWD_SITES,
                sample=1, with_tile=None) -> pd.DataFrame:
    """``Trace.events`` as the reader makes it (the spec's columns), at 2 cycles per ns. Tile fields
    follow from the list position; ``waits_ns`` maps a site to the ns waited there per record."""
    pos, cta, smid, role_id, start, mark, end = (np.asarray(a, dtype=np.int64) for a in
                                                 (pos, cta, smid, role_id, start, mark, end))
    with_tile = np.ones(len(pos), bool) if with_tile is None else np.asarray(with_tile)
    df = pd.DataFrame({
        "slot": pos // sample * len(roles) + role_id, "pos": pos, "cta": cta, "smid": smid, "role_id": role_id,
        "role": np.array(roles, dtype=object)[role_id], "t_start": EPOCH + start, "t_mark": EPOCH + mark,
        "t_end": EPOCH + end, "c_start": 10**9 + 2 * start, "c_end": 10**9 + 2 * end, "start_ns": start,
        "mark_ns": mark, "end_ns": end, "dur_ns": end - start, "dur_cycles": 2 * (end - start),
        "tile": np.where(with_tile, 1000 + pos, -1), "batch": np.where(with_tile, pos // 4, -1),
        "head": np.where(with_tile, pos % 4, -1), "block": np.where(with_tile, 0, -1),
        "kv_len": np.where(with_tile, 128 * (1 + pos % 3), -1), "n_blocks": np.where(with_tile, 1 + pos % 3, -1),
    })
    zero = np.zeros(len(pos), dtype=np.int64)
    for s in sites:
        df[f"wait_{s}"] = 2 * np.asarray(waits_ns.get(s, zero), dtype=np.int64)
    for s in sites:
        df[f"wait_{s}_ns"] = np.asarray(waits_ns.get(s, zero), dtype=np.float64)
    assert list(df.columns) == list(EVENT_FIELDS) + [f"wait_{s}" for s in sites] + [f"wait_{s}_ns" for s in sites]
    return df.sort_values(["cta", "role_id", "start_ns"], kind="stable").reset_index(drop=True)


# Where each forward role's window, mark and waits lie, in ns from the tile's turn on its CTA:
# the producer posts the tile at +100; the consumers' mailbox waits end at +110 and +120.
FWD_PLAN = {
    "producer": (0, 100, 300, {"k_empty": 40, "queue": 30}),
    "consumer0": (50, 500, 700, {"queue": 60, "k_full": 100, "mma_turn": 50}),
    "consumer1": (50, 560, 750, {"queue": 70, "k_full": 90, "mma_turn": 80}),
}


def fwd_events(n_tiles=4, n_ctas=2, *, sm_of_cta=(3, 7), with_tile=None, waits=None) -> pd.DataFrame:
    """Tiles dealt round-robin to CTAs, each CTA taking one every 1000 ns, with FWD_PLAN's times and
    waits, or ``waits(role)``'s (per site, an array over the tiles)."""
    pos = np.arange(n_tiles)
    cta = pos % n_ctas
    turn = (pos // n_ctas) * 1000
    parts = []
    for rid, role in enumerate(FWD_ROLES):
        a, m, e, planned = FWD_PLAN[role]
        waited = waits(role) if waits else {s: np.full(n_tiles, w) for s, w in planned.items()}
        parts.append(role_events(pos, cta, np.asarray(sm_of_cta)[cta], np.full(n_tiles, rid), turn + a, turn + m,
                                 turn + e, waited, with_tile=with_tile))
    return pd.concat(parts).sort_values(["cta", "role_id", "start_ns"]).reset_index(drop=True)


def level1_frames(ev: pd.DataFrame):
    """The tile records (consumer 0's view), role spans and wait totals a level-3 trace also has."""
    c0 = ev[ev["role"] == "consumer0"]
    tiles = pd.DataFrame({"slot": c0["pos"], "cta": c0["cta"], "smid": c0["smid"], "tile": c0["tile"],
                          "batch": c0["batch"], "head": c0["head"], "block": c0["block"], "kv_len": c0["kv_len"],
                          "n_blocks": c0["n_blocks"], "t_start": c0["t_start"], "t_end": c0["t_end"],
                          "c_start": c0["c_start"], "c_end": c0["c_end"], "role": c0["role_id"], "valid": 1,
                          "role_name": c0["role"], "start_ns": c0["start_ns"], "end_ns": c0["end_ns"],
                          "dur_ns": c0["dur_ns"], "dur_cycles": c0["dur_cycles"]})[list(TILE_COLUMNS)]
    spans = ev.groupby(["cta", "role_id", "role", "smid"], as_index=False).agg(
        t_start=("t_start", "min"), t_end=("t_end", "max"), c_start=("c_start", "min"), c_end=("c_end", "max"),
        n_tiles=("pos", "size"), start_ns=("start_ns", "min"), end_ns=("end_ns", "max"))
    spans["dur_ns"] = spans["end_ns"] - spans["start_ns"]
    spans["dur_cycles"] = spans["c_end"] - spans["c_start"]
    waits = ev.melt(id_vars=["cta", "smid", "role_id", "role"], value_vars=[f"wait_{s}" for s in FWD_SITES],
                    var_name="site", value_name="cycles")
    waits["site"] = waits["site"].str.removeprefix("wait_")
    waits = waits.groupby(["cta", "smid", "role_id", "role", "site"], as_index=False, sort=False).agg(
        cycles=("cycles", "sum"), count=("cycles", lambda c: int((c > 0).sum())))
    waits["site_id"] = waits["site"].map(FWD_SITES.index)
    return tiles, spans[list(SPAN_COLUMNS)], waits[list(WAIT_COLUMNS)]


def level3_doc(ev, **kw):
    tiles, spans, waits = level1_frames(ev)
    return chrome_trace(tiles, spans, waits, events=ev, sites=FWD_SITES, pass_="fwd", roles=FWD_ROLES, **kw)


def test_level3_one_thread_per_cta_and_role():
    doc = level3_doc(fwd_events())
    assert {e["pid"]: e["args"]["name"] for e in _events(doc, "M", name="process_name")} == {3: "SM 3", 7: "SM 7"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in _events(doc, "M", name="thread_name")}
    assert threads == {(3, 0): "CTA 0 · producer", (3, 1): "CTA 0 · consumer0", (3, 2): "CTA 0 · consumer1",
                       (7, 3): "CTA 1 · producer", (7, 4): "CTA 1 · consumer0", (7, 5): "CTA 1 · consumer1"}
    # the tile records and spans are not drawn beside the event records that cover them
    assert not _events(doc, "X", cat="role") and not _events(doc, "i")


def test_level3_every_event_record_is_a_slice():
    ev = fwd_events()
    doc = level3_doc(ev)
    slices = _events(doc, "X", cat="tile")
    got = sorted((e["pid"], e["tid"], e["ts"], e["dur"], e["args"]["pos"]) for e in slices)
    want = sorted(zip(ev["smid"], ev["cta"] * 3 + ev["role_id"], ev["start_ns"] / 1e3,
                      (ev["end_ns"] - ev["start_ns"]) / 1e3, ev["pos"]))
    assert got == want and len(got) == 12
    # pos 2 is CTA 0's second tile: consumer1 works on it from 1050 to 1750 ns
    (c1,) = [e for e in slices if e["tid"] == 2 and e["args"]["pos"] == 2]
    assert c1["name"] == "tile 1002 (b 0 h 2 blk 0)" and (c1["ts"], c1["dur"]) == (1.05, 0.7)
    assert c1["args"] == {"pos": 2, "batch": 0, "head": 2, "block": 0, "kv_len": 384, "n_blocks": 3,
                          "dur_cycles": 1400, "mark_us": 0.51,
                          "wait_us": {"q_full": 0.0, "k_full": 0.09, "v_full": 0.0, "mma_turn": 0.08, "queue": 0.07}}
    (p,) = [e for e in slices if e["tid"] == 0 and e["args"]["pos"] == 2]
    assert p["args"]["wait_us"] == {"q_empty": 0.0, "k_empty": 0.04, "v_empty": 0.0, "queue": 0.03}
    assert doc["metadata"]["counts"] == {"tiles": 4, "sms": 2, "events": 12, "flows": 8}


def test_level3_names_a_record_without_its_tile_by_position():
    doc = level3_doc(fwd_events(with_tile=[True, False, True, True]))
    names = {e["args"]["pos"]: e["name"] for e in _events(doc, "X", cat="tile")}
    assert names[1] == "pos 1 (no tile record)" and names[3] == "tile 1003 (b 0 h 3 blk 0)"


def test_level3_waits_are_children_laid_back_to_back():
    ev = fwd_events()
    doc = level3_doc(ev)
    waits = _events(doc, "X", cat="wait")
    epilogues = _events(doc, "X", cat="epilogue")
    for tile in _events(doc, "X", cat="tile"):
        lo, hi = tile["ts"], tile["ts"] + tile["dur"]

        def inside(e):
            return (e["pid"], e["tid"]) == (tile["pid"], tile["tid"]) and lo <= e["ts"] and e["ts"] + e["dur"] <= hi

        kids = sorted((e for e in waits if inside(e)), key=lambda e: e["ts"])
        role = FWD_ROLES[tile["tid"] % 3]
        recorded = FWD_PLAN[role][3]
        # the mailbox wait first, then the trace's site order; each slice as long as its recorded sum
        order = ["queue"] + [s for s in FWD_SITES if s != "queue" and s in recorded]
        assert [e["name"] for e in kids] == [f"wait {s}" for s in order]
        assert [e["args"]["cycles"] for e in kids] == [2 * recorded[s] for s in order]
        assert sum(e["dur"] for e in kids) == pytest.approx(sum(recorded.values()) / 1e3)
        assert kids[0]["ts"] == lo
        for a, b in zip(kids, kids[1:]):
            assert b["ts"] == pytest.approx(a["ts"] + a["dur"])
        assert all(e["args"]["placed"] == "per-tile sum, placed back to back" for e in kids)
        epi = [e for e in epilogues if inside(e)]
        if role == "producer":
            assert epi == []
        else:
            (e,) = epi
            a, m, end, _ = FWD_PLAN[role]
            assert (e["ts"] - lo, e["dur"]) == pytest.approx(((m - a) / 1e3, (end - m) / 1e3))
    assert len(waits) == 4 * (2 + 3 + 3) and len(epilogues) == 8
    assert "back to back" in doc["metadata"]["waits"] and "summed" in doc["metadata"]["waits"]


def test_level3_waits_are_cut_at_the_epilogue():
    ev = fwd_events(n_tiles=1, n_ctas=1)
    ev.loc[ev["role"] == "consumer0", ["wait_k_full", "wait_k_full_ns"]] = (1800, 900.0)  # more than the loop
    kids = [e for e in _events(level3_doc(ev), "X", cat="wait") if e["tid"] == 1]
    assert max(e["ts"] + e["dur"] for e in kids) == pytest.approx(0.5)  # the epilogue starts at +500 ns
    assert next(e for e in kids if e["name"] == "wait k_full")["args"]["cycles"] == 1800


def test_level3_flows_go_from_the_producers_post_to_each_consumers_wait_end():
    ev = fwd_events()
    doc = level3_doc(ev)
    starts = {e["id"]: e for e in _events(doc, "s")}
    ends = {e["id"]: e for e in _events(doc, "f")}
    assert len(starts) == len(_events(doc, "s")) == 8 and starts.keys() == ends.keys()
    slices = {(e["tid"], e["args"]["pos"]): e for e in _events(doc, "X", cat="tile")}
    arrived = set()
    for i, s in starts.items():
        f = ends[i]
        assert f["bp"] == "e" and s["name"] == f["name"] == "tile posted"
        (pos,) = [p for (t, p), e in slices.items() if t == s["tid"] and e["ts"] <= s["ts"] <= e["ts"] + e["dur"]]
        producer = slices[(s["tid"], pos)]
        assert s["ts"] == pytest.approx(producer["ts"] + 0.1)  # its mark: the tile posted
        consumer = slices[(f["tid"], pos)]
        role = FWD_ROLES[f["tid"] % 3]
        assert f["pid"] == s["pid"] and f["tid"] // 3 == s["tid"] // 3 and role != "producer"
        assert f["ts"] == pytest.approx(consumer["ts"] + FWD_PLAN[role][3]["queue"] / 1e3)
        arrived.add((f["tid"], pos))
    assert arrived == {k for k in slices if k[0] % 3 != 0}


def test_level3_backward_flows_end_where_compute_starts():
    pos = np.arange(3)
    plan = {"producer": (0, 200, 900, {"kv_empty": 30, "box": 20}),
            "compute": (150, 1500, 1800, {"kv_full": 60, "step_full": 40, "dq_stage": 10})}
    parts = [role_events(pos, pos, pos + 10, np.full(3, rid), 2000 * pos + a, 2000 * pos + m, 2000 * pos + e,
                         {s: np.full(3, w) for s, w in waits.items()}, roles=BWD_ROLES, sites=BWD_SITES)
             for rid, (a, m, e, waits) in enumerate(plan.values())]
    ev = pd.concat(parts).reset_index(drop=True)
    doc = chrome_trace(pd.DataFrame(columns=TILE_COLUMNS), events=ev, sites=BWD_SITES, pass_="bwd", roles=BWD_ROLES)
    ends = sorted(e["ts"] for e in _events(doc, "f"))
    assert ends == pytest.approx([0.15, 2.15, 4.15])
    # From the producer's window start (it posts the tile first thing), not its mark (the K/V load,
    # here after the compute role had the tile): no arrow points back in time.
    assert sorted(e["ts"] for e in _events(doc, "s")) == pytest.approx([0.0, 2.0, 4.0])
    assert {e["name"] for e in _events(doc, "s")} == {"tile handed over"}
    (epi, *_) = sorted(_events(doc, "X", cat="epilogue"), key=lambda e: e["ts"])
    assert (epi["tid"], epi["ts"], epi["dur"]) == (1, 1.5, pytest.approx(0.3))
    kids = sorted((e for e in _events(doc, "X", cat="wait") if e["tid"] == 1), key=lambda e: e["ts"])[:3]
    # no mailbox site in the backward: the recording's site order
    assert [e["name"] for e in kids] == ["wait dq_stage", "wait kv_full", "wait step_full"]


def test_level3_sm_range_keeps_those_sms():
    doc = level3_doc(fwd_events(), sm_range=(5, 8))
    assert {e["pid"] for e in doc["traceEvents"]} == {7}
    assert {e["tid"] for e in _events(doc, "X", cat="tile")} == {3, 4, 5}
    assert doc["metadata"]["counts"] == {"tiles": 2, "sms": 1, "events": 6, "flows": 4}


def test_level3_document_writes_as_json(tmp_path):
    doc = level3_doc(fwd_events(), meta=tracegen.make_meta(tracegen.Layout(4, 2, 3, len(FWD_SITES))))
    doc["metadata"]["origin"] = "memory"
    back = json.loads(write_chrome_trace(doc, tmp_path / "t.json").read_text())
    assert back["traceEvents"] == list(doc["traceEvents"]) and back["displayTimeUnit"] == "ns"
    assert back["metadata"]["schedule"] == "static" and back["metadata"]["origin"] == "memory"
    assert back["metadata"]["counts"]["events"] == 12 and event_counts(doc) == back["metadata"]["counts"]
    assert doc["traceEvents"][-1] == back["traceEvents"][-1] and len(doc["traceEvents"]) == len(back["traceEvents"])


def test_level2_input_gives_the_old_document(tr):
    """Without event records (an empty ``events`` frame below level 3) nothing changes."""
    empty = role_events(*[[]] * 7, {})
    old = chrome_trace(tr.tiles, tr.spans, tr.waits, roles=tr.roles, meta=tr.meta)
    new = chrome_trace(tr.tiles, tr.spans, tr.waits, events=empty, sites=FWD_SITES, pass_="fwd", roles=tr.roles,
                       meta=tr.meta)
    assert new == old and isinstance(new["traceEvents"], list)
    assert event_counts(new) == {"tiles": 3, "sms": 2, "events": 0, "flows": 0}


def test_level3_of_100k_tiles_is_built_and_written_in_seconds(tmp_path):
    """132 SMs, 100k tiles x 3 roles; each role waits at each of its sites in about half the tiles."""
    n, n_ctas = 100_000, 132
    rng = np.random.default_rng(0)
    ev = fwd_events(n, n_ctas, sm_of_cta=np.arange(n_ctas), waits=lambda role: {
        s: rng.integers(1, 12, n) * (rng.random(n) < 0.5) for s in ROLE_SITES["fwd"][role]})
    tiles, spans, waits = level1_frames(ev)
    t = time.perf_counter()
    doc = chrome_trace(tiles, spans, waits, events=ev, sites=FWD_SITES, pass_="fwd", roles=FWD_ROLES)
    path = write_chrome_trace(doc, tmp_path / "big.json")
    took = time.perf_counter() - t
    assert doc["metadata"]["counts"] == {"tiles": n, "sms": n_ctas, "events": 3 * n, "flows": 2 * n}
    assert path.stat().st_size > 100e6
    assert took < 5.0, f"{took:.1f} s"


def test_level3_written_in_parts_holds_the_same_events_parents_first(tmp_path, monkeypatch):
    """Forked formatters write the same events as one process, and in each part a tile's slice
    still comes before the wait slices inside it."""
    n = 300
    rng = np.random.default_rng(1)
    ev = fwd_events(n, 7, sm_of_cta=np.arange(7), waits=lambda role: {
        s: rng.integers(1, 12, n) * (rng.random(n) < 0.5) for s in ROLE_SITES["fwd"][role]})
    doc = level3_doc(ev)
    one = json.loads(write_chrome_trace(doc, tmp_path / "one.json").read_text())
    monkeypatch.setattr(timeline, "_PARALLEL_LINES", 0)
    monkeypatch.setattr(timeline, "_MAX_PARTS", 3)
    monkeypatch.setattr(timeline.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    parts = json.loads(write_chrome_trace(doc, tmp_path / "parts.json").read_text())
    assert {k: v for k, v in parts.items() if k != "traceEvents"} == {k: v for k, v in one.items() if k != "traceEvents"}
    key = lambda e: json.dumps(e, sort_keys=True)  # noqa: E731
    assert sorted(map(key, parts["traceEvents"])) == sorted(map(key, one["traceEvents"]))
    assert parts["traceEvents"] != one["traceEvents"]  # it was written in parts: the order differs
    events = parts["traceEvents"]
    lane_tiles: dict[tuple[int, int], list[tuple[float, float, int]]] = {}
    for i, e in enumerate(events):
        if e.get("cat") == "tile":
            lane_tiles.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], i))
    waits = [(i, e) for i, e in enumerate(events) if e.get("cat") == "wait"]
    assert len(waits) > n
    for i, e in waits:
        parent = [j for lo, hi, j in lane_tiles[e["pid"], e["tid"]] if lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 1e-9]
        assert len(parent) == 1 and parent[0] < i, e


def test_level3_a_failed_part_fails_the_write_and_leaves_no_file(tmp_path, monkeypatch):
    doc = level3_doc(fwd_events(40, 4, sm_of_cta=np.arange(4)))
    events = doc["traceEvents"]
    # a format its column cannot fill: the error is raised in a child
    events.jobs[-1] = dataclasses.replace(events.jobs[-1], fmt=events.jobs[-1].fmt.replace("%d", "%z", 1))
    monkeypatch.setattr(timeline, "_PARALLEL_LINES", 0)
    monkeypatch.setattr(timeline.os, "sched_getaffinity", lambda pid: {0, 1})
    with pytest.raises(ValueError, match="unsupported format character"):
        write_chrome_trace(doc, tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []


def test_gantt_lanes_from_event_records():
    ev = fwd_events()
    tiles, _, _ = level1_frames(ev)
    bars = gantt_bars(tiles, events=ev, sm_range=(0, 16))
    assert bars["lane"].drop_duplicates().tolist() == [
        "SM 3 · CTA 0 · producer", "SM 3 · CTA 0 · consumer0", "SM 3 · CTA 0 · consumer1",
        "SM 7 · CTA 1 · producer", "SM 7 · CTA 1 · consumer0", "SM 7 · CTA 1 · consumer1"]
    assert len(bars) == 12 and (bars["n_merged"] == 1).all()
    assert sorted(zip(bars["cta"], bars["role"], bars["start_ns"])) == sorted(zip(ev["cta"], ev["role_id"],
                                                                                ev["start_ns"]))
    # the tile records alone give consumer 0's lanes only
    assert gantt_bars(tiles)["lane"].drop_duplicates().tolist() == ["SM 3 · CTA 0 · consumer0",
                                                                    "SM 7 · CTA 1 · consumer0"]
    assert gantt_figure(bars).to_dict()["layout"]["yaxis"]["categoryarray"] == bars["lane"].drop_duplicates().tolist()


def test_gantt_merges_event_bars_past_max_bars():
    ev = fwd_events(n_tiles=2000, n_ctas=4, sm_of_cta=(0, 1, 2, 3))
    bars = gantt_bars(ev[ev["role"] == "consumer0"], events=ev, sm_range=(0, 4), max_bars=300)
    lanes = ev.groupby(["smid", "cta", "role_id"]).ngroups
    assert lanes == 12 and bars["lane"].nunique() == 12
    assert len(bars) <= 300 + lanes and (bars["n_merged"] > 1).any()
    assert bars["n_merged"].sum() == len(ev)
    assert bars["start_ns"].min() == 0 and bars["end_ns"].max() == ev["end_ns"].max()


def test_timeline_command_reports_events(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from jfa_prof import trace as trace_mod
    from jfa_prof.cli import app

    ev = fwd_events()
    tr = tracegen.hand_trace([{"cta": 0, "smid": 3, "start": 0, "end": 700}], n_sms=16, n_ctas=2)
    tr.meta["profile_level"] = 3
    tr.events, tr.sample, tr.events_dropped = ev, 2, 5
    monkeypatch.setattr(trace_mod, "open_trace", lambda path: tr)
    out = tmp_path / "t.json"
    given = ["--trace", str(tmp_path / "any.jfatrace")]  # open_trace is replaced: the name is never read
    result = CliRunner().invoke(app, ["timeline", *given, "--out", str(out), "--html", str(tmp_path / "g.html"),
                                      "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert {k: summary[k] for k in ("roles", "events", "level", "sample", "events_dropped", "flows", "tiles", "sms")} \
        == {"roles": list(FWD_ROLES), "events": 12, "level": 3, "sample": 2, "events_dropped": 5, "flows": 8,
            "tiles": 4, "sms": 2}
    assert summary["bars"] == 12
    assert "only 1 tile in 2 has event records" in result.stderr
    assert "5 event record(s) were dropped" in result.stderr
    doc = json.loads(out.read_text())
    assert doc["metadata"]["sample"] == 2 and len([e for e in doc["traceEvents"] if e.get("cat") == "tile"]) == 12

    tr.sample, tr.events_dropped = 1, 0
    result = CliRunner().invoke(app, ["timeline", *given, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    assert "12 role records of 4 tiles, 8 flow arrows, on 2 SMs" in result.stdout


@pytest.mark.parametrize("name", ["h200_fwd_hsp_lq256_kv2048_s0.5_op_level3.jfatrace",
                                  "h200_bwd_hsp_lq256_kv2048_s0.5_op_level3.jfatrace"])
def test_no_flow_of_a_recording_points_back_in_time(name, tmp_path):
    from jfa_prof.trace import bundled_dir, read_trace

    tr = read_trace(bundled_dir() / "roles" / name)
    doc = chrome_trace(tr.tiles, tr.spans, tr.waits, events=tr.events, sites=tr.sites, pass_=tr.pass_,
                       roles=tr.roles, meta=tr.meta)
    out = write_chrome_trace(doc, tmp_path / "t.json")
    events = json.loads(out.read_text())["traceEvents"]
    begin = {e["id"]: e["ts"] for e in events if e.get("ph") == "s"}
    finish = {e["id"]: e["ts"] for e in events if e.get("ph") == "f"}
    receivers = 2 if tr.pass_ == "fwd" else 1
    assert len(begin) == len(finish) == receivers * len(tr.tiles)
    assert all(finish[i] >= begin[i] for i in begin)
