"""`jfa-prof ncu` on the committed H200 reports (tests/data/ncu, ncu 2025.3.1, `_jfa_fwd` on
hsp Lq=128 max=1024 s=0.5, lpt and dynamic schedules), and its live path with a stand-in ncu."""
import json
import os
import re
import stat
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from jfa_prof import ncu_live, ncu_metrics, ncu_target
from jfa_prof.analyses import ncu as analysis
from jfa_prof.cli import app
from jfa_prof.errors import BadInputError, JfaProfError, ToolMissingError
from jfa_prof.render import ncu as render

runner = CliRunner()
DATA = Path(__file__).parent / "data" / "ncu"
LPT = DATA / "fwd_lpt.ncu-rep"
DYNAMIC = DATA / "fwd_dynamic.ncu-rep"


@pytest.fixture(scope="module")
def lpt():
    return analysis.read_report(LPT)


@pytest.fixture(scope="module")
def dynamic():
    return analysis.read_report(DYNAMIC)


def _console():
    return Console(file=StringIO(), width=120, highlight=False, color_system=None)


def _lines(text: str) -> list[str]:
    """Output lines with runs of spaces collapsed, so assertions do not depend on column widths."""
    return [re.sub(r"\s+", " ", line).strip() for line in text.splitlines() if line.strip()]


# ---- the metric table ----------------------------------------------------------------------------

def test_every_hopper_name_is_in_both_reports():
    import ncu_report

    for path in (LPT, DYNAMIC):
        action = ncu_report.load_report(str(path)).range_by_idx(0).action_by_idx(0)
        present = set(action.metric_names())
        absent = [name for _, name in ncu_metrics.metrics_for("sm_90") if name not in present]
        assert absent == [], path.name
        assert all(name in present for name in ncu_metrics.DEVICE_ATTRIBUTES.values())


def test_metric_list_for_hopper():
    names = ncu_metrics.metric_list("sm_90").split(",")
    assert len(names) == len(set(names))
    assert "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active" in names
    assert {"l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",
            "launch__registers_per_thread", "gpu__time_duration.sum", "sm__cycles_active.max",
            "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio"} <= set(names)
    # The metric list of the committed reports' run (benchmarks/gpu_round.sh) is covered.
    assert "sm__inst_executed_pipe_tensor.sum" in names
    without = ncu_metrics.metric_list("sm_90a", stalls=False).split(",")
    assert not any(ncu_metrics.stall_reason_of(n) for n in without)
    assert set(without) < set(names)


def test_blackwell_names_are_separate_and_marked_unverified():
    assert ncu_metrics.ARCHS["sm_90"].verified
    assert not ncu_metrics.ARCHS["sm_100"].verified
    tensor = ncu_metrics.metric("tensor_pipe")
    assert tensor.name_for("sm_100") == "sm__pipe_tc_cycles_active.avg.pct_of_peak_sustained_active"
    assert tensor.name_for("sm_90") != tensor.name_for("sm_100")
    assert ncu_metrics.metric("tmem_pipe").name_for("sm_90") is None  # no TMEM on Hopper
    blackwell = ncu_metrics.metric_list("blackwell")
    assert "sm__pipe_tmem_cycles_active" in blackwell and "_gmma_" not in blackwell


@pytest.mark.parametrize("text, arch", [("sm_90", "sm_90"), ("sm_90a", "sm_90"), ("9.0", "sm_90"),
                                        ("90", "sm_90"), ("Hopper", "sm_90"), ("sm_100a", "sm_100"),
                                        ("10.0", "sm_100")])
def test_normalize_arch(text, arch):
    assert ncu_metrics.normalize_arch(text) == arch


def test_unknown_arch_is_bad_input_and_gets_only_portable_names():
    with pytest.raises(BadInputError, match="sm_120"):
        ncu_metrics.metric_list("sm_120")
    shorts = {m.short for m, _ in ncu_metrics.metrics_for("sm_120")}
    assert "duration" in shorts and "registers" in shorts
    assert "tensor_pipe" not in shorts and "stall_gmma" not in shorts


def test_stall_names_round_trip():
    name = ncu_metrics.stall_metric("long_scoreboard")
    assert name == "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
    assert ncu_metrics.stall_reason_of(name) == "long_scoreboard"
    assert ncu_metrics.stall_reason_of("sm__cycles_active.avg") is None


# ---- reading the reports -------------------------------------------------------------------------

def test_lpt_report_values(lpt):
    assert lpt.path == str(LPT) and len(lpt.kernels) == 1
    k = lpt.kernel()
    assert k.name == "_jfa_fwd"
    assert (k.arch, k.device, k.sm_count) == ("sm_90", "NVIDIA H200", 132)
    assert k.arch_verified and k.missing == ()
    m = k.metrics
    assert m["registers"] == 168
    assert m["duration"] == 399648.0
    assert m["tensor_pipe"] == pytest.approx(45.27, abs=0.01)
    assert m["dram_throughput"] == pytest.approx(67.88, abs=0.01)
    assert m["sm_busy"] == pytest.approx(41.11, abs=0.01)
    assert m["local_load_bytes"] == 202752 and m["local_store_bytes"] == 202752
    assert (m["grid_size"], m["block_size"], m["threads"]) == (132, 384, 50688)
    assert (m["sm_cycles_min"], m["sm_cycles_max"]) == (591576, 684369)
    # 202752 B over 50688 threads: each thread stores and reloads one 4-byte word.
    assert m["local_load_per_thread"] == 4.0 and m["local_store_per_thread"] == 4.0
    assert m["sm_imbalance"] == pytest.approx(684369 / 623391.106, rel=1e-6)
    assert "tmem_pipe" not in m  # a Blackwell-only metric does not exist on sm_90, it is not "missing"


def test_dynamic_report_values(dynamic):
    k = dynamic.kernel()
    m = k.metrics
    assert k.name == "_jfa_fwd" and m["registers"] == 168
    assert m["tensor_pipe"] == pytest.approx(43.55, abs=0.01)
    assert m["dram_throughput"] == pytest.approx(70.64, abs=0.01)
    assert m["local_load_bytes"] == 0 and m["local_store_bytes"] == 0
    assert m["duration"] == 382848.0
    assert m["sm_imbalance"] == pytest.approx(1.0112, abs=1e-4)


def test_stalls_sorted_and_broken_down(lpt):
    k = lpt.kernel()
    values = list(k.stalls.values())
    assert values == sorted(values, reverse=True)
    assert list(k.stalls)[:3] == ["long_scoreboard", "barrier", "wait"]
    assert k.stalls["gmma"] == pytest.approx(0.0962, abs=1e-4)
    assert [r for r, _ in k.top_stalls][:3] == ["long_scoreboard", "barrier", "wait"]
    assert "selected" not in dict(k.top_stalls)

    df = analysis.stall_breakdown(k)
    assert list(df.columns) == ["reason", "cycles", "share", "stall"]
    assert len(df) == 19 and df["cycles"].is_monotonic_decreasing
    top = df.iloc[0]
    assert top["reason"] == "long_scoreboard"
    # share of ncu's warp cycles per issued instruction (8.61)
    assert top["share"] == pytest.approx(3.0051 / 8.6118, abs=1e-3)
    assert not df.loc[df["reason"] == "selected", "stall"].item()
    assert df["share"].sum() == pytest.approx(df["cycles"].sum() / k.metrics["warp_cycles_per_issue"])


def test_compare_deltas(lpt, dynamic):
    cmp = analysis.compare(lpt, dynamic)
    assert cmp.label_a == "fwd_lpt.ncu-rep: _jfa_fwd" and cmp.same_arch
    d = cmp.delta("duration")
    assert d.delta == -16800.0 and d.relative == pytest.approx(-0.04204, abs=1e-5) and d.improved
    loads = cmp.delta("local_load_bytes")
    assert (loads.a, loads.b, loads.delta, loads.improved) == (202752, 0, -202752, True)
    assert cmp.delta("registers").delta == 0 and cmp.delta("registers").improved is None
    assert cmp.delta("tensor_inst").delta == 0  # the same work on both schedules
    assert cmp.delta("tensor_pipe").improved is False
    assert cmp.delta("dram_throughput").improved is None  # neither good nor bad by itself
    assert cmp.delta("sm_imbalance").delta == pytest.approx(1.01122 - 1.09782, abs=1e-4)
    barrier = cmp.delta("stall_barrier")
    assert barrier.delta == pytest.approx(2.1954 - 1.9174, abs=1e-3) and barrier.improved is False
    firsts = [d.metric for d in cmp.stall_deltas[:2]]
    assert firsts == ["stall_long_scoreboard", "stall_barrier"]


def test_kernel_selection(lpt):
    assert lpt.kernel("jfa_fwd").name == "_jfa_fwd"
    with pytest.raises(BadInputError, match="no kernel matches 'bwd'"):
        lpt.kernel("bwd")
    with pytest.raises(BadInputError, match="bad kernel pattern"):
        lpt.kernel("(")


class _Metric:
    ValueKind_STRING = 2

    def __init__(self, value):
        self._v = value

    def kind(self):
        return self.ValueKind_STRING if isinstance(self._v, str) else 4

    def as_double(self):
        return float(self._v)

    def as_string(self):
        return str(self._v)


class _Action:
    def __init__(self, values):
        self._values = values

    def name(self):
        return "_jfa_fwd"

    def metric_names(self):
        return list(self._values)

    def metric_by_name(self, name):
        return _Metric(self._values[name]) if name in self._values else None


def test_missing_metrics_are_reported_not_guessed():
    attrs = ncu_metrics.DEVICE_ATTRIBUTES
    values = {attrs["cc_major"]: 9, attrs["cc_minor"]: 0, attrs["name"]: "NVIDIA H200", attrs["sm_count"]: 132,
              "gpu__time_duration.sum": 1000.0, "sm__cycles_active.avg": 10.0,
              ncu_metrics.stall_metric("barrier"): 2.0,
              # a warp state newer than the table: measured, so kept
              ncu_metrics.stall_metric("future_reason"): 0.5}
    k = analysis._read_action(_Action(values), source="x.ncu-rep", range_index=0, action_index=0)
    assert k.metrics["duration"] == 1000.0
    assert k.metrics["tensor_pipe"] is None and "tensor_pipe" in k.missing
    assert k.metrics["sm_imbalance"] is None  # sm_cycles_max missing: no derived value either
    assert "stall_wait" in k.missing and "sm_imbalance" not in k.missing
    assert k.stalls == {"barrier": 2.0, "future_reason": 0.5}
    out = _console()
    render.render_kernel(k, console=out)
    text = out.file.getvalue()
    assert "not in the report: sm_busy, tensor_pipe" in " ".join(_lines(text))
    assert "stall reasons (collect with --section WarpStateStats)" in text


def test_unknown_arch_reads_only_portable_metrics():
    attrs = ncu_metrics.DEVICE_ATTRIBUTES
    values = {attrs["cc_major"]: 12, attrs["cc_minor"]: 0, "gpu__time_duration.sum": 5.0,
              "sm__pipe_tensor_op_hmma_type_hmma_hgmma_qgmma_cycles_active.avg.pct_of_peak_sustained_active": 50.0}
    k = analysis._read_action(_Action(values), source="x.ncu-rep", range_index=0, action_index=0)
    assert k.arch == "sm_120" and not k.arch_known and not k.arch_verified
    assert k.metrics["duration"] == 5.0
    assert "tensor_pipe" not in k.metrics  # the Hopper name on another chip would be a guess


# ---- bad input -----------------------------------------------------------------------------------

def test_corrupt_missing_and_foreign_files(tmp_path):
    garbage = tmp_path / "garbage.ncu-rep"
    garbage.write_bytes(bytes(range(256)) * 8)
    with pytest.raises(BadInputError, match="not an Nsight Compute report"):
        analysis.read_report(garbage)
    with pytest.raises(BadInputError, match="no such report"):
        analysis.read_report(tmp_path / "absent.ncu-rep")
    with pytest.raises(BadInputError, match="not a file"):
        analysis.read_report(tmp_path)
    # The right header but cut short: ncu_report opens it and finds no kernel.
    truncated = tmp_path / "truncated.ncu-rep"
    truncated.write_bytes(LPT.read_bytes()[:20000])
    with pytest.raises(BadInputError, match="holds no profiled kernel"):
        analysis.read_report(truncated)


def test_random_bytes_mid_file_are_corrupt_not_a_nameless_kernel(tmp_path):
    import numpy as np

    data = bytearray(LPT.read_bytes())
    at = int(len(data) * 0.93)
    data[at:at + 4096] = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    damaged = tmp_path / "damaged.ncu-rep"
    damaged.write_bytes(bytes(data))
    with pytest.raises(BadInputError, match="is corrupt: profiled kernel 0") as info:
        analysis.read_report(damaged)
    assert info.value.exit_code == 2
    result = runner.invoke(app, ["ncu", "--report", str(damaged)])
    assert result.exit_code == 2 and result.stderr.strip().count("\n") == 0, result.output


def test_ncu_report_module_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "ncu_report", None)  # import now raises ImportError
    with pytest.raises(ToolMissingError, match="ncu_report") as info:
        analysis.read_report(LPT)
    assert info.value.exit_code == 4 and info.value.hint == "pip install ncu-report"


# ---- rendering -----------------------------------------------------------------------------------

def test_render_report(lpt):
    out = _console()
    render.render_report(lpt, console=out, top=3)
    lines = _lines(out.file.getvalue())
    assert lines[0] == "_jfa_fwd fwd_lpt.ncu-rep NVIDIA H200, sm_90, 132 SMs"
    assert lines[1] == "metric value unit"
    for expected in ("duration 399.6 µs", "tensor pipe active 45.3 %", "DRAM throughput 67.9 %",
                     "local loads 202,752 B", "local stores 202,752 B", "local loads/thread 4.0 B/thread",
                     "registers 168 reg/thread", "SM cycles max 684,369 cycles",
                     "SM imbalance 1.098 max/avg", "grid 132 CTAs",
                     "top stall reasons: warp cycles per issued instruction 8.61, 1.00 of them issuing",
                     "reason cycles share", "long scoreboard 3.01 34.9%", "barrier 1.92 22.3%", "wait 1.22 14.2%"):
        assert expected in lines, expected
    assert not any(line.startswith("no instruction") for line in lines)  # --top 3
    assert lines[-1].startswith("local memory at run time: 4.0 B loaded and 4.0 B stored per thread")


def test_render_report_without_local_memory(dynamic):
    out = _console()
    render.render_report(dynamic, console=out)
    text = out.file.getvalue()
    assert "local loads 0 B" in _lines(text)
    assert "local memory at run time" not in text
    assert "no instruction 0.71 7.8%" in _lines(text)


def test_render_comparison(lpt, dynamic):
    out = _console()
    render.render_comparison(analysis.compare(lpt, dynamic), console=out, top=2)
    lines = _lines(out.file.getvalue())
    assert lines[0] == "A fwd_lpt.ncu-rep: _jfa_fwd NVIDIA H200 sm_90"
    assert lines[1] == "B fwd_dynamic.ncu-rep: _jfa_fwd NVIDIA H200 sm_90"
    assert lines[2] == "metric unit A B B - A change"
    for expected in ("duration µs 399.6 382.8 -16.8 -4.2%",
                     "local loads B 202,752 0 -202,752 -100.0%",
                     "registers reg/thread 168 168 0 0%",
                     "SM imbalance max/avg 1.098 1.011 -0.087 -7.9%",
                     "long scoreboard 3.01 2.87 -0.14", "barrier 1.92 2.20 +0.28"):
        assert expected in lines, expected
    assert not any(line.startswith("wait ") for line in lines)  # --top 2
    assert lines[-1] == "B is 4.2% faster (399.6 -> 382.8 µs)"


def test_json(lpt, dynamic):
    data = json.loads(render.to_json(render.report_to_dict(lpt)))
    (k,) = data["kernels"]
    assert (k["name"], k["arch"], k["device"], k["arch_verified"]) == ("_jfa_fwd", "sm_90", "NVIDIA H200", True)
    assert k["metrics"]["registers"] == {"value": 168.0, "unit": "reg/thread", "label": "registers",
                                         "ncu": "launch__registers_per_thread"}
    assert k["metrics"]["local_load_bytes"]["value"] == 202752.0
    assert k["metrics"]["sm_imbalance"]["ncu"] is None
    assert k["stalls"][0]["reason"] == "long_scoreboard" and k["missing"] == []

    cmp = json.loads(render.to_json(render.comparison_to_dict(analysis.compare(lpt, dynamic))))
    assert cmp["a"]["report"] == str(LPT) and cmp["b"]["report"] == str(DYNAMIC)
    rows = {r["metric"]: r for r in cmp["metrics"]}
    assert rows["duration"]["delta"] == -16800.0 and rows["duration"]["improved"] is True
    assert rows["local_store_bytes"]["b"] == 0.0
    assert cmp["stalls"][0]["metric"] == "stall_long_scoreboard"


# ---- the command, reading reports ----------------------------------------------------------------

def test_cli_report():
    result = runner.invoke(app, ["ncu", "--report", str(LPT)])
    assert result.exit_code == 0, result.output
    lines = _lines(result.stdout)
    assert "tensor pipe active 45.3 %" in lines and "registers 168 reg/thread" in lines


def test_cli_report_json():
    result = runner.invoke(app, ["ncu", "--report", str(DYNAMIC), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kernels"][0]["metrics"]["dram_throughput"]["value"] == pytest.approx(70.64, abs=0.01)


def test_cli_compare():
    result = runner.invoke(app, ["ncu", "--report", str(LPT), "--compare", str(DYNAMIC)])
    assert result.exit_code == 0, result.output
    assert "duration µs 399.6 382.8 -16.8 -4.2%" in _lines(result.stdout)
    result = runner.invoke(app, ["ncu", "--report", str(LPT), "--compare", str(DYNAMIC), "--json"])
    rows = {r["metric"]: r for r in json.loads(result.stdout)["metrics"]}
    assert rows["local_load_bytes"]["delta"] == -202752.0


def test_cli_kernel_filter():
    result = runner.invoke(app, ["ncu", "--report", str(LPT), "--kernel", "_jfa_fwd", "--json"])
    assert result.exit_code == 0 and len(json.loads(result.stdout)["kernels"]) == 1
    result = runner.invoke(app, ["ncu", "--report", str(LPT), "--kernel", "_jfa_bwd"])
    assert result.exit_code == 2
    assert "no kernel matches '_jfa_bwd'" in result.stderr and "kernels: _jfa_fwd" in result.stderr


def test_cli_corrupt_report(tmp_path):
    bad = tmp_path / "bad.ncu-rep"
    bad.write_bytes(os.urandom(4096).replace(b"NVR", b"XXX"))
    result = runner.invoke(app, ["ncu", "--report", str(bad)])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {bad} is not an Nsight Compute report (.ncu-rep)")
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["ncu", "--report", str(LPT), "--compare", str(bad)])
    assert result.exit_code == 2


def test_cli_live_options_with_a_report():
    result = runner.invoke(app, ["ncu", "--report", str(LPT), "--schedule", "lpt", "--vs-no-peel"])
    assert result.exit_code == 2
    assert "--schedule, --vs-peel/--vs-no-peel apply only to a live run" in result.stderr


# ---- the live path -------------------------------------------------------------------------------

def test_live_without_ncu_exits_4(monkeypatch):
    monkeypatch.setattr(ncu_live, "find_ncu", lambda: None)
    result = runner.invoke(app, ["ncu", "--schedule", "lpt", "--lq", "128", "--max-kv", "1024"])
    assert result.exit_code == 4
    assert result.stderr.startswith("error: ncu (Nsight Compute) not found")


def test_find_ncu_uses_the_doctor_search(tmp_path, monkeypatch):
    from jfa_prof import doctor

    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(doctor, "NCU_CANDIDATES", (str(tmp_path / "nsight-compute" / "*" / "ncu"),))
    assert ncu_live.find_ncu() is None
    with pytest.raises(ToolMissingError, match="not found"):
        ncu_live.require_ncu()
    fake = tmp_path / "nsight-compute" / "2025.3.1" / "ncu"
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert ncu_live.find_ncu() == str(fake)


def test_ncu_command_line():
    run = ncu_live.LiveRun(schedule="lpt", grid="hsp", lq=128, max_kv=1024, sparsity=0.5)
    target = ncu_live.target_argv(run, python="/usr/bin/python3")
    assert target == ["/usr/bin/python3", "-m", "jfa_prof.ncu_target", "--pass", "fwd", "--schedule", "lpt",
                      "--grid", "hsp", "--lq", "128", "--max-kv", "1024", "--sparsity", "0.5", "--launches", "3"]
    argv = ncu_live.ncu_argv("/opt/ncu", "out/fwd_lpt.ncu-rep", target)
    assert argv == ["/opt/ncu", "--clock-control", "none", "-k", "regex:^_jfa_fwd$", "-s", "2", "-c", "1",
                    "--metrics", ncu_metrics.metric_list("sm_90"), "--section", "WarpStateStats",
                    "-o", "out/fwd_lpt", "-f", *target]
    # -o without the suffix means the same file
    assert ncu_live.ncu_argv("/opt/ncu", "out/fwd_lpt", target) == argv
    nopeel = ncu_live.LiveRun(schedule="dynamic", peel=False, seed=3)
    assert nopeel.tag == "dynamic-nopeel"
    assert nopeel.target_args() == ["--pass", "fwd", "--schedule", "dynamic", "--grid", "hsp", "--seed", "3",
                                    "--no-peel"]
    # The backward: its own kernel only (not the delta or dQ kernels), its reduction in the tag.
    bwd = ncu_live.LiveRun(schedule="static", pass_="bwd", dq="tma1")
    assert bwd.tag == "bwd-static-tma1" and bwd.target_args()[:6] == ["--pass", "bwd", "--schedule", "static",
                                                                      "--grid", "hsp"]
    assert "regex:^_jfa_bwd$" in ncu_live.ncu_argv("/opt/ncu", "b", ncu_live.target_argv(bwd), pass_="bwd")
    # An instrumented build: its level in the tag and passed on; level 0 adds nothing.
    prof = ncu_live.LiveRun(schedule="static", profile=1)
    assert prof.tag == "static-prof1" and prof.target_args()[-2:] == ["--profile", "1"]
    assert "--profile" not in ncu_live.LiveRun(schedule="static").target_args()


def test_target_parses_what_the_command_line_passes():
    run = ncu_live.LiveRun(schedule="static", peel=False, lq=256, max_kv=2048, sparsity=0.1, seed=7)
    args = ncu_target.build_parser().parse_args(ncu_live.target_argv(run)[3:])
    assert (args.schedule, args.grid, args.lq, args.max_kv, args.sparsity, args.seed, args.no_peel, args.profile) == (
        "static", "hsp", 256, 2048, 0.1, 7, True, 0)
    prof = ncu_live.LiveRun(pass_="bwd", schedule="dynamic", dq="tma", profile=2)
    assert ncu_target.build_parser().parse_args(ncu_live.target_argv(prof)[3:]).profile == 2
    # ncu skips the warm-up launches and profiles the next: the target launches exactly that many.
    assert args.launches == ncu_target.WARMUP_LAUNCHES + ncu_target.PROFILED_LAUNCHES


@pytest.mark.parametrize("argv, message", [
    (["--schedule", "nope"], "unknown fwd schedule 'nope'"),
    (["--pass", "bwd", "--schedule", "lpt"], "unknown bwd schedule 'lpt'"),
    (["--dq", "tma"], "--dq applies to the backward only"),
    (["--pass", "bwd", "--dq", "fast"], "unknown dQ reduction 'fast'"),
    (["--profile", "3"], "unknown instrumentation level 3"),
])
def test_target_rejects_bad_input_before_touching_a_gpu(capsys, argv, message):
    assert ncu_target.main(argv) == 2
    assert message in capsys.readouterr().err


def _completed(stdout, code=0):
    return lambda argv, **kw: subprocess.CompletedProcess(argv, code, stdout=stdout)


def test_run_ncu_permission_error(tmp_path):
    out = "==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not have permission " \
          "to access NVIDIA GPU Performance Counters on the target device 0.\n"
    with pytest.raises(ToolMissingError, match="ERR_NVGPUCTRPERM") as info:
        ncu_live.run_ncu(["ncu"], tmp_path / "r", runner=_completed(out, code=0))
    assert "NVreg_RestrictProfilingToAdminUsers=0" in info.value.hint


def test_run_ncu_failure_shows_the_tail(tmp_path):
    out = "\n".join(f"line {i}" for i in range(40)) + "\nRuntimeError: CUDA error: out of memory\n"
    with pytest.raises(JfaProfError, match="ncu exited 1") as info:
        ncu_live.run_ncu(["ncu"], tmp_path / "r", runner=_completed(out, code=1))
    assert info.value.exit_code == 1
    assert info.value.message.endswith("  RuntimeError: CUDA error: out of memory")
    assert "line 25" not in info.value.message and "line 39" in info.value.message


def test_run_ncu_without_a_report(tmp_path):
    stale = tmp_path / "r.ncu-rep"
    stale.write_bytes(b"old")  # an older report must not pass for this run's
    with pytest.raises(JfaProfError, match="ncu wrote no report"):
        ncu_live.run_ncu(["ncu"], tmp_path / "r", runner=_completed("==WARNING== No kernels were profiled."))


def test_run_ncu_that_does_not_start(tmp_path):
    with pytest.raises(ToolMissingError, match="cannot run"):
        ncu_live.run_ncu([str(tmp_path / "no-such-ncu")], tmp_path / "r")


_FAKE_NCU = '''#!{python}
"""Stands in for ncu: writes the committed report of the profiled schedule where -o says."""
import json, shutil, sys
argv = sys.argv[1:]
with open({log!r}, "a") as fh:
    fh.write(json.dumps(argv) + "\\n")
stem = argv[argv.index("-o") + 1]
schedule = argv[argv.index("--schedule") + 1]
shutil.copyfile({data!r} + "/fwd_" + schedule + ".ncu-rep", stem + ".ncu-rep")
print("==PROF== Report: " + stem + ".ncu-rep")
'''


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    log = tmp_path / "ncu_calls.jsonl"
    script = tmp_path / "bin" / "ncu"
    script.parent.mkdir()
    script.write_text(_FAKE_NCU.format(python=sys.executable, log=str(log), data=str(DATA)))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(ncu_live, "find_ncu", lambda: str(script))
    monkeypatch.setattr(ncu_live, "require_gpu_driver", lambda: None)
    monkeypatch.chdir(tmp_path)
    return lambda: [json.loads(line) for line in log.read_text().splitlines()]


def test_live_run_with_a_stand_in_ncu(fake_ncu, tmp_path):
    result = runner.invoke(app, ["ncu", "--schedule", "lpt", "--grid", "hsp", "--lq", "128", "--max-kv", "1024",
                                 "--sparsity", "0.5", "--json"])
    assert result.exit_code == 0, result.output
    (call,) = fake_ncu()
    assert call[:call.index("--metrics")] == ["--clock-control", "none", "-k", "regex:^_jfa_fwd$", "-s", "2", "-c", "1"]
    assert call[call.index("-o") + 1] == "ncu_hsp_lq128_kv1024_s0.5_lpt"
    assert call[call.index("-m") + 1:] == ["jfa_prof.ncu_target", "--pass", "fwd", "--schedule", "lpt", "--grid",
                                           "hsp", "--lq", "128", "--max-kv", "1024", "--sparsity", "0.5",
                                           "--launches", "3"]
    data = json.loads(result.stdout)
    assert data["kernels"][0]["metrics"]["local_load_bytes"]["value"] == 202752.0
    (run,) = data["runs"]
    assert run["report"] == "ncu_hsp_lq128_kv1024_s0.5_lpt.ncu-rep" and run["workload"] == "hsp Lq=128 max=1024 s=0.5"
    assert (tmp_path / run["report"]).is_file()


def test_live_compare_schedules(fake_ncu, tmp_path):
    result = runner.invoke(app, ["ncu", "--schedule", "lpt", "--vs-schedule", "dynamic", "--lq", "128",
                                 "--max-kv", "1024", "--sparsity", "0.5", "-o", str(tmp_path / "fwd")])
    assert result.exit_code == 0, result.output
    calls = fake_ncu()
    assert [c[c.index("-o") + 1] for c in calls] == [str(tmp_path / "fwd"), str(tmp_path / "fwd.vs-dynamic")]
    lines = _lines(result.stdout)
    assert lines[0].startswith("A lpt: hsp Lq=128 max=1024 s=0.5")
    assert lines[1].startswith("B dynamic: hsp Lq=128 max=1024 s=0.5")
    assert "duration µs 399.6 382.8 -16.8 -4.2%" in lines


@pytest.mark.parametrize("args, message", [
    (["--pass", "bwd", "--no-peel"], "apply to the forward only"),
    (["--pass", "bwd", "--vs-no-peel"], "apply to the forward only"),
    (["--dq", "tma"], "--dq applies to the backward only"),
    (["--vs-dq", "tma"], "--vs-dq applies to the backward only"),
    (["--pass", "bwd", "--vs-dq", "fast"], "unknown dQ reduction 'fast'"),
    (["--pass", "bwd", "--schedule", "lpt"], "unknown bwd schedule 'lpt'"),
    (["--pass", "bwd", "--dq", "tma", "--vs-dq", "tma"], "same as the first"),
    (["--vs-profile", "5"], "unknown instrumentation level 5"),
    (["--profile", "1", "--vs-profile", "1"], "same as the first"),
])
def test_live_backward_options_are_checked_before_ncu_runs(fake_ncu, args, message):
    result = runner.invoke(app, ["ncu", *args])
    assert result.exit_code == 2 and message in result.stderr, result.output
    assert not Path("ncu_calls.jsonl").exists()


def test_live_compare_needs_a_difference(fake_ncu):
    result = runner.invoke(app, ["ncu", "--schedule", "lpt", "--vs-schedule", "lpt"])
    assert result.exit_code == 2 and "same as the first" in result.stderr
    assert not Path("ncu_calls.jsonl").exists()


def test_live_compare_instrumentation_levels(fake_ncu, tmp_path):
    result = runner.invoke(app, ["ncu", "--schedule", "static", "--vs-profile", "1", "--lq", "256", "--max-kv",
                                 "2048", "--sparsity", "0.1", "--json"])
    assert result.exit_code == 0, result.output
    a, b = fake_ncu()
    assert "--profile" not in a and b[-4:] == ["--profile", "1", "--launches", "3"]
    assert b[b.index("-o") + 1] == "ncu_hsp_lq256_kv2048_s0.1_static.vs-static-prof1"
    data = json.loads(result.stdout)
    assert [r["profile"] for r in data["runs"]] == [0, 1]
    assert data["b"]["label"] == "static-prof1: hsp Lq=256 max=2048 s=0.1"
    result = runner.invoke(app, ["ncu", "--report", str(DYNAMIC), "--vs-profile", "1"])
    assert result.exit_code == 2 and "--vs-profile applies only to a live run" in result.stderr


def test_live_compare_peeling_and_against_a_file(fake_ncu, tmp_path):
    result = runner.invoke(app, ["ncu", "--lq", "128", "--max-kv", "1024", "--sparsity", "0.5", "--vs-no-peel",
                                 "--json"])
    assert result.exit_code == 0, result.output
    a, b = fake_ncu()
    assert "--no-peel" not in a and b[-3:] == ["--no-peel", "--launches", "3"]
    assert b[b.index("-o") + 1] == "ncu_hsp_lq128_kv1024_s0.5_dynamic.vs-dynamic-nopeel"
    data = json.loads(result.stdout)
    assert [r["peel"] for r in data["runs"]] == [True, False]
    assert data["b"]["label"] == "dynamic-nopeel: hsp Lq=128 max=1024 s=0.5"

    result = runner.invoke(app, ["ncu", "--lq", "128", "--max-kv", "1024", "--sparsity", "0.5",
                                 "--compare", str(DYNAMIC), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["b"]["report"] == str(DYNAMIC) and len(data["runs"]) == 1


def test_live_without_a_gpu_driver_exits_3(monkeypatch):
    if any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/dxg")) or not sys.platform.startswith("linux"):
        pytest.skip("checks a Linux machine without an NVIDIA driver")
    monkeypatch.setattr(ncu_live, "find_ncu", lambda: "/opt/ncu")
    result = runner.invoke(app, ["ncu", "--schedule", "dynamic"])
    assert result.exit_code == 3
    assert result.stderr.startswith("error: no NVIDIA GPU driver here")


# ---- the backward: ptxas's spill prediction against ncu's local-memory traffic ------------------

def test_backward_spills_predicted_by_ptxas_show_up_as_local_traffic_in_ncu():
    """The committed backward reports (TMA reduce-add vs atomics for dQ) against ptxas's account of
    the same build (commit 8f96150, logs kept beside the reports; today's kernel compiles
    differently): the variant ptxas says spills more moves more local bytes."""
    from jfa_prof.ptxas import entry_stats, parse_ptxas_log

    tma = analysis.read_report(DATA / "bwd_tma.ncu-rep").kernel("_jfa_bwd")
    atomic = analysis.read_report(DATA / "bwd_atomic.ncu-rep").kernel("_jfa_bwd")
    ptxas_logs = DATA.parent / "ptxas"
    logs = {name: (ptxas_logs / f"jfa_bwd_bcast_bf16_d128_{name}_8f96150.log").read_text()
            for name in ("tma2", "atomic")}
    spill = {name: entry_stats(parse_ptxas_log(log), "_jfa_bwd").spill_store_bytes for name, log in logs.items()}
    assert 0 < spill["tma2"] < spill["atomic"]
    local = {name: k.metrics["local_store_bytes"] for name, k in (("tma2", tma), ("atomic", atomic))}
    assert 0 < local["tma2"] < local["atomic"]
    # Same registers (255, the cap at 256 threads): the spilling is the difference.
    assert tma.metrics["registers"] == atomic.metrics["registers"] == 255


def test_forward_reports_of_schedules_and_peeling():
    """The committed forward comparisons (hsp Lq=256 max=2048 s=0.1): the dynamic queue evens the
    SMs out yet runs longer uninstrumented; every block masked runs longer than the peeled kernel."""
    static = analysis.read_report(DATA / "fwd_static.ncu-rep").kernel("_jfa_fwd").metrics
    dynamic = analysis.read_report(DATA / "fwd_static_vs_dynamic.ncu-rep").kernel("_jfa_fwd").metrics
    nopeel = analysis.read_report(DATA / "fwd_static_nopeel.ncu-rep").kernel("_jfa_fwd").metrics
    imbalance = {name: m["sm_cycles_max"] / m["sm_cycles_avg"]
                 for name, m in (("static", static), ("dynamic", dynamic))}
    assert imbalance["dynamic"] < imbalance["static"] and dynamic["duration"] > static["duration"]
    assert nopeel["duration"] > static["duration"] and nopeel["tensor_pipe"] < static["tensor_pipe"]
    assert static["local_load_bytes"] == dynamic["local_load_bytes"] == nopeel["local_load_bytes"] == 0


def test_backward_reports_show_what_limits_the_tlx_backward():
    """The committed reports of the TLX backward (HSP 128/1024/0.1, 256/2048/0.5 and the dense shape):
    the tensor pipe is busy less than half the time at every point, every point moves spilled
    registers through local memory, and the dense shape, the longest tiles, waits most on it."""
    reports = {name: analysis.read_report(DATA / f"{name}.ncu-rep").kernel("_jfa_bwd").metrics
               for name in ("bwd_tma_hsp_lq128_kv1024_s0.1", "bwd_tma", "bwd_tma_dense")}
    for m in reports.values():
        assert m["tensor_pipe"] < 50 and m["registers"] == 255
        assert m["local_load_bytes"] > 0 and m["local_store_bytes"] > 0
    per_thread = {name: m["local_load_bytes"] / m["threads"] for name, m in reports.items()}
    assert per_thread["bwd_tma_dense"] == max(per_thread.values())


def test_backward_reports_after_the_spill_fix():
    """The same two points after the step loop's buffer views went opaque (commit e90798f): no local
    memory traffic left, a shorter kernel and a busier tensor pipe."""
    for before, after in (("bwd_tma", "bwd_tma_e90798f"), ("bwd_tma_dense", "bwd_tma_dense_e90798f")):
        a = analysis.read_report(DATA / f"{before}.ncu-rep").kernel("_jfa_bwd").metrics
        b = analysis.read_report(DATA / f"{after}.ncu-rep").kernel("_jfa_bwd").metrics
        assert a["local_load_bytes"] > 0 and b["local_load_bytes"] == b["local_store_bytes"] == 0
        assert b["duration"] < a["duration"] and b["tensor_pipe"] > a["tensor_pipe"]


@pytest.mark.parametrize("point", ["bwd_tma", "bwd_tma_dense"])
def test_backward_report_after_the_step_loop_stopped_waiting_per_matmul(point):
    """hsp 256/2048/0.5 and the dense shape once the step loop was no longer software-pipelined
    (commit ceea4e8), whose pipeliner had put a wgmma wait after every matmul: shorter, a busier
    tensor pipe, and fewer cycles stalled at barriers (warps no longer idle together in every wait)."""
    a = analysis.read_report(DATA / f"{point}_e90798f.ncu-rep").kernel("_jfa_bwd")
    b = analysis.read_report(DATA / f"{point}_ceea4e8.ncu-rep").kernel("_jfa_bwd")
    assert b.metrics["duration"] < 0.95 * a.metrics["duration"]
    assert b.metrics["tensor_pipe"] > a.metrics["tensor_pipe"]
    assert b.stalls["barrier"] < 0.8 * a.stalls["barrier"]
    assert b.metrics["local_load_bytes"] == 0


@pytest.mark.parametrize("point", ["bwd_tma", "bwd_tma_dense"])
def test_backward_report_after_warp_specialization(point):
    """hsp 256/2048/0.5 and the dense shape once a producer warpgroup took the copies and the dQ
    reduce-adds off the two consumer warpgroups (commit 70476de): 384 threads at 168 registers (the
    consumers raise theirs to 240 with setmaxnreg), no local memory, a shorter kernel and a busier
    tensor pipe."""
    a = analysis.read_report(DATA / f"{point}_ceea4e8.ncu-rep").kernel("_jfa_bwd").metrics
    b = analysis.read_report(DATA / f"{point}_70476de.ncu-rep").kernel("_jfa_bwd").metrics
    assert b["block_size"] == 384 and b["registers"] == 168
    assert b["local_load_bytes"] == b["local_store_bytes"] == 0
    assert b["duration"] < 0.92 * a["duration"]
    assert b["tensor_pipe"] > a["tensor_pipe"] + 5


def test_forward_instrumentation_reports():
    """The forward at hsp Lq=256 max=2048 s=0.1, uninstrumented (prof0) and with tile records and spans
    (prof1), commit e5d7771: only the instrumented build moves local memory; under the static schedule it
    slows the slowest SM more than the average one (its kernel time swings with it), under the dynamic
    queue about evenly."""
    growth = {}
    for schedule in ("static", "dynamic"):
        a = analysis.read_report(DATA / f"fwd_{schedule}_prof0_e5d7771.ncu-rep").kernel("_jfa_fwd")
        b = analysis.read_report(DATA / f"fwd_{schedule}_prof1_e5d7771.ncu-rep").kernel("_jfa_fwd")
        assert a.metrics["local_load_bytes"] == a.metrics["local_store_bytes"] == 0
        assert b.metrics["local_load_bytes"] > 0 and b.metrics["local_store_bytes"] > 0
        assert b.metrics["duration"] > a.metrics["duration"] and b.metrics["registers"] == a.metrics["registers"] == 168
        cmp = analysis.compare(a, b)
        growth[schedule] = {k: cmp.delta(k).relative for k in ("sm_cycles_max", "sm_cycles_avg")}
    assert growth["static"]["sm_cycles_max"] > growth["static"]["sm_cycles_avg"] + 0.05
    assert abs(growth["dynamic"]["sm_cycles_max"] - growth["dynamic"]["sm_cycles_avg"]) < 0.02


def test_backward_instrumentation_reports():
    """The backward at hsp Lq=256 max=2048 s=0.5 (static, TMA dQ), uninstrumented (prof0) and with tile
    records and spans (prof1): level 1 moves no local memory, keeps the registers, and its kernel ran
    within the run-to-run noise of the plain one (1.7% faster in this pair)."""
    a = analysis.read_report(DATA / "bwd_static_prof0_exitwait.ncu-rep").kernel("_jfa_bwd")
    b = analysis.read_report(DATA / "bwd_static_prof1_exitwait.ncu-rep").kernel("_jfa_bwd")
    for k in (a, b):
        assert k.metrics["local_load_bytes"] == k.metrics["local_store_bytes"] == 0
    assert b.metrics["registers"] == a.metrics["registers"] == 168
    assert abs(analysis.compare(a, b).delta("duration").relative) < 0.03


@pytest.mark.parametrize("profile, spills", [("noprof", False), ("prof", False), ("prof-roles", False)])
def test_spills_compiles_the_build_that_launches(profile, spills):
    """`jfa-prof spills` compiles with the pointer alignment a launch has, on which ptxas's register
    allocation depends: the level-1 forward of commit e5d7771 spilled only with it, as in ncu's
    local-memory counters above. Since the tile mailbox and the 32-bit wait counters only level 3
    spilled, and since its event offset is rebuilt per record (`prof.opaque` where it calls `event_base`) no
    level does."""
    from jfa_prof import compile as jcompile
    from jfa_prof.kernels.registry import all_variants

    v = next(x for x in all_variants() if x.name == f"fwd/bcast/bf16/d128/static/peel/{profile}")
    attrs = jcompile.launch_attrs(v.kernel.arg_names, v.signature)
    assert attrs and all(v.signature[v.kernel.arg_names[i]].startswith("*") for (i,) in attrs)
    r = jcompile.compile_variant(v)
    assert (r.metadata.local_bytes > 0) == spills and (r.local_memory.total > 0) == spills


def test_dense_forward_against_the_tlx_tutorial_reports():
    """The forward and the TLX Hopper tutorial kernel on the dense shape (Z=8 H=16 N=4096,
    `benchmarks/fwd_calibration.py --ncu-target`): the same tensor-core instructions, but the
    tutorial keeps the tensor pipe busier and finishes sooner, and our warps wait longer at named
    barriers (the ping-pong turns), which is where the steady KV loop loses to it."""
    ours = analysis.read_report(DATA / "fwd_dense_jfa_f0450ed.ncu-rep").kernel("_jfa_fwd")
    tut = analysis.read_report(DATA / "fwd_dense_tlx_tutorial.ncu-rep").kernel(
        "_attn_fwd_ws_pipelined_pingpong_persistent")
    c = analysis.compare(ours, tut)
    assert c.delta("tensor_inst").a == c.delta("tensor_inst").b > 0
    assert c.delta("tensor_pipe").b > c.delta("tensor_pipe").a
    assert c.delta("duration").relative < -0.03
    assert ours.stalls["barrier"] > 2 * tut.stalls["barrier"]
    # Not from spilling: ours moves no local memory, the tutorial does.
    assert ours.metrics["local_load_bytes"] == 0 < tut.metrics["local_load_bytes"]
