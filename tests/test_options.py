"""Options the commands share, and options that would otherwise be silently ignored: each
refusal is one line on stderr and exit code 2."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from jfa_prof.cli import app
from jfa_prof.commands import heatmap as heatmap_cmd
from jfa_prof.trace import bundled_traces
from tests.resultgen import write_waterfall

runner = CliRunner()


@pytest.fixture
def no_live(monkeypatch):
    monkeypatch.setattr(heatmap_cmd, "_record_live", lambda *a, **k: None)
    monkeypatch.setattr("jfa_prof.report.can_record_live", lambda: False)


def _refused(result, *words):
    assert result.exit_code == 2, result.output
    # report logs its steps first when stderr is no terminal ("reading …"); the error is one line, the last
    lines = [ln for ln in result.stderr.strip().splitlines() if not ln.startswith("reading ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("args, words", [
    (["--lq", "-1"], ["--lq -1", "positive"]),
    (["--max-kv", "0"], ["--max-kv 0", "positive"]),
    (["--sparsity", "7"], ["--sparsity 7", "(0, 1]"]),
    (["--sparsity", "0"], ["--sparsity 0"]),
    (["--seed", "-3"], ["--seed -3"]),
])
@pytest.mark.parametrize("cmd", ["heatmap", "waterfall", "record", "report"])
def test_workload_values_out_of_range_are_refused(tmp_path, no_live, cmd, args, words):
    out = ["-o", str(tmp_path / "x")] if cmd in ("record", "report") else []
    _refused(runner.invoke(app, [cmd, *out, *args]), *words)


def test_a_seed_the_bundled_recordings_were_not_made_with_is_refused(tmp_path, no_live):
    result = runner.invoke(app, ["heatmap", "--seed", "3", "--out", str(tmp_path / "h.html")])
    _refused(result, "seed=3")
    assert not (tmp_path / "h.html").exists()
    _refused(runner.invoke(app, ["report", "-o", str(tmp_path / "r.html"), "--no-doctor", "--seed", "3"]), "seed=3")
    # the seed they were made with is accepted
    result = runner.invoke(app, ["heatmap", "--seed", "0", "--clc", "on", "--out", str(tmp_path / "h.html")])
    assert result.exit_code == 0, result.output


def test_workload_options_next_to_trace_files_are_refused(tmp_path, no_live):
    trace = str(bundled_traces()[0])
    _refused(runner.invoke(app, ["heatmap", "--trace", trace, "--lq", "128", "--out", str(tmp_path / "h.html")]),
             "--lq", "--trace")
    _refused(runner.invoke(app, ["report", "-o", str(tmp_path / "r.html"), "--trace", trace, "--seed", "1"]),
             "--seed", "--trace")


def test_waterfall_pass_must_match_the_recorded_file(tmp_path):
    recorded = write_waterfall(tmp_path / "wf.json")  # a forward waterfall
    _refused(runner.invoke(app, ["waterfall", "--results", str(recorded), "--pass", "bwd",
                                 "--out", str(tmp_path / "w.html")]), "--pass bwd", "fwd pass")
    assert not (tmp_path / "w.html").exists()
    ok = runner.invoke(app, ["waterfall", "--results", str(recorded), "--pass", "fwd", "--out", str(tmp_path / "w.html")])
    assert ok.exit_code == 0, ok.output


def test_timeline_sm_range_past_the_gpus_sms_is_refused(tmp_path):
    result = runner.invoke(app, ["timeline", "--sm-range", "500:600", "--out", str(tmp_path / "t.json")])
    _refused(result, "--sm-range 500:600", "SMs 0 to 131")
    assert not (tmp_path / "t.json").exists()


def test_live_only_options_next_to_results_are_refused(tmp_path):
    recorded = write_waterfall(tmp_path / "wf.json")
    _refused(runner.invoke(app, ["waterfall", "--results", str(recorded), "--save", str(tmp_path / "s.json"),
                                 "--out", str(tmp_path / "w.html")]), "--save", "live run")
    _refused(runner.invoke(app, ["waterfall", "--results", str(recorded), "--cumulative",
                                 "--out", str(tmp_path / "w.html")]), "--cumulative")
    bench = str(Path(__file__).resolve().parents[1] / "benchmarks/results/bench/superseded/fwd_hsp_h200_2026-11-30.json")
    _refused(runner.invoke(app, ["bench", "--results", bench, "--out", str(tmp_path / "b.json")]), "--out",
             "live run")
    assert not (tmp_path / "b.json").exists()


def test_causal_applies_to_jagged_q_workloads_only(tmp_path, no_live):
    from jfa_prof.commands.options import resolve_workload
    from jfa_prof.errors import BadInputError
    from jfa_prof.ncu_live import LiveRun
    from jfa_prof.ncu_target import build_parser

    w = resolve_workload("jagged", None, 2048, 1.0, None, causal=True)
    assert w.causal and w.label == "jagged max=2048 s=1 causal"
    assert not resolve_workload("jagged", None, 2048, 1.0, None).causal
    with pytest.raises(BadInputError, match="broadcasts Q") as info:
        resolve_workload("hsp", 256, 2048, 0.5, None, causal=True)
    assert "--grid jagged or dense" in info.value.hint
    # Refused before any GPU is looked for, by each command that builds a workload.
    _refused(runner.invoke(app, ["waterfall", "--grid", "hsp", "--causal", "--out", str(tmp_path / "w.html")]),
             "broadcasts Q")
    _refused(runner.invoke(app, ["record", "-o", str(tmp_path / "t.jfatrace"), "--grid", "long", "--causal"]),
             "broadcasts Q")
    # ncu's target process gets the mask too.
    args = LiveRun(grid="jagged", max_kv=2048, sparsity=1.0, causal=True).target_args()
    assert "--causal" in args and build_parser().parse_args(args).causal
    assert "--causal" not in LiveRun(grid="jagged").target_args()


def test_causal_has_no_bundled_recording_to_fall_back_on(tmp_path, no_live):
    # No causal backward recording is at hand; the forward's committed one is read instead of a live run.
    _refused(runner.invoke(app, ["diagnose", "--pass", "bwd", "--grid", "jagged", "--causal"]), "causal", "no GPU")
    found = runner.invoke(app, ["diagnose", "--grid", "jagged", "--causal", "--no-spills"])
    assert found.exit_code == 0, found.output
    assert "jagged max=512 s=1 causal" in found.stdout
    # Without --causal that recording is not the workload asked for.
    _refused(runner.invoke(app, ["diagnose", "--grid", "jagged", "--max-kv", "512"]), "causal=False", "no GPU")
    recorded = write_waterfall(tmp_path / "wf.json")
    _refused(runner.invoke(app, ["waterfall", "--results", str(recorded), "--causal", "--out",
                                 str(tmp_path / "w.html")]), "--causal", "--results")


def test_an_ncu_report_of_a_causal_workload_says_so_in_its_name():
    from jfa_prof.commands.ncu import _default_name
    from jfa_prof.commands.options import resolve_workload
    from jfa_prof.ncu_live import LiveRun

    w = resolve_workload("jagged", None, 2048, 1.0, None, causal=True)
    assert str(_default_name(w, LiveRun(grid="jagged", causal=True))) == "ncu_jagged_kv2048_s1_causal_dynamic.ncu-rep"
    plain = resolve_workload("jagged", None, 2048, 1.0, None)
    assert "causal" not in str(_default_name(plain, LiveRun(grid="jagged")))


def test_heatmap_causal_without_a_gpu_has_no_bundled_recording(tmp_path, no_live):
    _refused(runner.invoke(app, ["heatmap", "--grid", "jagged", "--causal", "--out", str(tmp_path / "h.html")]),
             "causal=True")
    _refused(runner.invoke(app, ["heatmap", "--trace", str(bundled_traces()[0]), "--causal",
                                 "--out", str(tmp_path / "h.html")]), "--causal", "--trace")


def test_a_diagnosis_names_the_workload_it_recorded_causal_and_seed_included():
    from jfa_prof.analyses.diagnose import workload_flags

    flags = workload_flags({"grid": "jagged", "Lq": 512, "max_kv": 512, "sparsity": 1.0, "broadcast_q": False,
                            "causal": True, "seed": 0})
    assert flags == "--grid jagged --max-kv 512 --sparsity 1.0 --causal"
    flags = workload_flags({"grid": "long", "Lq": 512, "max_kv": 16384, "sparsity": 0.5, "broadcast_q": True,
                            "causal": False, "seed": 3})
    assert flags == "--grid long --lq 512 --max-kv 16384 --sparsity 0.5 --seed 3"
