"""Ablation plans and measurement with a stand-in kernel module, launcher and timer; record
files on disk. The real kernel is timed by the GPU test at the end."""
from __future__ import annotations

import json
import types

import pytest

from jfa_prof import ablations
from jfa_prof.ablations import Ablation, WaterfallRecord, load_waterfall, measure_waterfall, n_steps
from jfa_prof.errors import BadInputError, JfaProfError, ToolMissingError

FAKE = {"no_o_store": (1, "stores"), "no_exp": (2, "exp"), "reuse_kv": (4, "loads"), "no_mask": (8, "mask")}


@pytest.fixture
def fake_kernel(monkeypatch):
    mods = {"jfa_prof.kernels.fwd": types.SimpleNamespace(ABLATIONS=FAKE)}

    def fake_import(name):
        if name not in mods:
            raise ImportError(f"No module named {name!r}")
        return mods[name]
    monkeypatch.setattr(ablations, "_import", fake_import)
    return mods


def test_available_and_plan(fake_kernel):
    assert [a.name for a in ablations.available_ablations("fwd")] == list(FAKE)
    plan = ablations.ablation_plan("fwd", ["reuse_kv", "no_exp"])
    assert plan == [Ablation("reuse_kv", 4, "loads"), Ablation("no_exp", 2, "exp")]
    assert ablations.ablation_plan("fwd") == ablations.available_ablations("fwd")


def test_plan_errors(fake_kernel):
    with pytest.raises(BadInputError, match="unknown fwd ablation"):
        ablations.ablation_plan("fwd", ["no_exp", "no_softmax"])
    with pytest.raises(BadInputError, match="listed twice"):
        ablations.ablation_plan("fwd", ["no_exp", "no_exp"])
    with pytest.raises(BadInputError, match="unknown pass"):
        ablations.available_ablations("both")
    # A pass whose kernel does not import: a clear error, not an ImportError.
    with pytest.raises(JfaProfError, match="no bwd kernel to ablate"):
        ablations.available_ablations("bwd")
    fake_kernel["jfa_prof.kernels.fwd"] = types.SimpleNamespace()
    with pytest.raises(JfaProfError, match="no ablation switches"):
        ablations.available_ablations("fwd")


def test_the_real_kernel_publishes_the_four_switches():
    names = [a.name for a in ablations.available_ablations("fwd")]
    assert names == ["no_o_store", "no_exp", "reuse_kv", "no_mask"]
    bits = [a.bit for a in ablations.available_ablations("fwd")]
    assert len(set(bits)) == 4 and all(b and not b & (b - 1) for b in bits)  # distinct single bits


def test_the_backward_publishes_its_switches_and_options():
    names = [a.name for a in ablations.available_ablations("bwd")]
    assert names == ["no_dq", "dq_no_reduce", "no_mask", "no_dkv_store"]
    bits = [a.bit for a in ablations.available_ablations("bwd")]
    assert len(set(bits)) == 4 and all(b and not b & (b - 1) for b in bits)
    assert ablations.default_schedule("fwd") == "dynamic" and ablations.default_schedule("bwd") == "static"
    # The backward's follows the op's for the inputs: the queue for jagged Q.
    assert ablations.default_schedule("bwd", broadcast_q=False) == "dynamic"
    assert ablations.default_schedule("fwd", broadcast_q=False) == "dynamic"
    assert ablations.bwd_dq("tma") == ("tma", 2) and ablations.bwd_dq("tma1") == ("tma", 1)
    from jfa_prof.kernels import bwd  # the CLI's default reduction is the op's
    assert ablations.bwd_dq(ablations.DEFAULT_DQ_NAME) == (bwd.DEFAULT_DQ, bwd.DEFAULT_DQ_STAGES)
    with pytest.raises(BadInputError, match="unknown dQ reduction 'fast'"):
        ablations.bwd_dq("fast")
    with pytest.raises(BadInputError, match="unknown bwd schedule 'lpt'"):
        ablations.check_schedule("bwd", "lpt")
    with pytest.raises(BadInputError, match="--dq applies to the backward only"):
        ablations.make_launcher(None, "fwd", "lpt", dq="tma")


def _fake_time(mask):
    """A kernel whose stores cost 1/8 ms, and whose exponentials and loads overlap: 1/4 and
    1/16 ms alone, 1/2 ms together."""
    t = 1.0
    if mask & 1:
        t -= 0.125
    if mask & 2 and mask & 4:
        t -= 0.5
    elif mask & 2:
        t -= 0.25
    elif mask & 4:
        t -= 0.0625
    return t


def _measure(plan, cumulative):
    calls, steps = [], []

    def launcher(mask):
        def fn():
            calls.append(mask)
            return mask
        return fn

    def timer(fn, **kw):
        return _fake_time(fn())

    t = measure_waterfall(launcher, plan, cumulative=cumulative, timer=timer, on_step=steps.append)
    return t, calls, steps


def test_measure_alone_and_cumulative(fake_kernel):
    plan = ablations.ablation_plan("fwd", ["no_o_store", "no_exp", "reuse_kv"])
    t, calls, steps = _measure(plan, cumulative=True)
    assert t.baseline_ms == t.baseline_repeat_ms == 1.0
    assert [a.alone_ms for a in t.ablations] == [0.875, 0.75, 0.9375]
    assert [a.cumulative_ms for a in t.ablations] == [0.875, 0.625, 0.375]
    assert [a.bit for a in t.ablations] == [1, 2, 4]
    # The repeat brackets the run: baseline first, its repeat after the ablations alone.
    assert steps == ["baseline", "no_o_store", "no_exp", "reuse_kv", "baseline (repeat)", "no_o_store+no_exp",
                     "no_o_store+no_exp+reuse_kv"]
    assert len(steps) == n_steps(plan, True)
    # Each variant runs once untimed (the check that it launches), then once inside the timer.
    assert calls == [m for m in (0, 1, 2, 4, 0, 3, 7) for _ in range(2)]


def test_measure_alone_only(fake_kernel):
    plan = ablations.ablation_plan("fwd")
    t, _, steps = _measure(plan, cumulative=False)
    assert all(a.cumulative_ms is None for a in t.ablations)
    assert len(steps) == n_steps(plan, False) == 6


def test_a_failing_variant_names_itself(fake_kernel):
    def launcher(mask):
        def fn():
            if mask & 2:
                raise RuntimeError("out of resources: shared memory")
        return fn

    with pytest.raises(JfaProfError, match="'no_exp' \\(mask 0x2\\) failed: RuntimeError: out of resources"):
        measure_waterfall(launcher, ablations.ablation_plan("fwd"), timer=lambda fn, **kw: 1.0)


def test_record_round_trip(tmp_path, fake_kernel):
    plan = ablations.ablation_plan("fwd")
    t, _, _ = _measure(plan, cumulative=True)
    rec = WaterfallRecord(t, {"label": "hsp Lq=256 max=2048 s=0.5", "B": 1024}, "lpt",
                          {"gpu": "NVIDIA H200", "date": "2026-12-01T00:00:00+00:00"}, flops=2e12)
    p = tmp_path / "wf.json"
    p.write_text(json.dumps(rec.to_dict()))
    back = load_waterfall(p)
    assert back.timings == t and back.label == "hsp Lq=256 max=2048 s=0.5" and back.schedule == "lpt"
    assert back.baseline_tflops == 2e12 / 1.0 / 1e9
    assert back.dq is None and back.variant == "lpt"
    bwd = WaterfallRecord(t, {"label": "x"}, "static", dq="tma1")
    p.write_text(json.dumps(bwd.to_dict()))
    assert load_waterfall(p).dq == "tma1" and load_waterfall(p).variant == "static · dQ tma1"


def test_load_waterfall_errors(tmp_path):
    with pytest.raises(BadInputError, match="does not exist"):
        load_waterfall(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(BadInputError, match="not a JSON file"):
        load_waterfall(bad)
    other = tmp_path / "bench.json"
    other.write_text(json.dumps({"meta": {}, "results": []}))
    with pytest.raises(BadInputError, match="not a recorded waterfall"):
        load_waterfall(other)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"kind": ablations.RECORD_KIND, "timings": {"baseline_ms": 1.0}}))
    with pytest.raises(BadInputError, match="malformed"):
        load_waterfall(broken)


# ---- the command on a machine without plotly (a GPU image may lack it) ------------------------

def _no_plotly_run(tmp_path, monkeypatch, args):
    from typer.testing import CliRunner

    from jfa_prof.cli import app
    from jfa_prof.commands import waterfall as waterfall_cmd
    from tests.resultgen import write_waterfall

    recorded = load_waterfall(write_waterfall(tmp_path / "recorded.json"))
    measured = []
    monkeypatch.setattr("jfa_prof.render.figures.have_plotly", lambda: False)
    monkeypatch.setattr(waterfall_cmd, "_measure", lambda *a, **k: measured.append(k) or recorded)
    return CliRunner().invoke(app, ["waterfall", "--out", str(tmp_path / "w.html"), *args]), measured


def test_waterfall_without_plotly_refuses_before_measuring(tmp_path, monkeypatch):
    result, measured = _no_plotly_run(tmp_path, monkeypatch, [])
    assert result.exit_code == ToolMissingError.exit_code and measured == []
    assert "needs plotly" in result.output and "--save" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "w.html").exists()


def test_waterfall_without_plotly_still_measures_what_it_saves(tmp_path, monkeypatch):
    save = tmp_path / "wf.json"
    result, measured = _no_plotly_run(tmp_path, monkeypatch, ["--save", str(save)])
    assert result.exit_code == 0, result.output
    assert len(measured) == 1 and load_waterfall(save).timings.baseline_ms == pytest.approx(1.2898)
    assert "no chart written: plotly is not installed" in result.output and not (tmp_path / "w.html").exists()
    assert "saved timings to" in result.output and "1.2898" in result.output  # the table, with the baseline
    result, _ = _no_plotly_run(tmp_path, monkeypatch, ["--save", str(tmp_path / "again.json"), "--json"])
    assert json.loads(result.output)["html"] is None


@pytest.mark.gpu
def test_real_ablations_on_the_gpu(cuda_device):
    from jfa_prof.inputs import Workload
    from jfa_prof.reference import reference_attention

    w = Workload("hsp", B=64, H=4, H_kv=4, D=128, Lq=128, max_kv=1024, sparsity=0.5, broadcast_q=True)
    x = w.make(cuda_device)
    launcher = ablations.make_launcher(x, "fwd", "lpt")
    t = measure_waterfall(launcher, ablations.ablation_plan("fwd"), cumulative=True, rep_ms=20, warmup_ms=5)
    assert t.baseline_ms > 0 and all(a.alone_ms > 0 and a.cumulative_ms > 0 for a in t.ablations)
    # The baseline goes through ablate=0 and must still be the right kernel.
    o = launcher(0)()[0]
    ref = reference_attention(x.q, x.k, x.v, None, x.kv_offsets, broadcast_q=True)[0]
    assert float((o.float() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dq", ["tma", "tma1", "atomic"])
def test_real_backward_ablations_on_the_gpu(cuda_device, dq):
    from jfa_prof import bench
    from jfa_prof.inputs import Workload

    w = Workload("hsp", B=64, H=4, H_kv=4, D=128, Lq=128, max_kv=1024, sparsity=0.5, broadcast_q=True)
    x = w.make(cuda_device)
    launcher = ablations.make_launcher(x, "bwd", dq=dq)
    t = measure_waterfall(launcher, ablations.ablation_plan("bwd"), pass_="bwd", cumulative=True, rep_ms=20,
                          warmup_ms=5)
    assert t.baseline_ms > 0 and all(a.alone_ms > 0 and a.cumulative_ms > 0 for a in t.ablations)
    # The baseline is the right backward (its upstream gradient is the bench's), and no_dq really
    # leaves dQ out while dK and dV stay right.
    ref = bench.reference_output(x, "bwd")
    assert bench.rel_err(launcher(0)(), ref) < 2e-2
    dq0, dk, dv = launcher(1)()
    assert not dq0.any() and bench.rel_err((dk, dv), ref[1:]) < 2e-2
