"""How close the op's jagged-causal autograd comes to the GPU tests' tolerances over many fresh
random inputs (the case of tests/test_bwd_gpu.py::test_autograd_through_the_op[jagged-causal]):
the worst of each error over the runs, and every run that would fail.

    python benchmarks/grad_margins.py 60
"""
import sys

import torch

sys.path.insert(0, ".")
from jfa_prof.kernels.attention import jagged_flash_attention  # noqa: E402
from tests.bwd_cases import REL_TOL, ROW_TOL, ZERO_TOL, assert_errors, grad_errors, make_case, reference  # noqa: E402
from tests.test_bwd_gpu import LENGTHS, Q_LENGTHS  # noqa: E402

dev = torch.device("cuda", 0)
worst: dict[str, float] = {}
fails = 0
for i in range(int(sys.argv[1])):
    q, k, v, q_off, kv_off = make_case(dev, LENGTHS, H=2, H_kv=2, D=128, q_lengths=Q_LENGTHS)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o, _ = jagged_flash_attention(q, k, v, q_off, kv_off, max(Q_LENGTHS), max(LENGTHS), return_lse=True, causal=True)
    do = torch.randn_like(o)
    got = torch.autograd.grad(o, (q, k, v), do)
    o_ref, _, ref = reference(q, k, v, q_off, kv_off, do, causal=True)
    o_err = float((o.detach().float() - o_ref).norm() / o_ref.norm())
    worst["o.rel"] = max(worst.get("o.rel", 0.0), o_err)
    bad = o_err > REL_TOL["bf16"]
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        e = grad_errors(g, r)
        for m in ("rel", "row", "zero"):
            worst[f"{name}.{m}"] = max(worst.get(f"{name}.{m}", 0.0), float(e[m]))
        try:
            assert_errors(name, e, "bf16")  # the GPU tests' own pass / fail
        except AssertionError:
            print(f"run {i}: {name} {e}")
            bad = True
    fails += bad
print(f"runs {sys.argv[1]}, failing {fails}; worst: " + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
print(f"tolerances: rel {REL_TOL['bf16']}, row {ROW_TOL['bf16']}, zero {ZERO_TOL}")
