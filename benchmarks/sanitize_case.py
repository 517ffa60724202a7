"""A small forward case of every schedule (and one instrumented launch), also with a single query
block (the 64-key KV blocks), then the backward with every dQ reduction and schedule, and causal
jagged self-attention under each schedule (the forward's lists grouped by sequence), checked against
the reference: the target of compute-sanitizer runs.

    compute-sanitizer --tool memcheck python benchmarks/sanitize_case.py
"""
import math

import torch

from jfa_prof.inputs import offsets_from_lengths
from jfa_prof.kernels.attention import bwd_launch, fwd_launch
from jfa_prof.reference import reference_attention

torch.manual_seed(0)
lengths = torch.tensor([0, 1, 129, 300, 5])
kv_off = offsets_from_lengths(lengths).cuda()
k = torch.randn(int(lengths.sum()), 2, 128, device="cuda", dtype=torch.bfloat16)
v = torch.randn_like(k)
q = torch.randn(130, 2, 128, device="cuda", dtype=torch.bfloat16)
ref, _ = reference_attention(q, k, v, None, kv_off, broadcast_q=True)
for schedule, profile in (("static", False), ("lpt", False), ("dynamic", False), ("dynamic", True)):
    o, _, _, _ = fwd_launch(q, k, v, None, kv_off, 130, sm_scale=1 / math.sqrt(128), window=None, causal=False,
                            broadcast_q=True, schedule=schedule, profile=profile, n_ctas=4)
    err = float((o.float() - ref).norm() / ref.norm())
    print(f"{schedule} profile={profile} rel_err={err:.2e}")
    assert err < 1e-2
q_short = q[:100]  # one query block per (batch, head): 64-key KV blocks
ref_short, _ = reference_attention(q_short, k, v, None, kv_off, broadcast_q=True)
for schedule in ("lpt", "dynamic"):
    o, _, _, launch = fwd_launch(q_short, k, v, None, kv_off, 100, sm_scale=1 / math.sqrt(128), window=None,
                                 causal=False, broadcast_q=True, schedule=schedule, n_ctas=4)
    err = float((o.float() - ref_short).norm() / ref_short.norm())
    print(f"{schedule} Lq=100 block_n={launch.block_n} rel_err={err:.2e}")
    assert err < 1e-2

qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
o_ref, lse = reference_attention(qr, kr, vr, None, kv_off, broadcast_q=True)
do = torch.randn(o_ref.shape, device="cuda").to(q.dtype)
grads = torch.autograd.grad(o_ref, (qr, kr, vr), do.float())
for dq, stages, schedule in (("tma", 2, "static"), ("tma", 1, "dynamic"), ("atomic", 1, "static"),
                             ("deterministic", 1, "dynamic")):
    got = bwd_launch(q, k, v, o_ref.detach().to(q.dtype), lse.detach(), do, None, kv_off, 130, 300,
                     sm_scale=1 / math.sqrt(128), window=None, causal=False, broadcast_q=True, dq=dq, dq_stages=stages,
                     schedule=schedule, n_ctas=4)
    err = max(float((g.float() - r).norm() / r.norm()) for g, r in zip(got, grads))
    print(f"bwd dq={dq}x{stages} {schedule} rel_err={err:.2e}")
    assert err < 2e-2

# Causal jagged self-attention: the blocks below the diagonal skip the mask, the ones it crosses keep it.
q_j = torch.randn(int(lengths.sum()), 2, 128, device="cuda", dtype=torch.bfloat16)
qr = q_j.detach().float().requires_grad_()
o_ref, lse = reference_attention(qr, kr, vr, kv_off, kv_off, causal=True)
do = torch.randn(o_ref.shape, device="cuda").to(q.dtype)
grads = torch.autograd.grad(o_ref, (qr, kr, vr), do.float())
for schedule in ("static", "lpt", "dynamic"):
    o, _, _, _ = fwd_launch(q_j, k, v, kv_off, kv_off, 300, sm_scale=1 / math.sqrt(128), window=None, causal=True,
                            broadcast_q=False, schedule=schedule, n_ctas=4)
    err = float((o.float() - o_ref.detach()).norm() / o_ref.detach().norm())
    print(f"fwd causal {schedule} rel_err={err:.2e}")
    assert err < 1e-2
for schedule in ("static", "dynamic"):
    got = bwd_launch(q_j, k, v, o_ref.detach().to(q.dtype), lse.detach(), do, kv_off, kv_off, 300, 300,
                     sm_scale=1 / math.sqrt(128), window=None, causal=True, broadcast_q=False, schedule=schedule,
                     n_ctas=4)
    err = max(float((g.float() - r).norm() / r.norm()) for g, r in zip(got, grads))
    print(f"bwd causal {schedule} rel_err={err:.2e}")
    assert err < 2e-2
