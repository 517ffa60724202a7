"""The one way jfa-prof times GPU work.

- :func:`bench`: warm-up, then the median of many repeats, from ``triton.testing.do_bench``
  (CUDA events around each call, L2 flushed between calls). Medians, because a stray
  preemption or clock dip moves a mean but not a median.
- :func:`time_twice`: the same measurement made twice. The gap between the two is the noise
  floor: a difference between two versions smaller than it says nothing.
- :func:`host_breakdown`: host wall time per call, with and without waiting for the GPU, for
  short kernels where launching (building a work list, descriptors) can cost more than the
  kernel itself and ``bench`` would time the host.
- :func:`stream_read_tb_s` and :func:`matmul_tflops`: the HBM bandwidth a streaming read and the
  tensor-core rate a large matrix product reach on this GPU now, the ceilings a run's points are
  held to (datasheet figures are not reached).
- :func:`require_gpu` and :func:`measurement_meta`: the device check every live measurement
  starts with, and the machine / versions / date / command a result file records.

``triton`` and ``torch`` are imported inside the functions, so importing this module is free.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["DEFAULT_REP_MS", "DEFAULT_WARMUP_MS", "Timing", "bench", "cuda_graphed", "gpu_ms", "host_breakdown",
           "host_us_per_call", "kernel_median_ms", "matmul_tflops", "measurement_meta", "require_gpu",
           "stream_read_tb_s", "time_twice"]

# do_bench's budgets are milliseconds of GPU time, not iteration counts: a 0.1 ms kernel gets
# ~1000 repeats in 100 ms, a 5 ms one ~20, and both medians settle.
DEFAULT_WARMUP_MS = 25
DEFAULT_REP_MS = 100


def bench(fn: Callable[[], Any], *, warmup_ms: float = DEFAULT_WARMUP_MS, rep_ms: float = DEFAULT_REP_MS) -> float:
    """Median milliseconds per call of ``fn`` on the current CUDA device.

    ``fn`` is called once before the warm-up too (do_bench does), so compilation, module load
    and autotuning stay out of the number; the caller should still have run ``fn`` once to
    check its output, which is where a first-call failure belongs.
    """
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


@dataclass(frozen=True)
class Timing:
    """Two medians of the same thing, taken one after the other."""

    ms: float
    ms_repeat: float

    @property
    def noise_ms(self) -> float:
        """The spread of the two: differences below this are not measurable here."""
        return abs(self.ms - self.ms_repeat)

    @property
    def noise_frac(self) -> float:
        return self.noise_ms / self.ms if self.ms > 0 else math.nan

    def to_dict(self) -> dict[str, float]:
        return {"ms": self.ms, "ms_repeat": self.ms_repeat, "noise_ms": self.noise_ms}


def time_twice(fn: Callable[[], Any], *, warmup_ms: float = DEFAULT_WARMUP_MS,
               rep_ms: float = DEFAULT_REP_MS, timer: Callable[..., float] | None = None) -> Timing:
    """:func:`bench` twice in a row. ``timer`` replaces :func:`bench` (tests, other timers)."""
    timer = timer or bench
    first = timer(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)
    second = timer(fn, warmup_ms=warmup_ms, rep_ms=rep_ms)
    return Timing(first, second)


def alternated(calls: Mapping[str, Callable[[], Any]], rounds: int, *,
               timer: Callable[[Callable[[], Any]], float] | None = None) -> dict[str, list[float]]:
    """:func:`bench` of every named call, in ``rounds`` rounds that each time every call once, in
    order: a GPU clock drifting over the run then spreads over all of them instead of favouring
    the ones timed first. Per name, the round times; their median is the figure to compare.
    ``timer`` replaces :func:`bench` (tests)."""
    timer = timer or bench
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(timer(fn))
    return times


def rounds_summary(rounds: list[float], flops: float) -> dict[str, Any]:
    """What a benchmark file keeps of one call's alternated rounds: the round times, their median
    (the figure to compare) and the TFLOPS at that median."""
    ms = statistics.median(rounds)
    return {"rounds": rounds, "ms": ms, "tflops": flops / ms / 1e9}


def paired_rounds(rounds: list[float], ref_rounds: list[float]) -> dict[str, Any]:
    """One call's :func:`alternated` rounds against a reference's, round by round: the two calls of
    a round ran moments apart, so a clock that moves between rounds (a power cap) moves both, and
    their ratio keeps a difference that the spread of either call's rounds would hide. The median
    of the per-round ratios, and in how many rounds the call was the faster."""
    if len(rounds) != len(ref_rounds) or not rounds:
        raise ValueError(f"paired rounds need equally many, at least one: {len(rounds)} and {len(ref_rounds)}")
    ratios = [t / r for t, r in zip(rounds, ref_rounds)]
    return {"ratio": statistics.median(ratios), "ratios": ratios,
            "faster_rounds": sum(r < 1.0 for r in ratios), "rounds": len(ratios)}


def format_rounds(summary: Mapping[str, Any]) -> str:
    """A :func:`rounds_summary` on one console line."""
    rounds = ", ".join(f"{r:.3f}" for r in summary["rounds"])
    return f"{summary['ms']:8.3f} ms {summary['tflops']:6.1f} TFLOPS (rounds {rounds})"


def host_breakdown(calls: Mapping[str, Callable[[], Any]], *, n: int = 20) -> dict[str, dict[str, float]]:
    """Per named call, milliseconds of host time per call: ``enqueue_ms`` until the host is done
    issuing ``n`` calls, ``synced_ms`` until the GPU has finished them too.

    When ``enqueue_ms`` is close to ``synced_ms`` the host is the bottleneck, and a kernel-time
    median of that call is really a measurement of the host. Each call runs once first so that
    compilation is not counted.
    """
    import torch

    for fn in calls.values():
        fn()
    out = {}
    for name, fn in calls.items():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        enqueue = (time.perf_counter() - t0) / n * 1e3
        torch.cuda.synchronize()
        out[name] = {"enqueue_ms": enqueue, "synced_ms": (time.perf_counter() - t0) / n * 1e3}
    return out


HOST_CALLS = 50  # calls enqueued back to back per round of host_us_per_call


def host_us_per_call(fn: Callable[[], Any], *, n: int = HOST_CALLS, rounds: int = 5) -> float:
    """Host microseconds per call of ``fn`` as a training loop spends them: ``n`` calls enqueued
    back to back from an idle GPU, without waiting between them, timed until the host is done
    issuing; the median of ``rounds``. A call that synchronizes inside waits for the GPU here, as it
    would in the loop. Once the launch queue is full the host waits for the GPU too, so ``n`` is
    kept well below its depth."""
    import torch

    fn()
    per_call = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per_call.append((time.perf_counter() - t0) / n * 1e6)
    torch.cuda.synchronize()
    return statistics.median(per_call)


STREAM_READ_BYTES = 8 << 30
STREAM_READ_METHOD = "torch.sum over a bf16 tensor (8 GiB, or a quarter of the free memory if less), do_bench median"


def stream_read_tb_s(*, nbytes: int = STREAM_READ_BYTES, timer: Callable[..., float] | None = None) -> float:
    """Decimal TB/s of a streaming read on the current GPU: ``torch.sum`` over ``nbytes`` of bf16
    (capped at a quarter of the free memory), far larger than the L2, timed by :func:`bench`."""
    import torch

    free, _ = torch.cuda.mem_get_info()
    n = min(nbytes, free // 4) // 2
    x = torch.empty(n, dtype=torch.bfloat16, device="cuda")  # the values do not matter to a read
    try:
        ms = (timer or bench)(lambda: x.sum())
    finally:
        del x
        torch.cuda.empty_cache()
    return 2 * n / ms / 1e9


MATMUL_N = 8192
MATMUL_METHOD = f"a bf16 {MATMUL_N}^3 matrix product (torch.matmul of random inputs), do_bench median"


def matmul_tflops(*, n: int = MATMUL_N, timer: Callable[..., float] | None = None) -> float:
    """Dense bf16 TFLOPS of an n x n x n matrix product on the current GPU now: the tensor cores'
    rate a kernel can reach, below the datasheet's peak at its boost clock."""
    import torch

    a, b = (torch.randn(n, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    ms = (timer or bench)(lambda: a @ b)
    return 2 * n ** 3 / ms / 1e9


def cuda_graphed(fn: Callable[[], Any], *, warmup: int = 3) -> Callable[[], Any]:
    """``fn`` captured once in a CUDA graph (after ``warmup`` calls on a side stream, as capture
    wants); the returned callable replays it and returns the outputs of the captured call, which
    each replay overwrites in place."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return lambda: (graph.replay(), out)[1]


def kernel_durations_ms(fn: Callable[[], Any], kernel: str, *, n: int = 1, activity: str = "cuda"):
    """(durations in ms of the launches of the kernel named `kernel` during n calls of fn, fn's
    last result), read by the profiler (CUPTI for "cuda"). CUDA events around a launch would
    also count the host's launch work, a large share of a short kernel. The name must match
    whole: `_jfa_bwd` is not `_jfa_bwd_delta`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA if activity == "cuda" else ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(n):
            result = fn()
        if activity == "cuda":
            torch.cuda.synchronize()
    return [e.time_range.elapsed_us() / 1e3 for e in prof.events() if e.name.split("(")[0] == kernel], result


def gpu_ms(fn: Callable[[], Any], *, n: int = 10, rounds: int = 3) -> float:
    """Milliseconds of GPU work per call of ``fn``: every kernel, copy and fill it puts on the
    device, summed from the profiler (CUPTI) over ``n`` calls, divided by ``n``; the median of
    ``rounds`` such bursts. Unlike :func:`bench`, the host's gaps between launches are not in it,
    so two implementations compare as GPU work whatever their launch paths cost."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
        device_us = sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == DeviceType.CUDA)
        per_call.append(device_us / n / 1e3)
    return statistics.median(per_call)


def kernel_median_ms(fn: Callable[[], Any], kernel: str, *, n: int = 10, activity: str = "cuda") -> float:
    """The median of :func:`kernel_durations_ms` over n calls of fn: one round's figure for the
    kernel alone, e.g. as the ``timer`` of :func:`alternated`."""
    return statistics.median(kernel_durations_ms(fn, kernel, n=n, activity=activity)[0])


def require_gpu(what: str, *, hint: str | None = None):
    """The CUDA device to time on, or :class:`~jfa_prof.errors.NoGpuError` saying what needed it.

    The kernels are built for sm_90a, so another architecture is as good as none."""
    import torch

    from jfa_prof.errors import NoGpuError

    if not torch.cuda.is_available():
        raise NoGpuError(f"no CUDA GPU is visible: {what} needs an sm_90 GPU", hint=hint)
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        raise NoGpuError(f"{what} needs an sm_90 (Hopper) GPU; this one is sm_{major}{minor}", hint=hint)
    return torch.device("cuda", torch.cuda.current_device())


def measurement_meta(command: str | None = None, **versions: str | None) -> dict[str, Any]:
    """Machine, versions, date, command and timer of a measurement made now, for result files.
    ``versions`` adds packages beyond torch/triton/jfa-prof (peers), None ones left out."""
    import datetime
    import platform
    import sys

    import torch
    import triton

    from jfa_prof import __version__

    meta: dict[str, Any] = {}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        meta.update(gpu=props.name, sm_count=props.multi_processor_count,
                    capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)
    meta.update(torch=torch.__version__, triton=triton.__version__, jfa_prof=__version__,
                python=platform.python_version(),
                **{k: v for k, v in versions.items() if v is not None})
    meta.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                command=command if command is not None else " ".join(["jfa-prof"] + sys.argv[1:]),
                timer="triton.testing.do_bench median")
    return meta
