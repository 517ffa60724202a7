"""Small TLX kernels the compile, ptxas and spills tests build for sm_90a.

They are ours rather than the tutorials' so the tests pin down exactly which features get
exercised (warp specialization, mbarriers, TMA, wgmma) while staying cheap to compile.
"""
from __future__ import annotations

import triton
import triton.language as tl
import triton.language.extra.tlx as tlx

from jfa_prof.kernels.registry import KernelVariant


@triton.jit
def _tile_phase(counter, NUM_BUFFERS: tl.constexpr):
    # Ring-buffer slot and the mbarrier parity to wait for: the parity flips on every lap.
    return counter % NUM_BUFFERS, (counter // NUM_BUFFERS) & 1


@triton.jit
def ws_gemm_kernel(a_desc, b_desc, c_ptr, M, N, K, stride_cm,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   NUM_BUFFERS: tl.constexpr, NUM_CONSUMERS: tl.constexpr, CONSUMER_REGS: tl.constexpr):
    """C = A @ B, one tile per CTA: a TMA producer warp group feeds NUM_CONSUMERS wgmma
    warp groups, each owning BLOCK_M // NUM_CONSUMERS rows of the tile (the FA layout)."""
    SPLIT_M: tl.constexpr = BLOCK_M // NUM_CONSUMERS
    off_m = tl.program_id(0) * BLOCK_M
    off_n = tl.program_id(1) * BLOCK_N

    a_bufs = tlx.local_alloc((SPLIT_M, BLOCK_K), tlx.dtype_of(a_desc), NUM_BUFFERS * NUM_CONSUMERS)
    b_bufs = tlx.local_alloc((BLOCK_K, BLOCK_N), tlx.dtype_of(b_desc), NUM_BUFFERS)
    fulls = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=1)
    # A slot is free again only once every consumer has finished reading it.
    empties = tlx.alloc_barriers(num_barriers=NUM_BUFFERS, arrive_count=NUM_CONSUMERS)
    tile_bytes: tl.constexpr = (BLOCK_M * BLOCK_K + BLOCK_K * BLOCK_N) * tlx.size_of(tlx.dtype_of(a_desc))

    with tlx.async_tasks():
        with tlx.async_task("default"):
            for k in range(0, tl.cdiv(K, BLOCK_K)):
                buf, phase = _tile_phase(k, NUM_BUFFERS)
                # The first lap finds every slot free, hence the inverted parity.
                tlx.barrier_wait(empties[buf], phase ^ 1)
                tlx.barrier_expect_bytes(fulls[buf], tile_bytes)
                for c in tl.static_range(NUM_CONSUMERS):
                    tlx.async_descriptor_load(a_desc, a_bufs[buf * NUM_CONSUMERS + c],
                                              [off_m + c * SPLIT_M, k * BLOCK_K], fulls[buf])
                tlx.async_descriptor_load(b_desc, b_bufs[buf], [k * BLOCK_K, off_n], fulls[buf])

        with tlx.async_task(num_warps=4, registers=CONSUMER_REGS, replicate=NUM_CONSUMERS):
            cid = tlx.async_task_replica_id()
            acc = tl.zeros((SPLIT_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, tl.cdiv(K, BLOCK_K)):
                buf, phase = _tile_phase(k, NUM_BUFFERS)
                tlx.barrier_wait(fulls[buf], phase)
                acc = tlx.async_dot(a_bufs[buf * NUM_CONSUMERS + cid], b_bufs[buf], acc)
                acc = tlx.async_dot_wait(0, acc)
                tlx.barrier_arrive(empties[buf], 1)
            offs_m = off_m + cid * SPLIT_M + tl.arange(0, SPLIT_M)
            offs_n = off_n + tl.arange(0, BLOCK_N)
            mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
            c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def register_hog_kernel(x_ptr, y_ptr, n, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Keeps a large fp32 tile live across a data-dependent loop so that a low register cap
    (``maxnreg``) forces ptxas to spill it to local memory."""
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    tile = tl.load(x_ptr + rows[:, None] * COLS + cols[None, :])
    acc = tl.zeros((ROWS, COLS), dtype=tl.float32)
    for i in range(n):
        acc = acc * 0.5 + tl.math.exp2(tile * i)
        tile = tile + acc
    tl.store(y_ptr + rows[:, None] * COLS + cols[None, :], acc + tile)


@triton.jit(noinline=True)
def _softplus_inplace(ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(ptr + offs, mask=offs < n)
    tl.store(ptr + offs, tl.log(1.0 + tl.exp(x)), mask=offs < n)


@triton.jit
def calls_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """Two calls of a ``noinline`` helper: ptxas then reports the device functions separately."""
    _softplus_inplace(x_ptr, n, BLOCK)
    _softplus_inplace(y_ptr, n, BLOCK // 2)


REGISTER_HOG_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "ROWS": "constexpr",
                          "COLS": "constexpr"}
CALLS_SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


def ws_gemm_variant(name: str = "test/ws_gemm/bf16", dtype: str = "bf16", block_m: int = 128,
                    block_n: int = 128, block_k: int = 64, num_buffers: int = 2, num_consumers: int = 2,
                    consumer_regs: int = 232) -> KernelVariant:
    return KernelVariant(
        name=name,
        kernel=ws_gemm_kernel,
        signature={
            "a_desc": f"tensordesc<{dtype}[{block_m // num_consumers},{block_k}]>",
            "b_desc": f"tensordesc<{dtype}[{block_k},{block_n}]>",
            "c_ptr": f"*{dtype}",
            "M": "i32", "N": "i32", "K": "i32", "stride_cm": "i32",
            "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "BLOCK_K": "constexpr",
            "NUM_BUFFERS": "constexpr", "NUM_CONSUMERS": "constexpr", "CONSUMER_REGS": "constexpr",
        },
        constexprs={"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
                    "NUM_BUFFERS": num_buffers, "NUM_CONSUMERS": num_consumers,
                    "CONSUMER_REGS": consumer_regs},
        num_warps=4,
        num_stages=1,
        tags={"pass": "test", "dtype": dtype, "kind": "ws_gemm"},
    )
