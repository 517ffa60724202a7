"""The one table of GPU specifications: every peak number jfa-prof compares against.

Formulas elsewhere take a ``GpuSpec`` (usually from ``lookup``) and never spell out SM counts,
clocks or bandwidths, so a new GPU is one entry here. Peak FLOP/s follow the datasheet
convention: SMs x dense tensor-core FLOP per clock per SM x the clock the datasheet quotes
(for Hopper, 132 x 4096 x 1.83 GHz = 989 TFLOPS bf16).

Standard library only: the CLI and analyses import this without torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from jfa_prof.errors import BadInputError

DTYPE_ALIASES: Mapping[str, str] = MappingProxyType({
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "tf32": "tf32",
    "fp8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
})


@dataclass(frozen=True)
class GpuSpec:
    key: str
    name: str
    arch: str
    compute_capability: tuple[int, int]
    sm_count: int
    # The clock the datasheet's peak FLOP figures are quoted at; sustained tensor-core work
    # runs near it, not at the higher max_clock_ghz that nvidia-smi shows.
    boost_clock_ghz: float
    max_clock_ghz: float
    # Dense (no 2:4 sparsity) tensor-core FLOP per clock per SM, by input dtype.
    dense_flop_per_clock_per_sm: Mapping[str, int]
    hbm_bandwidth_tb_s: float  # decimal TB/s, as datasheets and ncu quote it
    l2_bytes: int
    # Lower-case name tokens: all of `tokens` must appear and none of `exclude`.
    tokens: tuple[str, ...] = field(repr=False, default=())
    exclude: tuple[str, ...] = field(repr=False, default=())
    note: str = ""

    @property
    def sm_arch(self) -> str:
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_bandwidth_tb_s * 1e12

    def flop_per_clock_per_sm(self, dtype: str = "bf16") -> int:
        canonical = DTYPE_ALIASES.get(str(dtype).lower())
        if canonical is None or canonical not in self.dense_flop_per_clock_per_sm:
            known = ", ".join(sorted(self.dense_flop_per_clock_per_sm))
            raise BadInputError(f"no peak for dtype {dtype!r} on {self.name}", hint=f"known: {known}")
        return self.dense_flop_per_clock_per_sm[canonical]

    def peak_flops(self, dtype: str = "bf16", *, clock_ghz: float | None = None,
                   sm_count: int | None = None) -> float:
        """Dense tensor-core peak in FLOP/s. ``clock_ghz`` / ``sm_count`` override the table
        for a clock-locked run or a partitioned (MIG) device."""
        clock = self.boost_clock_ghz if clock_ghz is None else clock_ghz
        sms = self.sm_count if sm_count is None else sm_count
        return sms * self.flop_per_clock_per_sm(dtype) * clock * 1e9

    def peak_tflops(self, dtype: str = "bf16", *, clock_ghz: float | None = None,
                    sm_count: int | None = None) -> float:
        return self.peak_flops(dtype, clock_ghz=clock_ghz, sm_count=sm_count) / 1e12

    def ridge_flop_per_byte(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity where the roofline turns from HBM-bound to compute-bound."""
        return self.peak_flops(dtype) / self.hbm_bytes_per_s


_MiB = 1 << 20

_HOPPER_FLOP = MappingProxyType({"tf32": 2048, "bf16": 4096, "fp16": 4096, "fp8": 8192})
_BLACKWELL_FLOP = MappingProxyType({"tf32": 4096, "bf16": 8192, "fp16": 8192, "fp8": 16384})

_SPECS = (
    GpuSpec(
        key="h100-sxm", name="NVIDIA H100 SXM5 80GB", arch="hopper", compute_capability=(9, 0),
        sm_count=132, boost_clock_ghz=1.83, max_clock_ghz=1.98,
        dense_flop_per_clock_per_sm=_HOPPER_FLOP, hbm_bandwidth_tb_s=3.35, l2_bytes=50 * _MiB,
        # The driver calls the SXM part "H100 80GB HBM3"; PCIe (114 SMs) and NVL differ.
        tokens=("h100",), exclude=("pcie", "nvl"),
    ),
    GpuSpec(
        key="h200-sxm", name="NVIDIA H200 SXM 141GB", arch="hopper", compute_capability=(9, 0),
        sm_count=132, boost_clock_ghz=1.83, max_clock_ghz=1.98,
        dense_flop_per_clock_per_sm=_HOPPER_FLOP, hbm_bandwidth_tb_s=4.8, l2_bytes=60 * _MiB,
        tokens=("h200",), exclude=("nvl",),
        note="same compute as H100 SXM; HBM3e and the L2 the driver reports (60 MiB) differ",
    ),
    GpuSpec(
        key="b200", name="NVIDIA B200", arch="blackwell", compute_capability=(10, 0),
        sm_count=148, boost_clock_ghz=1.86, max_clock_ghz=1.965,
        dense_flop_per_clock_per_sm=_BLACKWELL_FLOP, hbm_bandwidth_tb_s=8.0, l2_bytes=126 * _MiB,
        tokens=("b200",),
        note="clock is the one implied by the 2.25 PFLOPS dense bf16 datasheet figure; "
             "the kernels here target Hopper, so B200 figures are for comparison only",
    ),
)

SPECS: Mapping[str, GpuSpec] = MappingProxyType({spec.key: spec for spec in _SPECS})

# H100 and H200 SXM share a capability; a capability alone answers for the compute side,
# which is identical, and the first-listed part of that capability stands in for memory.
_BY_CAPABILITY: Mapping[tuple[int, int], GpuSpec] = MappingProxyType(
    {cc: next(s for s in _SPECS if s.compute_capability == cc)
     for cc in dict.fromkeys(s.compute_capability for s in _SPECS)}
)


def _tokens(name: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", name.lower())) - {""}


def lookup(name: str | None = None, capability: tuple[int, int] | None = None) -> GpuSpec | None:
    """The spec for a device name (as ``torch.cuda.get_device_name`` or nvidia-smi print it,
    or a table key such as ``h200-sxm``), else for a compute capability; None if neither fits.

    A name that is given but matches nothing falls back to the capability only when one is
    passed: a Hopper part missing from the table (H100 PCIe) then still gets Hopper compute
    peaks, while an unknown name alone gets None rather than a guess.
    """
    if name:
        if name.lower() in SPECS:
            return SPECS[name.lower()]
        words = _tokens(name)
        for spec in _SPECS:
            if words.issuperset(spec.tokens) and not words.intersection(spec.exclude):
                return spec
    if capability is not None:
        return _BY_CAPABILITY.get(tuple(capability))
    return None


def get(key_or_name: str) -> GpuSpec:
    """Like ``lookup`` by name, for user input: an unknown GPU is a BadInputError (exit 2)."""
    spec = lookup(key_or_name)
    if spec is None:
        raise BadInputError(f"unknown GPU {key_or_name!r}", hint="known: " + ", ".join(SPECS))
    return spec


def peak_tflops(gpu: str | GpuSpec, dtype: str = "bf16", *, clock_ghz: float | None = None) -> float:
    """Dense tensor-core peak TFLOPS of a GPU given by spec, key or device name."""
    spec = gpu if isinstance(gpu, GpuSpec) else get(gpu)
    return spec.peak_tflops(dtype, clock_ghz=clock_ghz)


def detect(device_index: int = 0) -> GpuSpec | None:
    """The spec of a visible CUDA device, or None without one. Imports torch."""
    import torch

    if not torch.cuda.is_available():
        return None
    return lookup(torch.cuda.get_device_name(device_index),
                  torch.cuda.get_device_capability(device_index))
