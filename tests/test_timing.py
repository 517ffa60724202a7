"""The timing helpers, with do_bench and CUDA stood in for."""
from __future__ import annotations

import pytest
import torch

from jfa_prof import timing
from jfa_prof.errors import NoGpuError


def test_bench_asks_do_bench_for_the_median(monkeypatch):
    import triton.testing

    seen = {}

    def fake(fn, **kw):
        seen.update(kw)
        fn()
        return 0.25
    monkeypatch.setattr(triton.testing, "do_bench", fake)
    calls = []
    assert timing.bench(lambda: calls.append(1), rep_ms=50) == 0.25
    assert seen == {"warmup": timing.DEFAULT_WARMUP_MS, "rep": 50, "return_mode": "median"} and calls == [1]


def test_time_twice_reports_the_noise():
    times = iter([1.0, 0.96875])
    t = timing.time_twice(lambda: None, timer=lambda fn, **kw: next(times))
    assert (t.ms, t.ms_repeat, t.noise_ms, t.noise_frac) == (1.0, 0.96875, 0.03125, 0.03125)
    assert t.to_dict() == {"ms": 1.0, "ms_repeat": 0.96875, "noise_ms": 0.03125}


def test_alternated_times_every_call_once_per_round_in_order():
    seen = []

    def timer(fn):
        seen.append(fn())
        return float(len(seen))

    times = timing.alternated({"a": lambda: "a", "b": lambda: "b"}, 3, timer=timer)
    assert seen == ["a", "b"] * 3
    assert times == {"a": [1.0, 3.0, 5.0], "b": [2.0, 4.0, 6.0]}


def test_rounds_summary_takes_the_median():
    s = timing.rounds_summary([2.0, 1.0, 4.0], flops=3e9)
    assert s == {"rounds": [2.0, 1.0, 4.0], "ms": 2.0, "tflops": pytest.approx(1.5)}  # 3 GFLOP in 2 ms
    assert timing.format_rounds(s) == "   2.000 ms    1.5 TFLOPS (rounds 2.000, 1.000, 4.000)"


def test_host_breakdown(monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(1))
    calls = {"a": 0, "b": 0}

    def call(name):
        def fn():
            calls[name] += 1
        return fn
    out = timing.host_breakdown({"a": call("a"), "b": call("b")}, n=5)
    assert set(out) == {"a", "b"} and calls == {"a": 6, "b": 6}  # one untimed first call each
    assert all(0 <= v["enqueue_ms"] <= v["synced_ms"] for v in out.values())
    assert len(syncs) == 4


def test_require_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGpuError, match="no CUDA GPU is visible: the bench needs an sm_90 GPU") as e:
        timing.require_gpu("the bench", hint="use --results")
    assert e.value.exit_code == 3 and e.value.hint == "use --results"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))
    with pytest.raises(NoGpuError, match="needs an sm_90 \\(Hopper\\) GPU; this one is sm_100"):
        timing.require_gpu("the bench")


def test_measurement_meta_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    meta = timing.measurement_meta("jfa-prof bench --grid hsp", flash_attn_4="4.0.0b36", missing=None)
    assert meta["command"] == "jfa-prof bench --grid hsp" and meta["flash_attn_4"] == "4.0.0b36"
    assert "missing" not in meta and "gpu" not in meta
    assert meta["torch"] == torch.__version__ and meta["timer"] == "triton.testing.do_bench median"
    assert meta["date"][:2] == "20" and meta["date"].endswith("+00:00")


def test_kernel_durations_come_from_the_profiler_with_the_last_result():
    import torch

    from jfa_prof.timing import kernel_durations_ms

    a = torch.randn(64, 64)
    calls = []
    times, out = kernel_durations_ms(lambda: calls.append(1) or a @ a, "aten::mm", n=3, activity="cpu")
    assert len(calls) == 3 and len(times) == 3 and all(t > 0 for t in times)
    assert torch.equal(out, a @ a)


def test_kernel_median_is_the_median_of_the_profiled_durations(monkeypatch):
    from jfa_prof import timing

    monkeypatch.setattr(timing, "kernel_durations_ms", lambda fn, kernel, n, activity: ([3.0, 1.0, 2.0, 9.0, 4.0], None))
    assert timing.kernel_median_ms(lambda: None, "k", n=5) == 3.0


@pytest.mark.gpu
def test_gpu_ms_sums_every_kernel_of_a_call_and_leaves_host_gaps_out(cuda_device):
    import time

    a = torch.randn(4096, 4096, device=cuda_device, dtype=torch.bfloat16)
    one = timing.gpu_ms(lambda: a @ a)
    two = timing.gpu_ms(lambda: (a @ a, a @ a))
    assert 0 < one < 5 and two == pytest.approx(2 * one, rel=0.15)
    # 2 ms of host sleep per call would dominate a call's wall time, not its GPU time.
    slow = timing.gpu_ms(lambda: (time.sleep(0.002), a @ a), n=3, rounds=1)
    assert slow == pytest.approx(one, rel=0.15)


@pytest.mark.gpu
def test_stream_read_reaches_most_of_the_datasheet_bandwidth_and_never_more(cuda_device):
    from jfa_prof.hardware import lookup

    spec = lookup(torch.cuda.get_device_name(cuda_device))
    tb_s = timing.stream_read_tb_s(nbytes=2 << 30)
    # A read of 2 GiB, far beyond the L2: above half the datasheet's figure, and not past it.
    assert spec is not None and 0.5 * spec.hbm_bandwidth_tb_s < tb_s <= 1.02 * spec.hbm_bandwidth_tb_s


@pytest.mark.gpu
def test_matmul_rate_is_below_the_datasheet_peak_and_near_it(cuda_device):
    from jfa_prof.hardware import lookup

    spec = lookup(torch.cuda.get_device_name(cuda_device))
    tflops = timing.matmul_tflops(n=4096)
    assert spec is not None and 0.4 * spec.peak_flops("bf16") / 1e12 < tflops <= 1.02 * spec.peak_flops("bf16") / 1e12


def test_paired_rounds_compare_round_by_round():
    # The clock drops in the second round for both calls: the medians alone would overlap, the
    # per-round ratios do not.
    p = timing.paired_rounds([0.98, 1.47, 0.99], [1.0, 1.5, 1.0])
    assert p["ratio"] == pytest.approx(0.98) and p["ratios"] == pytest.approx([0.98, 0.98, 0.99])
    assert (p["faster_rounds"], p["rounds"]) == (3, 3)
    assert timing.paired_rounds([1.0, 1.1], [1.0, 1.0])["faster_rounds"] == 0
    with pytest.raises(ValueError, match="equally many"):
        timing.paired_rounds([1.0], [1.0, 1.0])
