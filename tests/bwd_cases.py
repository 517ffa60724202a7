"""Backward test cases shared by the GPU tests and the CPU interpreter run (SPEC §2).

A case is fresh random jagged inputs plus a random output gradient; the oracle is the fp32
reference's autograd. The backward kernels are fed the reference's O (rounded to the input dtype,
as the forward returns it) and log-sum-exp, so a test of the backward compiles no forward kernel.

Run as a script (`python tests/bwd_cases.py '<json list of case kwargs>'`) it computes each case's
dQ with the plain-Triton kernels in Triton's interpreter on the CPU (`interpreted_dq`) and prints
one JSON line of errors per case: the interpreter is chosen when `triton.jit` decorates the
kernels, so it needs a process of its own.
"""
from __future__ import annotations

import math

# Largest error of one row (one token and head), relative to that row's size plus a tenth of the
# mean row size: a key that one row misses or sees twice shows here even where it vanishes in the
# norm of the whole tensor. The floor keeps rows whose true gradient is tiny from dominating. In
# bf16 a dQ row of the jagged-causal case reached 5.8e-2 once in 150 fresh inputs (its tensor's
# error 2.5e-3; tests/data/grad_margins_h200.txt), hence 1e-1.
REL_TOL = {"bf16": 2e-2, "fp16": 5e-3}
ROW_TOL = {"bf16": 1e-1, "fp16": 1e-2}
ZERO_TOL = 1e-3  # a gradient that is exactly 0 in fp32 (a one-key softmax) may carry this much noise


def make_case(device, lengths, H, H_kv, D, *, Lq=None, q_lengths=None, dtype="bf16"):
    """(q, k, v, q_offsets, kv_offsets): broadcast-Q when `Lq` is given (q_offsets None)."""
    import torch

    from jfa_prof.inputs import offsets_from_lengths

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    kv_lens = torch.tensor(lengths, dtype=torch.int64)
    kv_off = offsets_from_lengths(kv_lens).to(device)
    k = torch.randn(int(kv_lens.sum()), H_kv, D, device=device).to(dt)
    v = torch.randn(int(kv_lens.sum()), H_kv, D, device=device).to(dt)
    if Lq is not None:
        return torch.randn(Lq, H, D, device=device).to(dt), k, v, None, kv_off
    q_lens = torch.tensor(q_lengths if q_lengths is not None else lengths, dtype=torch.int64)
    q = torch.randn(int(q_lens.sum()), H, D, device=device).to(dt)
    return q, k, v, offsets_from_lengths(q_lens).to(device), kv_off


def reference(q, k, v, q_off, kv_off, do, *, window=None, causal=False):
    """fp32 (o, lse, (dq, dk, dv)) from the reference and its autograd."""
    import torch

    from jfa_prof.reference import reference_attention

    qr, kr, vr = (t.detach().float().requires_grad_() for t in (q, k, v))
    o, lse = reference_attention(qr, kr, vr, q_off, kv_off, window_size=window, causal=causal,
                                 broadcast_q=q_off is None)
    grads = torch.autograd.grad(o, (qr, kr, vr), do.float(), allow_unused=True)
    grads = tuple(torch.zeros_like(t) if g is None else g for t, g in zip((qr, kr, vr), grads))
    return o.detach(), lse.detach(), grads


def grad_errors(got, ref) -> dict:
    """Whole-tensor relative error, worst row error (see ROW_TOL), largest |got| where ref == 0."""
    got = got.float()
    diff = (got - ref).flatten(1)
    ref_rows = ref.flatten(1).norm(dim=1)
    if ref.norm() == 0:
        return {"rel": 0.0, "row": 0.0, "zero": float(got.abs().max()) if got.numel() else 0.0, "nan": False}
    rows = diff.norm(dim=1) / (ref_rows + 0.1 * ref_rows.mean())
    return {"rel": float(diff.norm() / ref.norm()), "row": float(rows.max()), "zero": 0.0,
            "nan": bool(got.isnan().any())}


def check_grads(got: tuple, ref: tuple, dtype: str, expected_dtype) -> None:
    for name, g, r in zip(("dq", "dk", "dv"), got, ref):
        assert g.dtype == expected_dtype, f"{name} is {g.dtype}"
        assert g.shape == r.shape, f"{name} shape {tuple(g.shape)} != {tuple(r.shape)}"
        assert_errors(name, grad_errors(g, r), dtype)


def assert_errors(name: str, e: dict, dtype: str) -> None:
    assert not e["nan"], f"{name}: NaN, an element was not written or a row blew up"
    assert e["rel"] <= REL_TOL[dtype], f"{name}: relative error {e['rel']:.2e} > {REL_TOL[dtype]}"
    assert e["row"] <= ROW_TOL[dtype], f"{name}: worst row error {e['row']:.2e} > {ROW_TOL[dtype]}"
    assert e["zero"] <= ZERO_TOL, f"{name}: {e['zero']:.2e} where the gradient is exactly 0"


def run_backward(q, k, v, q_off, kv_off, *, window=None, causal=False, max_kv=None, **options):
    """The backward kernels on reference O / lse, into NaN-poisoned dK/dV; returns (got, ref).
    `options` go to `bwd_launch` (dq reduction, schedule)."""
    import torch

    from jfa_prof.kernels.attention import bwd_launch

    broadcast = q_off is None
    B = kv_off.numel() - 1
    rows = B * q.shape[0] if broadcast else q.shape[0]
    do = torch.randn(rows, q.shape[1], q.shape[2], device=q.device).to(q.dtype)
    o, lse, ref = reference(q, k, v, q_off, kv_off, do, window=window, causal=causal)
    kv_lens = (kv_off[1:] - kv_off[:-1]).tolist()
    max_q = q.shape[0] if broadcast else max((q_off[1:] - q_off[:-1]).tolist(), default=0)
    if max_kv is None:
        max_kv = max(kv_lens, default=0)
    dk_out = torch.full_like(k, float("nan"))
    dv_out = torch.full_like(v, float("nan"))
    got = bwd_launch(q, k, v, o.to(q.dtype), lse, do, q_off, kv_off, max_q, max_kv, sm_scale=1 / math.sqrt(q.shape[2]),
                     window=window, causal=causal, broadcast_q=broadcast, dk_out=dk_out, dv_out=dv_out, **options)
    if q.is_cuda:
        torch.cuda.synchronize()
    return got, ref


def _patch_interpreter() -> None:
    # fbtriton 3.7.4's interpreter: `create_dot` does not take the `two_ctas` flag the frontend now
    # passes, and multiplies bfloat16 operands (stored as uint16) as integers.
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.create_dot

    def widen(h):
        if h.dtype == tl.bfloat16:
            return interpreter.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc, *_):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    interpreter.InterpreterBuilder.create_dot = create_dot


def interpreted_dq(q, k, v, q_off, kv_off, *, window=None, causal=False):
    """dQ from the backward's plain-Triton kernels, which the interpreter can run: the delta kernel
    (rowsum(dO * O)) and the deterministic dQ kernel. The main kernel (dK, dV and the reduced dQ)
    keeps K, V, Q and dO in shared memory behind mbarriers and runs only on the GPU."""
    import torch

    from jfa_prof.kernels.attention import _bwd_delta, _deterministic_dq

    broadcast = q_off is None
    B = kv_off.numel() - 1
    rows = B * q.shape[0] if broadcast else q.shape[0]
    do = torch.randn(rows, q.shape[1], q.shape[2], device=q.device).to(q.dtype)
    o, lse, ref = reference(q, k, v, q_off, kv_off, do, window=window, causal=causal)
    H, D, rows_q = q.shape[1], q.shape[2], q.shape[0]
    # The delta kernel also zeroes the fp32 dQ accumulator and the dynamic schedule's counter for
    # the main kernel: given poisoned ones here, it must leave zeros.
    dq_acc = torch.full((rows_q, H * D), float("nan"), device=q.device)
    queue = torch.full((1, ), 7, dtype=torch.int32, device=q.device)
    delta, _ = _bwd_delta(o.to(q.dtype), do, kv_off, dq_acc, queue)
    assert torch.equal(dq_acc, torch.zeros_like(dq_acc)) and int(queue) == 0, "the delta kernel left dQ or the counter"
    q_arg = kv_off if broadcast else q_off
    acc = _deterministic_dq(q, k, v, do, lse, delta, q_arg, kv_off, 1 / math.sqrt(D), H, k.shape[1], B, rows_q,
                            window if window is not None else 0, rows, -1, window, causal, broadcast)
    dq = acc.view(rows_q, H, D).to(q.dtype)
    return dq, ref[0]


def _main(cases_json: str) -> None:
    import json
    import os

    os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
    _patch_interpreter()
    for kw in json.loads(cases_json):
        kw = dict(kw)
        window, causal = kw.pop("window", None), kw.pop("causal", False)
        got, ref = interpreted_dq(*make_case("cpu", **kw), window=window, causal=causal)
        print(json.dumps({"dq": {**grad_errors(got, ref), "dtype": str(got.dtype).removeprefix("torch."),
                                 "shape_ok": got.shape == ref.shape}}), flush=True)


if __name__ == "__main__":
    import sys

    _main(sys.argv[1])
