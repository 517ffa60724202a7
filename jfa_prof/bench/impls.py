"""The implementations a run times: one :class:`Impl` per name and point, ours (the public op as
a user calls it, and with a plan built beforehand), and the backward of any forward builder.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from jfa_prof.schedule import DEFAULT_SCHEDULE

__all__ = ["Impl", "impl_kind", "jfa_impls"]


def impl_kind(name: str) -> str:
    """"jfa" for this project's implementations, "peer" for the others."""
    return "jfa" if name.startswith("jfa") else "peer"


@dataclass
class Impl:
    """One implementation at one point. ``build()`` does the setup that is not timed and returns
    ``(run, output)``: ``run()`` is what is timed; ``output(run())`` is the attention output as
    ``[rows, H, D]`` in packed order, for the checks (also not timed)."""

    name: str
    build: Callable[[], tuple[Callable[[], Any], Callable[[Any], Any]]]
    kind: str = ""
    note: str = ""

    def __post_init__(self):
        self.kind = self.kind or impl_kind(self.name)


def _scale(x) -> float:
    return 1.0 / math.sqrt(x.workload.D)


def jfa_impls(x, schedules: Sequence[str] = (DEFAULT_SCHEDULE,), pass_: str = "fwd") -> list[Impl]:
    """Per schedule: ``jfa-<s>``, the public op as a user calls it (default arguments, the
    schedule named only where it is not the default; for the backward, its gradient through
    autograd), and for the forward ``jfa-<s>-planned``, the op with a plan built beforehand and
    ``validate=False``, as a model that shares one plan across its attention layers runs it."""
    if pass_ == "bwd":
        return [Impl(f"jfa-{s}", (lambda s=s: _backward(x, lambda xg: _jfa_op(xg, s))),
                     note="backward of the public op as called (autograd)") for s in schedules]
    out = []
    for s in schedules:
        out.append(Impl(f"jfa-{s}", (lambda s=s: _jfa_op(x, s)), note=f"public op as called, {s} schedule"))
        out.append(Impl(f"jfa-{s}-planned", (lambda s=s: _jfa_op(x, s, planned=True)),
                        note=f"public op, {s} plan built beforehand, validate=False"))
    return out


def _jfa_op(x, schedule: str, planned: bool = False):
    """The public op as a model calls it: broadcast-Q without q_offsets, the mask's own arguments
    only, everything else at its default. ``planned``: with a plan and ``validate=False``."""
    from jfa_prof.kernels.attention import jagged_flash_attention, plan_attention

    w = x.workload
    q_off = None if w.broadcast_q else x.q_offsets
    kw: dict[str, Any] = {}
    if w.broadcast_q:
        kw["broadcast_q"] = True
    if w.window is not None:
        kw["window_size"] = w.window
    if w.causal:
        kw["causal"] = True
    if schedule != DEFAULT_SCHEDULE:
        kw["schedule"] = schedule
    if planned:
        kw["plan"] = plan_attention(x.kv_offsets, q_off,
                                    max_seq_len_q=x.q.shape[0] if w.broadcast_q else x.max_seq_len_q, H=w.H,
                                    window_size=w.window, causal=w.causal, broadcast_q=w.broadcast_q,
                                    schedule=schedule)
        kw["validate"] = False

    def run():
        return jagged_flash_attention(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, x.max_seq_len_kv, **kw)
    return run, lambda o: o


def _backward(x, forward: Callable[[Any], tuple[Callable[[], Any], Callable[[Any], Any]]]):
    """``(run, output)`` of the backward pass of ``forward`` (a builder like the forward peers'):
    the forward runs once here, on leaf copies of q, k, v, and ``run()`` is the gradient of that
    output with a fixed upstream gradient (graph kept, so it can be timed again). ``output``
    gives ``(dq, dk, dv)`` in the inputs' layout: for broadcast-Q, dq is the sum over the batch.
    What the forward saved for the backward (a repeated Q, for peers without broadcast) is in
    the setup memory; what the backward allocates (a repeated dQ) in its peak."""
    import dataclasses

    import torch

    from jfa_prof.inputs import upstream_grad

    leaves = [t.detach().clone().requires_grad_(True) for t in (x.q, x.k, x.v)]
    xg = dataclasses.replace(x, q=leaves[0], k=leaves[1], v=leaves[2])
    run_fwd, output = forward(xg)
    o = output(run_fwd())
    do = upstream_grad(x, o)

    def run():
        return torch.autograd.grad(o, leaves, do, retain_graph=True)
    return run, lambda grads: grads
