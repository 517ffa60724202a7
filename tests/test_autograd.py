"""The op's autograd wiring (SPEC §2): `jfa_prof::jfa_fwd` differentiates through
`jfa_prof::jfa_bwd`, with shapes that fake tensors can trace, so `torch.compile(fullgraph=True)`
captures both passes. The CPU tests never launch a kernel: fake tensors run the ops' fake
implementations, and the compile test's backend only records the graphs. The GPU tests run the
real kernels through `torch.library.opcheck` and a compiled training step."""
import math

import pytest

torch = pytest.importorskip("torch")

from jfa_prof.kernels.attention import jagged_flash_attention  # noqa: E402

B, LQ, H, H_KV, D = 3, 40, 8, 2, 128
KV_LENGTHS = [30, 0, 70]
Q_LENGTHS = [5, 12, 40]


def _inputs(*, broadcast, device="cpu", requires_grad=(True, True, True)):
    total_kv = sum(KV_LENGTHS)
    rows_q = LQ if broadcast else sum(Q_LENGTHS)
    q, k, v = (torch.randn(n, h, D, device=device, dtype=torch.bfloat16).requires_grad_(rg)
               for n, h, rg in zip((rows_q, total_kv, total_kv), (H, H_KV, H_KV), requires_grad))
    kv_off = torch.tensor([0, 30, 30, 100], dtype=torch.int32, device=device)
    q_off = None if broadcast else torch.tensor([0, 5, 17, 57], dtype=torch.int32, device=device)
    return q, k, v, q_off, kv_off


def _attend(q, k, v, q_off, kv_off, **kw):
    max_q = LQ if q_off is None else max(Q_LENGTHS)
    return jagged_flash_attention(q, k, v, q_off, kv_off, max_q, max(KV_LENGTHS), broadcast_q=q_off is None,
                                  validate=False, **kw)


@pytest.mark.parametrize("broadcast", [True, False], ids=["bcast", "jagged"])
def test_fake_tensors_trace_forward_and_backward(broadcast):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v, q_off, kv_off = _inputs(broadcast=broadcast)
        o, lse = _attend(q, k, v, q_off, kv_off, causal=not broadcast, return_lse=True)
        rows = B * LQ if broadcast else sum(Q_LENGTHS)
        assert o.shape == (rows, H, D) and lse.shape == (H, rows)
        assert o.requires_grad and not lse.requires_grad, "the log-sum-exp carries no gradient"
        dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.empty_like(o))
    # Broadcast-Q: dQ has Q's shape [Lq, H, D], the sum over the batch.
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)
    assert dq.dtype == dk.dtype == dv.dtype == torch.bfloat16


def test_gradient_for_a_subset_of_inputs():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k, v, q_off, kv_off = _inputs(broadcast=True, requires_grad=(False, True, False))
        o = _attend(q, k, v, q_off, kv_off)
        (dk, ) = torch.autograd.grad(o.sum(), (k, ))
    assert dk.shape == k.shape


def test_backward_op_is_registered_with_its_schema():
    schema = str(torch.ops.jfa_prof.jfa_bwd.default._schema)
    assert schema.startswith("jfa_prof::jfa_bwd(Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, Tensor do,")
    assert schema.endswith("-> (Tensor, Tensor, Tensor)")
    # The forward takes the KV bound the backward's grid needs; callers that predate it still work.
    assert "max_seq_len_kv=-1" in str(torch.ops.jfa_prof.jfa_fwd.default._schema)


def _recording_backend(graphs):
    """An AOTAutograd backend that keeps the forward and backward graphs and, instead of running
    them, returns zeros shaped like their outputs: the trace is the test, no kernel runs."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind):
        def compile_graph(gm, example_inputs):
            graphs[kind] = gm
            metas = [n.meta["val"] if isinstance(n, torch.fx.Node) else n for n in gm.graph.output_node().args[0]]

            def run(*args):
                return [torch.zeros(m.shape, dtype=m.dtype) if isinstance(m, torch.Tensor) else m for m in metas]

            return make_boxed_func(run)

        return compile_graph

    return aot_autograd(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"))


@pytest.mark.parametrize("broadcast", [True, False], ids=["bcast", "jagged"])
def test_torch_compile_fullgraph_captures_both_passes(broadcast):
    torch._dynamo.reset()
    graphs = {}
    step = torch.compile(lambda q, k, v, q_off, kv_off: _attend(q, k, v, q_off, kv_off, window_size=16),
                         backend=_recording_backend(graphs), fullgraph=True)
    q, k, v, q_off, kv_off = _inputs(broadcast=broadcast)
    o = step(q, k, v, q_off, kv_off)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), torch.ones_like(o))
    assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, v.shape)

    def calls(gm, name):
        return [n for n in gm.graph.nodes if n.op == "call_function" and str(n.target).startswith(name)]

    (fwd, ) = calls(graphs["forward"], "jfa_prof.jfa_fwd")
    (bwd, ) = calls(graphs["backward"], "jfa_prof.jfa_bwd")
    assert not calls(graphs["forward"], "jfa_prof.jfa_bwd") and not calls(graphs["backward"], "jfa_prof.jfa_fwd")
    # The backward gets the scalars the forward was called with: max lengths, scale, window, flags.
    # (deterministic, false by default, is left out of the traced call.)
    assert list(bwd.args[8:]) == [LQ if broadcast else max(Q_LENGTHS), max(KV_LENGTHS), 1 / math.sqrt(D), 16,
                                  False, broadcast]
    assert fwd.args[11] == max(KV_LENGTHS)


def test_deterministic_reaches_the_backward():
    torch._dynamo.reset()
    graphs = {}
    step = torch.compile(lambda q, k, v, q_off, kv_off: _attend(q, k, v, q_off, kv_off, deterministic=True),
                         backend=_recording_backend(graphs), fullgraph=True)
    o = step(*_inputs(broadcast=True))
    o.sum().backward()
    (bwd, ) = [n for n in graphs["backward"].graph.nodes if str(n.target).startswith("jfa_prof.jfa_bwd")]
    assert len(bwd.args) == 15 and bwd.args[14] is True


def test_backward_variants_are_registered():
    from jfa_prof.kernels.registry import all_variants

    names = {v.name for v in all_variants()}
    for dtype in ("bf16", "fp16"):
        for d in (64, 128):
            assert f"bwd/delta/{dtype}/d{d}" in names
            for mode in ("bcast", "bcast-window", "jagged", "jagged-causal", "jagged-window", "jagged-causal-window"):
                # The op's reduction (the TMA reduce-add), and the deterministic pair (no dQ, then
                # the dQ kernel).
                for dq in ("tma1", "det", "dq-det"):
                    assert f"bwd/{mode}/{dtype}/d{d}/{dq}" in names


# ---- on the GPU ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("broadcast", [True, False], ids=["bcast", "jagged"])
def test_opcheck(cuda_device, broadcast):
    q, k, v, q_off, kv_off = _inputs(broadcast=broadcast, device=cuda_device)
    max_q = LQ if broadcast else max(Q_LENGTHS)
    fwd_args = (q, k, v, kv_off if broadcast else q_off, kv_off, max_q, 1 / math.sqrt(D), -1, not broadcast,
                broadcast, "lpt", max(KV_LENGTHS))
    torch.library.opcheck(torch.ops.jfa_prof.jfa_fwd.default, fwd_args)
    o, lse = torch.ops.jfa_prof.jfa_fwd(*fwd_args)
    do = torch.randn_like(o)
    bwd_args = (q.detach(), k.detach(), v.detach(), o.detach(), lse, do, kv_off if broadcast else q_off, kv_off,
                max_q, max(KV_LENGTHS), 1 / math.sqrt(D), -1, not broadcast, broadcast)
    torch.library.opcheck(torch.ops.jfa_prof.jfa_bwd.default, bwd_args)
    torch.library.opcheck(torch.ops.jfa_prof.jfa_bwd.default, (*bwd_args, True))  # deterministic


@pytest.mark.gpu
def test_compiled_training_step_matches_eager(cuda_device):
    q, k, v, q_off, kv_off = _inputs(broadcast=True, device=cuda_device)

    def loss(q, k, v, q_off, kv_off):
        return (_attend(q, k, v, q_off, kv_off).float() ** 2).sum()

    torch._dynamo.reset()
    eager = torch.autograd.grad(loss(q, k, v, q_off, kv_off), (q, k, v))
    compiled_loss = torch.compile(loss, backend="aot_eager", fullgraph=True)
    compiled = torch.autograd.grad(compiled_loss(q, k, v, q_off, kv_off), (q, k, v))
    for e, c in zip(eager, compiled):
        # dQ sums fp32 atomics in whatever order the blocks finish: equal up to rounding.
        torch.testing.assert_close(c, e, rtol=2e-2, atol=2e-2)
