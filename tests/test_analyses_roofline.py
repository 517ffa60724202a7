"""The roofline of benchmark points: unavoidable HBM bytes, the two floors, and the share of the
roof a recorded time reached, down to the bench tables."""
from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

from jfa_prof.analyses.roofline import min_hbm_bytes, roofline, roofline_of_record
from jfa_prof.bench import load_results
from jfa_prof.hardware import get
from jfa_prof.render.bench import roofline_table

H200 = get("h200-sxm")
# A broadcast-Q point: 2 sequences of Lq = 100 queries, 4 query heads on 2 KV heads, D = 64, 300 keys.
SHAPE = dict(H=4, H_kv=2, D=64, total_q=200, total_kv=300, broadcast_q=True, Lq=100)


def test_forward_bytes_read_each_input_once_and_write_each_output_once():
    q = 100 * 4 * 64 * 2  # the shared Lq rows, not one copy per sequence
    k = v = 300 * 2 * 64 * 2
    o = 200 * 4 * 64 * 2
    lse = 200 * 4 * 4
    assert min_hbm_bytes("fwd", **SHAPE) == q + k + v + o + lse
    jagged = {**SHAPE, "broadcast_q": False, "Lq": None}
    assert min_hbm_bytes("fwd", **jagged) == 2 * o + k + v + lse  # Q has as many rows as O


def test_backward_bytes_add_do_in_and_the_three_gradients_out():
    fwd = min_hbm_bytes("fwd", **SHAPE)
    q, kv, o = 100 * 4 * 64 * 2, 300 * 2 * 64 * 2, 200 * 4 * 64 * 2
    assert min_hbm_bytes("bwd", **SHAPE) == fwd + o + q + 2 * kv  # + dO in; + dQ, dK, dV out


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="pass must be"):
        min_hbm_bytes("both", **SHAPE)
    with pytest.raises(ValueError, match="needs Lq"):
        min_hbm_bytes("fwd", **{**SHAPE, "Lq": None})


def test_floors_and_fractions_on_the_h200():
    flops = 2e12
    r = roofline("fwd", flops, H200, **SHAPE)
    assert r.compute_ms == pytest.approx(flops / (132 * 4096 * 1.83e9) * 1e3)
    assert r.memory_ms == pytest.approx(min_hbm_bytes("fwd", **SHAPE) / 4.8e12 * 1e3)
    assert r.bound == "compute" and r.floor_ms == r.compute_ms
    assert r.fraction(2 * r.floor_ms) == pytest.approx(0.5)
    assert math.isnan(r.fraction(None)) and math.isnan(r.fraction(0.0))
    # 1.15x faster than a peer at 80% of the roof would need 92%.
    assert r.needed_fraction(r.floor_ms / 0.8, 1.15) == pytest.approx(0.92)
    few = roofline("fwd", 1.0, H200, **SHAPE)
    assert few.bound == "memory" and few.floor_ms == few.memory_ms
    assert json.loads(json.dumps(few.to_dict()))["bound"] == "memory"


def test_record_without_the_shape_has_no_roofline():
    record = {"pass": "fwd", "flops": 1e9, "workload": {**SHAPE, "dtype": "bf16"}}
    assert roofline_of_record(record, H200) == roofline("fwd", 1e9, H200, **SHAPE)
    assert roofline_of_record({**record, "flops": None}, H200) is None
    assert roofline_of_record({**record, "workload": {**SHAPE, "total_kv": None}}, H200) is None


def _write(tmp_path, gpu):
    record = {"pass": "fwd", "flops": 4e12, "workload": {**SHAPE, "label": "p", "grid": "hsp", "dtype": "bf16"},
              "impls": {"jfa-lpt": {"ms": 10.0, "ms_repeat": 10.0}, "fa4": {"ms": 8.0}}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"meta": {"gpu": gpu, "date": "2026-11-30"}, "results": [record]}))
    return load_results(path)


def test_bench_frame_and_tables_show_the_share_of_the_roof(tmp_path):
    res = _write(tmp_path, "NVIDIA H200")
    frame = res.frame().set_index("impl")
    floor = 4e12 / (132 * 4096 * 1.83e9) * 1e3
    assert frame.loc["jfa-lpt", "bound"] == "compute"
    assert frame.loc["jfa-lpt", "roof"] == pytest.approx(floor / 10.0)
    assert frame.loc["fa4", "roof"] == pytest.approx(floor / 8.0)
    out = io.StringIO()
    roofline_table(res.frame(), Console(file=out, width=80), title="t")
    row = next(line.split() for line in out.getvalue().splitlines() if line.split()[:1] == ["p"])
    nbytes = min_hbm_bytes("fwd", **SHAPE)
    assert frame.loc["fa4", "hbm_tb_s"] == pytest.approx(nbytes / 8.0 / 1e9)
    assert row == ["p", "compute", f"{floor:.3f}", f"{floor / 10.0:.0%}", f"{floor / 8.0:.0%}",
                   f"{nbytes / 10.0 / 1e9:.2f}", f"{nbytes / 8.0 / 1e9:.2f}"]
    assert "roof: the point's floor" in out.getvalue()


def test_unknown_gpu_leaves_the_roof_empty(tmp_path):
    frame = _write(tmp_path, "Some Future GPU").frame()
    assert frame["roof"].isna().all() and frame["bound"].isna().all()
    out = io.StringIO()
    roofline_table(frame, Console(file=out, width=80))
    assert out.getvalue() == ""
