"""Compiling TLX kernels for sm_90a without a GPU: the bundled ptxas runs on the CPU."""
import re
import time

import pytest

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX)")

from jfa_prof.compile import (CompileFailure, KernelCompileError, cache_key, compile_kernel,  # noqa: E402
                              compile_many, compile_variant, parse_target)
from jfa_prof.errors import BadInputError  # noqa: E402
from jfa_prof.ptxas import parse_ptxas_log  # noqa: E402
from tests.tlx_kernels import (CALLS_SIGNATURE, REGISTER_HOG_SIGNATURE, calls_kernel,  # noqa: E402
                               register_hog_kernel, ws_gemm_variant)


@pytest.fixture(scope="session")
def compile_cache(tmp_path_factory):
    # Where JFA_PROF_CACHE in tests/test_spills.py points, so each test kernel is built once per session.
    return tmp_path_factory.getbasetemp() / "jfa-prof-cache" / "compile"


@pytest.fixture(scope="session")
def ws_gemm_cache(tmp_path_factory):
    # Its own directory: test_spills fills the shared one with the same kernel, and whichever test
    # runs first would otherwise find this "cold" build already cached.
    return tmp_path_factory.mktemp("ws-gemm-cache")


@pytest.fixture(scope="session")
def ws_gemm(ws_gemm_cache):
    start = time.perf_counter()
    result = compile_variant(ws_gemm_variant(), "sm_90a", cache_dir=ws_gemm_cache)
    return result, time.perf_counter() - start


# ---- targets and inputs (no compiling) ----------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("sm_90a", ("sm_90a", 90)), ("SM90A", ("sm_90a", 90)), (" sm_100a ", ("sm_100a", 100)),
    ("sm_80", ("sm_80", 80)),
])
def test_parse_target(text, expected):
    assert parse_target(text) == expected


@pytest.mark.parametrize("text, hint", [
    ("sm_90", "use sm_90a"), ("sm_80a", "one of"), ("hopper", "one of"), ("sm_75", "one of"), ("", "one of"),
])
def test_unknown_targets_are_bad_input(text, hint):
    with pytest.raises(BadInputError) as info:
        parse_target(text)
    assert info.value.exit_code == 2
    assert hint in str(info.value)


def test_signature_must_name_every_argument():
    v = ws_gemm_variant()
    sig = dict(v.signature)
    del sig["stride_cm"]
    with pytest.raises(BadInputError, match=r"missing \['stride_cm'\]"):
        compile_kernel(v.kernel, sig, v.constexprs, target="sm_90a")
    with pytest.raises(BadInputError, match="constexpr arguments without a value"):
        compile_kernel(v.kernel, v.signature, {k: x for k, x in v.constexprs.items() if k != "BLOCK_K"})
    with pytest.raises(BadInputError, match="not a @triton.jit"):
        compile_kernel(lambda x: x, {"x": "i32"}, {})


def test_cache_key_covers_what_changes_the_binary():
    v = ws_gemm_variant()
    base = cache_key(v.kernel, v.signature, v.constexprs, v.num_warps, v.num_stages, "sm_90a")
    assert base == cache_key(v.kernel, dict(v.signature), dict(v.constexprs), v.num_warps, v.num_stages, "sm_90a")
    others = [
        cache_key(v.kernel, v.signature, {**v.constexprs, "NUM_BUFFERS": 3}, v.num_warps, v.num_stages),
        cache_key(v.kernel, v.signature, v.constexprs, 8, v.num_stages),
        cache_key(v.kernel, v.signature, v.constexprs, v.num_warps, v.num_stages, options={"maxnreg": 128}),
        cache_key(v.kernel, {**v.signature, "c_ptr": "*fp16"}, v.constexprs, v.num_warps, v.num_stages),
        cache_key(v.kernel, v.signature, v.constexprs, v.num_warps, v.num_stages, "sm_100a"),
    ]
    assert len({base, *others}) == 1 + len(others)


# ---- a warp-specialized TLX kernel --------------------------------------------------------------

def test_ws_kernel_compiles_for_sm90a(ws_gemm):
    result, _ = ws_gemm
    assert result.kernel == "ws_gemm_kernel" and result.target == "sm_90a"
    assert result.variant == "test/ws_gemm/bf16"
    assert re.search(r"Compiling entry function 'ws_gemm_kernel' for 'sm_90a'", result.ptxas_log)
    assert ".target sm_90a" in result.ptx
    assert result.cubin[:4] == b"\x7fELF"
    # the TLX pieces made it to PTX: mbarriers, TMA, per-role register budgets
    assert "mbarrier" in result.ptx
    assert "cp.async.bulk.tensor" in result.ptx
    assert "setmaxnreg" in result.ptx
    # one producer warp group and two consumer warp groups
    assert result.metadata.num_warps == 12
    assert result.metadata.shared > 0
    assert set(result.stage_seconds) >= {"ttir", "ttgir", "llir", "ptx", "cubin"}


def test_registers_agree_between_log_and_cubin(ws_gemm):
    result, _ = ws_gemm
    (entry,) = [f for f in parse_ptxas_log(result.ptxas_log) if f.is_entry]
    assert entry.registers == result.metadata.n_regs == result.n_regs == result.stats.registers
    assert 64 < result.n_regs <= 255
    # the log came from assembling the same PTX into the very same binary
    assert result.log_matches_cubin
    assert result.stats.spill_bytes == 0 and result.metadata.local_bytes == 0 and result.n_spills == 0


def test_sass_has_wgmma(ws_gemm):
    result, _ = ws_gemm
    assert "HGMMA" in result.sass
    assert "Function : ws_gemm_kernel" in result.sass
    assert result.local_memory.total == 0


def test_second_compile_is_a_cache_hit(ws_gemm, ws_gemm_cache):
    cold, cold_seconds = ws_gemm
    start = time.perf_counter()
    warm = compile_variant(ws_gemm_variant(), "sm_90a", cache_dir=ws_gemm_cache)
    warm_seconds = time.perf_counter() - start
    assert warm.cached and not cold.cached
    assert warm_seconds < cold_seconds / 10
    assert warm.cubin == cold.cubin and warm.sass == cold.sass and warm.ptx == cold.ptx
    assert warm.metadata == cold.metadata
    assert warm.compile_seconds == cold.compile_seconds  # the original build time is kept
    assert warm.stats == cold.stats


def test_maxnreg_option_forces_spills(compile_cache):
    result = compile_kernel(register_hog_kernel, REGISTER_HOG_SIGNATURE, {"ROWS": 64, "COLS": 64},
                            num_warps=4, num_stages=1, target="sm_90a", options={"maxnreg": 64},
                            cache_dir=compile_cache)
    assert ".maxnreg 64" in result.ptx
    assert result.metadata.maxnreg == 64
    assert result.n_regs == result.stats.registers <= 64
    assert result.stats.spill_bytes > 0
    # spills live in the stack frame, which is the per-thread local memory the driver reports
    assert result.metadata.local_bytes == result.stats.stack_frame_bytes > 0
    assert result.n_spills == result.metadata.local_bytes // 4
    local = result.local_memory
    assert local.loads > 0 and local.stores > 0
    assert all(s.function == "register_hog_kernel" for s in local.sites)


def test_no_cache_rebuilds(tmp_path):
    kwargs = dict(num_warps=4, num_stages=1, target="sm_90a", cache_dir=tmp_path)
    first = compile_kernel(calls_kernel, CALLS_SIGNATURE, {"BLOCK": 256}, **kwargs)
    again = compile_kernel(calls_kernel, CALLS_SIGNATURE, {"BLOCK": 256}, use_cache=False, **kwargs)
    assert not first.cached and not again.cached
    assert again.cubin == first.cubin
    # device functions that survived inlining are reported too
    assert [f.is_entry for f in again.functions] == [True, False, False]


def test_frontend_error_is_a_compile_error(tmp_path):
    sig = {**CALLS_SIGNATURE, "x_ptr": "i32"}  # a scalar where the kernel loads through a pointer
    with pytest.raises(KernelCompileError) as info:
        compile_kernel(calls_kernel, sig, {"BLOCK": 256}, cache_dir=tmp_path)
    assert info.value.stage == "frontend" and info.value.exit_code == 1
    assert "calls_kernel" in str(info.value)
    # why, and where: the load in the helper the kernel calls (Triton's own text ends in a caret)
    assert "Unsupported ptr type" in info.value.message and "tl.load" in info.value.message, info.value.message
    assert "of _softplus_inplace" in info.value.message
    assert "_softplus_inplace(x_ptr, n, BLOCK)" in info.value.log  # every level of the chain is kept


def test_ptxas_error_is_a_compile_error(tmp_path):
    with pytest.raises(KernelCompileError) as info:
        compile_kernel(calls_kernel, CALLS_SIGNATURE, {"BLOCK": 256}, cache_dir=tmp_path,
                       options={"ptx_options": "--no-such-ptxas-flag"})
    assert info.value.stage == "ptxas"
    assert "no-such-ptxas-flag" in info.value.log


# ---- the real forward kernel --------------------------------------------------------------------

def _fwd_variants():
    try:
        from jfa_prof.kernels.registry import all_variants

        variants = {v.name: v for v in all_variants()}
    except ImportError as err:
        pytest.skip(f"the forward kernel is not importable yet: {err}")
    wanted = ["fwd/bcast/bf16/d64/static/peel/noprof", "fwd/bcast/bf16/d64/static/nopeel/noprof"]
    missing = [w for w in wanted if w not in variants]
    if missing:
        pytest.skip(f"forward variants not registered: {missing}")
    return [variants[w] for w in wanted]


def test_forward_variants_compile_in_worker_processes(tmp_path):
    variants = _fwd_variants()
    seen = []
    results = compile_many(variants, "sm_90a", cache_dir=tmp_path, jobs=2,
                           on_result=lambda v, r: seen.append(v.name))
    assert sorted(seen) == sorted(v.name for v in variants)
    for v, r in zip(variants, results):
        assert not isinstance(r, CompileFailure), r
        assert r.variant == v.name and r.tags == v.tags and r.kernel == v.kernel.__name__
        assert r.log_matches_cubin
        assert r.n_regs == r.stats.registers
        assert "HGMMA" in r.sass
        assert r.metadata.num_warps == 12
        # PROFILE=False compiles the instrumentation out: no timer reads at all
        assert "globaltimer" not in r.ptx and "clock64" not in r.ptx
    again = compile_many(variants, "sm_90a", cache_dir=tmp_path, jobs=2)
    assert all(r.cached for r in again)


# ---- the backward's inner loop: the next query block's loads are in flight while one computes ---

def _tma_loads_waited_one_by_one(ptx: str) -> list[bool]:
    """For each TMA load (global to shared) after the first: was an mbarrier wait issued since the
    previous one? False means the two copies went out back to back, the second not waited for."""
    waited, seen, out = False, False, []
    for line in ptx.splitlines():
        if "cp.async.bulk.tensor" in line and ".global.mbarrier" in line:
            if seen:
                out.append(waited)
            seen, waited = True, False
        elif "mbarrier.try_wait" in line:
            waited = True
    return out


@pytest.mark.parametrize("name", ["bwd/bcast/bf16/d128/tma1", "bwd/jagged/bf16/d128/tma1"])
def test_backward_prefetches_the_next_query_block(name):
    """Q and dO of the next step are copied back to back, before the current step's matmuls.
    (Barriers written into the loop once stopped the software pipeliner that then made these
    copies, and every step waited for its own loads: K, wait, V, wait, Q, wait, dO, wait.)"""
    from jfa_prof.kernels import bwd

    variant = {v.name: v for v in bwd.bwd_variants()}[name]
    gaps = _tma_loads_waited_one_by_one(compile_variant(variant).ptx)
    assert len(gaps) >= 3  # K, V, then Q / dO at least once
    # the prologue's first Q / dO pair and the loop's prefetch pair
    assert gaps.count(False) >= 2, gaps


@pytest.mark.parametrize("name", ["bwd/bcast/bf16/d128/tma1", "bwd/jagged-causal/bf16/d64/tma1"])
def test_backward_step_issues_matmuls_before_waiting(name):
    """S^T and dP^T go to the tensor cores together and dV with dK, as the step loop is written.
    (Software-pipelined at num_stages=2, the step loop had a wgmma wait after every matmul.)"""
    from jfa_prof.kernels import bwd

    variant = {v.name: v for v in bwd.bwd_variants()}[name]
    waits = compile_variant(variant).waits
    assert waits.wgmma_groups >= 5 and waits.wgmma_in_flight >= 2, waits
