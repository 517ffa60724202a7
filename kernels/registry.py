"""Every compiled variant of the project's kernels, enumerable by name.

A variant is one (kernel, constexpr set, launch config) that the op can launch. `spills`,
the compile tests and the benchmarks iterate over `all_variants()` so none is forgotten.
Names read like paths, e.g. ``fwd/bf16/d128/lpt/peel/prof-off``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class KernelVariant:
    name: str
    kernel: Any  # a triton JITFunction
    # Argument name -> triton signature type: "*bf16", "i32", "fp32", "tensordesc<bf16[64,128]>",
    # or "constexpr" for the names given in `constexprs`.
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    num_stages: int = 1
    tags: dict[str, str] = field(default_factory=dict)  # pass, dtype, head_dim, schedule, peel, profile


_PROVIDERS: list[Callable[[], list[KernelVariant]]] = []


def provider(fn: Callable[[], list[KernelVariant]]) -> Callable[[], list[KernelVariant]]:
    """Kernel modules register a function that lists their variants."""
    _PROVIDERS.append(fn)
    return fn


def all_variants() -> list[KernelVariant]:
    # Importing the kernel modules registers their providers.
    from jfa_prof.kernels import fwd  # noqa: F401
    from jfa_prof.kernels import bwd  # noqa: F401

    out = [v for p in _PROVIDERS for v in p()]
    names = [v.name for v in out]
    if len(set(names)) != len(names):
        raise RuntimeError("duplicate kernel variant names")
    return out
