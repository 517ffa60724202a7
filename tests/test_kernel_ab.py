"""The kernel A/B script's build loading, its fronts and the epilogue breakdown's reading, on the CPU (the timing
needs a GPU)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("kernel_ab", ROOT / "benchmarks/kernel_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_builds_load_by_label_beside_the_checkout(tmp_path):
    ab = _script()
    # (A copy of kernels/fwd.py would also register its variants a second time in this process.)
    other = tmp_path / "fwd_other.py"
    other.write_text("BUILD = 'other'\n")
    builds = ab.load_builds("fwd", [f"other={other}"])
    assert list(builds) == ["other", "checkout"]
    assert builds["checkout"] is ab.CHECKOUT["fwd"] and builds["other"].BUILD == "other"


@pytest.mark.parametrize("spec", ["no-equals-sign", "=path.py", "checkout=kernels/fwd.py"])
def test_a_bad_build_is_refused(spec):
    with pytest.raises(SystemExit, match="LABEL=PATH"):
        _script().load_builds("fwd", [spec])


def test_the_backward_front_says_what_it_needs(tmp_path):
    # Without a GPU it must stop at the device check, having taken its options apart.
    run = subprocess.run([sys.executable, "benchmarks/bwd_ab.py", "--before", str(ROOT / "kernels/bwd.py"),
                          "--label-before", "same", "--out", str(tmp_path / "ab.json"), "--points", "dense"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    if run.returncode == 0:
        pytest.skip("a GPU is present: the front ran the benchmark")
    assert "needs an sm_90 GPU" in run.stderr, run.stderr[-2000:]


def test_the_forward_runner_takes_jagged_queries():
    # The work list's query-length arguments: a jagged-Q workload (the dense shape is one) has no Lq.
    from jfa_prof.inputs import Workload

    w = Workload("jagged", B=3, H=2, H_kv=2, D=64, Lq=96, max_kv=96, sparsity=0.5, broadcast_q=False)
    x = w.make("cpu")
    run, ref, compared = _script().runner("fwd", w, x, n_ctas=4)
    assert callable(run) and ref.shape == x.q.shape and compared(ref) is ref


def test_the_epilogue_breakdown_reads_each_consumers_sums():
    import numpy as np

    from jfa_prof.records import SPAN_WORDS, Span

    path = ROOT / "benchmarks/bwd_epilogue_breakdown.py"
    spec = importlib.util.spec_from_file_location("bwd_epilogue_breakdown", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    n_ctas, n_sites = 3, 9
    waits = np.zeros((n_ctas, 2, n_sites, 2), np.int64)
    spans = np.zeros((n_ctas, 2, SPAN_WORDS), np.int64)
    spans[:, 1, Span.C_START], spans[:, 1, Span.C_END] = 100, 1100  # 3000 cycles in all
    waits[:, 1, 2, 0] = 600  # consumer 0: step loop
    waits[:, 1, 7, 0] = 150  # consumer 0: the copies' issue
    waits[:, 0, 2, 0] = 900  # consumer 1: step loop
    waits[:, 1, 6, 1] = 40  # consumer 0: the first dV copy
    waits[:, 1, 4, 1] = 7  # tiles per CTA
    c0, c1 = mod.shares(waits, spans, 1), mod.shares(waits, spans, 0)
    assert (c0["step_loop"], c0["copies_issue"], c0["dv_copy_0"]) == pytest.approx((0.6, 0.15, 0.04))
    assert c0["tiles"] == 21 and c1["step_loop"] == pytest.approx(0.9) and c1["copies_issue"] == 0.0


def test_the_backward_call_wires_one_forwards_gradient(monkeypatch):
    # The launchers need the GPU: stand-ins record what the call passes them.
    import torch

    from jfa_prof.inputs import Workload

    ab = _script()
    w = Workload("hsp", B=3, H=2, H_kv=2, D=64, Lq=64, max_kv=96, sparsity=0.5, broadcast_q=True)
    x = w.make("cpu")
    o, lse = torch.randn(x.q.shape[0] * 3, 2, 64), torch.zeros(2, x.q.shape[0] * 3)
    seen = {}
    monkeypatch.setattr(ab, "fwd_launch", lambda *a, **kw: (o, lse, None, None))
    monkeypatch.setattr(ab, "bwd_launch_recorded", lambda *a, **kw: seen.update(args=a, kw=kw) or ("dq", "dk", "dv"))
    assert ab.bwd_call(w, x)(2) == ("dq", "dk", "dv")
    q, k, v, o_, lse_, do, q_off, kv_off, max_q, max_kv = seen["args"]
    assert (q, k, v, o_, lse_, kv_off) == (x.q, x.k, x.v, o, lse, x.kv_offsets) and q_off is None
    assert do.shape == o.shape and (max_q, max_kv) == (x.max_seq_len_q, x.max_seq_len_kv)
    assert seen["kw"] == dict(profile=2, sm_scale=0.125, window=None, causal=False, broadcast_q=True)


def test_points_name_hsp_jagged_causal_and_dense_workloads():
    ab = _script()
    w = ab.point_workload("jagged,2048,1,causal")
    assert (w.grid, w.max_kv, w.sparsity, w.causal) == ("jagged", 2048, 1.0, True)
    assert not ab.point_workload("jagged,512,0.5").causal
    hsp = ab.point_workload("128,1024,0.1")
    assert (hsp.grid, hsp.Lq, hsp.max_kv, hsp.sparsity, hsp.broadcast_q) == ("hsp", 128, 1024, 0.1, True)
    assert ab.point_workload("dense").grid == "dense"
    windowed = ab.point_workload("jagged,2048,1,window=256")
    assert (windowed.window, windowed.causal) == (256, False)
    for bad in ("jagged,512,0.5,window", "jagged,512,0.5,window=x", "jagged,512,0.5,causal,window=8"):
        with pytest.raises(SystemExit, match="causal"):
            ab.point_workload(bad)


def test_schedules_are_refused_for_the_forward(tmp_path):
    with pytest.raises(SystemExit):
        _script().main(["--pass", "fwd", "--schedules", "dynamic", "--out", str(tmp_path / "ab.json")])


def test_orders_are_refused_for_the_backward(tmp_path):
    with pytest.raises(SystemExit):
        _script().main(["--pass", "bwd", "--orders", "tile", "--out", str(tmp_path / "ab.json")])


def test_the_orders_list_the_same_tiles():
    """The orders the A/B compares the op's against: each tile by its own cost, ties in grid order;
    whole sequences, longest first, in grid order within."""
    import torch

    from jfa_prof.inputs import offsets_from_lengths
    from jfa_prof.schedule import fwd_work_list

    lens = torch.tensor([300, 0, 129, 700, 5])
    off = offsets_from_lengths(lens)
    wl = fwd_work_list(off, off, None, 2, 700, block_m=128, block_n=128, window=None, causal=True,
                       schedule="dynamic", n_ctas=2)
    n = int(wl.n_work)
    tiled, by_seq = _script().by_tile_cost(wl), _script().by_sequence(wl, off, 2)
    for other in (tiled, by_seq):
        assert sorted(other.tiles[:n].tolist()) == sorted(wl.tiles[:n].tolist())
        assert torch.equal(other.tiles[n:], wl.tiles[n:]) and other.queue is None
        assert not torch.equal(other.tiles, wl.tiles)  # causal: the orders differ from the op's
    pairs = list(zip((-tiled.costs[:n]).tolist(), tiled.tiles[:n].tolist()))
    assert pairs == sorted(pairs)  # cost descending, then tile id
    split = _script().split_blocks(wl, 2)  # groups of four positions, each by query block
    listed = wl.tiles[:n].tolist()
    for g in range(0, n, 4):
        assert split.tiles[g:g + 4].tolist() == sorted(listed[g:g + 4], key=lambda t: (t % wl.n_m_blocks,
                                                                                       listed.index(t)))
    seq_blocks = ((lens + 127) // 128).tolist()
    keys = [(-seq_blocks[t // (2 * wl.n_m_blocks)], t) for t in by_seq.tiles[:n].tolist()]
    assert keys == sorted(keys)


def test_groups_of_two_waves_from_whole_sequences_are_the_ops_list():
    """`wavesK` regroups the whole-sequence order; with the op's two waves it gives the op's list."""
    import torch

    from jfa_prof.inputs import offsets_from_lengths
    from jfa_prof.schedule import GROUP_WAVES, fwd_work_list

    lens = torch.randint(0, 900, (40, ), generator=torch.Generator().manual_seed(0))
    off = offsets_from_lengths(lens)
    wl = fwd_work_list(off, off, None, 2, int(lens.max()), block_m=128, block_n=128, window=None, causal=True,
                       schedule="dynamic", n_ctas=5)
    regrouped = _script().in_groups(_script().by_sequence(wl, off, 2), GROUP_WAVES * 5)
    assert torch.equal(regrouped.tiles, wl.tiles) and torch.equal(regrouped.costs, wl.costs)
    assert not torch.equal(_script().in_groups(_script().by_sequence(wl, off, 2), 5).tiles, wl.tiles)
