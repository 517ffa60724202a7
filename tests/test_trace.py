"""The trace file: round trip, decoding, and clear errors for anything that is not a good trace."""
from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import pytest

import tracegen
from jfa_prof import trace as trace_mod
from jfa_prof.errors import BadInputError
from jfa_prof.records import FWD_ROLES, FWD_SITES, LAYOUT_VERSION, Header, Layout
from jfa_prof.trace import (FORMAT, FORMAT_VERSION, TILE_COLUMNS, find_bundled, layout_meta, open_trace, read_meta,
                            read_trace, trace_from_buffer, write_trace)


@pytest.fixture(scope="module")
def run():
    rng = np.random.default_rng(3)
    return tracegen.persistent_run(rng.integers(1, 9, size=50), n_ctas=6, n_sms=8, schedule="lpt")


def _npz(path, **arrays):
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)
    return path


def _meta_bytes(meta):
    return np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)


def test_round_trip_keeps_buffer_and_meta(tmp_path, run):
    buf, meta, _ = run
    meta = {**meta, "kernel_ms": 0.125, "config_scalar": np.int64(7)}
    path = write_trace(tmp_path / "run.jfatrace", buf, meta)
    assert path == tmp_path / "run.jfatrace" and path.is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["run.jfatrace"]  # no ".npz" appended, no temp file left
    tr = read_trace(path)
    np.testing.assert_array_equal(tr.buffer, buf)
    assert tr.meta["format"] == FORMAT and tr.meta["format_version"] == FORMAT_VERSION
    assert tr.meta["layout"] == meta["layout"]
    assert tr.meta["config_scalar"] == 7 and tr.kernel_ms == 0.125
    for key in ("date", "command", "versions"):
        assert tr.meta[key]
    assert tr.meta["versions"]["numpy"] == np.__version__
    assert tr.origin == "file" and tr.path == path
    assert read_meta(path)["gpu"]["name"] == "NVIDIA H200"


def test_decoded_tiles_match_the_run(run):
    buf, meta, truth = run
    tr = trace_from_buffer(buf, meta)
    assert tuple(tr.tiles.columns) == TILE_COLUMNS
    assert len(tr.tiles) == len(truth) and tr.dropped == 0 and tr.warnings == []
    got = tr.tiles.set_index("slot")
    want = truth.set_index("slot")
    for col in ("cta", "smid", "tile", "batch", "head", "kv_len", "n_blocks", "start_ns", "end_ns", "dur_ns", "role"):
        np.testing.assert_array_equal(got[col].to_numpy(), want.loc[got.index, col].to_numpy(), err_msg=col)
    assert tr.tiles["start_ns"].min() == 0
    assert tr.t0_ns == tracegen.GLOBALTIMER_EPOCH
    # clock64 counts cycles at the SM clock: 1.98 cycles per ns here
    np.testing.assert_allclose(tr.tiles["dur_cycles"], tr.tiles["dur_ns"] * 1.98, atol=1)
    assert set(tr.tiles["role_name"]) == {"consumer0"}  # the first consumer writes the record
    assert tr.n_sms == 8 and tr.n_ctas == 6 and tr.roles == FWD_ROLES and tr.sites == FWD_SITES
    assert tr.schedule == "lpt" and "zigzag" in tr.schedule_mechanism


def test_spans_and_waits_are_decoded(run):
    buf, meta, truth = run
    tr = trace_from_buffer(buf, meta)
    assert len(tr.spans) == 6 * len(FWD_ROLES)
    producer = tr.spans[tr.spans["role"] == "producer"]
    assert (producer["start_ns"] == -300).all()  # the producer starts before the first tile
    assert list(tr.waits.columns) == ["cta", "smid", "role_id", "role", "site_id", "site", "cycles", "count"]
    assert len(tr.waits) == 6 * len(FWD_ROLES) * len(FWD_SITES)
    k_full = tr.waits[(tr.waits["site"] == "k_full")]
    assert k_full["cycles"].sum() == (100 + 80) * truth["n_blocks"].sum()  # both consumers wait
    # every CTA's SM is known to its waits
    sm_of_cta = truth.groupby("cta")["smid"].first()
    np.testing.assert_array_equal(tr.waits["smid"], sm_of_cta[tr.waits["cta"]].to_numpy())


def test_unwritten_slots_are_not_tiles():
    tr = tracegen.hand_trace([{"cta": 0, "smid": 0, "start": 0, "end": 10, "slot": 3}], n_sms=1, capacity=8)
    assert list(tr.tiles["slot"]) == [3]


def test_full_buffer_is_reported(tmp_path):
    buf, meta, truth = tracegen.persistent_run(np.arange(1, 21), n_ctas=4, capacity=15)
    tr = read_trace(write_trace(tmp_path / "full.jfatrace", buf, meta))
    assert tr.dropped == 5
    assert len(tr.tiles) == 15 and tr.tiles["slot"].max() == 14
    assert any("5 tile record(s) dropped" in w for w in tr.warnings)


def test_empty_trace_decodes():
    tr = tracegen.hand_trace([], n_sms=4, n_ctas=2)
    assert len(tr.tiles) == 0 and tuple(tr.tiles.columns) == TILE_COLUMNS
    assert tr.makespan_ns == 0.0 and tr.n_sms == 4


# ---------------------------------------------------------------------------------------------
# bad files
# ---------------------------------------------------------------------------------------------

def _expect(path, *words):
    with pytest.raises(BadInputError) as info:
        read_trace(path)
    assert info.value.exit_code == 2
    for w in words:
        assert w in str(info.value), str(info.value)


def test_missing_file(tmp_path):
    _expect(tmp_path / "nope.jfatrace", "does not exist")


def test_directory(tmp_path):
    _expect(tmp_path, "not a file")


def test_text_file_is_foreign(tmp_path):
    p = tmp_path / "notes.jfatrace"
    p.write_text("hello")
    _expect(p, "not a jfa-prof trace")


def test_npy_file_is_foreign(tmp_path):
    p = tmp_path / "array.jfatrace"
    with open(p, "wb") as f:
        np.save(f, np.zeros(4))
    _expect(p, "not a jfa-prof trace")


def test_other_npz_is_foreign(tmp_path):
    p = _npz(tmp_path / "other.jfatrace", weights=np.zeros(3))
    _expect(p, "not a jfa-prof trace", "records", "weights")


def test_other_zip_is_foreign(tmp_path):
    p = tmp_path / "doc.jfatrace"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("word/document.xml", "<xml/>")
    _expect(p, "not a jfa-prof trace")


def test_wrong_format_name(tmp_path, run):
    buf, meta, _ = run
    p = _npz(tmp_path / "x.jfatrace", records=buf, meta=_meta_bytes({**meta, "format": "someone-else"}))
    _expect(p, "not a jfa-prof trace", "someone-else")


def test_newer_format_version(tmp_path, run):
    buf, meta, _ = run
    p = _npz(tmp_path / "x.jfatrace", records=buf,
             meta=_meta_bytes({**meta, "format": FORMAT, "format_version": FORMAT_VERSION + 1}))
    _expect(p, "format version", "not supported")


def test_other_layout_version(tmp_path, run):
    buf, meta, _ = run
    lay = {**meta["layout"], "version": LAYOUT_VERSION + 1}
    p = _npz(tmp_path / "x.jfatrace", records=buf,
             meta=_meta_bytes({**meta, "layout": lay, "format": FORMAT, "format_version": FORMAT_VERSION}))
    _expect(p, "layout version", "not supported")


def test_buffer_size_must_match_layout(tmp_path, run):
    buf, meta, _ = run
    p = _npz(tmp_path / "x.jfatrace", records=buf[:-2],
             meta=_meta_bytes({**meta, "format": FORMAT, "format_version": FORMAT_VERSION}))
    _expect(p, "words", "needs")


def test_header_capacity_must_match_layout(tmp_path, run):
    buf, meta, _ = run
    bad = buf.copy()
    bad[Header.CAPACITY] += 1
    with pytest.raises(BadInputError, match="corrupt"):
        trace_from_buffer(bad, meta)


def test_metadata_not_json(tmp_path, run):
    buf, _, _ = run
    p = _npz(tmp_path / "x.jfatrace", records=buf, meta=np.frombuffer(b"\xff\xfe{", dtype=np.uint8))
    _expect(p, "corrupt", "metadata")


def test_pickled_metadata_is_refused(tmp_path, run):
    buf, meta, _ = run
    p = tmp_path / "x.jfatrace"
    with open(p, "wb") as f:
        np.savez(f, records=buf, meta=np.array([meta], dtype=object))
    _expect(p, "corrupt")


def test_truncated_file(tmp_path, run):
    buf, meta, _ = run
    good = write_trace(tmp_path / "good.jfatrace", buf, meta).read_bytes()
    p = tmp_path / "cut.jfatrace"
    p.write_bytes(good[: len(good) // 2])
    _expect(p, "corrupt")


def test_flipped_bytes_in_records(tmp_path, run):
    buf, meta, _ = run
    data = bytearray(write_trace(tmp_path / "good.jfatrace", buf, meta).read_bytes())
    # damage the compressed payload of the first member, not the zip directory
    data[200:260] = bytes(60)
    p = tmp_path / "bad.jfatrace"
    p.write_bytes(bytes(data))
    _expect(p, "")  # any BadInputError: the point is no traceback


def test_write_rejects_bad_input(tmp_path, run):
    buf, meta, _ = run
    with pytest.raises(BadInputError, match="int64"):
        write_trace(tmp_path / "x.jfatrace", buf.astype(np.int32), meta)
    with pytest.raises(BadInputError, match="needs"):
        write_trace(tmp_path / "x.jfatrace", buf[:-1], meta)
    with pytest.raises(BadInputError, match="layout"):
        write_trace(tmp_path / "x.jfatrace", buf, {k: v for k, v in meta.items() if k != "layout"})
    assert not list(tmp_path.iterdir())


def test_layout_meta_checks_names():
    with pytest.raises(ValueError):
        layout_meta(Layout(4, 2, len(FWD_ROLES), len(FWD_SITES)), roles=("only-one",))
    assert layout_meta(Layout(4, 2, len(FWD_ROLES), len(FWD_SITES)))["roles"] == list(FWD_ROLES)


# ---------------------------------------------------------------------------------------------
# bundled recordings
# ---------------------------------------------------------------------------------------------

def test_bundled_lookup(tmp_path, monkeypatch, run):
    buf, meta, _ = run
    monkeypatch.setattr(trace_mod, "bundled_dir", lambda: tmp_path)
    with pytest.raises(BadInputError, match="bundled"):
        open_trace(None)
    write_trace(tmp_path / "h200_hsp_lq256_kv2048_s0.5_static.jfatrace", buf, {**meta, "schedule": "static"})
    write_trace(tmp_path / "h200_hsp_lq256_kv2048_s0.5_dynamic.jfatrace", buf, {**meta, "schedule": "dynamic"})
    assert find_bundled("off").name.endswith("_static.jfatrace")
    assert find_bundled("on").name.endswith("_dynamic.jfatrace")
    assert find_bundled("on", max_kv=2048, grid="hsp") is not None
    assert find_bundled("on", max_kv=4096) is None
    tr = open_trace(None)
    assert tr.origin == "bundled" and tr.schedule == "dynamic"
    assert tr.describe_origin().startswith("bundled H200 recording (not live)")


# ---------------------------------------------------------------------------------------------
# real recordings, when the repository has some
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", tracegen.recorded_traces(), ids=tracegen.recorded_id)
def test_recorded_trace_decodes(path):
    tr = read_trace(path)
    assert len(tr.tiles) > 0
    assert (tr.tiles["end_ns"] >= tr.tiles["start_ns"]).all()
    assert tr.tiles["slot"].is_unique
    assert tr.tiles["smid"].between(0, tr.n_sms - 1).all()
    assert tr.tiles["cta"].between(0, tr.n_ctas - 1).all()
    assert tr.gpu_name and tr.schedule in ("static", "lpt", "dynamic")
    # a CTA never leaves its SM
    assert (tr.tiles.groupby("cta")["smid"].nunique() == 1).all()
    assert io.StringIO(json.dumps(tr.meta)).read()


def test_recording_metadata_is_what_read_trace_expects():
    """The metadata a live recording writes (built on the CPU here from stand-in device properties),
    for both passes, decodes with an empty buffer of its layout."""
    from types import SimpleNamespace

    from jfa_prof import recording
    from jfa_prof.inputs import Workload
    from jfa_prof.records import BWD_ROLES, BWD_SITES, Layout
    from jfa_prof.trace import layout_meta, trace_from_buffer

    x = Workload("hsp", B=3, H=2, H_kv=2, D=64, Lq=16, max_kv=40, sparsity=0.5, broadcast_q=True).make("cpu")
    props = SimpleNamespace(name="NVIDIA H200", multi_processor_count=132, major=9, minor=0)
    layout = Layout(tile_capacity=4, n_ctas=2, n_roles=len(BWD_ROLES), n_sites=len(BWD_SITES))
    meta = recording._meta(x, props, "bwd", {"BLOCK_M": 64}, "bwd/bcast/bf16/d64/tma2/static/prof2",
                           layout_meta(layout, BWD_ROLES, BWD_SITES), "static", "round-robin", 2, 4, [1.5, 1.6])
    assert meta["kernel"] == {"name": "_jfa_bwd", "pass": "bwd", "config": {"BLOCK_M": 64},
                              "variant": "bwd/bcast/bf16/d64/tma2/static/prof2"}
    assert meta["workload"]["flops"] == x.flops("bwd") and meta["workload"]["total_kv"] == x.total_kv
    assert meta["gpu"]["sm_count"] == 132 and meta["gpu"]["capability"] == "9.0"
    assert meta["kernel_ms"] == 1.5 and meta["n_work"] == 4 and meta["profile_level"] == 2
    tr = trace_from_buffer(np.zeros(layout.total_words, dtype=np.int64), meta)
    assert tr.schedule == "static" and len(tr.tiles) == 0


def test_recorded_warp_specialized_backward_has_both_roles():
    """A level-2 H200 recording of the warp-specialized backward (commit a5cf585): the producer and
    the consumers each account for every tile, tile records come from the consumers, and only the
    consumers wait at the dQ staging site (two query blocks per tile at Lq = 128)."""
    tr = read_trace(tracegen.DATA_DIR / "traces" / "h200_bwd_hsp_lq128_kv1024_s0.1_static_level2_a5cf585.jfatrace")
    assert tr.roles == ("producer", "compute") and tr.sites == ("dq_stage", ) and tr.dropped == 0
    assert tr.spans.groupby("role")["n_tiles"].sum().to_dict() == {"producer": len(tr.tiles), "compute": len(tr.tiles)}
    assert set(tr.tiles["role_name"]) == {"compute"}
    waits = tr.waits.groupby("role")["count"].sum()
    assert waits["producer"] == 0 and waits["compute"] == tr.tiles["n_blocks"].sum()


# ---------------------------------------------------------------------------------------------
# records checked against their own metadata
# ---------------------------------------------------------------------------------------------

def _corrupted(run, edit):
    buf, meta, _ = run
    bad = buf.copy()
    layout = trace_mod.layout_from_meta(meta)
    edit(layout.split(bad), meta)
    return bad, {**meta, "n_work": 50}


def _refused(run, edit, *words):
    bad, meta = _corrupted(run, edit)
    with pytest.raises(BadInputError) as info:
        trace_from_buffer(bad, meta)
    assert info.value.exit_code == 2 and "corrupt" in info.value.message
    for w in words:
        assert w in info.value.message, info.value.message


def test_the_generated_run_passes_the_checks(run):
    buf, meta, _ = run
    assert len(trace_from_buffer(buf, {**meta, "n_work": 50}).tiles) == 50


def test_an_sm_id_past_the_gpus_sms_is_refused(run):
    def edit(parts, meta):
        parts["tiles"][3, trace_mod.Tile.SMID] = 444
    _refused(run, edit, "SM id 444", "has 8")


def test_a_cta_role_or_tile_outside_the_launch_is_refused(run):
    T = trace_mod.Tile
    _refused(run, lambda p, m: p["tiles"][0].__setitem__(T.CTA, 6), "CTA 6", "launch had 6")
    _refused(run, lambda p, m: p["tiles"][0].__setitem__(T.ROLE, 3), "warp role 3")
    _refused(run, lambda p, m: p["tiles"][0].__setitem__(T.TILE, 50), "tile id 50", "launch had 50")
    _refused(run, lambda p, m: p["tiles"][0].__setitem__(T.KV_LEN, -1), "kv_len -1")


def test_more_records_than_the_launch_had_tiles_is_refused(run):
    _refused(run, lambda p, m: p["header"].__setitem__(Header.DROPPED, 1), "51 tile records", "50 tiles")


def test_times_that_run_backwards_or_span_more_than_a_launch_are_refused(run):
    T = trace_mod.Tile
    _refused(run, lambda p, m: p["tiles"][2].__setitem__(T.T_END, p["tiles"][2, T.T_START] - 1), "end before")
    _refused(run, lambda p, m: p["tiles"][2].__setitem__(T.T_END, p["tiles"][2, T.T_START] + 10**12),
             "spread over")
    _refused(run, lambda p, m: p["tiles"][2].__setitem__(T.C_END, p["tiles"][2, T.C_START] + 10**12),
             "SM clock")


def test_wait_counters_past_32_bits_or_a_role_long_enough_to_wrap_them_are_refused(run):
    """The kernels count waits in 32-bit counters: a value past 2^32 is damage, and a role that
    ran 2^32 cycles may have wrapped its counters, so its waits are refused, not read low."""
    W, S = trace_mod.Wait, trace_mod.Span
    _refused(run, lambda p, m: p["waits"][0, 1, 0].__setitem__(W.CYCLES, 2**32), "barrier wait cycles 4,294,967,296")
    _refused(run, lambda p, m: p["waits"][0, 1, 0].__setitem__(W.COUNT, 2**32), "barrier wait count")

    def long_span(parts, meta):
        span = parts["spans"][0, 0]
        khz = meta["gpu"]["sm_clock_khz"]
        span[S.C_END] = span[S.C_START] + 2**32
        span[S.T_END] = span[S.T_START] + 2**32 * 10**6 // khz  # the same length in ns: the clocks agree
    bad, meta = _corrupted(run, long_span)
    with pytest.raises(BadInputError, match="wrapped") as info:
        trace_from_buffer(bad, meta)
    assert "4,294,967,296 cycles" in info.value.message


def test_a_record_of_random_words_is_refused(tmp_path, run):
    buf, meta, _ = run
    layout = trace_mod.layout_from_meta(meta)
    rng = np.random.default_rng(0)
    bad = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=buf.size, dtype=np.int64)
    bad[:8] = buf[:8]  # a sound header: the damage is in the records
    path = write_trace(tmp_path / "random.jfatrace", bad, meta)
    _expect(path, "corrupt")
    # random words that are all valid-looking flags still name an SM the GPU lacks
    parts = layout.split(bad)
    parts["tiles"][:, trace_mod.Tile.VALID] = 1
    parts["spans"][:, :, trace_mod.Span.VALID] = 0
    _expect(write_trace(tmp_path / "random2.jfatrace", bad, meta), "corrupt")


def test_a_file_of_all_zero_records_is_refused(tmp_path, run):
    buf, meta, _ = run
    path = write_trace(tmp_path / "zeros.jfatrace", np.zeros_like(buf), meta)
    _expect(path, "holds no records", "all zeros")


@pytest.mark.parametrize("offset", [3, 24, 27, 30])
def test_damaged_zip_headers_are_one_short_line(tmp_path, run, offset):
    buf, meta, _ = run
    data = bytearray(write_trace(tmp_path / "good.jfatrace", buf, meta).read_bytes())
    data[offset:offset + 4] = b"\xff\xff\xff\xff"
    p = tmp_path / "bad.jfatrace"
    p.write_bytes(bytes(data))
    with pytest.raises(BadInputError) as info:
        read_trace(p)
    assert len(str(info.value)) < 300 and "\n" not in str(info.value), str(info.value)[:400]
    assert "allow_pickle" not in str(info.value)


# ---------------------------------------------------------------------------------------------
# level 3: event records
# ---------------------------------------------------------------------------------------------

def _event_trace(sample=1, capacity=None, n_tiles=6):
    """Three roles on two CTAs: tile p runs on CTA p % 2 from 1000 p ns for 800 ns at 2 cycles per
    ns, its mark at 600 ns, and role r waits 10 (r + 1) cycles at site r within it."""
    import pandas as pd

    cap = n_tiles if capacity is None else capacity
    events_cap = Layout.event_capacity_for(cap, 3, sample)
    layout = Layout(tile_capacity=cap, n_ctas=2, n_roles=3, n_sites=len(FWD_SITES), event_capacity=events_cap)
    tiles = pd.DataFrame({"slot": range(n_tiles), "cta": [p % 2 for p in range(n_tiles)], "smid": [p % 2 for p in
                          range(n_tiles)], "tile": [n_tiles - 1 - p for p in range(n_tiles)], "batch": range(n_tiles),
                          "head": 0, "block": 0, "kv_len": 100, "n_blocks": 1, "role": 1,
                          "t_start": [tracegen.GLOBALTIMER_EPOCH + 1000 * p for p in range(n_tiles)],
                          "t_end": [tracegen.GLOBALTIMER_EPOCH + 1000 * p + 700 for p in range(n_tiles)],
                          "c_start": [2000 * p for p in range(n_tiles)], "c_end": [2000 * p + 1400 for p in
                                                                                   range(n_tiles)]})
    buf = tracegen.encode(layout, tiles)
    rows = [(p, r) for p in range(0, n_tiles, sample) for r in range(3)]
    t0 = [tracegen.GLOBALTIMER_EPOCH + 1000 * p for p, _ in rows]
    ev = pd.DataFrame({"pos": [p for p, _ in rows], "role_id": [r for _, r in rows], "cta": [p % 2 for p, _ in rows],
                       "smid": [p % 2 for p, _ in rows], "t_start": t0, "t_mark": [t + 600 for t in t0],
                       "t_end": [t + 800 for t in t0], "c_start": [2000 * p for p, _ in rows],
                       "c_end": [2000 * p + 1600 for p, _ in rows]})
    start = np.full((len(rows), len(FWD_SITES)), 5000, dtype=np.int64)
    end = start.copy()
    for i, (_, r) in enumerate(rows):
        end[i, r] += 10 * (r + 1)
    tracegen.encode_events(layout, buf, ev, start, end, sample=sample)
    meta = tracegen.make_meta(layout, n_sms=8, profile_level=3, n_work=n_tiles)
    return buf, meta


def test_event_records_decode_to_per_tile_waits():
    buf, meta = _event_trace()
    tr = trace_from_buffer(buf, meta)
    ev = tr.events
    assert tr.level == 3 and tr.sample == 1 and tr.events_dropped == 0 and len(ev) == 18
    assert list(ev.columns) == list(trace_mod.event_columns(FWD_SITES))
    # The tile record joins in; times share the tiles' clock (t0 = the first tile's start).
    assert (ev["tile"] == 5 - ev["pos"]).all() and (ev["batch"] == ev["pos"]).all()
    assert (ev["start_ns"] == 1000 * ev["pos"]).all() and (ev["mark_ns"] - ev["start_ns"] == 600).all()
    assert (ev["dur_ns"] == 800).all() and (ev["dur_cycles"] == 1600).all()
    for r, site in enumerate(FWD_SITES[:3]):
        mine = ev[ev["role_id"] == r]
        assert (mine[f"wait_{site}"] == 10 * (r + 1)).all() and (mine[f"wait_{site}_ns"] == 5.0 * (r + 1)).all()
        assert (ev.loc[ev["role_id"] != r, f"wait_{site}"] == 0).all()
    assert ev.groupby("role_id")["role"].first().tolist() == list(FWD_ROLES)


def test_sampled_and_dropped_event_records():
    buf, meta = _event_trace(sample=2)
    tr = trace_from_buffer(buf, meta)
    assert tr.sample == 2 and sorted(set(tr.events["pos"])) == [0, 2, 4]
    buf, meta = _event_trace(capacity=4)
    tr = trace_from_buffer(buf, {**meta, "n_work": 6})
    assert tr.events_dropped == 2 * 3 and len(tr.events) == 4 * 3
    assert any("event record(s) dropped" in w for w in tr.warnings)


def test_event_records_round_trip_and_a_level2_trace_has_none(tmp_path, run):
    buf, meta = _event_trace()
    back = read_trace(write_trace(tmp_path / "e.jfatrace", buf, meta))
    assert back.layout.event_capacity == 18 and len(back.events) == 18
    buf2, meta2, _ = run
    tr = trace_from_buffer(buf2, meta2)
    assert tr.events.empty and list(tr.events.columns) == list(trace_mod.event_columns(tr.sites))


def test_a_layout_1_file_reads_with_no_event_section(tmp_path, run):
    buf, meta, _ = run
    lay = {k: v for k, v in meta["layout"].items() if k != "event_capacity"}
    p = _npz(tmp_path / "v1.jfatrace", records=buf,
             meta=_meta_bytes({**meta, "layout": {**lay, "version": 1}, "format": FORMAT, "format_version": 1}))
    tr = read_trace(p)
    assert tr.layout.event_capacity == 0 and tr.events.empty and len(tr.tiles) == 50


def test_event_records_whose_waits_run_backwards_are_refused():
    buf, meta = _event_trace()
    layout = trace_mod.layout_from_meta(meta)
    parts = layout.split(buf)
    parts["events"][0, -1] = 0  # a cumulative wait at the window's end below its start
    with pytest.raises(BadInputError, match="waits run backwards"):
        trace_from_buffer(buf, meta)


def test_an_event_section_that_does_not_match_the_sample_is_refused():
    buf, meta = _event_trace(sample=2)
    layout = trace_mod.layout_from_meta(meta)
    layout.split(buf)["header"][Header.SAMPLE] = 3  # 6 tiles every 3rd: 2 slots per role, not 3
    with pytest.raises(BadInputError, match="event slots"):
        trace_from_buffer(buf, meta)


def test_an_event_record_past_the_launchs_tiles_is_refused():
    from jfa_prof.records import Tile

    buf, meta = _event_trace()
    trace_mod.layout_from_meta(meta).split(buf)["tiles"][:, Tile.VALID] = 0  # a launch of 4 tiles...
    with pytest.raises(BadInputError, match="event tile position 5"):  # ...with records of tiles 4 and 5
        trace_from_buffer(buf, {**meta, "n_work": 4})
