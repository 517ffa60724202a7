"""Argument checks for the jagged attention op (SPEC §2), with messages that say what to fix.

These read only metadata (shapes, dtypes, devices, Python arguments), so they never wait for the
GPU. The rules on offset *values* (start at 0, non-decreasing, end at the rows, lengths within
``max_seq_len_*``) are checked on the device, in the call's stream: `jfa_prof.kernels.checks`.

Broadcast-Q and ``q_offsets``: the kernel ignores them, but a caller may pass the offsets of
the equivalent repeated-Q layout, ``arange(B+1)·Lq`` (what :meth:`Workload.make` returns and
what peers take); the device checks reject anything else, which means the caller thinks Q is jagged.
"""
from __future__ import annotations

import math
import numbers

import torch

from jfa_prof.errors import BadInputError
from jfa_prof.schedule import DEFAULT_SCHEDULE, SCHEDULES

__all__ = ["JaggedInputError", "validate_attention_inputs"]

_DTYPES = (torch.bfloat16, torch.float16)
_HEAD_DIMS = (64, 128)
_OFFSET_DTYPES = (torch.int32, torch.int64)


class JaggedInputError(BadInputError, ValueError):
    """Arguments that the jagged attention op cannot accept."""


def _check_offsets_meta(name: str, offsets, device: torch.device) -> None:
    if not isinstance(offsets, torch.Tensor):
        raise JaggedInputError(f"{name} must be a torch.Tensor, got {type(offsets).__name__}")
    if offsets.dtype not in _OFFSET_DTYPES:
        raise JaggedInputError(f"{name} must be int32 or int64, got {offsets.dtype}")
    if offsets.dim() != 1:
        raise JaggedInputError(f"{name} must be 1-D [B+1], got shape {tuple(offsets.shape)}")
    if offsets.numel() < 2:
        raise JaggedInputError(
            f"{name} must have at least 2 entries ([0, len_0]), got {offsets.numel()}")
    if offsets.device != device:
        raise JaggedInputError(f"{name} is on {offsets.device} but q is on {device}")
    if offsets.stride(0) != 1:
        # The kernels read offsets[i] at base + i: a strided view would be read wrong.
        raise JaggedInputError(f"{name} must be contiguous, got a view with stride {offsets.stride(0)}",
                               hint=f"pass {name}.contiguous()")


def validate_attention_inputs(
    q, k, v, q_offsets, kv_offsets, *, broadcast_q: bool, causal: bool,
    window_size, sm_scale=None, max_seq_len_q=0, max_seq_len_kv=0, schedule=DEFAULT_SCHEDULE,
) -> None:
    """Raise :class:`JaggedInputError` if the arguments break the SPEC §2 contract (as far as it
    can be told without reading offset values)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise JaggedInputError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise JaggedInputError(
                f"{name} must be 3-D [rows, heads, head_dim], got shape {tuple(t.shape)}")
    if q.dtype not in _DTYPES:
        raise JaggedInputError(f"q must be bfloat16 or float16, got {q.dtype}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise JaggedInputError(f"{name} is {t.dtype} but q is {q.dtype}; they must match")
        if t.device != q.device:
            raise JaggedInputError(f"{name} is on {t.device} but q is on {q.device}")
    if k.shape != v.shape:
        raise JaggedInputError(
            f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    h, h_kv = q.shape[1], k.shape[1]
    if h_kv == 0 or h % h_kv:
        raise JaggedInputError(f"q heads ({h}) must be a multiple of k/v heads ({h_kv})")
    if q.shape[2] != k.shape[2]:
        raise JaggedInputError(
            f"q head dim ({q.shape[2]}) must equal k/v head dim ({k.shape[2]})")
    if q.shape[2] not in _HEAD_DIMS:
        raise JaggedInputError(f"head dim must be one of {_HEAD_DIMS}, got {q.shape[2]}")

    if causal and broadcast_q:
        raise JaggedInputError("causal=True is only supported for jagged Q, not broadcast_q=True")
    if window_size is not None:
        if isinstance(window_size, bool) or not isinstance(window_size, numbers.Integral):
            raise JaggedInputError(
                f"window_size must be an int or None, got {type(window_size).__name__}")
        if window_size < 0:
            raise JaggedInputError(f"window_size must be >= 0, got {window_size}")
    if sm_scale is not None:
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
            raise JaggedInputError(
                f"sm_scale must be a float or None, got {type(sm_scale).__name__}")
        if not (math.isfinite(sm_scale) and sm_scale > 0):
            raise JaggedInputError(f"sm_scale must be finite and > 0, got {sm_scale}")

    _check_offsets_meta("kv_offsets", kv_offsets, q.device)
    batch = kv_offsets.numel() - 1
    if q_offsets is None:
        if not broadcast_q:
            raise JaggedInputError("q_offsets is required for jagged Q (broadcast_q=False)")
    else:
        _check_offsets_meta("q_offsets", q_offsets, q.device)
        if q_offsets.numel() != batch + 1:
            raise JaggedInputError(
                f"q_offsets has {q_offsets.numel()} entries but kv_offsets has {batch + 1}; "
                "both must be [B+1]")

    for name, value in (("max_seq_len_q", max_seq_len_q), ("max_seq_len_kv", max_seq_len_kv)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise JaggedInputError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise JaggedInputError(f"{name} must be >= 0, got {value}")
    if schedule not in SCHEDULES:
        raise JaggedInputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
