"""Launching the op's kernels with little host work per call.

`JITFunction.run` binds every argument in Python, compares the constexprs and builds the cache key
on each call; for the forward kernel (23 arguments, four TMA descriptors, 12 constexprs) that is
most of a short call's host time, and fbtriton's C launch cache does not take descriptor
arguments. `launch` keeps the compiled kernel per specialization instead: the key is what Triton's
own cache key is made of, the constexpr values and each runtime argument's specialization as
Triton computes it (`native_specialize_impl`, with each parameter's own `do_not_specialize` flags),
so the kernel found is the one `run` would have found. A new key goes through `run` once, which
compiles if need be, and its kernel is kept. Anything unusual (Triton's interpreter, launch hooks
set by a profiler) takes `run` every time.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

_kernels: dict[tuple, Any] = {}  # keyed by the JITFunction itself (held), never by a recyclable id
_params: dict[Any, tuple] = {}


def _param_specs(jit_fn) -> tuple:
    # (is_constexpr, is_const, specialize value, specialize alignment, default) per parameter.
    specs = _params.get(jit_fn)
    if specs is None:
        specs = tuple((p.is_constexpr, p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment,
                       p.default) for p in jit_fn.params)
        # `launch` passes the runtime arguments first and fills the constexprs in after them.
        first = next((i for i, sp in enumerate(specs) if sp[0]), len(specs))
        if any(not sp[0] for sp in specs[first:]):
            raise ValueError(f"{jit_fn.__name__}: a runtime parameter after a constexpr one")
        _params[jit_fn] = specs
    return specs


def _key(jit_fn, args, constexprs, num_warps, num_stages, device_index) -> tuple:
    from triton import knobs
    from triton._C.libtriton import native_specialize_impl

    backend = jit_fn.device_caches[device_index][3]
    specs = _param_specs(jit_fn)
    # The options `run` adds from Triton's knobs are part of its key: so here.
    opts = (knobs.runtime.debug, knobs.runtime.sanitize_overflow, knobs.compilation.instrumentation_mode)
    return (jit_fn, device_index, num_warps, num_stages, opts, tuple(constexprs.items()),
            tuple(native_specialize_impl(backend, a, s[1], s[2], s[3]) for a, s in zip(args, specs)))


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    # Global scratch for the descriptors the kernels build (128 bytes each per CTA), from torch's
    # caching allocator: no cudaMalloc per launch, and graph-safe under capture.
    return torch.empty(size, dtype=torch.int8, device="cuda")


def launch(jit_fn, grid: tuple[int, ...], args: Sequence[Any], constexprs: dict[str, Any], *, num_warps: int,
           num_stages: int, device_index: int, stream: int) -> None:
    """`jit_fn[grid](*args, **constexprs, num_warps=..., num_stages=...)`, on `stream` of the device
    `device_index` (the current one), with the runtime `args` positional and in order. A kernel
    that needs global scratch gets it from torch unless the caller set a Triton allocator."""
    from triton.runtime import _allocation

    if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        _launch(jit_fn, grid, args, constexprs, num_warps, num_stages, device_index, stream)
        return
    token = _allocation._allocator.set(_scratch)
    try:
        _launch(jit_fn, grid, args, constexprs, num_warps, num_stages, device_index, stream)
    finally:
        _allocation._allocator.reset(token)


def _launch(jit_fn, grid, args, constexprs, num_warps, num_stages, device_index, stream) -> None:
    from triton import knobs

    caches = getattr(jit_fn, "device_caches", None)
    hooked = knobs.runtime.launch_enter_hook or knobs.runtime.launch_exit_hook
    key = None if caches is None or hooked or device_index not in caches else \
        _key(jit_fn, args, constexprs, num_warps, num_stages, device_index)
    kernel = _kernels.get(key) if key is not None else None
    if kernel is None:
        kernel = jit_fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)
        if caches is not None and not hooked and kernel is not None and hasattr(kernel, "_init_handles"):
            # The first launch on a device creates its cache, so the key may only exist now.
            kernel._init_handles()
            _kernels[key or _key(jit_fn, args, constexprs, num_warps, num_stages, device_index)] = kernel
        return
    specs = _param_specs(jit_fn)
    names = jit_fn.arg_names
    values = list(args) + [constexprs.get(names[i], specs[i][4]) for i in range(len(args), len(specs))]
    g = tuple(grid) + (1, 1)
    kernel.run(g[0], g[1], g[2], stream, kernel.function, kernel.packed_metadata, None, None, None, *values)
