"""Two bench result files side by side (`analyses.runs`, `jfa-prof bench --against`): the op as
called before and after at each point both hold, and the reasons the runs may not compare."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jfa_prof.analyses.runs import compare_runs
from jfa_prof.bench import load_results
from jfa_prof.cli import app

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks/results/bench"
# Two H100 runs of the forward on one day, the second on a host whose matrix product ran 8.5% slower.
BEFORE = RESULTS / "superseded/bench_fwd_hsp_h100_2026-12-06b.json"
AFTER = RESULTS / "bench_fwd_hsp_h100_2026-12-06c.json"
runner = CliRunner()


def _rewritten(tmp_path, src, name, edit):
    doc = json.loads(src.read_text())
    edit(doc)
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def test_every_point_of_two_runs_with_the_op_as_called_before_and_after():
    change = compare_runs(load_results(AFTER), load_results(BEFORE))
    assert len(change.points) == 18 and not change.only_before and not change.only_after
    assert change.ours_before == change.ours_after == "jfa-dynamic"
    p = next(p for p in change.points if p.label == "hsp Lq=256 max=4096 s=0.5")
    assert p.bound == "compute" and p.ms_before == pytest.approx(2.057, abs=1e-3)
    assert p.ms_after == pytest.approx(2.137, abs=1e-3) and p.time_change == pytest.approx(0.039, abs=1e-3)
    assert p.fa4_before == pytest.approx(1.077, abs=1e-3) and p.fa4_after == pytest.approx(0.981, abs=1e-3)
    assert (p.ahead_after, p.rounds_after) == (1, 3)
    assert change.at_least_fa4("before") == 13 and change.at_least_fa4("after") == 12
    assert change.geomean_fa4("after") == pytest.approx(1.041, abs=1e-3)


def test_a_matrix_product_that_moved_between_runs_is_named():
    change = compare_runs(load_results(AFTER), load_results(BEFORE))
    assert len(change.caveats) == 1
    assert change.caveats[0].startswith("matrix product 774 -> 708 TFLOPS (-8.5%)")
    assert "compute-bound" in change.caveats[0]


def test_a_run_against_itself_changes_nothing_and_has_no_caveat():
    res = load_results(AFTER)
    change = compare_runs(res, res)
    assert all(p.time_change == 0 for p in change.points) and change.caveats == []
    assert change.geomean_fa4("before") == change.geomean_fa4("after")


def test_another_gpu_and_missing_ceilings_are_named(tmp_path):
    def other(doc):
        for m in [doc["meta"]] + [r["meta"] for r in doc["results"]]:
            m["gpu"] = "NVIDIA H200"
            m.pop("stream_read", None)
    change = compare_runs(load_results(_rewritten(tmp_path, AFTER, "h200.json", other)), load_results(BEFORE))
    assert change.caveats[0] == "other GPUs: NVIDIA H100 80GB HBM3 -> NVIDIA H200; every figure moved with the GPU"
    assert any(c.startswith("streaming read: not recorded in the later file") for c in change.caveats)


def test_points_in_one_run_only_are_listed_not_compared(tmp_path):
    def drop_first(doc):
        doc["results"] = doc["results"][1:]
    change = compare_runs(load_results(_rewritten(tmp_path, AFTER, "17.json", drop_first)), load_results(BEFORE))
    assert len(change.points) == 17 and change.only_before == ["hsp Lq=128 max=1024 s=0.1"]
    # A point missing from one run is left out of both geomeans' points, not counted as a loss.
    assert change.geomean_fa4("before") is not None


def test_bench_against_prints_the_table_and_the_caveat():
    r = runner.invoke(app, ["bench", "--results", str(AFTER), "--against", str(BEFORE), "--no-detail"],
                      env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    start = next(i for i, line in enumerate(lines) if "the op as called against bench_fwd_hsp_h100_2026-12-06b" in line)
    row = next(line for line in lines[start:] if line.strip().startswith("hsp Lq=256 max=4096 s=0.5"))
    assert row.split()[4:] == ["compute", "2.057", "2.137", "+3.9%", "1.08", "0.98", "1/3"]
    assert "geomean 1.04 -> 1.04; at least FA4's speed at 13 -> 12 of 18 points" in r.output
    assert "not comparable as it stands: matrix product 774 -> 708 TFLOPS" in r.output


def test_bench_against_json():
    r = runner.invoke(app, ["bench", "--results", str(AFTER), "--against", str(BEFORE), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["against"]
    assert len(d["points"]) == 18 and d["at_least_fa4_after"] == 12 and len(d["caveats"]) == 1
    p = next(p for p in d["points"] if p["label"] == "hsp Lq=256 max=4096 s=0.5")
    assert p["time_change"] == pytest.approx(0.039, abs=1e-3)


def test_bench_against_a_file_of_the_other_pass_is_a_clear_error():
    bwd = RESULTS / "bench_bwd_hsp_h100_2026-12-05b.json"
    r = runner.invoke(app, ["bench", "--results", str(AFTER), "--against", str(bwd)])
    assert r.exit_code == 2 and "holds no fwd results" in r.output


def test_bench_against_a_file_of_another_grid_is_a_clear_error():
    dense = RESULTS / "bench_fwd_dense_h100_2026-12-06c.json"
    r = runner.invoke(app, ["bench", "--results", str(AFTER), "--against", str(dense)])
    assert r.exit_code == 2 and "holds none of these fwd points" in r.output


def test_a_live_run_checks_the_earlier_file_before_it_needs_a_gpu(no_gpu):
    bwd = RESULTS / "bench_bwd_hsp_h100_2026-12-05b.json"
    r = runner.invoke(app, ["bench", "--against", str(bwd)])
    assert r.exit_code == 2 and "holds no fwd results" in r.output
