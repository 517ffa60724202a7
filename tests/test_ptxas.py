from pathlib import Path

import pytest

from jfa_prof.errors import BadInputError
from jfa_prof.ptxas import PtxasLogError, count_local_memory, count_waits, entry_stats, matmul_loops, parse_ptxas_log

DATA = Path(__file__).parent / "data" / "ptxas"


def _log(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize(
    "fixture, name, registers, stores, loads, stack, barriers",
    [
        ("ws_gemm_sm90a.log", "ws_gemm_kernel", 168, 0, 0, 0, 4),
        ("wgmma_serialized_spills.log", "ws_gemm_kernel", 160, 1488, 1168, 976, 3),
        ("setmaxnreg_ignored.log", "ws_gemm_kernel", 90, 0, 0, 0, 4),
        ("register_hog_spills.log", "register_hog_kernel", 64, 80, 100, 48, 0),
        ("register_hog_maxnreg8.log", "register_hog_kernel", 24, 824, 956, 392, 0),
        ("jfa_fwd_bcast_bf16_d128.log", "_jfa_fwd", 168, 504, 640, 192, 13),
    ],
)
def test_single_kernel_logs(fixture, name, registers, stores, loads, stack, barriers):
    (rec,) = parse_ptxas_log(_log(fixture))
    assert (rec.name, rec.is_entry, rec.target) == (name, True, "sm_90a")
    assert rec.registers == registers
    assert (rec.spill_store_bytes, rec.spill_load_bytes, rec.stack_frame_bytes) == (stores, loads, stack)
    assert rec.spill_bytes == stores + loads
    assert rec.spills == (stores + loads > 0)
    assert rec.barriers == barriers
    assert rec.compile_time_ms > 0
    # ptxas prints the cumulative stack only when there is one.
    assert rec.cumulative_stack_bytes == (stack or None)


def test_wgmma_serialization_note_goes_to_the_function_it_names():
    (rec,) = parse_ptxas_log(_log("wgmma_serialized_spills.log"))
    assert len(rec.warnings) == 1
    assert rec.warnings[0].startswith("(C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized")


def test_unnamed_setmaxnreg_note_goes_to_the_next_entry():
    (rec,) = parse_ptxas_log(_log("setmaxnreg_ignored.log"))
    assert rec.warnings == ["(C7507) Potential Performance Loss: 'setmaxnreg' ignored to maintain minimum "
                            "register requirements."]


def test_register_count_warning():
    (rec,) = parse_ptxas_log(_log("register_hog_maxnreg8.log"))
    assert rec.warnings == ["For entry register_hog_kernel adjusting per thread register count of 8 to "
                            "lower bound of 24"]


def test_clean_log_has_no_warnings():
    (rec,) = parse_ptxas_log(_log("ws_gemm_sm90a.log"))
    assert rec.warnings == []
    assert rec.smem_bytes is None  # this ptxas prints smem only for static shared memory


def test_device_functions_follow_their_entry():
    recs = parse_ptxas_log(_log("noinline_calls.log"))
    assert [r.is_entry for r in recs] == [True, False, False]
    entry, *helpers = recs
    assert entry.name == "calls_kernel" and entry.registers == 26
    for h in helpers:
        assert "_softplus_inplace" in h.name
        assert h.registers is None and h.compile_time_ms is None
        assert h.target == "sm_90a"
        assert h.stack_frame_bytes == 0
    assert helpers[0].name != helpers[1].name  # one specialization per BLOCK


def test_several_logs_back_to_back():
    recs = parse_ptxas_log(_log("session_several_kernels.log"))
    assert [(r.name, r.is_entry) for r in recs][:3] == [
        ("ws_gemm_kernel", True), ("register_hog_kernel", True), ("calls_kernel", True)]
    assert len(recs) == 5
    ws, hog, calls = recs[:3]
    assert ws.registers == 255
    assert ws.warnings == ["Too many maxnreg specified for entry ws_gemm_kernel, will be ignored"]
    assert hog.warnings == [] and calls.warnings == []
    assert hog.spill_bytes == 180
    assert entry_stats(recs, "calls_kernel") is calls


@pytest.mark.parametrize("fixture", ["static_smem.log", "static_smem_ptxas_blackwell.log"])
def test_static_shared_memory_and_tool_prefix(fixture):
    (rec,) = parse_ptxas_log(_log(fixture))
    assert (rec.name, rec.registers, rec.barriers, rec.smem_bytes) == ("static_smem_kernel", 12, 1, 4096)


def test_older_ptxas_wording_with_constant_banks():
    # CUDA 11/12.0-era ptxas: no barrier count, static smem and constant banks on the register line.
    log = "\n".join([
        "ptxas info    : 0 bytes gmem",
        "ptxas info    : Compiling entry function 'k' for 'sm_80'",
        "ptxas info    : Function properties for k",
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        "ptxas info    : Used 40 registers, 384 bytes smem, 372 bytes cmem[0], 8 bytes cmem[2]",
    ])
    (rec,) = parse_ptxas_log(log)
    assert (rec.registers, rec.smem_bytes, rec.cmem_bytes, rec.barriers) == (40, 384, {0: 372, 2: 8}, None)
    assert rec.compile_time_ms is None and rec.target == "sm_80"


def test_entry_stats_missing_name():
    with pytest.raises(KeyError, match="nope"):
        entry_stats(parse_ptxas_log(_log("ws_gemm_sm90a.log")), "nope")


@pytest.mark.parametrize("text", [
    "",
    "hello world\n",
    "ptxas info    : 0 bytes gmem\n",  # a module line alone says nothing about any function
    (DATA / "register_hog_spills.sass").read_text()[:2000],
])
def test_garbage_is_rejected(text):
    with pytest.raises(PtxasLogError, match="no ptxas function statistics"):
        parse_ptxas_log(text)


def test_failed_assembly_is_rejected_with_the_fatal_message():
    with pytest.raises(PtxasLogError, match=r"ptxas failed.*C7602\) Insufficient registers"):
        parse_ptxas_log(_log("fatal_insufficient_registers.log"))


def test_parse_error_is_a_value_error_and_a_bad_input_error():
    with pytest.raises(ValueError):
        parse_ptxas_log("nothing")
    with pytest.raises(BadInputError) as info:
        parse_ptxas_log("nothing")
    assert info.value.exit_code == 2


def test_non_text_is_rejected():
    with pytest.raises(PtxasLogError):
        parse_ptxas_log(b"ptxas info")  # type: ignore[arg-type]


# ---- SASS --------------------------------------------------------------------------------------

def test_local_memory_counts_and_sites():
    sass = (DATA / "register_hog_spills.sass").read_text()
    stats = count_local_memory(sass)
    assert (stats.loads, stats.stores, stats.total) == (23, 19, 42)
    assert dict(stats.per_function) == {"register_hog_kernel": (23, 19)}
    assert stats.instructions > stats.total
    assert len(stats.sites) == 42
    lines = sass.splitlines()
    for site in stats.sites:
        assert site.function == "register_hog_kernel"
        assert site.opcode.split(".")[0] in ("LDL", "STL")
        assert site.is_load == site.opcode.startswith("LDL")
        # line and offset point back at the very instruction in the dump
        assert f"/*{site.offset:04x}*/" in lines[site.line - 1]
        assert site.opcode in lines[site.line - 1]
        marked = [c for c in site.context if c.startswith("->")]
        assert marked == [f"-> /*{site.offset:04x}*/ {site.instruction}"]
        assert 1 <= len(site.context) <= 5
    offsets = [s.offset for s in stats.sites]
    assert offsets == sorted(offsets)


def test_local_memory_none_in_a_clean_kernel():
    sass = "\n".join([
        "\tcode for sm_90a",
        "\t\tFunction : k",
        "        /*0000*/                   LDC R1, c[0x0][0x28] ;  /* 0x00000a00ff017b82 */",
        "        /*0010*/                   EXIT ;                  /* 0x000000000000794d */",
    ])
    stats = count_local_memory(sass)
    assert (stats.loads, stats.stores, stats.instructions, stats.sites) == (0, 0, 2, ())


def test_predicated_and_wide_local_accesses():
    sass = "\n".join([
        "\t\tFunction : k",
        "        /*0000*/               @P0 STL.64 [R1+0x8], R2 ;  /* 0x0000 */",
        "        /*0010*/              @!P1 LDL.LU.128 R4, [R1+0x10] ;  /* 0x0000 */",
        "        /*0020*/                   LDG.E R6, desc[UR4][R2.64] ;  /* 0x0000 */",
    ])
    stats = count_local_memory(sass)
    assert [(s.opcode, s.offset, s.instruction) for s in stats.sites] == [
        ("STL.64", 0, "@P0 STL.64 [R1+0x8], R2"),
        ("LDL.LU.128", 0x10, "@!P1 LDL.LU.128 R4, [R1+0x10]"),
    ]


@pytest.mark.parametrize("count", [count_local_memory, count_waits])
@pytest.mark.parametrize("text", ["", "not sass at all", _log("ws_gemm_sm90a.log")])
def test_sass_garbage_is_rejected(text, count):
    with pytest.raises(PtxasLogError, match="no SASS instructions"):
        count(text)


def _sass(*instrs: str) -> str:
    return "\n".join(["\tcode for sm_90a", "\t\tFunction : k"]
                     + [f"        /*{16 * i:04x}*/                   {x} ;" for i, x in enumerate(instrs)])


def test_waits_count_groups_issued_before_each_wait():
    overlapped = _sass(
        "WARPGROUP.ARRIVE", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT",
        "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0",  # closes group 1
        "HGMMA.64x64x16.F32.BF16 R56, gdesc[UR12], R56, gsb0",  # group 2, issued before any wait
        "WARPGROUP.DEPBAR.LE gsb0, 0x1", "BAR.SYNC.DEFER_BLOCKING 0x0",
        "HGMMA.64x128x16.F32.BF16 R88, R120, gdesc[UR16].tnspB, R88, gsb0",
        "WARPGROUP.DEPBAR.LE gsb0, 0x0", "BAR.SYNC.DEFER_BLOCKING 0x2, 0x80", "EXIT")
    w = count_waits(overlapped)
    assert (w.wgmma_groups, w.wgmma_waits, w.wgmma_in_flight, w.barriers) == (3, 2, 2, 2)
    serialized = _sass(
        "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], R24, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "HGMMA.64x64x16.F32.BF16 R56, gdesc[UR12], R56, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0", "EXIT")
    assert count_waits(serialized).wgmma_in_flight == 1
    assert count_waits(_sass("LDC R1, c[0x0][0x28]", "EXIT")).wgmma_in_flight == 0


def _kv_loop(*softmax: str) -> list[str]:
    """A consumer's KV loop as SASS lines (offsets 0x10 apart, the loop starting at 0x0010): QK^T
    and P·V issued, then `softmax` between the two waits' neighbours, then the back branch."""
    return ["WARPGROUP.ARRIVE", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0",
            "PRMT R152, R152, 0x5432, R152", "HGMMA.64x128x16.F32.BF16 R88, R152, gdesc[UR8].tnspB, R88, gsb0",
            *softmax, "ISETP.GE.AND P0, PT, R2, R3, PT", "@!P0 BRA 0x10"]


def test_matmul_loops_tell_whether_the_softmax_overlaps_the_matmul():
    overlapped = _sass("NOP", *_kv_loop("WARPGROUP.DEPBAR.LE gsb0, 0x1", "MUFU.EX2 R4, R4", "MUFU.EX2 R5, R5",
                                        "WARPGROUP.DEPBAR.LE gsb0, 0x0"), "EXIT")
    s = matmul_loops(overlapped)
    assert (s.loops, s.shuffles, s.fences, s.local, s.mufu_overlap) == (1, 1, 0, 0, 1.0)
    assert s.instructions == 10  # from the loop's first instruction to its back branch
    serial = _sass("NOP", *_kv_loop("WARPGROUP.DEPBAR.LE gsb0, 0x1", "FENCE.VIEW.ASYNC.S", "LDL R7, [R1]",
                                    "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R4, R4", "MUFU.EX2 R5, R5"), "EXIT")
    s = matmul_loops(serial)
    assert (s.fences, s.local, s.mufu_overlap) == (1, 1, 0.0)
    assert s.mufu_wait == "elsewhere" and matmul_loops(overlapped).mufu_wait is None
    # A loop without matmuls, and a barrier-retry stub after EXIT branching back, are not wgmma loops.
    assert matmul_loops(_sass("NOP", "MUFU.EX2 R4, R4", "@P0 BRA 0x10", "EXIT")).loops == 0
    # A loop of matmuls alone has no exponentials to overlap: no share rather than 0%.
    gemm = matmul_loops(_sass("NOP", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], R24, gsb0",
                              "WARPGROUP.DEPBAR.LE gsb0, 0x0", "@P0 BRA 0x10", "EXIT"))
    assert gemm.loops == 1 and gemm.mufu_overlap is None
    stub = _sass("NOP", "HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT, gsb0", "EXIT", "BRA 0x10")
    assert matmul_loops(stub).loops == 0


def test_matmul_loops_say_what_the_wait_holding_the_exponentials_back_sits_next_to():
    # _kv_loop's lines start at 0x0010 (after the NOP), 0x10 apart: its softmax starts at 0x0050.
    def wait_at(*softmax):
        return matmul_loops(_sass("NOP", *_kv_loop(*softmax), "EXIT")).mufu_wait
    # A masked block's branch rejoining right before the wait (the peeled forward's KV loop).
    assert wait_at("WARPGROUP.DEPBAR.LE gsb0, 0x1", "@P1 BRA 0x80", "FSEL R24, R24, -INF, !P2",
                   "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R4, R4") == "branch join"
    assert wait_at("WARPGROUP.DEPBAR.LE gsb0, 0x1", "@!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4+0x38740], RZ",
                   "WARPGROUP.DEPBAR.LE gsb0, 0x0", "MUFU.EX2 R4, R4") == "mbarrier arrive"
    # A branch that rejoins far from the wait says nothing about it.
    assert wait_at("WARPGROUP.DEPBAR.LE gsb0, 0x1", "@P1 BRA 0x70", "FSEL R24, R24, -INF, !P2", "FMNMX R3, R24, R25",
                   "FMNMX R3, R3, R26", "FMNMX R3, R3, R27", "WARPGROUP.DEPBAR.LE gsb0, 0x0",
                   "MUFU.EX2 R4, R4") == "elsewhere"
    # A wait at the end of the body holds back the exponentials at its top, the next time round.
    top = matmul_loops(_sass("NOP", "MUFU.EX2 R4, R4", *_kv_loop("@!P0 SYNCS.ARRIVE.TRANS64.A1T0 RZ, [UR4], RZ",
                                                                 "WARPGROUP.DEPBAR.LE gsb0, 0x0"), "EXIT"))
    assert (top.mufu_overlap, top.mufu_wait) == (0.0, "mbarrier arrive")
    # Exponentials issued before the wait are not held back by it.
    assert wait_at("WARPGROUP.DEPBAR.LE gsb0, 0x1", "MUFU.EX2 R4, R4", "@P1 BRA 0x80", "NOP",
                   "WARPGROUP.DEPBAR.LE gsb0, 0x0") is None


def test_forward_kv_loop_anatomy():
    """The broadcast forward's KV loop, one copy per consumer. With the output staged in buffers of
    its own, no generic write reaches a Q buffer and the loop has no proxy fence; staged through the
    Q buffer (`O_BUF=False`) the compiler fences every iteration's QK^T. P, copied into the
    registers the next P·V reads (`fwd._moved`), needs no byte permutes before it."""
    import dataclasses

    from jfa_prof.compile import _registered_variants, compile_variant

    variant = _registered_variants()["fwd/bcast/bf16/d128/dynamic/peel/noprof"]
    loops = compile_variant(variant).loops
    assert loops.loops == 2 and loops.fences == 0 and loops.local == 0 and loops.shuffles == 0
    # Its exponentials wait for the P·V where the peeled mask's branch rejoins.
    assert loops.mufu_overlap == 0.0 and loops.mufu_wait == "branch join"
    through_q = dataclasses.replace(variant, name=f"{variant.name}/q-staged",
                                    constexprs={**variant.constexprs, "O_BUF": False})
    assert compile_variant(through_q).loops.fences == 1
    assert 400 < loops.instructions < 1000


def test_the_barrier_wait_level_does_not_spill():
    """Level 2 times every wait into 32-bit counters (`kernels/profiling.counter`): in 64 bits the
    forward producer's eight counters, in its 40 registers, spilled 136 bytes; the backward's
    level-2 build spilled too."""
    from jfa_prof.compile import _registered_variants, compile_variant

    variants = _registered_variants()
    for name in ("fwd/bcast/bf16/d128/dynamic/peel/prof", "fwd/bcast/bf16/d128/dynamic/peel/prof/n64",
                 "bwd/bcast/bf16/d128/tma1/prof2"):
        result = compile_variant(variants[name])
        assert result.stats.spill_bytes == 0, name


@pytest.mark.parametrize("name", ["bwd/bcast/bf16/d128/tma1", "bwd/bcast/bf16/d64/tma1", "bwd/jagged/bf16/d128/det"])
def test_the_backward_consumers_take_turns_at_the_first_matmuls(name):
    """Each step both consumers wait once at the turn barrier (id 15, 256 threads): consumer 1 after
    issuing S^T and dP^T, consumer 0 before. Both must, in every step loop, or the two would
    deadlock or drift apart."""
    from jfa_prof.compile import _registered_variants, compile_variant
    from jfa_prof.ptxas import _loop_bodies, _sass_instructions

    sass = compile_variant(_registered_variants()[name]).sass
    turn = "BAR.SYNC.DEFER_BLOCKING 0xf, 0x100"
    assert sass.count(turn) == 2
    steps = _loop_bodies(_sass_instructions(sass))  # the loops that hold a wgmma
    assert len(steps) == 2
    assert all(sum(turn in m.group(0) for m in body) == 1 for body in steps)
