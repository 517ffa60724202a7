"""The public op as users call it, on the GPU: inputs in the layouts models hand over, empty work,
the offsets checks, no host synchronization, reuse across calls, CUDA graphs, and a small model
trained under torch.compile. Forward and backward against the fp32 reference, outputs poisoned
where a buffer is ours to give."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bwd_cases import check_grads, reference

pytestmark = pytest.mark.gpu

BF16_TOL = 1e-2
LENGTHS = [0, 1, 127, 128, 129, 300, 1000, 0, 5]


def _offsets(lengths, device):
    import torch

    from jfa_prof.inputs import offsets_from_lengths

    return offsets_from_lengths(torch.tensor(lengths)).to(device)


def _attend(q, k, v, q_off, kv_off, lengths, q_lengths=None, **kw):
    from jfa_prof.kernels.attention import jagged_flash_attention

    max_q = q.shape[0] if q_off is None else max(q_lengths, default=0)
    return jagged_flash_attention(q, k, v, q_off, kv_off, max_q, max(lengths, default=0), broadcast_q=q_off is None,
                                  **kw)


def _check_forward_and_backward(q, k, v, q_off, kv_off, lengths, q_lengths=None, *, do=None, causal=False):
    """The op's output and its gradients (through autograd) against the reference's."""
    import torch

    from jfa_prof.reference import reference_attention

    # detach() keeps each tensor's strides: the op gets the inputs in their own layout.
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = _attend(*leaves, q_off, kv_off, lengths, q_lengths, causal=causal)
    ref_o, _ = reference_attention(q, k, v, q_off, kv_off, causal=causal, broadcast_q=q_off is None)
    assert not torch.isnan(o).any()
    err = (o.float() - ref_o).norm() / ref_o.norm().clamp_min(1e-6)
    assert err <= BF16_TOL, f"output relative error {err:.2e}"
    if do is None:
        do = torch.randn_like(o)
    got = torch.autograd.grad(o, leaves, do)
    _, _, ref = reference(q, k, v, q_off, kv_off, do.contiguous(), causal=causal)
    check_grads(got, ref, "bf16", q.dtype)


def _strided_case(device, layout, broadcast):
    """(q, k, v, q_off, kv_off, lengths, q_lengths) with q, k, v in `layout`."""
    import torch

    H, H_kv, D, Lq = 4, 2, 128, 100
    total = sum(LENGTHS)
    kv_off = _offsets(LENGTHS, device)
    q_rows = Lq if broadcast else total
    q_off = None if broadcast else kv_off
    if layout == "fused_kv":
        # One projection gives K and V: kv.view(T, 2, H_kv, D); k, v = kv[:, 0], kv[:, 1].
        kv = torch.randn(total, 2 * H_kv * D, device=device, dtype=torch.bfloat16).view(total, 2, H_kv, D)
        k, v = kv[:, 0], kv[:, 1]
        q = torch.randn(q_rows, H, D, device=device, dtype=torch.bfloat16)
    elif layout == "fused_qkv":
        qkv = torch.randn(total, (H + 2 * H_kv) * D, device=device, dtype=torch.bfloat16)
        q = qkv[:, :H * D].view(total, H, D)
        k = qkv[:, H * D:(H + H_kv) * D].view(total, H_kv, D)
        v = qkv[:, (H + H_kv) * D:].view(total, H_kv, D)
    elif layout == "row_slices":
        big = torch.randn(total + 16, H_kv, D, device=device, dtype=torch.bfloat16)
        k, v = big[3:3 + total], big[16:16 + total]
        q = torch.randn(q_rows + 5, H, D, device=device, dtype=torch.bfloat16)[5:]
    elif layout == "permuted":
        # Heads first, then permuted to [rows, heads, D]: heads are not packed in a row.
        k = torch.randn(H_kv, total, D, device=device, dtype=torch.bfloat16).permute(1, 0, 2)
        v = torch.randn(H_kv, total, D, device=device, dtype=torch.bfloat16).permute(1, 0, 2)
        q = torch.randn(H, q_rows, D, device=device, dtype=torch.bfloat16).permute(1, 0, 2)
    elif layout == "expanded_q":
        # One learned query row shared by all Lq positions and sequences (stride 0).
        q = torch.randn(1, H, D, device=device, dtype=torch.bfloat16).expand(q_rows, H, D)
        k = torch.randn(total, H_kv, D, device=device, dtype=torch.bfloat16)
        v = torch.randn(total, H_kv, D, device=device, dtype=torch.bfloat16)
    else:
        raise ValueError(layout)
    return q, k, v, q_off, kv_off


@pytest.mark.parametrize("layout, broadcast", [
    ("fused_kv", True), ("fused_kv", False), ("fused_qkv", False), ("row_slices", True), ("row_slices", False),
    ("permuted", True), ("permuted", False), ("expanded_q", True)])
def test_strided_inputs_forward_and_backward(cuda_device, layout, broadcast):
    q, k, v, q_off, kv_off = _strided_case(cuda_device, layout, broadcast)
    _check_forward_and_backward(q, k, v, q_off, kv_off, LENGTHS, None if broadcast else LENGTHS,
                                causal=not broadcast and layout == "fused_kv")


def test_non_contiguous_upstream_gradient(cuda_device):
    import torch

    q, k, v, q_off, kv_off = _strided_case(cuda_device, "fused_kv", True)
    rows = q.shape[0] * (kv_off.numel() - 1)
    do = torch.randn(q.shape[1], rows, q.shape[2], device=cuda_device, dtype=q.dtype).transpose(0, 1)
    assert not do.is_contiguous()
    _check_forward_and_backward(q, k, v, q_off, kv_off, LENGTHS, do=do)
    # An expanded (stride-0) gradient, as autograd hands over for o.sum().
    do = torch.ones(1, 1, 1, device=cuda_device, dtype=q.dtype).expand(rows, q.shape[1], q.shape[2])
    _check_forward_and_backward(q, k, v, q_off, kv_off, LENGTHS, do=do)


@pytest.mark.parametrize("broadcast", [True, False])
def test_descriptors_built_in_the_kernel_match_host_made_ones(cuda_device, broadcast):
    """The kernels build their TMA descriptors from pointers, row counts and strides; the host-made
    descriptors (kept to compare the two) must read and write exactly the same elements."""
    import torch

    from jfa_prof.kernels.attention import bwd_launch, fwd_launch

    q, k, v, q_off, kv_off = _strided_case(cuda_device, "fused_kv", broadcast)
    max_q = q.shape[0] if broadcast else max(LENGTHS)
    kw = dict(sm_scale=0.1, window=None, causal=not broadcast, broadcast_q=broadcast)
    outs = [fwd_launch(q, k, v, q_off, kv_off, max_q, host_descriptors=h, **kw)[:2] for h in (False, True)]
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    o, lse = outs[0]
    do = torch.randn_like(o)
    grads = [bwd_launch(q, k, v, o, lse, do, q_off, kv_off, max_q, max(LENGTHS), host_descriptors=h, **kw)
             for h in (False, True)]
    assert torch.equal(grads[0][1], grads[1][1]) and torch.equal(grads[0][2], grads[1][2])  # dK, dV: no atomics
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-2, atol=1e-2)  # dQ: reduce-adds in any order


@pytest.mark.parametrize("case", ["all_empty_bcast", "all_empty_jagged", "lq_zero", "jagged_no_queries"])
def test_empty_work_gives_zeros_and_zero_gradients(cuda_device, case):
    import torch

    H, H_kv, D = 4, 2, 64
    kv_lengths = {"lq_zero": [3, 0, 5], "jagged_no_queries": [3, 0, 5]}.get(case, [0, 0, 0])
    q_lengths = [0, 0, 0]
    kv_off = _offsets(kv_lengths, cuda_device)
    k = torch.randn(sum(kv_lengths), H_kv, D, device=cuda_device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    if case in ("all_empty_bcast", "lq_zero"):
        q = torch.randn(0 if case == "lq_zero" else 7, H, D, device=cuda_device, dtype=torch.bfloat16,
                        requires_grad=True)
        q_off = None
    else:
        q = torch.randn(0, H, D, device=cuda_device, dtype=torch.bfloat16, requires_grad=True)
        q_off = _offsets(q_lengths, cuda_device)
    o, lse = _attend(q, k, v, q_off, kv_off, kv_lengths, q_lengths, return_lse=True)
    assert o.shape == ((3 * q.shape[0] if q_off is None else 0), H, D)
    assert torch.all(o == 0) and torch.all(lse == float("-inf"))
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.randn_like(o), allow_unused=True)
    for g, t in zip((dq, dk, dv), (q, k, v)):
        assert g.shape == t.shape and torch.all(g == 0)


_BAD_CALL = """
import sys, torch
from jfa_prof.kernels.attention import jagged_flash_attention
case = sys.argv[1]
dev = "cuda"
q = torch.randn(350, 4, 64, device=dev, dtype=torch.bfloat16)
k = torch.randn(350, 4, 64, device=dev, dtype=torch.bfloat16)
off = torch.tensor([0, 300, 350], dtype=torch.int32, device=dev)
if case == "short_max_q":
    o = jagged_flash_attention(q, k, k, off, off, 100, 300)
elif case == "decreasing":
    q_off = torch.tensor([0, 300, 300, 350], dtype=torch.int32, device=dev)
    kv_off = torch.tensor([0, 300, 250, 350], dtype=torch.int32, device=dev)
    o = jagged_flash_attention(q, k, k, q_off, kv_off, 300, 300)
print("call returned", flush=True)
torch.cuda.synchronize()
print("synchronized", flush=True)
"""


@pytest.mark.parametrize("case, rule", [("short_max_q", "a q sequence is longer than max_seq_len_q"),
                                        ("decreasing", "kv_offsets must be non-decreasing")])
def test_broken_offsets_rules_fail_at_the_next_synchronization(cuda_device, case, rule):
    # A device assertion ends the process's CUDA context, so the call runs in a child process. CUDA
    # reports it at the next synchronization, or earlier at the call's next allocation once the GPU
    # has run the check: either way the program stops before it can read a result.
    run = subprocess.run([sys.executable, "-c", _BAD_CALL, case], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).parent.parent)
    out = run.stdout + run.stderr
    assert "synchronized" not in run.stdout and run.returncode != 0, out[-3000:]
    assert rule in out, out[-3000:]


def test_default_call_never_synchronizes(cuda_device):
    import torch

    q, k, v, q_off, kv_off = _strided_case(cuda_device, "fused_kv", True)
    q, k, v = (t.detach().requires_grad_() for t in (q.contiguous(), k.contiguous(), v.contiguous()))
    o = _attend(q, k, v, None, kv_off, LENGTHS)  # compiles the kernels
    torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    fresh = kv_off.clone()  # a new offsets tensor: the whole path, checks and work list included
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = _attend(q, k, v, None, fresh, LENGTHS)
        grads = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
        o = _attend(q, k, v, None, fresh, LENGTHS)  # and the cached path
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(g).all() for g in grads)


def test_reuse_across_calls_and_in_place_offsets_changes(cuda_device):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from jfa_prof.reference import reference_attention

    q, k, v, _, kv_off = _strided_case(cuda_device, "row_slices", True)
    _attend(q, k, v, None, kv_off, LENGTHS)
    torch.cuda.synchronize()

    def kernels_of_one_call():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            _attend(q, k, v, None, kv_off, LENGTHS)
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.device_type.name == "CUDA"]

    names = kernels_of_one_call()
    assert sum("_jfa_fwd" in n for n in names) == 1
    assert not any("_plan_keys" in n for n in names), names  # the kept work list
    assert sum("_check_offsets" in n for n in names) == 1, names  # the checks run every call
    # Same tensor, new values (in place): the list and the checks are rebuilt, the answer is right.
    new_lengths = LENGTHS[::-1]
    kv_off.copy_(_offsets(new_lengths, cuda_device))
    o = _attend(q, k, v, None, kv_off, new_lengths)
    ref, _ = reference_attention(q, k, v, None, kv_off, broadcast_q=True)
    assert (o.float() - ref).norm() / ref.norm() <= BF16_TOL


def test_jagged_offsets_changed_behind_the_version_counter_still_give_the_right_answer(cuda_device):
    # `.data` writes (like collectives and graph replays) leave the version counter alone, and which
    # tiles a jagged-Q list holds depends on the query lengths: such lists are built every call.
    from jfa_prof.reference import reference_attention

    q, k, v, q_off, kv_off = _strided_case(cuda_device, "row_slices", False)
    _attend(q, k, v, kv_off, kv_off, LENGTHS, LENGTHS)
    version = kv_off._version
    new_lengths = LENGTHS[::-1]
    kv_off.data.copy_(_offsets(new_lengths, cuda_device))
    assert kv_off._version == version
    o = _attend(q, k, v, kv_off, kv_off, new_lengths, new_lengths)
    ref, _ = reference_attention(q, k, v, kv_off, kv_off)
    assert (o.float() - ref).norm() / ref.norm() <= BF16_TOL


@pytest.mark.parametrize("deterministic", [False, True])
def test_training_step_captured_in_a_cuda_graph(cuda_device, deterministic):
    import torch

    from jfa_prof import timing
    from jfa_prof.reference import reference_attention

    # Jagged Q: which tiles the work list holds depends on the lengths, so a replay that reused the
    # list of the captured offsets would be wrong after new offsets are copied in.
    q, k, v, _, kv_off = _strided_case(cuda_device, "fused_kv", False)
    q = q.detach().requires_grad_()
    kv = k.detach().requires_grad_()  # k and v as the same leaf's views would share .grad; keep them apart
    vv = v.detach().contiguous().requires_grad_()
    do = torch.randn(q.shape, device=cuda_device, dtype=q.dtype)

    def step():
        o = _attend(q, kv, vv, kv_off, kv_off, LENGTHS, LENGTHS, deterministic=deterministic)
        return (o, *torch.autograd.grad(o, (q, kv, vv), do))

    replay = timing.cuda_graphed(step, warmup=2)
    eager = step()
    captured = replay()
    torch.cuda.synchronize()
    for name, e, c in zip(("o", "dq", "dk", "dv"), eager, captured):
        if deterministic or name != "dq":
            assert torch.equal(e, c), f"{name} differs between eager and graph replay"
        else:  # dQ's atomics add in whatever order blocks finish
            torch.testing.assert_close(c, e, rtol=2e-2, atol=2e-2)
    # New offsets copied into the captured tensor: the replay rebuilds its own work list.
    new_lengths = LENGTHS[::-1]
    kv_off.copy_(_offsets(new_lengths, cuda_device))
    replay()
    torch.cuda.synchronize()
    ref, _ = reference_attention(q.detach(), kv.detach(), vv.detach(), kv_off, kv_off)
    assert (captured[0].float() - ref).norm() / ref.norm() <= BF16_TOL


def test_model_with_fused_kv_projection_trains_under_torch_compile(cuda_device, tmp_path):
    import torch

    from jfa_prof.reference import reference_attention

    torch.manual_seed(0)
    H, H_kv, D, Lq, d_model = 4, 2, 64, 32, 96
    lengths = [0, 1, 40, 129, 7, 300, 64, 2]
    kv_off = _offsets(lengths, cuda_device)
    T, B = sum(lengths), len(lengths)
    x = torch.randn(T, d_model, device=cuda_device)
    target = torch.randn(B * Lq, 1, device=cuda_device)

    class Model(torch.nn.Module):
        def __init__(self, attend):
            super().__init__()
            self.attend = attend
            self.q = torch.nn.Parameter(torch.randn(Lq, H, D) * 0.5)
            self.kv = torch.nn.Linear(d_model, 2 * H_kv * D)
            self.head = torch.nn.Linear(H * D, 1)

        def forward(self, x, kv_off):
            kv = self.kv(x).to(torch.bfloat16).view(-1, 2, H_kv, D)
            o = self.attend(self.q.to(torch.bfloat16), kv[:, 0], kv[:, 1], kv_off)
            return self.head(o.float().reshape(o.shape[0], H * D))

    def ours(q, k, v, kv_off):
        return _attend(q, k, v, None, kv_off, lengths)

    def fp32(q, k, v, kv_off):
        return reference_attention(q.float(), k.float(), v.float(), None, kv_off, broadcast_q=True)[0]

    def train(model, step_fn):
        opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        losses = []
        for _ in range(30):
            loss = torch.nn.functional.mse_loss(step_fn(x, kv_off), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    model = Model(ours).to(cuda_device)
    ref_model = Model(fp32).to(cuda_device)
    ref_model.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    got, want = train(model, compiled), train(ref_model, ref_model)
    (tmp_path / "losses.json").write_text(json.dumps({"jfa": got, "fp32": want}))
    assert got[-1] < 0.8 * got[0], f"the loss did not fall: {got[0]:.4f} -> {got[-1]:.4f}"
    worst = max(abs(a - b) / b for a, b in zip(got, want))
    assert worst <= 2e-2, f"loss curve departs from the fp32 model's by {worst:.2%}: {got} vs {want}"


def test_math_scale_default(cuda_device):
    # The default softmax scale is 1/sqrt(D): the same as passing it.
    import torch

    q, k, v, _, kv_off = _strided_case(cuda_device, "row_slices", True)
    a = _attend(q, k, v, None, kv_off, LENGTHS)
    b = _attend(q, k, v, None, kv_off, LENGTHS, sm_scale=1 / math.sqrt(q.shape[2]))
    assert torch.equal(a, b)
