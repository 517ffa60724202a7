"""The offsets checks of the op, run on the GPU so that a call never waits for the device.

Reading offsets values on the host would synchronize every call, and then a training loop's host
can never run ahead of its GPU. These checks run in the call's stream instead: one small program
reads each offsets tensor once and, where a rule is broken, fails a device assertion whose
message names the rule. CUDA reports a failed device assertion at the next synchronization
(`torch.cuda.synchronize()`, `.item()`, a copy to the host), with the message printed by the
device; the CUDA context is then unusable, as after any device-side assert in torch. A wrong
answer is never returned quietly: the call that broke the rule does not complete.

The rules (SPEC §2): offsets start at 0, never decrease, end at the number of rows, and no
sequence is longer than the `max_seq_len_*` the call promised (the kernels size their work by it,
so a longer sequence would leave rows unwritten). For broadcast-Q a given `q_offsets` must be
`arange(B+1) * Lq`.
"""
import triton
import triton.language as tl

from jfa_prof.kernels import C_CACHE

_BLOCK = 1024


@triton.jit
def _check_kv(offsets, i, ok, prev, rows, max_len, n):
    cur = tl.load(offsets + i, mask=ok, other=0)
    tl.device_assert((i != 0) | (cur == 0), "kv_offsets[0] must be 0")
    tl.device_assert(~ok | (i == 0) | (cur >= prev), "kv_offsets must be non-decreasing")
    tl.device_assert(~ok | (i == 0) | (cur - prev <= max_len),
                     "a kv sequence is longer than max_seq_len_kv")
    tl.device_assert((i != n - 1) | (cur == rows), "kv_offsets[-1] must equal the number of rows of k")


@triton.jit
def _check_q(offsets, i, ok, prev, rows, max_len, n, Lq, BROADCAST_Q: tl.constexpr):
    cur = tl.load(offsets + i, mask=ok, other=0)
    if BROADCAST_Q:
        tl.device_assert(~ok | (cur == i * Lq), "broadcast_q=True takes q_offsets=None or arange(B+1) * Lq")
    else:
        tl.device_assert((i != 0) | (cur == 0), "q_offsets[0] must be 0")
        tl.device_assert(~ok | (i == 0) | (cur >= prev), "q_offsets must be non-decreasing")
        tl.device_assert(~ok | (i == 0) | (cur - prev <= max_len),
                         "a q sequence is longer than max_seq_len_q")
        tl.device_assert((i != n - 1) | (cur == rows), "q_offsets[-1] must equal the number of rows of q")


@triton.jit(debug=True, c_cache=C_CACHE)
def _check_offsets(kv_offsets, q_offsets, n, kv_rows, q_rows, max_kv, max_q, Lq,
                   HAS_Q: tl.constexpr, BROADCAST_Q: tl.constexpr, BLOCK: tl.constexpr):
    # One program walks both tensors: B is at most a few hundred thousand, and one launch costs
    # the host less than several.
    for start in range(0, n, BLOCK):
        i = start + tl.arange(0, BLOCK)
        ok = i < n
        prev_i = tl.maximum(i - 1, 0)
        _check_kv(kv_offsets, i, ok, tl.load(kv_offsets + prev_i, mask=ok, other=0), kv_rows, max_kv, n)
        if HAS_Q:
            _check_q(q_offsets, i, ok, tl.load(q_offsets + prev_i, mask=ok, other=0), q_rows, max_q, n, Lq,
                     BROADCAST_Q)


def check_offsets(kv_offsets, q_offsets, *, kv_rows: int, q_rows: int, max_seq_len_kv: int, max_seq_len_q: int,
                  broadcast_q: bool, Lq: int) -> None:
    """Enqueue the checks on the current stream; returns at once (nothing is read back)."""
    n = kv_offsets.numel()
    has_q = q_offsets is not None
    _check_offsets[(1, )](kv_offsets, q_offsets if has_q else kv_offsets, n, kv_rows, q_rows, max_seq_len_kv,
                          max_seq_len_q, Lq, HAS_Q=has_q, BROADCAST_Q=broadcast_q, BLOCK=_BLOCK)
