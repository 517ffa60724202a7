import re

import pytest
import torch

from jfa_prof.validation import JaggedInputError, validate_attention_inputs

KV_LENS = [3, 0, 5]
LQ = 4


def _args(broadcast_q=False, device="cpu", **overrides):
    """Valid arguments: 3 sequences, H=4, H_kv=2, D=64, bf16; then apply overrides."""
    total_kv = sum(KV_LENS)
    kv_offsets = torch.tensor([0, 3, 3, 8], dtype=torch.int32, device=device)
    if broadcast_q:
        q = torch.zeros(LQ, 4, 64, dtype=torch.bfloat16, device=device)
        q_offsets = None
    else:
        q = torch.zeros(total_kv, 4, 64, dtype=torch.bfloat16, device=device)
        q_offsets = kv_offsets.clone()
    args = dict(q=q, k=torch.zeros(total_kv, 2, 64, dtype=torch.bfloat16, device=device),
                v=torch.zeros(total_kv, 2, 64, dtype=torch.bfloat16, device=device),
                q_offsets=q_offsets, kv_offsets=kv_offsets, broadcast_q=broadcast_q,
                causal=False, window_size=None)
    args.update(overrides)
    return args


def _rejects(message, **kwargs):
    with pytest.raises(JaggedInputError, match=re.escape(message)):
        validate_attention_inputs(**kwargs)


def test_valid_inputs_pass():
    validate_attention_inputs(**_args())
    validate_attention_inputs(**_args(causal=True, window_size=16, sm_scale=0.1))
    validate_attention_inputs(**_args(broadcast_q=True))
    validate_attention_inputs(**_args(broadcast_q=True,
                                      q_offsets=torch.tensor([0, 4, 8, 12])))
    validate_attention_inputs(**_args(kv_offsets=torch.tensor([0, 3, 3, 8]),
                                      q_offsets=torch.tensor([0, 3, 3, 8])))
    validate_attention_inputs(**_args(q=torch.zeros(8, 4, 128, dtype=torch.float16),
                                      k=torch.zeros(8, 4, 128, dtype=torch.float16),
                                      v=torch.zeros(8, 4, 128, dtype=torch.float16)))


def test_is_a_value_error():
    assert issubclass(JaggedInputError, ValueError)


def test_offsets_dtype():
    _rejects("kv_offsets must be int32 or int64, got torch.float32",
             **_args(kv_offsets=torch.tensor([0.0, 3.0, 3.0, 8.0])))


def test_offsets_not_1d():
    _rejects("q_offsets must be 1-D [B+1], got shape (1, 4)",
             **_args(q_offsets=torch.tensor([[0, 3, 3, 8]], dtype=torch.int32)))


def test_offsets_too_short():
    _rejects("kv_offsets must have at least 2 entries ([0, len_0]), got 1",
             **_args(kv_offsets=torch.tensor([0], dtype=torch.int32)))


def test_offsets_batch_mismatch():
    _rejects("q_offsets has 3 entries but kv_offsets has 4",
             **_args(q_offsets=torch.tensor([0, 3, 8], dtype=torch.int32)))


def test_jagged_q_needs_q_offsets():
    _rejects("q_offsets is required for jagged Q", **_args(q_offsets=None))


def test_q_dtype():
    a = _args()
    _rejects("q must be bfloat16 or float16, got torch.float32",
             **{**a, "q": a["q"].float(), "k": a["k"].float(), "v": a["v"].float()})


def test_kv_dtype_mismatch():
    a = _args()
    _rejects("v is torch.float16 but q is torch.bfloat16", **{**a, "v": a["v"].half()})


def test_device_mismatch():
    a = _args()
    _rejects("k is on meta but q is on cpu", **{**a, "k": a["k"].to("meta")})
    _rejects("kv_offsets is on meta but q is on cpu",
             **{**a, "kv_offsets": a["kv_offsets"].to("meta")})


def test_k_v_shapes_differ():
    a = _args()
    _rejects("k and v must have the same shape, got (8, 2, 64) and (7, 2, 64)",
             **{**a, "v": a["v"][:7]})


def test_heads_not_a_multiple():
    a = _args()
    _rejects("q heads (4) must be a multiple of k/v heads (3)",
             **{**a, "k": torch.zeros(8, 3, 64, dtype=torch.bfloat16),
                "v": torch.zeros(8, 3, 64, dtype=torch.bfloat16)})


def test_head_dim_mismatch_and_unsupported():
    a = _args()
    _rejects("q head dim (64) must equal k/v head dim (128)",
             **{**a, "k": torch.zeros(8, 2, 128, dtype=torch.bfloat16),
                "v": torch.zeros(8, 2, 128, dtype=torch.bfloat16)})
    _rejects("head dim must be one of (64, 128), got 96",
             **{**a, "q": torch.zeros(8, 4, 96, dtype=torch.bfloat16),
                "k": torch.zeros(8, 2, 96, dtype=torch.bfloat16),
                "v": torch.zeros(8, 2, 96, dtype=torch.bfloat16)})


def test_q_not_3d():
    a = _args()
    _rejects("q must be 3-D [rows, heads, head_dim], got shape (8, 256)",
             **{**a, "q": a["q"].reshape(8, 256)})


def test_causal_with_broadcast_q():
    _rejects("causal=True is only supported for jagged Q", **_args(broadcast_q=True, causal=True))


def test_window_size():
    _rejects("window_size must be >= 0, got -1", **_args(window_size=-1))
    _rejects("window_size must be an int or None, got float", **_args(window_size=2.0))
    _rejects("window_size must be an int or None, got bool", **_args(window_size=True))


def test_sm_scale():
    _rejects("sm_scale must be finite and > 0, got nan", **_args(sm_scale=float("nan")))
    _rejects("sm_scale must be a float or None, got str", **_args(sm_scale="0.1"))


def test_lengths_promised_and_schedule():
    _rejects("max_seq_len_q must be >= 0, got -1", **_args(max_seq_len_q=-1))
    _rejects("max_seq_len_kv must be an int, got float", **_args(max_seq_len_kv=5.0))
    _rejects("max_seq_len_kv must be an int, got bool", **_args(max_seq_len_kv=True))
    _rejects("schedule must be one of static, lpt, dynamic, got 'bogus'", **_args(schedule="bogus"))


def test_never_reads_offset_values():
    # Meta tensors have no data: reading an offset value would raise. The value rules are the
    # device's (tests/test_checks.py), so these checks never wait for a GPU.
    validate_attention_inputs(**_args(device="meta"))
    validate_attention_inputs(**_args(device="meta", broadcast_q=True,
                                      q_offsets=torch.zeros(4, dtype=torch.int32, device="meta")))


def test_strided_offsets_are_refused():
    base = torch.tensor([0, 9, 3, 9, 3, 9, 8, 9], dtype=torch.int32)
    _rejects("kv_offsets must be contiguous, got a view with stride 2", **_args(kv_offsets=base[::2]))
