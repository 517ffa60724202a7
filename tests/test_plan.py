"""Reusable forward plans: built once per batch's offsets, checked against each call."""
import pytest
import torch

from jfa_prof.errors import BadInputError
from jfa_prof.inputs import offsets_from_lengths
from jfa_prof.kernels.attention import jagged_flash_attention, plan_attention
from jfa_prof.schedule import fwd_work_list


def _inputs(device="cpu", Lq=200, H=4):
    kv_off = offsets_from_lengths(torch.tensor([0, 5, 300, 129])).to(device)
    q = torch.randn(Lq, H, 128, dtype=torch.bfloat16, device=device)
    k = torch.randn(int(kv_off[-1]), H, 128, dtype=torch.bfloat16, device=device)
    return q, k, k.clone(), kv_off


def test_plan_holds_the_schedules_work_list():
    _, _, _, kv_off = _inputs()
    plan = plan_attention(kv_off, max_seq_len_q=200, H=4, broadcast_q=True, schedule="dynamic", n_ctas=7)
    ref = fwd_work_list(kv_off, None, 200, 4, 200, block_m=128, block_n=128, window=None, causal=False,
                        schedule="dynamic", n_ctas=7)
    assert torch.equal(plan.work.tiles, ref.tiles) and torch.equal(plan.work.n_work, ref.n_work)
    assert plan.work.n_m_blocks == 2


@pytest.mark.parametrize("change, message", [
    (dict(schedule="static"), "schedule='lpt'"),
    (dict(window_size=16), "window=None"),
    (dict(H=2), "H=4"),
])
def test_a_plan_for_other_arguments_is_refused(change, message):
    q, k, v, kv_off = _inputs(H=change.pop("H", 4))
    plan = plan_attention(kv_off, max_seq_len_q=200, H=4, broadcast_q=True, schedule="lpt", n_ctas=7)
    kw = dict(broadcast_q=True, schedule="lpt", validate=False, plan=plan) | change
    with pytest.raises(BadInputError, match=message.replace("(", r"\(")):
        jagged_flash_attention(q, k, v, None, kv_off, 200, 300, **kw)


def test_a_plan_for_other_offsets_or_lengths_is_refused():
    q, k, v, kv_off = _inputs()
    plan = plan_attention(kv_off, max_seq_len_q=200, H=4, broadcast_q=True, n_ctas=7)
    with pytest.raises(BadInputError, match="another kv_offsets tensor"):
        jagged_flash_attention(q, k, v, None, kv_off.clone(), 200, 300, broadcast_q=True, plan=plan, validate=False)
    with pytest.raises(BadInputError, match="max_seq_len_q=200"):
        jagged_flash_attention(q[:130], k, v, None, kv_off, 130, 300, broadcast_q=True, plan=plan, validate=False)
    # The same tensor changed in place: its list would visit the old lengths' tiles.
    kv_off[1] += 0
    with pytest.raises(BadInputError, match="kv_offsets was changed in place after its plan was built"):
        jagged_flash_attention(q, k, v, None, kv_off, 200, 300, broadcast_q=True, plan=plan, validate=False)


def test_a_plan_goes_by_the_tensor_not_its_address():
    # The caching allocator hands a freed block to the next batch's offsets: an address proves
    # nothing. Another tensor object at the same address (here a view) is refused.
    q, k, v, kv_off = _inputs()
    plan = plan_attention(kv_off, max_seq_len_q=200, H=4, broadcast_q=True, n_ctas=7)
    same_address = kv_off[:]
    assert same_address.data_ptr() == kv_off.data_ptr()
    with pytest.raises(BadInputError, match="another kv_offsets tensor"):
        jagged_flash_attention(q, k, v, None, same_address, 200, 300, broadcast_q=True, plan=plan, validate=False)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["static", "lpt", "dynamic"])
def test_a_plan_gives_the_same_bits_as_building_per_call(cuda_device, schedule):
    q, k, v, kv_off = _inputs(cuda_device)
    plan = plan_attention(kv_off, max_seq_len_q=200, H=4, broadcast_q=True, schedule=schedule)
    a = jagged_flash_attention(q, k, v, None, kv_off, 200, 300, broadcast_q=True, schedule=schedule)
    for _ in range(2):  # reused
        b = jagged_flash_attention(q, k, v, None, kv_off, 200, 300, broadcast_q=True, schedule=schedule, plan=plan)
        assert torch.equal(a, b)
