"""The offsets rules the op checks on the device (`jfa_prof.kernels.checks`), run on the CPU by
Triton's interpreter: the same kernel source, its assertions raised as Python errors. The
interpreter is picked when kernels are decorated, so the cases run in a child process. On the GPU
the same assertions end the call at the next synchronization (tests/test_op_gpu.py)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
pytest.importorskip("torch")

# kv_offsets over 8 rows of k: lengths 3, 0, 5.
GOOD = dict(kv=[0, 3, 3, 8], q=None, kv_rows=8, q_rows=4, max_kv=5, max_q=4, broadcast_q=True, Lq=4)
CASES = {
    "valid broadcast-Q": ({}, None),
    "valid broadcast-Q with arange q_offsets": (dict(q=[0, 4, 8, 12]), None),
    "valid jagged Q": (dict(q=[0, 2, 2, 6], q_rows=6, broadcast_q=False), None),
    "longest sequence exactly max": (dict(max_kv=5), None),
    "a long valid batch (entries in three blocks)": (dict(kv=list(range(3001)), kv_rows=3000, max_kv=1), None),
    "empty sequences only": (dict(kv=[0, 0, 0], kv_rows=0, max_kv=0), None),
    "a long batch, bad entry past the first block": (dict(kv=list(range(3000)) + [2998], kv_rows=2998, max_kv=1),
                                                      "kv_offsets must be non-decreasing"),
    "kv first": (dict(kv=[1, 3, 3, 8]), "kv_offsets[0] must be 0"),
    "kv decreasing": (dict(kv=[0, 3, 2, 8]), "kv_offsets must be non-decreasing"),
    "kv last": (dict(kv=[0, 3, 3, 7]), "kv_offsets[-1] must equal the number of rows of k"),
    "kv longer than max": (dict(max_kv=4), "a kv sequence is longer than max_seq_len_kv"),
    "q first": (dict(q=[2, 2, 2, 6], q_rows=6, broadcast_q=False), "q_offsets[0] must be 0"),
    "q decreasing": (dict(q=[0, 5, 3, 6], q_rows=6, broadcast_q=False), "q_offsets must be non-decreasing"),
    "q last": (dict(q=[0, 2, 2, 5], q_rows=6, broadcast_q=False), "q_offsets[-1] must equal the number of rows of q"),
    "q longer than max": (dict(q=[0, 2, 2, 6], q_rows=6, max_q=3, broadcast_q=False),
                          "a q sequence is longer than max_seq_len_q"),
    "broadcast-Q given jagged q_offsets": (dict(q=[0, 3, 3, 8]),
                                           "broadcast_q=True takes q_offsets=None or arange(B+1) * Lq"),
}

_CHILD = """
import json, sys, torch
from jfa_prof.kernels.checks import check_offsets
for name, case in json.loads(sys.argv[1]).items():
    kv = torch.tensor(case.pop("kv"), dtype=torch.int32)
    q = case.pop("q")
    q = None if q is None else torch.tensor(q, dtype=torch.int64)
    try:
        check_offsets(kv, q, kv_rows=case["kv_rows"], q_rows=case["q_rows"], max_seq_len_kv=case["max_kv"],
                      max_seq_len_q=case["max_q"], broadcast_q=case["broadcast_q"], Lq=case["Lq"])
        print(json.dumps({"name": name, "failed": None}))
    except Exception as e:
        print(json.dumps({"name": name, "failed": str(e)}))
"""


@pytest.fixture(scope="module")
def outcomes():
    cases = {name: {**GOOD, **change} for name, (change, _) in CASES.items()}
    run = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases)], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).parent.parent, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert run.returncode == 0, run.stderr[-4000:]
    got = {r["name"]: r["failed"] for r in map(json.loads, filter(None, run.stdout.splitlines()))}
    assert set(got) == set(CASES), run.stdout[-2000:]
    return got


@pytest.mark.parametrize("name", list(CASES))
def test_offsets_rule(outcomes, name):
    expected = CASES[name][1]
    if expected is None:
        assert outcomes[name] is None, f"a valid case failed: {outcomes[name]}"
    else:
        assert outcomes[name] is not None and expected in outcomes[name], outcomes[name]
