"""Whether an implementation's output is right: the fp32 reference and the relative error to it."""
from __future__ import annotations

import math

from jfa_prof.bench.impls import _scale

__all__ = ["DEFAULT_TOL", "bitwise_equal", "reference_output", "rel_err"]

# bf16 operands land between 1e-3 and 1e-2 against an fp32 reference; more is a wrong kernel.
DEFAULT_TOL = 1e-2


def rel_err(out, ref, rows=None) -> float:
    """‖out − ref‖ / ‖ref‖ in fp32 over ``rows`` (all when None); NaN when out has NaN there.
    For tuples (the backward's dq, dk, dv): the worst of the parts, over all their rows."""
    if isinstance(out, (tuple, list)):
        errs = [rel_err(o, r) for o, r in zip(out, ref, strict=True)]
        return float("nan") if any(math.isnan(e) for e in errs) else max(errs)
    out, ref = out.float(), ref.float()
    if rows is not None:
        out, ref = out[rows], ref[rows]
    denom = float(ref.norm())
    return float((out - ref).norm()) / denom if denom > 0 else float((out - ref).norm())


def reference_output(x, pass_: str = "fwd"):
    """The fp32 reference's output (fwd) or its gradients ``(dq, dk, dv)`` for
    `jfa_prof.inputs.upstream_grad` (bwd)."""
    import torch

    from jfa_prof.inputs import upstream_grad
    from jfa_prof.reference import reference_attention

    w = x.workload
    leaves = [t.detach().float().requires_grad_(pass_ == "bwd") for t in (x.q, x.k, x.v)]
    o = reference_attention(*leaves, None if w.broadcast_q else x.q_offsets, x.kv_offsets, sm_scale=_scale(x),
                            window_size=w.window, causal=w.causal, broadcast_q=w.broadcast_q)[0]
    if pass_ == "fwd":
        return o
    return torch.autograd.grad(o, leaves, upstream_grad(x, o).float())


def bitwise_equal(out, ref) -> bool:
    """Bit for bit the same: two tensors, or two sequences of tensors part by part (as the
    instrumented and plain builds of one kernel must be)."""
    import torch

    if isinstance(out, torch.Tensor):
        return torch.equal(out, ref)
    return len(out) == len(ref) and all(torch.equal(p, q) for p, q in zip(out, ref))
