"""The op's host side on the CPU: which layouts go to the kernels as they are, what is kept across
calls for an offsets tensor, empty work, and the errors a CPU-only caller meets. The kernels
themselves are checked on the GPU (tests/test_op_gpu.py)."""
import pytest

torch = pytest.importorskip("torch")

from jfa_prof.errors import NoGpuError  # noqa: E402
from jfa_prof.kernels import offsets_cache  # noqa: E402
from jfa_prof.kernels.attention import bwd_launch, fwd_launch, jagged_flash_attention, tma_ready  # noqa: E402


def _aligned(shape, dtype=torch.bfloat16):
    # CPU allocations are 64-byte aligned, like CUDA's.
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize("make, in_place", [
    (lambda: _aligned((10, 4, 64)), True),
    # K and V of one fused projection: row stride 2 * H_kv * D.
    (lambda: _aligned((10, 2, 4, 64))[:, 1], True),
    # Q of a fused QKV projection, and a slice of rows.
    (lambda: _aligned((10, 3 * 4 * 64)).view(10, 3, 4, 64)[:, 0], True),
    (lambda: _aligned((10, 4, 64))[2:7], True),
    # One row, one head: any stride.
    (lambda: _aligned((1, 1, 64)).expand(1, 1, 64), True),
    # Heads not packed in a row, stride-0 rows or heads, an unaligned start, a strided last dim.
    (lambda: _aligned((4, 10, 64)).permute(1, 0, 2), False),
    (lambda: _aligned((1, 4, 64)).expand(10, 4, 64), False),
    (lambda: _aligned((10, 1, 64)).expand(10, 4, 64), False),
    (lambda: _aligned((10 * 4 * 64 + 1, )).narrow(0, 1, 10 * 4 * 64).view(10, 4, 64), False),
    (lambda: _aligned((10, 4, 128))[:, :, ::2], False),
])
def test_tma_ready_reads_views_in_place_and_copies_the_rest(make, in_place):
    t = make()
    got = tma_ready(t)
    assert torch.equal(got, t)
    assert (got.data_ptr() == t.data_ptr() and got.stride() == t.stride()) == in_place
    if not in_place:
        assert got.is_contiguous()


def test_empty_forward_launches_nothing_and_writes_zeros():
    H, D = 4, 64
    kv_off = torch.zeros(4, dtype=torch.int32)  # three empty sequences
    k = v = torch.empty(0, 2, D, dtype=torch.bfloat16)
    q = _aligned((5, H, D))
    out = torch.full((15, H, D), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((H, 15), float("nan"))
    o, lse, rec, launch = fwd_launch(q, k, v, None, kv_off, 5, sm_scale=0.1, window=None, causal=False,
                                     broadcast_q=True, out=out, lse_out=lse)
    assert o is out and torch.all(o == 0) and torch.all(lse == float("-inf"))
    assert rec is None and launch.n_ctas == 0
    # Jagged Q with no query rows: an empty output.
    o, lse, _, _ = fwd_launch(torch.empty(0, H, D, dtype=torch.bfloat16), _aligned((8, 2, D)), _aligned((8, 2, D)),
                              torch.zeros(4, dtype=torch.int32), torch.tensor([0, 3, 3, 8], dtype=torch.int32), 0,
                              sm_scale=0.1, window=None, causal=False, broadcast_q=False)
    assert o.shape == (0, H, D) and lse.shape == (H, 0)


def test_empty_backward_gives_zero_gradients():
    H, D = 4, 64
    q = _aligned((5, H, D))
    k = v = torch.empty(0, 2, D, dtype=torch.bfloat16)
    o = torch.zeros(15, H, D, dtype=torch.bfloat16)
    lse = torch.full((H, 15), float("-inf"))
    dq, dk, dv = bwd_launch(q, k, v, o, lse, torch.randn_like(o), None, torch.zeros(4, dtype=torch.int32), 5, 0,
                            sm_scale=0.1, window=None, causal=False, broadcast_q=True)
    assert dq.shape == q.shape and torch.all(dq == 0) and dk.shape == k.shape and dv.shape == v.shape
    # Keys but no query rows: dK and dV are zeros, written into the caller's buffers.
    k = _aligned((8, 2, D))
    dk_out = torch.full_like(k, float("nan"))
    dv_out = torch.full((2, 8, D), float("nan"), dtype=torch.bfloat16).transpose(0, 1)  # not contiguous
    dq, dk, dv = bwd_launch(torch.empty(0, H, D, dtype=torch.bfloat16), k, k, torch.empty(0, H, D, dtype=torch.bfloat16),
                            torch.empty(H, 0), torch.empty(0, H, D, dtype=torch.bfloat16),
                            torch.zeros(4, dtype=torch.int32), torch.tensor([0, 3, 3, 8], dtype=torch.int32), 0, 5,
                            sm_scale=0.1, window=None, causal=False, broadcast_q=False, dk_out=dk_out, dv_out=dv_out)
    assert dk is dk_out and dv is dv_out and torch.all(dk == 0) and torch.all(dv == 0) and dq.shape == (0, H, D)


def test_a_cpu_call_says_it_needs_a_hopper_gpu():
    q = _aligned((4, 4, 64))
    k = v = _aligned((8, 2, 64))
    with pytest.raises(NoGpuError, match="sm_90"):
        jagged_flash_attention(q, k, v, None, torch.tensor([0, 3, 3, 8], dtype=torch.int32), 4, 5, broadcast_q=True)


def test_a_bad_schedule_is_named_before_any_launch():
    q = _aligned((4, 4, 64))
    k = v = _aligned((8, 2, 64))
    with pytest.raises(ValueError, match="schedule must be one of static, lpt, dynamic, got 'bogus'"):
        jagged_flash_attention(q, k, v, None, torch.tensor([0, 3, 3, 8], dtype=torch.int32), 4, 5, broadcast_q=True,
                               schedule="bogus")


class TestOffsetsCache:
    def setup_method(self):
        offsets_cache.clear()

    def test_same_tensor_same_version_hits(self):
        off = torch.tensor([0, 3, 8], dtype=torch.int32)
        e = offsets_cache.lookup(off, None, ("k", ))
        e.work = "list"
        assert offsets_cache.lookup(off, None, ("k", )) is e
        assert offsets_cache.lookup(off, None, ("other key", )) is not e

    def test_an_in_place_change_rebuilds(self):
        off = torch.tensor([0, 3, 8], dtype=torch.int32)
        e = offsets_cache.lookup(off, None, ())
        off[1] = 4
        assert offsets_cache.lookup(off, None, ()) is not e
        e2 = offsets_cache.lookup(off, None, ())
        off[:2].add_(0)  # through a view: the version counter is shared
        assert offsets_cache.lookup(off, None, ()) is not e2

    def test_an_equal_new_tensor_or_other_q_offsets_misses(self):
        off = torch.tensor([0, 3, 8], dtype=torch.int32)
        q_off = torch.tensor([0, 1, 2], dtype=torch.int32)
        e = offsets_cache.lookup(off, q_off, ())
        assert offsets_cache.lookup(off.clone(), q_off, ()) is not e
        assert offsets_cache.lookup(off, q_off.clone(), ()) is not e
        assert offsets_cache.lookup(off, q_off, ()) is e

    def test_a_dead_tensor_never_matches_a_recycled_id(self):
        off = torch.tensor([0, 3, 8], dtype=torch.int32)
        e = offsets_cache.lookup(off, None, ())
        key_id = id(off)
        del off
        fresh = [torch.tensor([0, 1, 2], dtype=torch.int32) for _ in range(50)]
        for t in fresh:
            got = offsets_cache.lookup(t, None, ())
            assert got is not e or id(t) != key_id

    def test_entries_asked_not_to_be_kept_are_not(self):
        # Jagged-Q lists and compiled calls: a buffer can change without its version counter moving.
        off = torch.tensor([0, 3, 8], dtype=torch.int32)
        e = offsets_cache.lookup(off, off, ("k", ), keep=False)
        e.work = "list"
        assert offsets_cache.lookup(off, off, ("k", ), keep=False).work is None
        assert not offsets_cache._entries

    def test_inference_tensors_are_not_kept(self):
        with torch.inference_mode():
            off = torch.tensor([0, 3, 8], dtype=torch.int32)
        e = offsets_cache.lookup(off, None, ())
        e.work = "list"
        assert offsets_cache.lookup(off, None, ()).work is None

    def test_bounded(self):
        tensors = [torch.tensor([0, i], dtype=torch.int32) for i in range(offsets_cache.CAPACITY + 3)]
        for t in tensors:
            offsets_cache.lookup(t, None, ())
        assert len(offsets_cache._entries) == offsets_cache.CAPACITY

    def test_dynamic_counters_are_fresh_zeros_and_rezeroed_when_used_up(self):
        e = offsets_cache.lookup(torch.tensor([0, 3], dtype=torch.int32), None, ())
        seen = []
        for _ in range(offsets_cache._COUNTERS + 2):
            c = e.counter(torch.device("cpu"))
            assert c.shape == (1, ) and int(c) == 0
            c += 7  # what a launch leaves behind
            seen.append(c.data_ptr())
        assert len(set(seen[:offsets_cache._COUNTERS])) == offsets_cache._COUNTERS
        assert seen[offsets_cache._COUNTERS] == seen[0]
