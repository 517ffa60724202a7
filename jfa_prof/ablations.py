"""Measuring ablations: the timings behind ``jfa-prof waterfall``.

A kernel publishes its ablation switches as ``ABLATIONS: dict[name, (bit, what it removes)]``
in its module (``jfa_prof.kernels.fwd`` for the forward pass) and takes the OR of the bits as
``ablate=`` on its launcher. Ablated kernels compute wrong results on purpose, so the switches
are reachable only here, never through the public op. The decomposition itself is the pure
math of :mod:`jfa_prof.analyses.waterfall`.

The work list is built once, before any timing: a model builds it once per batch and shares it
across layers, and when the kernel is short, building it per call would make every timing a
timing of the host, in which no ablation shows.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from jfa_prof.analyses.waterfall import AblationTiming, WaterfallTimings
from jfa_prof.errors import BadInputError, JfaProfError, read_json_file
from jfa_prof.schedule import DEFAULT_SCHEDULE

__all__ = ["BWD_DQ", "KERNEL_MODULES", "PASSES", "RECORD_KIND", "Ablation", "WaterfallRecord", "ablation_plan",
           "available_ablations", "bwd_dq", "check_pass", "check_schedule", "DEFAULT_DQ_NAME", "default_schedule",
           "load_waterfall", "make_launcher", "measure_waterfall", "n_steps", "pass_options", "workload_dict"]

PASSES = ("fwd", "bwd")
# Where each pass's kernel publishes ABLATIONS.
KERNEL_MODULES = {"fwd": "jfa_prof.kernels.fwd", "bwd": "jfa_prof.kernels.bwd"}
RECORD_KIND = "jfa-prof waterfall"

# Tests replace this to stand in a fake kernel module.
_import = importlib.import_module


def __getattr__(name: str) -> Any:
    # workload_dict lives beside the workload, in jfa_prof.inputs; it is still served from here for
    # the callers that take it from this module, on first use because jfa_prof.inputs imports
    # torch and reading a recorded waterfall (`waterfall --results`) does not need it.
    if name == "workload_dict":
        from jfa_prof.inputs import workload_dict

        return workload_dict
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Ablation:
    name: str
    bit: int
    removes: str


def check_pass(pass_: str) -> None:
    if pass_ not in PASSES:
        raise BadInputError(f"unknown pass {pass_!r}", hint=f"one of {', '.join(PASSES)}")


def available_ablations(pass_: str = "fwd") -> list[Ablation]:
    """The ablation switches the ``pass_`` kernel of this build has, in its order."""
    check_pass(pass_)
    module = KERNEL_MODULES[pass_]
    try:
        mod = _import(module)
    except ImportError as e:
        raise JfaProfError(f"no {pass_} kernel to ablate: {module} does not import ({e})") from None
    table = getattr(mod, "ABLATIONS", None)
    if not table:
        raise JfaProfError(f"the {pass_} kernel of this build has no ablation switches ({module}.ABLATIONS)")
    return [Ablation(name, int(bit), str(removes)) for name, (bit, removes) in table.items()]


def ablation_plan(pass_: str = "fwd", names: Sequence[str] | None = None) -> list[Ablation]:
    """The ablations to measure, in the order they will be applied cumulatively: ``names`` in
    the order given, or all of them in the kernel's order."""
    known = {a.name: a for a in available_ablations(pass_)}
    if not names:
        return list(known.values())
    unknown = [n for n in names if n not in known]
    if unknown:
        raise BadInputError(f"unknown {pass_} ablation(s): {', '.join(unknown)}", hint=f"known: {', '.join(known)}")
    if len(set(names)) != len(names):
        raise BadInputError(f"ablation listed twice: {', '.join(names)}")
    return [known[n] for n in names]


# ---------------------------------------------------------------------------------------------
# launchers: mask -> zero-argument callable that runs the pass once
# ---------------------------------------------------------------------------------------------

def _fwd_launcher(x, schedule: str, profile: int = 0) -> Callable[[int], Callable[[], Any]]:
    import torch

    from jfa_prof.kernels import fwd
    from jfa_prof.kernels.attention import fwd_launch
    from jfa_prof.schedule import fwd_work_list

    w = x.workload
    q_off = None if w.broadcast_q else x.q_offsets
    n_ctas = torch.cuda.get_device_properties(x.q.device).multi_processor_count
    work = fwd_work_list(x.kv_offsets, q_off, x.q.shape[0] if w.broadcast_q else None, w.H, x.max_seq_len_q,
                         block_m=fwd.BLOCK_M, window=w.window, causal=w.causal,
                         schedule=schedule, n_ctas=n_ctas)
    scale = 1.0 / math.sqrt(w.D)

    def make(mask: int) -> Callable[[], Any]:
        # Baseline too goes through ablate= (with 0), so every timing takes the same path.
        return lambda: fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=scale,
                                  window=w.window, causal=w.causal, broadcast_q=w.broadcast_q, schedule=schedule,
                                  work=work, ablate=mask, profile=profile)
    return make


def _bwd_launcher(x, schedule: str, dq: str | None = None, profile: int = 0) -> Callable[[int], Callable[[], Any]]:
    from jfa_prof.inputs import upstream_grad
    from jfa_prof.kernels.attention import bwd_launch, fwd_launch

    w = x.workload
    dq_mode, stages = bwd_dq(dq or DEFAULT_DQ_NAME)
    q_off = None if w.broadcast_q else x.q_offsets
    scale = 1.0 / math.sqrt(w.D)
    # The forward runs once: its O and log-sum-exp, and a fixed upstream gradient, feed every timing.
    o, lse, _, _ = fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=scale, window=w.window,
                              causal=w.causal, broadcast_q=w.broadcast_q)
    do = upstream_grad(x, o)

    def make(mask: int) -> Callable[[], Any]:
        return lambda: bwd_launch(x.q, x.k, x.v, o, lse, do, q_off, x.kv_offsets, x.max_seq_len_q, x.max_seq_len_kv,
                                  sm_scale=scale, window=w.window, causal=w.causal, broadcast_q=w.broadcast_q,
                                  dq=dq_mode, dq_stages=stages, schedule=schedule, ablate=mask, profile=profile)
    return make


# The backward's dQ reductions by CLI name: (bwd_launch dq, staging buffers).
BWD_DQ = {"tma": ("tma", 2), "tma1": ("tma", 1), "atomic": ("atomic", 1)}


DEFAULT_DQ_NAME = "tma1"  # the ``--dq`` name of the reduction the op uses (``jfa_prof.kernels.bwd.DEFAULT_DQ``)


def bwd_dq(name: str) -> tuple[str, int]:
    """(dq mode, stages) of a ``--dq`` name."""
    if name not in BWD_DQ:
        raise BadInputError(f"unknown dQ reduction {name!r}", hint=f"one of {', '.join(BWD_DQ)}")
    return BWD_DQ[name]


def default_schedule(pass_: str, broadcast_q: bool = True) -> str:
    """The schedule a pass runs when none is named, as the op does: the forward's (dynamic); the
    backward's for its inputs (`kernels/bwd.py default_schedule`: round-robin for broadcast-Q, the
    queue for jagged Q)."""
    check_pass(pass_)
    if pass_ == "fwd":
        return DEFAULT_SCHEDULE
    from jfa_prof.kernels.bwd import default_schedule as bwd_default

    return bwd_default(broadcast_q)


def check_schedule(pass_: str, schedule: str) -> None:
    from jfa_prof.kernels.bwd import SCHEDULES as BWD_SCHEDULES
    from jfa_prof.schedule import SCHEDULES

    known = SCHEDULES if pass_ == "fwd" else BWD_SCHEDULES
    if schedule not in known:
        raise BadInputError(f"unknown {pass_} schedule {schedule!r}", hint=f"one of {', '.join(known)}")


def pass_options(pass_: str, schedule: str | None = None, dq: str | None = None, *, dq_flag: str = "--dq",
                 broadcast_q: bool = True) -> str:
    """Check a pass and the options that go with it (a schedule of that pass, a dQ reduction for
    the backward only); returns the schedule, the pass's default for the inputs when none is named
    (`broadcast_q`: whether the workload broadcasts Q)."""
    schedule = schedule or default_schedule(pass_, broadcast_q)
    check_schedule(pass_, schedule)
    if dq is not None:
        if pass_ != "bwd":
            raise BadInputError(f"{dq_flag} applies to the backward only", hint="add --pass bwd")
        bwd_dq(dq)
    return schedule


def make_launcher(x, pass_: str = "fwd", schedule: str | None = None,
                  dq: str | None = None, *, profile: int = 0) -> Callable[[int], Callable[[], Any]]:
    """For inputs ``x`` (:class:`~jfa_prof.inputs.JaggedInputs` on the GPU): a function from an
    ablation mask to a callable that runs ``pass_`` once with those ablations. ``dq`` (backward
    only) names the dQ reduction of :data:`BWD_DQ`; ``profile`` is the instrumentation level."""
    pass_options(pass_, schedule, dq)  # bad options before the inputs are looked at
    schedule = schedule or default_schedule(pass_, x.workload.broadcast_q)
    if pass_ == "fwd":
        return _fwd_launcher(x, schedule, profile)
    return _bwd_launcher(x, schedule, dq, profile)


# ---------------------------------------------------------------------------------------------
# measuring
# ---------------------------------------------------------------------------------------------

def measure_waterfall(launcher: Callable[[int], Callable[[], Any]], plan: Sequence[Ablation], *,
                      pass_: str = "fwd", cumulative: bool = False, timer: Callable[..., float] | None = None,
                      rep_ms: float | None = None, warmup_ms: float | None = None,
                      on_step: Callable[[str], None] | None = None) -> WaterfallTimings:
    """Time the baseline twice, each ablation alone, and with ``cumulative`` each prefix of
    ``plan`` (ablations 1..k applied together). ``on_step(description)`` is called before each
    timing, for progress bars; :func:`n_steps` says how many there will be.

    Every ablated kernel is run once before it is timed, so a variant that fails to compile or
    launch fails here with its name, not inside the timer.
    """
    from jfa_prof import timing

    timer = timer or timing.bench
    kw = {k: v for k, v in (("rep_ms", rep_ms), ("warmup_ms", warmup_ms)) if v is not None}
    step = on_step or (lambda _d: None)

    def time_mask(desc: str, mask: int) -> float:
        step(desc)
        fn = launcher(mask)
        try:
            fn()
        except Exception as e:
            raise JfaProfError(f"{pass_} kernel with ablations {desc!r} (mask {mask:#x}) failed: "
                               f"{type(e).__name__}: {e}") from e
        return timer(fn, **kw)

    base = time_mask("baseline", 0)
    alone = {a.name: time_mask(a.name, a.bit) for a in plan}
    # Timed after the ablations rather than right after the first baseline, so that the two
    # baseline timings bracket the run and their gap includes any drift (clocks, heat) within it.
    repeat = time_mask("baseline (repeat)", 0)
    cum: dict[str, float] = {}
    if cumulative and plan:
        mask = 0
        for i, a in enumerate(plan):
            mask |= a.bit
            # The first prefix is the first ablation alone: the same kernel, already timed.
            cum[a.name] = alone[a.name] if i == 0 else time_mask("+".join(p.name for p in plan[:i + 1]), mask)
    return WaterfallTimings(
        baseline_ms=base, baseline_repeat_ms=repeat, pass_=pass_,
        ablations=tuple(AblationTiming(a.name, a.removes, alone[a.name], cum.get(a.name), a.bit) for a in plan))


def n_steps(plan: Sequence[Ablation], cumulative: bool) -> int:
    """How many timings :func:`measure_waterfall` makes (for a progress bar's total)."""
    return 2 + len(plan) + (max(len(plan) - 1, 0) if cumulative else 0)


# ---------------------------------------------------------------------------------------------
# record files
# ---------------------------------------------------------------------------------------------

@dataclass
class WaterfallRecord:
    """A measured waterfall as it is written to disk: the raw timings (the decomposition is
    recomputed on load, so files stay valid when the analysis improves), what was measured
    and where."""

    timings: WaterfallTimings
    workload: dict[str, Any]
    schedule: str
    meta: dict[str, Any] = field(default_factory=dict)
    flops: float | None = None
    dq: str | None = None  # the backward's dQ reduction (BWD_DQ name)

    @property
    def label(self) -> str:
        return str(self.workload.get("label", ""))

    @property
    def variant(self) -> str:
        """What ran, for titles: the schedule, and the backward's dQ reduction."""
        return self.schedule + (f" · dQ {self.dq}" if self.dq else "")

    @property
    def baseline_tflops(self) -> float | None:
        return self.flops / self.timings.baseline_ms / 1e9 if self.flops else None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": RECORD_KIND, "pass": self.timings.pass_, "workload": self.workload,
                "schedule": self.schedule, "flops": self.flops, "meta": self.meta,
                "timings": self.timings.to_dict(), **({"dq": self.dq} if self.dq else {})}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> WaterfallRecord:
        return cls(timings=WaterfallTimings.from_dict(d["timings"]), workload=dict(d.get("workload") or {}),
                   schedule=d.get("schedule", "?"), meta=dict(d.get("meta") or {}), flops=d.get("flops"),
                   dq=d.get("dq"))


def load_waterfall(path: str | Path) -> WaterfallRecord:
    """A waterfall written by ``jfa-prof waterfall --save`` or ``--json``."""
    path = Path(path)
    d = read_json_file(path, "a recorded waterfall")
    if not isinstance(d, dict) or d.get("kind") != RECORD_KIND or "timings" not in d:
        raise BadInputError(f"{path} is not a recorded waterfall",
                            hint="write one with `jfa-prof waterfall --save FILE` on a GPU")
    try:
        return WaterfallRecord.from_dict(d)
    except (KeyError, TypeError, ValueError) as e:
        raise BadInputError(f"{path}: malformed waterfall record ({type(e).__name__}: {e})") from None
