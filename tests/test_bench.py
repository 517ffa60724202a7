"""Bench library on the CPU: reading the committed H200 results, the new file format, peer
availability, and the peers' input preparation (block mask, padding) checked against the fp32
reference. The GPU run itself is the `gpu` test at the end."""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from jfa_prof import bench
from jfa_prof.bench import impls as bench_impls
from jfa_prof.bench import load_results, results_document
from jfa_prof.bench import peers as bench_peers
from jfa_prof.bench import results as bench_results
from jfa_prof.cli import app
from jfa_prof.errors import BadInputError
from jfa_prof.inputs import Workload, attention_flops, find_workload, rows_seeing_keys, upstream_grad
from jfa_prof.reference import reference_attention

H200 = Path(__file__).resolve().parents[1] / "benchmarks/results/bench/superseded/fwd_hsp_h200_2026-11-30.json"
POINT = "hsp Lq=256 max=2048 s=0.1"


@pytest.fixture(scope="module")
def h200():
    return load_results(H200)


def _record(res, label):
    return next(r for r in res.records if r["workload"]["label"] == label)


# ---------------------------------------------------------------------------------------------
# the committed H200 file (earlier format: meta at the top only)
# ---------------------------------------------------------------------------------------------

def test_h200_file_loads(h200):
    assert len(h200.records) == 18
    assert h200.gpu == "NVIDIA H200" and h200.date == "2026-11-30"
    assert h200.provenance() == "recorded on NVIDIA H200 on 2026-11-30"
    # Records inherit the top-level meta, so each names machine, versions, date and command.
    r = _record(h200, POINT)
    assert r["meta"]["sm_count"] == 132 and r["meta"]["triton"] == "3.7.4+fb"
    assert r["meta"]["command"].startswith("python benchmarks/fwd_bench.py --grid hsp")
    assert h200.baseline == "jfa-lpt"  # the one it timed twice


def test_h200_numbers(h200):
    r = _record(h200, POINT)
    fa4 = r["impls"]["fa4"]
    # SPEC §8: FA4 forward with a stride-0 Q, HSP Lq=256 max=2048 s=0.1: 278 TFLOPS.
    assert fa4["tflops"] == pytest.approx(278.609, abs=1e-3)
    assert fa4["tflops"] == pytest.approx(r["flops"] / fa4["ms"] / 1e9)
    assert r["best_peer"] == "fa4"
    planned = r["impls"]["jfa-lpt-planned"]
    assert planned["ratio_vs_fa4"] == pytest.approx(0.39592 / 0.42362, abs=1e-4)
    assert planned["ratio_vs_best_peer"] == pytest.approx(planned["ratio_vs_fa4"])
    assert r["impls"]["torch-varlen"]["ratio_vs_fa4"] == pytest.approx(0.7907, abs=1e-4)


def test_h200_flops_follow_the_spec_convention(h200):
    # The recorded FLOPs are 4·H·D·Σ Lq·Lk over the seeded lengths of that grid point.
    r = _record(h200, POINT)
    w = find_workload(POINT)
    kv = w.lengths()
    assert attention_flops([w.Lq] * w.B, kv, w.H, w.D) == r["flops"]
    assert int(kv.sum()) == r["workload"]["total_kv"]


def test_h200_frame(h200):
    df = h200.frame()
    assert len(df) == 18 * 8
    assert list(df.columns) == list(bench.FRAME_COLUMNS)
    row = df[(df["label"] == POINT) & (df["impl"] == "fa4")].iloc[0]
    assert row["kind"] == "peer" and row["Lq"] == 256 and row["max_kv"] == 2048 and row["sparsity"] == 0.1
    assert row["tflops"] == pytest.approx(278.609, abs=1e-3)
    assert row["rel_err"] == pytest.approx(9.5749e-4, rel=1e-4)  # against jfa-static, the first one
    assert df[df["impl"] == "jfa-lpt"]["ms_repeat"].notna().all()
    assert set(df[df["kind"] == "jfa"]["impl"]) == {"jfa-static", "jfa-lpt", "jfa-dynamic", "jfa-lpt-planned",
                                                    "jfa-dynamic-planned", "jfa-lpt-nopeel"}
    # FA4 is the best peer everywhere on this file, and the fastest at the densest points.
    assert (df.groupby("label")["best_peer"].first() == "fa4").all()
    dense = df[df["sparsity"] == 0.9]
    assert (dense.loc[dense.groupby("label")["tflops"].idxmax(), "impl"] == "fa4").all()


def test_filter(h200):
    assert len(h200.filter(grid="hsp").records) == 18
    assert h200.filter(grid="jagged").records == []
    assert [r["workload"]["label"] for r in h200.filter(labels=[POINT]).records] == [POINT]
    assert h200.filter(pass_="bwd").records == []


def test_impl_names_ours_first(h200):
    names = h200.impl_names()
    assert names[:6] == ["jfa-static", "jfa-lpt", "jfa-dynamic", "jfa-lpt-planned", "jfa-dynamic-planned",
                         "jfa-lpt-nopeel"]
    assert names[6:] == ["torch-varlen", "fa4"]


# ---------------------------------------------------------------------------------------------
# the new format
# ---------------------------------------------------------------------------------------------

def _new_record(label="hsp Lq=128 max=1024 s=0.5"):
    w = find_workload(label)
    return {"pass": "fwd", "workload": {"grid": w.grid, "label": label, "Lq": w.Lq, "max_kv": w.max_kv,
                                        "sparsity": w.sparsity, "broadcast_q": True, "B": w.B, "H": w.H},
            "flops": 1e12, "baseline": "jfa-lpt", "best_peer": None,
            "impls": {"jfa-lpt": {"ms": 4.0, "ms_repeat": 4.1, "peak_mem_mb": 12.0, "rel_err_vs_ref": 2e-3},
                      "torch-sdpa": {"ms": 8.0, "peak_mem_mb": 900.0},
                      "fa4": {"ms": 2.0},
                      "torch-flex": {"error": "wrong output on the first point: relative error 0.5"}}}


def test_new_format_round_trip(tmp_path):
    meta = {"gpu": "NVIDIA H200", "date": "2026-12-02T10:00:00+00:00", "command": "jfa-prof bench"}
    rec = _new_record()
    bench_results._derive(rec["impls"], rec["flops"])
    status = {"flex": bench.PeerStatus("flex", "torch-flex", True, None, "2.13.0")}
    doc = results_document([rec], meta, status)
    assert doc["results"][0]["meta"] == meta and doc["meta"] == meta and doc["format"] == bench.FORMAT
    p = tmp_path / "r.json"
    p.write_text(json.dumps(doc))
    res = load_results(p)
    r = res.records[0]
    assert r["best_peer"] == "fa4"
    assert r["impls"]["jfa-lpt"]["tflops"] == 1e12 / 4.0 / 1e9
    assert r["impls"]["jfa-lpt"]["ratio_vs_fa4"] == 0.5 and r["impls"]["torch-sdpa"]["ratio_vs_fa4"] == 0.25
    assert "tflops" not in r["impls"]["torch-flex"]
    assert res.peers["flex"]["version"] == "2.13.0"
    assert res.provenance() == "recorded on NVIDIA H200 on 2026-12-02"
    df = res.frame()
    assert df.set_index("impl").loc["torch-flex", "error"].startswith("wrong output")
    assert df.set_index("impl").loc["torch-sdpa", "peak_mem_mb"] == 900.0


def test_derive_without_fa4_or_peers():
    impls = {"jfa-lpt": {"ms": 2.0}, "torch-varlen": {"ms": 4.0}}
    assert bench_results._derive(impls, 4e9) == "torch-varlen"
    assert "ratio_vs_fa4" not in impls["jfa-lpt"] and impls["jfa-lpt"]["ratio_vs_best_peer"] == 2.0
    impls = {"jfa-lpt": {"ms": 2.0}}
    assert bench_results._derive(impls, 4e9) is None and impls["jfa-lpt"]["tflops"] == 2.0


def test_derive_pairs_each_round_with_fa4s():
    # The second round ran at a lower clock for both: the medians call it a tie, the rounds do not.
    impls = {"jfa-dynamic": {"ms": 1.0, "rounds_ms": [0.95, 1.33, 1.0]},
             "fa4": {"ms": 1.0, "rounds_ms": [1.0, 1.4, 0.95]},
             "jfa-lpt": {"ms": 2.0, "rounds_ms": [2.0]}}
    bench_results._derive(impls, 4e9)
    ours = impls["jfa-dynamic"]
    assert ours["ratio_vs_fa4"] == 1.0 and ours["ratio_vs_fa4_paired"] == pytest.approx(1.4 / 1.33)
    assert ours["rounds_faster_than_fa4"] == 2
    # One round, or none shared with FA4: nothing to pair.
    assert "ratio_vs_fa4_paired" not in impls["jfa-lpt"] and "ratio_vs_fa4_paired" not in impls["fa4"]


def test_more_rounds_times_every_implementation_in_turn_and_takes_the_median():
    from jfa_prof.bench.run import _more_rounds

    order = []

    def impl(name, fails=False):
        def build():  # round 1 is in `entries` already: these builds are rounds 2 and 3
            if fails:
                raise RuntimeError("out of memory")
            return (lambda: name), (lambda out: out)
        return bench_impls.Impl(name, build)

    # A clock slowing down over the point: each timing takes longer than the one before, whoever runs.
    clock = iter(range(10, 100))

    def timer(run, **kw):
        order.append(run())
        return float(next(clock))

    point = [impl("jfa-dynamic"), impl("fa4"), impl("sdpa", fails=True), impl("flex")]
    entries = {"jfa-dynamic": {"ms": 2.0, "ms_repeat": 2.1}, "fa4": {"ms": 5.0}, "sdpa": {"ms": 7.0},
               "flex": {"error": "wrong output on the first point"}}
    rounds_seen = []
    _more_rounds(point, entries, 3, timer=timer, timer_kw={}, on_round=rounds_seen.append)
    assert rounds_seen == [2, 3]
    assert order == ["jfa-dynamic", "fa4", "jfa-dynamic", "fa4"]  # in turn; flex never timed, sdpa failed to build
    assert entries["jfa-dynamic"]["rounds_ms"] == [2.0, 10.0, 12.0] and entries["jfa-dynamic"]["ms"] == 10.0
    assert entries["fa4"]["rounds_ms"] == [5.0, 11.0, 13.0] and entries["fa4"]["ms"] == 11.0
    assert entries["sdpa"]["rounds_ms"] == [7.0] and entries["sdpa"]["ms"] == 7.0
    assert entries["sdpa"]["rounds_error"].startswith("round 2: RuntimeError: out of memory")
    assert "rounds_ms" not in entries["flex"] and entries["jfa-dynamic"]["ms_repeat"] == 2.1


def test_load_results_errors(tmp_path):
    with pytest.raises(BadInputError, match="does not exist"):
        load_results(tmp_path / "none.json")
    p = tmp_path / "x.json"
    p.write_text("[1, 2]")
    with pytest.raises(BadInputError, match="not a bench result file"):
        load_results(p)
    p.write_text(json.dumps({"results": [{"workload": {}}]}))
    with pytest.raises(BadInputError, match="record 0 lacks"):
        load_results(p)


@pytest.mark.parametrize("impls, message", [
    ({"jfa-dynamic": None, "fa4": {"ms": 1.0}}, "implementation 'jfa-dynamic' is null"),
    ({"jfa-dynamic": [1.0]}, "implementation 'jfa-dynamic' is list"),
    ({"jfa-dynamic": {"ms": "fast"}}, "has ms 'fast'"),
    ({}, "times no implementation"),
])
def test_a_record_with_a_bad_or_no_implementation_is_bad_input(tmp_path, impls, message):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"results": [{"workload": {"label": "hsp Lq=128"}, "flops": 1e9, "impls": impls}]}))
    with pytest.raises(BadInputError, match=message) as info:
        load_results(p)
    assert "record 0 (hsp Lq=128)" in info.value.message
    result = CliRunner().invoke(app, ["bench", "--results", str(p)])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_select_workloads():
    assert len(bench.select_workloads("hsp")) == 18
    assert len(bench.select_workloads("jagged")) == 8
    assert [w.label for w in bench.select_workloads("hsp", [POINT])] == [POINT]
    with pytest.raises(BadInputError, match="unknown grid"):
        bench.select_workloads("sparse")
    with pytest.raises(BadInputError, match="no hsp workload labelled"):
        bench.select_workloads("hsp", ["hsp Lq=64"])


def test_select_workloads_causal():
    plain = bench.select_workloads("jagged", ["jagged max=512 s=0.5"])
    (w,) = bench.select_workloads("jagged", ["jagged max=512 s=0.5"], causal=True)
    assert w.causal and not plain[0].causal and w.label == "jagged max=512 s=0.5 causal"
    assert {**vars(w), "causal": False} == vars(plain[0])
    assert all(w.causal for w in bench.select_workloads("dense", causal=True))
    with pytest.raises(BadInputError, match="causal mask is defined for jagged Q only") as info:
        bench.select_workloads("hsp", causal=True)
    assert "--grid jagged or dense" in info.value.hint


def test_bench_causal_is_refused_with_a_result_file(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--results", str(tmp_path / "none.json"), "--causal"])
    assert result.exit_code == 2 and "--causal applies to a live run" in result.output, result.output
    result = CliRunner().invoke(app, ["bench", "--grid", "hsp", "--causal"])
    assert result.exit_code == 2 and "jagged Q only" in result.output, result.output


# ---------------------------------------------------------------------------------------------
# peers
# ---------------------------------------------------------------------------------------------

def test_peer_availability(monkeypatch):
    real = bench_peers._import

    def fake(name):
        if name == "flash_attn.cute":
            return types.SimpleNamespace(flash_attn_varlen_func=lambda **kw: None, __version__="4.0.0b36")
        if name == "torch.nn.attention.varlen":
            raise ImportError("No module named 'torch.nn.attention.varlen'")
        if name == "torch.nn.attention.flex_attention":
            return types.SimpleNamespace(flex_attention=None)  # no BlockMask
        return real(name)
    monkeypatch.setattr(bench_peers, "_import", fake)
    monkeypatch.setattr(bench_peers, "_dist_version", lambda *names: None)
    st = bench.peer_status(["fa4", "varlen", "sdpa", "flex"])
    assert st["fa4"].available and st["fa4"].version == "4.0.0b36" and st["fa4"].impl == "fa4"
    assert not st["varlen"].available and "not importable" in st["varlen"].reason
    assert st["sdpa"].available and st["sdpa"].impl == "torch-sdpa"
    assert not st["flex"].available and "BlockMask" in st["flex"].reason
    assert bench.impl_names([k for k, s in st.items() if s.available], ["lpt", "static"]) == [
        "jfa-lpt", "jfa-lpt-planned", "jfa-static", "jfa-static-planned", "fa4", "torch-sdpa"]


def test_fa4_missing(monkeypatch):
    def fake(name):
        raise ImportError("No module named 'flash_attn'")
    monkeypatch.setattr(bench_peers, "_import", fake)
    st = bench.peer_status(["fa4"])
    assert not st["fa4"].available and "flash_attn" in st["fa4"].reason


def test_unknown_peer():
    with pytest.raises(BadInputError, match="unknown peer"):
        bench.peer_status(["fa3"])


def test_unknown_pass():
    with pytest.raises(BadInputError, match="unknown pass 'dq'"):
        bench.peer_impls(None, ["fa4"], "dq")


def test_bwd_names_and_impls():
    assert bench.impl_names(["fa4"], ("lpt", "dynamic"), "bwd") == ["jfa-lpt", "jfa-dynamic", "fa4"]
    assert bench.impl_names(["fa4"], ("lpt",)) == ["jfa-lpt", "jfa-lpt-planned", "fa4"]
    x = SMALL[0].make("cpu", dtype=torch.float32)
    assert [i.name for i in bench.jfa_impls(x, ("lpt",), "bwd")] == ["jfa-lpt"]
    assert [(i.name, i.kind) for i in bench.peer_impls(x, ["varlen", "sdpa"], "bwd")] == [
        ("torch-varlen", "peer"), ("torch-sdpa", "peer")]


SMALL = [
    Workload("hsp", B=7, H=2, H_kv=2, D=64, Lq=32, max_kv=100, sparsity=0.5, broadcast_q=True),
    Workload("jagged", B=9, H=2, H_kv=1, D=64, Lq=90, max_kv=90, sparsity=0.5, broadcast_q=False,
             distribution="with_zeros"),
    Workload("jagged", B=9, H=2, H_kv=2, D=64, Lq=90, max_kv=90, sparsity=0.9, broadcast_q=False, causal=True),
    Workload("hsp", B=5, H=2, H_kv=2, D=64, Lq=40, max_kv=70, sparsity=0.3, broadcast_q=True, window=5),
    # All sequences full: SDPA runs without a mask.
    Workload("dense", B=2, H=2, H_kv=2, D=64, Lq=48, max_kv=48, sparsity=1.0, broadcast_q=False),
]


def _dense(n, idx, n_cols):
    from torch.nn.attention.flex_attention import _ordered_to_dense

    return _ordered_to_dense(n, idx, n_cols)


@pytest.mark.parametrize("w", SMALL, ids=lambda w: w.label)
def test_document_block_mask_matches_create_block_mask(w):
    from torch.nn.attention.flex_attention import create_block_mask

    x = w.make("cpu", dtype=torch.float32)
    tq, tk = x.total_q, x.total_kv
    bm = bench.document_block_mask(x.q_offsets, x.kv_offsets, tq, tk, block=16, window=w.window, causal=w.causal)
    ref = create_block_mask(bm.mask_mod, None, None, tq, tk, device="cpu", BLOCK_SIZE=16)
    n_cols = -(-tk // 16)
    part = _dense(bm.kv_num_blocks, bm.kv_indices, n_cols)
    full = _dense(bm.full_kv_num_blocks, bm.full_kv_indices, n_cols)
    ref_part = _dense(ref.kv_num_blocks, ref.kv_indices, n_cols)
    ref_full = _dense(ref.full_kv_num_blocks, ref.full_kv_indices, n_cols)
    assert not (part & full).any()
    if w.window is None and not w.causal:
        # Without a window or causal rule the block-level construction is exact.
        assert torch.equal(part, ref_part) and torch.equal(full, ref_full)
    else:
        # With one, every block is partial: a superset of the visited blocks, never fewer.
        assert not full.any() and ((part | full) >= (ref_part | ref_full)).all()


@pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")
@pytest.mark.parametrize("w", SMALL, ids=lambda w: w.label)
def test_flex_and_sdpa_inputs_give_the_reference(w):
    from torch.nn.attention.flex_attention import flex_attention

    x = w.make("cpu", dtype=torch.float32)
    ref = reference_attention(x.q, x.k, x.v, None if w.broadcast_q else x.q_offsets, x.kv_offsets,
                              window_size=w.window, causal=w.causal, broadcast_q=w.broadcast_q)[0]
    rows = rows_seeing_keys(x)
    q = bench_peers._repeated_q(x).transpose(0, 1).unsqueeze(0).contiguous()
    k, v = (t.transpose(0, 1).unsqueeze(0).contiguous() for t in (x.k, x.v))
    bm = bench.document_block_mask(x.q_offsets, x.kv_offsets, q.shape[2], k.shape[2], window=w.window,
                                   causal=w.causal)
    o = flex_attention(q, k, v, block_mask=bm, enable_gqa=w.H != w.H_kv)[0].transpose(0, 1)
    assert bench.rel_err(o, ref, rows) < 1e-5
    run, output = bench_peers._sdpa(x)
    assert bench.rel_err(output(run()), ref, rows) < 1e-5


@pytest.mark.parametrize("w", SMALL, ids=lambda w: w.label)
def test_backward_of_the_padded_sdpa_peer_gives_the_reference_gradients(w):
    """The bwd bench's plumbing on the CPU: leaves, the fixed upstream gradient, dQ summed over
    the batch for broadcast-Q (autograd through the repeated Q), compared part by part."""
    x = w.make("cpu", dtype=torch.float32)
    ref = bench.reference_output(x, "bwd")
    run, output = bench_impls._backward(x, bench_peers._sdpa)
    grads = output(run())
    assert [g.shape for g in grads] == [x.q.shape, x.k.shape, x.v.shape]
    assert bench.rel_err(grads, ref) < 1e-5
    assert bench.rel_err(output(run()), grads) == 0.0  # the graph is kept: timing can repeat it
    # A wrong dK shows even though dQ and dV are right.
    assert bench.rel_err((grads[0], grads[1] * 1.1, grads[2]), ref) > 0.05


def test_upstream_grad_is_fixed_and_zero_where_no_key_is_seen():
    w = Workload("hsp", B=3, H=1, H_kv=1, D=64, Lq=8, max_kv=6, sparsity=0.3, broadcast_q=True, window=1)
    x = w.make("cpu")
    o = torch.empty(x.q.shape[0] * 3, 1, 64, dtype=x.q.dtype)
    g = upstream_grad(x, o)
    assert g.dtype == x.q.dtype and torch.equal(g, upstream_grad(x, o))
    rows = rows_seeing_keys(x)
    assert (g[~rows] == 0).all() and (g[rows] != 0).any(dim=-1).all()


def test_rows_seeing_keys_and_rel_err():
    w = Workload("hsp", B=3, H=1, H_kv=1, D=64, Lq=8, max_kv=6, sparsity=0.3, broadcast_q=True, window=1)
    x = w.make("cpu")
    rows = rows_seeing_keys(x).reshape(3, 8)
    for b, lk in enumerate(x.kv_lens.tolist()):
        # Row i sees keys [i-1, i+1] ∩ [0, lk): something while i <= lk.
        assert rows[b].tolist() == [i <= lk for i in range(8)]
    a = torch.ones(4, 2)
    b = a.clone()
    b[0, 0] = float("nan")
    assert rel_nan(b, a) and bench.rel_err(b, a, torch.tensor([False, True, True, True])) == 0.0


def rel_nan(out, ref):
    import math

    return math.isnan(bench.rel_err(out, ref))


# ---------------------------------------------------------------------------------------------
# on the GPU
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_run_bench_small_point(cuda_device):
    w = Workload("hsp", B=64, H=4, H_kv=4, D=128, Lq=128, max_kv=512, sparsity=0.5, broadcast_q=True)
    records = bench.run_bench([w, w], peers=["varlen", "sdpa", "flex", "fa4"], rep_ms=10, warmup_ms=5,
                              device=cuda_device)
    first, second = records
    assert first["baseline"] == "jfa-dynamic" and "ms_repeat" in first["impls"]["jfa-dynamic"]
    for name, e in first["impls"].items():
        if "error" in e:
            continue  # a peer may be missing or fail: reported, not fatal
        assert e["rel_err_vs_ref"] < 1e-2 and e["ms"] > 0 and e["tflops"] > 0 and e["peak_mem_mb"] >= 0
    assert first["impls"]["jfa-dynamic"]["rel_err_vs_first"] == 0.0
    assert all("rel_err_vs_ref" not in e for e in second["impls"].values())
    assert "host_ms" in first


@pytest.mark.gpu
def test_run_bench_backward_small_point(cuda_device):
    w = Workload("hsp", B=64, H=4, H_kv=4, D=128, Lq=128, max_kv=512, sparsity=0.5, broadcast_q=True)
    (rec,) = bench.run_bench([w], pass_="bwd", peers=["varlen", "fa4"], rep_ms=10, warmup_ms=5, device=cuda_device,
                             rounds=2)
    assert rec["pass"] == "bwd" and rec["flops"] == pytest.approx(2.5 * w.make("cpu").flops("fwd"))
    e = rec["impls"]["jfa-dynamic"]
    assert e["rel_err_vs_ref"] < 2e-2 and e["ms"] > 0 and e["peak_mem_mb"] >= 0, e
    assert len(e["rounds_ms"]) == 2 and e["ms"] == pytest.approx(sum(e["rounds_ms"]) / 2), e
    for name, e in rec["impls"].items():
        if "error" not in e:
            assert e["rel_err_vs_ref"] < 2e-2, name


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_run_bench_records_the_time_split(cuda_device, pass_):
    w = Workload("hsp", B=256, H=4, H_kv=4, D=128, Lq=256, max_kv=1024, sparsity=0.5, broadcast_q=True)
    (rec,) = bench.run_bench([w], pass_=pass_, peers=[], rep_ms=10, warmup_ms=5, device=cuda_device, limits=True,
                             host=False)
    s = rec["time_split"]
    assert "error" not in s, s
    assert s["profile_level"] == 1 and s["schedule"] == "dynamic" and s["kernel_ms"] > 0
    assert s["n_ctas"] == torch.cuda.get_device_properties(cuda_device).multi_processor_count
    # The backward's broadcast-Q tiles all walk Lq / 64 query blocks: a point alone has one tile
    # size, and its fit puts every busy ns on the blocks (a = 0).
    assert s["a_ns"] >= 0 and s["b_ns"] > 0 and s["n_blocks"] >= s["n_tiles"] > 0
    assert s["sums"]["count"] == s["n_tiles"] and s["sums"]["sx"] == s["n_blocks"]
    assert s["sums"]["sy"] == pytest.approx(s["busy_ns"]) and s["busy_ns"] <= s["n_ctas"] * s["makespan_ns"]
    assert s["blocks_share"] + s["tile_share"] + s["idle_share"] == pytest.approx(1.0)
    assert 0 <= s["idle_share"] < 1 and s["blocks_share"] > 0.2
    # The recording's makespan is the instrumented kernel (CUPTI), less its launch ramp.
    assert 0.7 < s["makespan_ns"] / 1e6 / s["kernel_ms"] <= 1.01


def test_bitwise_equal_tells_one_flipped_bit_and_compares_part_by_part():
    a = torch.randn(4, 3, dtype=torch.bfloat16)
    b = a.clone()
    assert bench.bitwise_equal(a, b) and bench.bitwise_equal((a, a), (b, b))
    b.view(torch.int16)[1, 2] ^= 1
    assert not bench.bitwise_equal(a, b) and not bench.bitwise_equal((a, a), (a, b))
    assert not bench.bitwise_equal((a, a), (a, ))
