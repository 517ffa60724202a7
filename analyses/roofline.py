"""How close a timed call came to the GPU's limits (the roofline of each benchmark point).

Two floors bound any implementation of a point: its FLOPs at the tensor cores' dense peak, and
the HBM bytes it cannot avoid at peak bandwidth. The larger floor names what bounds the point
(``compute`` or ``memory``); a time divided into it is the fraction of the roof reached, and a
target ratio against a peer is only reachable if the peer's time over the ratio stays above it.

The unavoidable bytes are each input read once and each output written once, in the inputs'
element size (2 bytes for bf16 / fp16):

- forward: Q (for broadcast-Q its ``Lq`` shared rows), K, V; O and the fp32 log-sum-exp out;
- backward: Q, K, V, O, dO and the log-sum-exp in; dQ, dK, dV out.

Everything an implementation moves beyond that (K/V read again per query block, a dQ
accumulator in fp32, copies of Q) is its own cost, so fractions compare implementations fairly.
FLOPs follow the benchmark's convention (`jfa_prof.inputs.attention_flops`: the backward counts
2.5 times the forward). Standard library only, like `jfa_prof.hardware`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from jfa_prof.hardware import GpuSpec

__all__ = ["Roofline", "min_hbm_bytes", "roofline", "roofline_of_record"]

_ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "bfloat16": 2, "float16": 2}
_LSE_BYTES = 4  # the log-sum-exp is fp32


@dataclass(frozen=True)
class Roofline:
    flops: float
    min_bytes: float
    compute_ms: float  # the FLOPs at the dense tensor-core peak
    memory_ms: float  # the unavoidable bytes at peak HBM bandwidth

    @property
    def floor_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms)

    @property
    def bound(self) -> str:
        return "memory" if self.memory_ms >= self.compute_ms else "compute"

    def fraction(self, ms: float | None) -> float:
        """The share of the roof a call of ``ms`` milliseconds reached (1.0: at the floor)."""
        if ms is None or not ms > 0:
            return math.nan
        return self.floor_ms / ms

    def needed_fraction(self, peer_ms: float | None, ratio: float) -> float:
        """The share of the roof a call must reach to be ``ratio`` times faster than the peer."""
        if peer_ms is None or not peer_ms > 0:
            return math.nan
        return self.fraction(peer_ms / ratio)

    def to_dict(self) -> dict[str, Any]:
        return {"flops": self.flops, "min_bytes": self.min_bytes, "compute_ms": self.compute_ms,
                "memory_ms": self.memory_ms, "floor_ms": self.floor_ms, "bound": self.bound}


def min_hbm_bytes(pass_: str, *, H: int, H_kv: int, D: int, total_q: int, total_kv: int, broadcast_q: bool,
                  Lq: int | None = None, dtype: str = "bf16") -> float:
    """Bytes each input read once and each output written once (see the module notes).
    ``total_q`` counts output rows (for broadcast-Q, batch x Lq); ``Lq`` is needed for broadcast-Q."""
    if pass_ not in ("fwd", "bwd"):
        raise ValueError(f"pass must be fwd or bwd, got {pass_!r}")
    if broadcast_q and Lq is None:
        raise ValueError("broadcast-Q needs Lq (its Q has Lq rows, shared by the batch)")
    elt = _ELEMENT_BYTES[str(dtype).removeprefix("torch.")]
    q = (Lq if broadcast_q else total_q) * H * D * elt
    kv = total_kv * H_kv * D * elt  # K or V
    o = total_q * H * D * elt  # O, or dO
    lse = total_q * H * _LSE_BYTES
    if pass_ == "fwd":
        return float(q + 2 * kv + o + lse)
    return float(2 * q + 4 * kv + 2 * o + lse)  # in: Q, K, V, O, dO, lse; out: dQ, dK, dV


def roofline(pass_: str, flops: float, spec: GpuSpec, *, dtype: str = "bf16", peak_flops: float | None = None,
             **shape: Any) -> Roofline:
    """The two floors of one point on ``spec``; ``shape`` as for :func:`min_hbm_bytes`.
    ``peak_flops`` replaces the datasheet's tensor-core peak (a measured matrix product's rate)."""
    nbytes = min_hbm_bytes(pass_, dtype=dtype, **shape)
    peak = peak_flops or spec.peak_flops(dtype)
    return Roofline(flops=float(flops), min_bytes=nbytes, compute_ms=flops / peak * 1e3,
                    memory_ms=nbytes / spec.hbm_bytes_per_s * 1e3)


def roofline_of_record(record: Mapping[str, Any], spec: GpuSpec, *, peak_flops: float | None = None
                       ) -> Roofline | None:
    """The roofline of a bench record (``jfa_prof.bench``'s format: ``pass``, ``flops`` and the
    workload's shape); None when the record lacks what it needs. ``peak_flops`` as for :func:`roofline`."""
    w = record.get("workload") or {}
    need = ("H", "H_kv", "D", "total_q", "total_kv", "broadcast_q")
    if not record.get("flops") or any(w.get(k) is None for k in need):
        return None
    if w["broadcast_q"] and w.get("Lq") is None:
        return None
    return roofline(record.get("pass", "fwd"), float(record["flops"]), spec, dtype=w.get("dtype", "bf16"),
                    peak_flops=peak_flops, **{k: w[k] for k in need}, Lq=w.get("Lq"))
