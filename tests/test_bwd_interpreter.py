"""The backward's dQ math on the CPU: Triton's interpreter runs the real source of the delta kernel
and the deterministic dQ kernel (masks, query-block and KV-block ranges, GQA, the batch sum of
broadcast-Q) against the fp32 reference's autograd.

The main kernel (dK, dV and the reduced dQ) is TLX: K, V, Q and dO in shared memory behind
mbarriers, asynchronous wgmma. The interpreter has none of that, so the GPU tests cover it
(`tests/test_bwd_gpu.py`, the same cases and more). The interpreter is picked when the kernels are
decorated, so the cases run in a child process (`tests/bwd_cases.py`)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bwd_cases import assert_errors

pytest.importorskip("triton")
pytest.importorskip("torch")

LENGTHS = [0, 1, 127, 128, 129, 300, 0, 5]
Q_LENGTHS = [0, 1, 200, 128, 129, 300, 10, 3]  # Lq != Lk, and rows with no key under causal

CASES = [
    # broadcast-Q, GQA 4:1, D=128: dQ is summed over the batch, several query blocks per key block
    dict(lengths=LENGTHS, H=8, H_kv=2, D=128, Lq=150),
    # a window of 33 puts row 95 / key 128 on a block boundary of the query range
    dict(lengths=LENGTHS, H=2, H_kv=1, D=64, Lq=200, window=33),
    dict(lengths=LENGTHS, H=2, H_kv=1, D=64, window=1, dtype="fp16"),
    # causal bottom-right with unequal lengths, with and without a window
    dict(lengths=LENGTHS, H=2, H_kv=2, D=64, q_lengths=Q_LENGTHS, causal=True),
    dict(lengths=LENGTHS, H=2, H_kv=1, D=64, q_lengths=Q_LENGTHS, causal=True, window=64, dtype="fp16"),
    # window 0: one key per row, so dQ = 0 exactly
    dict(lengths=LENGTHS, H=2, H_kv=2, D=64, window=0),
    # nothing but empty sequences
    dict(lengths=[0, 0], H=2, H_kv=2, D=64, Lq=33),
    # broadcast-Q at D=64, GQA 2:1: the batch split into parts, summed in a fixed order
    dict(lengths=LENGTHS, H=4, H_kv=2, D=64, Lq=150),
]


@pytest.fixture(scope="module")
def results():
    script = Path(__file__).with_name("bwd_cases.py")
    run = subprocess.run([sys.executable, str(script), json.dumps(CASES)], capture_output=True, text=True,
                         timeout=600, cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == len(CASES), run.stdout[-4000:]
    return lines


@pytest.mark.parametrize("i", range(len(CASES)), ids=[
    "bcast-gqa-d128", "bcast-window33", "jagged-window1-fp16", "causal", "causal-window-fp16", "window0",
    "all-empty", "bcast-gqa-d64"])
def test_backward_matches_reference_in_interpreter(results, i):
    dtype = CASES[i].get("dtype", "bf16")
    for name, errors in results[i].items():
        assert errors["dtype"] == {"bf16": "bfloat16", "fp16": "float16"}[dtype]
        assert errors["shape_ok"]
        assert_errors(name, errors, dtype)


@pytest.mark.parametrize("options, message", [
    ({"dq": "fast"}, "unknown dq reduction 'fast'"),
    ({"schedule": "lpt"}, "unknown backward schedule 'lpt'"),
    ({"dq_stages": 4}, "dq_stages must be 1, 2 or 3"),
])
def test_bad_backward_options_are_refused_before_any_launch(options, message):
    import torch

    from jfa_prof.errors import BadInputError
    from jfa_prof.kernels.attention import bwd_launch

    q, k, v = (torch.zeros(10, 2, 64, dtype=torch.bfloat16) for _ in range(3))
    off = torch.tensor([0, 4, 10], dtype=torch.int32)
    with pytest.raises(BadInputError, match=message):
        bwd_launch(q, k, v, q, torch.zeros(2, 10), q, off, off, 6, 6, sm_scale=0.125, window=None, causal=False,
                   broadcast_q=False, **options)


_TILE_LIST = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
import torch
from jfa_prof.inputs import offsets_from_lengths
from jfa_prof.kernels import bwd
lens = torch.tensor(json.loads(sys.argv[1]), dtype=torch.int64)
for dtype in (torch.int32, torch.int64):
    off = offsets_from_lengths(lens).to(dtype)
    cum = torch.full((lens.numel() + 1, ), -7, dtype=torch.int32)
    empty = torch.empty(0, 1, 64)
    bwd._jfa_bwd_delta[(1, 1)](empty, empty, torch.empty(1, 0), off, cum, torch.empty(0), cum, 0, 1, lens.numel(),
                               0, 0, **bwd.delta_constexprs(head_dim=64))
    print(json.dumps(cum.tolist()))
"""


def test_delta_kernel_prefix_sums_kv_blocks_across_scan_chunks():
    """The backward's tile list (KV blocks before each sequence) is built by the delta kernel's
    first program in chunks of `DELTA_SCAN` sequences: a batch longer than one chunk must carry
    the running sum over, for int32 and int64 offsets, with empty sequences adding nothing."""
    import random

    from jfa_prof.kernels import bwd

    rng = random.Random(7)
    lengths = [rng.choice([0, 1, 127, 128, 129, 300]) for _ in range(bwd.DELTA_SCAN + 77)]
    run = subprocess.run([sys.executable, "-c", _TILE_LIST, json.dumps(lengths)], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-4000:]
    expected = [0]
    for n in lengths:
        expected.append(expected[-1] + -(-n // bwd.BLOCK_N))
    got = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("[")]
    assert got == [expected, expected]


_DECODE = """
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are decorated
import torch
import triton
import triton.language as tl
from jfa_prof.kernels import bwd

@triton.jit
def decode(tile_cum, out, B, H_kv, n_tiles, n_progs):
    # A persistent program's walk: tiles pid, pid + n_progs, ..., each decoded from the last one's batch.
    t = tl.program_id(0)
    b = 0
    while t < n_tiles:
        b, kvh, blk = bwd._find_tile(t, tile_cum, B, H_kv, b)
        tl.store(out + 3 * t, b)
        tl.store(out + 3 * t + 1, kvh)
        tl.store(out + 3 * t + 2, blk)
        t += n_progs

cum, H_kv, n_progs = json.loads(sys.argv[1])
n_tiles = cum[-1] * H_kv
out = torch.full((n_tiles, 3), -1, dtype=torch.int32)
decode[(n_progs, )](torch.tensor(cum, dtype=torch.int32), out, len(cum) - 1, H_kv, n_tiles, n_progs)
print(json.dumps(out.tolist()))
"""


@pytest.mark.parametrize("n_progs", [3, 40])
def test_tile_decode_walks_forward_from_the_previous_batch(n_progs):
    """The main kernel decodes each tile starting from its previous tile's batch: one load of the
    next `_SEARCH` sequences, a binary search past them. Every tile must decode to its (batch, kv
    head, KV block) in block-innermost order, over empty sequences, short and long strides alike
    (40 programs jump past the window where a run of empty sequences follows)."""
    import random

    from jfa_prof.kernels import bwd

    rng = random.Random(n_progs)
    blocks = [rng.choice([0, 0, 0, 1, 2, 3]) for _ in range(150)] + [0] * 80 + [1, 4]
    H_kv = 2
    cum = [0]
    for n in blocks:
        cum.append(cum[-1] + n)
    expected = [[b, r // n, r % n] for b, n in enumerate(blocks) for r in range(n * H_kv)]
    run = subprocess.run([sys.executable, "-c", _DECODE, json.dumps([cum, H_kv, n_progs])], capture_output=True,
                         text=True, timeout=300, cwd=Path(__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-4000:]
    assert json.loads(run.stdout.splitlines()[-1]) == expected
    assert len(blocks) > bwd._SEARCH.value + 80  # the run of empty sequences is longer than one window
