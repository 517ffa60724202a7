"""Jagged workloads: sequence lengths, offsets, seeded tensors, FLOP counts, benchmark grids,
and what every measurement says of a workload's inputs (its result-file fields, the rows that see
a key, the fixed upstream gradient).

Lengths and FLOP counts live on the host (CPU int64): a workload's shape is decided before any
tensor reaches the GPU, so it is identical on every device and costs no device sync to read.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

import torch

__all__ = [
    "DISTRIBUTIONS",
    "DTYPES",
    "GRIDS",
    "JaggedInputs",
    "Workload",
    "attention_flops",
    "density_bounds",
    "find_workload",
    "offsets_from_lengths",
    "rows_seeing_keys",
    "sample_lengths",
    "upstream_grad",
    "workload_dict",
]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DISTRIBUTIONS = ("density", "equal", "long_tail", "with_zeros")

# long_tail: log-normal spread. 1.5 puts most sequences well below the mean and ~10% at the
# clip for sparsity 0.5 — the shape of real user histories, and the worst case for balance.
_LONG_TAIL_SIGMA = 1.5
_ZERO_FRACTION = 0.1


# ---------------------------------------------------------------------------------------------
# lengths and offsets
# ---------------------------------------------------------------------------------------------

def _snap(x: float) -> float:
    # 2 * 0.35 * 100 is 69.99999999999999 in floating point; the convention means 70.
    r = round(x)
    return float(r) if abs(x - r) < 1e-6 else x


def density_bounds(max_len: int, sparsity: float) -> tuple[int, int]:
    """Inclusive integer range of lengths for the "density" convention (SPEC §6).

    The range is the integers inside the real interval: s >= 0.5 gives
    ``[ceil((2s-1)·max), max]`` (s = 0.5 therefore allows empty sequences), s < 0.5 gives
    ``[1, max(1, floor(2s·max))]``. Either way the mean length is about s·max.
    """
    if not 0.0 < sparsity <= 1.0:
        raise ValueError(f"sparsity must be in (0, 1], got {sparsity}")
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if sparsity >= 0.5:
        return math.ceil(_snap((2 * sparsity - 1) * max_len)), max_len
    return 1, max(1, math.floor(_snap(2 * sparsity * max_len)))


def sample_lengths(
    B: int, max_len: int, sparsity: float, *, generator: torch.Generator,
    distribution: str = "density",
) -> torch.Tensor:
    """Sequence lengths, int64 ``[B]`` on the CPU.

    - ``"density"``: uniform in :func:`density_bounds` (``s == 1``: every length is max_len).
    - ``"equal"``: every length is max_len; sparsity is ignored.
    - ``"long_tail"``: log-normal with sigma 1.5 whose *unclipped* mean is s·max_len, rounded
      and clipped to ``[1, max_len]``: most sequences short, a spike of them at max_len.
    - ``"with_zeros"``: "density" lengths with each one set to 0 with probability 0.1.
    """
    if distribution == "equal":
        return torch.full((B,), max_len, dtype=torch.int64)
    lo, hi = density_bounds(max_len, sparsity)
    if distribution in ("density", "with_zeros"):
        lengths = torch.randint(lo, hi + 1, (B,), generator=generator, dtype=torch.int64)
        if distribution == "with_zeros":
            drop = torch.rand(B, generator=generator) < _ZERO_FRACTION
            lengths = lengths.masked_fill(drop, 0)
        return lengths
    if distribution == "long_tail":
        mu = math.log(sparsity * max_len) - _LONG_TAIL_SIGMA ** 2 / 2
        z = torch.randn(B, generator=generator, dtype=torch.float64)
        return torch.exp(mu + _LONG_TAIL_SIGMA * z).round().clamp(1, max_len).to(torch.int64)
    raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")


def offsets_from_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """int32 ``[B+1]`` offsets (``0, l0, l0+l1, ...``) on the lengths' device."""
    lengths = torch.as_tensor(lengths)
    ends = torch.cumsum(lengths.to(torch.int64), dim=0)
    if lengths.numel():
        smallest, total = torch.stack([lengths.min().to(torch.int64), ends[-1]]).tolist()
        if smallest < 0:
            raise ValueError(f"lengths must be >= 0, got a length of {smallest}")
        if total > torch.iinfo(torch.int32).max:
            raise ValueError(f"{total} tokens do not fit int32 offsets")
    zero = torch.zeros(1, dtype=torch.int64, device=lengths.device)
    return torch.cat([zero, ends]).to(torch.int32)


# ---------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------

def _as_lengths(x: Sequence[int] | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.int64).cpu().reshape(-1)


def _key_ranges(q_lens: torch.Tensor, kv_lens: torch.Tensor, window, causal) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)``, one entry per query row in packed order: the visible keys of a row form one
    contiguous range ``[lo, hi]`` of its sequence (empty where ``hi < lo``)."""
    batch_of_row = torch.repeat_interleave(torch.arange(q_lens.numel()), q_lens)
    row_start = torch.cumsum(q_lens, 0) - q_lens
    i = torch.arange(batch_of_row.numel()) - row_start[batch_of_row]
    lk = kv_lens[batch_of_row]
    lo = torch.zeros_like(i)
    hi = lk - 1
    if window is not None:
        lo = (i - window).clamp(min=0)
        hi = torch.minimum(hi, i + window)
    if causal:
        hi = torch.minimum(hi, i + lk - q_lens[batch_of_row])
    return lo, hi


def _visible_pairs(q_lens: torch.Tensor, kv_lens: torch.Tensor, window, causal) -> int:
    if window is None and not causal:
        return int((q_lens * kv_lens).sum())
    lo, hi = _key_ranges(q_lens, kv_lens, window, causal)
    return int((hi - lo + 1).clamp(min=0).sum())


def attention_flops(
    q_lens, kv_lens, H: int, D: int, *, window: int | None = None, causal: bool = False,
    pass_: str = "fwd",
) -> float:
    """FLOPs by the SPEC §2 convention: forward ``4·H·D·Σ_b (visible query-key pairs)``.

    Unmasked, the pairs of sequence b are ``Lq_b·Lk_b``; pairs hidden by a window or causal mask
    are not counted (counted exactly, per query row). Backward (``pass_="bwd"``) is 2.5 × forward.
    For broadcast-Q pass ``q_lens = [Lq] * B``.
    """
    if pass_ not in ("fwd", "bwd"):
        raise ValueError(f"pass_ must be 'fwd' or 'bwd', got {pass_!r}")
    q_lens, kv_lens = _as_lengths(q_lens), _as_lengths(kv_lens)
    if q_lens.shape != kv_lens.shape:
        raise ValueError(f"q_lens has {q_lens.numel()} sequences, kv_lens {kv_lens.numel()}")
    fwd = 4.0 * H * D * _visible_pairs(q_lens, kv_lens, window, causal)
    return fwd if pass_ == "fwd" else 2.5 * fwd


# ---------------------------------------------------------------------------------------------
# workloads
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Workload:
    """One benchmark point. Jagged Q (``broadcast_q=False``) is self-attention: every sequence
    has as many queries as keys and q shares kv's offsets, so ``Lq`` must equal ``max_kv``."""

    grid: str
    B: int
    H: int
    H_kv: int
    D: int
    Lq: int
    max_kv: int
    sparsity: float
    broadcast_q: bool
    causal: bool = False
    window: int | None = None
    dtype: str = "bf16"
    distribution: str = "density"
    seed: int = 0

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {self.dtype!r}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, "
                             f"got {self.distribution!r}")
        if self.H % self.H_kv:
            raise ValueError(f"H={self.H} is not a multiple of H_kv={self.H_kv}")
        if self.causal and self.broadcast_q:
            raise ValueError("causal is only defined for jagged Q, not broadcast-Q")
        if not self.broadcast_q and self.Lq != self.max_kv:
            raise ValueError(f"jagged Q is self-attention: Lq ({self.Lq}) must equal "
                             f"max_kv ({self.max_kv})")
        if self.window is not None and self.window < 0:
            raise ValueError(f"window must be >= 0, got {self.window}")
        density_bounds(self.max_kv, self.sparsity)  # validates sparsity

    @property
    def label(self) -> str:
        """Short human name, e.g. ``"hsp Lq=256 max=2048 s=0.1"``."""
        parts = [self.grid]
        if self.broadcast_q:
            parts.append(f"Lq={self.Lq}")
        parts += [f"max={self.max_kv}", f"s={self.sparsity:g}"]
        if self.H_kv != self.H:
            parts.append(f"H_kv={self.H_kv}")
        if self.causal:
            parts.append("causal")
        if self.window is not None:
            parts.append(f"W={self.window}")
        if self.distribution != "density":
            parts.append(self.distribution)
        return " ".join(parts)

    def lengths(self) -> torch.Tensor:
        """The KV lengths (CPU int64 ``[B]``), the same for a given seed on every device."""
        gen = torch.Generator().manual_seed(self.seed)
        return sample_lengths(self.B, self.max_kv, self.sparsity, generator=gen,
                              distribution=self.distribution)

    def make(self, device="cpu", dtype: torch.dtype | None = None) -> JaggedInputs:
        """Seeded inputs. q, k, v are standard normal, which with the default 1/sqrt(D) scale
        gives unit-variance logits: a softmax that is neither flat nor one-hot. Values come
        from a generator on ``device``, so they are reproducible per device type."""
        dtype = dtype or DTYPES[self.dtype]
        device = torch.device(device)
        kv_lens = self.lengths()
        kv_offsets = offsets_from_lengths(kv_lens)
        if self.broadcast_q:
            q_lens = torch.full((self.B,), self.Lq, dtype=torch.int64)
            q_offsets = torch.arange(self.B + 1, dtype=torch.int32) * self.Lq
            q_rows = self.Lq
        else:
            q_lens, q_offsets = kv_lens, kv_offsets
            q_rows = int(kv_offsets[-1])
        total_kv = int(kv_offsets[-1])

        gen = torch.Generator(device=device).manual_seed(self.seed + 1)

        def randn(*shape):
            return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

        q = randn(q_rows, self.H, self.D)
        k = randn(total_kv, self.H_kv, self.D)
        v = randn(total_kv, self.H_kv, self.D)
        return JaggedInputs(
            q=q, k=k, v=v,
            q_offsets=q_offsets.to(device), kv_offsets=kv_offsets.to(device),
            max_seq_len_q=int(q_lens.max()) if self.B else 0,
            max_seq_len_kv=int(kv_lens.max()) if self.B else 0,
            q_lens=q_lens, kv_lens=kv_lens, workload=self,
        )


@dataclass
class JaggedInputs:
    """Tensors for one call. ``q_lens``/``kv_lens`` are CPU int64; ``max_seq_len_*`` are the
    actual maxima of this sample (plain ints, so peers do not recompile per call). For
    broadcast-Q, q is ``[Lq, H, D]`` and ``q_offsets`` is ``arange(B+1)·Lq``, the offsets of
    the repeated-Q form that peers without broadcast support take."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_offsets: torch.Tensor
    kv_offsets: torch.Tensor
    max_seq_len_q: int
    max_seq_len_kv: int
    q_lens: torch.Tensor
    kv_lens: torch.Tensor
    workload: Workload

    @property
    def total_q(self) -> int:
        return int(self.q_lens.sum())

    @property
    def total_kv(self) -> int:
        return int(self.kv_lens.sum())

    def flops(self, pass_: str = "fwd") -> float:
        w = self.workload
        return attention_flops(self.q_lens, self.kv_lens, w.H, w.D, window=w.window,
                               causal=w.causal, pass_=pass_)


# ---------------------------------------------------------------------------------------------
# what measurements say of the inputs (bench, waterfall and recordings share these)
# ---------------------------------------------------------------------------------------------

def workload_dict(x: JaggedInputs) -> dict[str, Any]:
    """The workload fields of a result file (SPEC §6) for inputs ``x``."""
    w = x.workload
    return {**asdict(w), "label": w.label, "total_q": x.total_q, "total_kv": x.total_kv}


def rows_seeing_keys(x: JaggedInputs) -> torch.Tensor:
    """Bool ``[rows]``: output rows that see at least one key. Peers disagree on the others
    (SDPA's all-masked softmax is NaN, the op and FA4 give zeros), so checks skip them."""
    lo, hi = _key_ranges(x.q_lens, x.kv_lens, x.workload.window, x.workload.causal)
    return (hi >= lo).to(x.q.device)


def upstream_grad(x: JaggedInputs, o: torch.Tensor) -> torch.Tensor:
    """The gradient fed into every implementation's backward: fixed random values (one seed per
    workload), zero on rows that see no key, whose outputs peers do not agree on."""
    g = torch.Generator(device=o.device).manual_seed(x.workload.seed + 1)
    do = torch.randn(o.shape, generator=g, device=o.device, dtype=torch.float32)
    return (do * rows_seeing_keys(x)[:, None, None]).to(x.q.dtype)


# ---------------------------------------------------------------------------------------------
# SPEC §6 grids, and the long sequences the backward's targets name
# ---------------------------------------------------------------------------------------------

def _grids() -> dict[str, list[Workload]]:
    hsp = [
        Workload("hsp", B=1024, H=4, H_kv=4, D=128, Lq=lq, max_kv=mkv, sparsity=s,
                 broadcast_q=True)
        for lq in (128, 256) for mkv in (1024, 2048, 4096) for s in (0.1, 0.5, 0.9)
    ]
    jagged = [
        Workload("jagged", B=1152, H=4, H_kv=4, D=128, Lq=mkv, max_kv=mkv, sparsity=s,
                 broadcast_q=False)
        for mkv in (256, 512, 1024, 2048) for s in (0.5, 1.0)
    ]
    dense = [Workload("dense", B=8, H=16, H_kv=16, D=128, Lq=4096, max_kv=4096, sparsity=1.0,
                      broadcast_q=False)]
    # Long broadcast-Q sequences: few of them, so one sequence's KV blocks fill the GPU.
    long = [Workload("long", B=32, H=4, H_kv=4, D=128, Lq=512, max_kv=16384, sparsity=s, broadcast_q=True)
            for s in (0.5, 0.9)]
    return {"hsp": hsp, "jagged": jagged, "dense": dense, "long": long}


GRIDS: dict[str, list[Workload]] = _grids()


def find_workload(label: str) -> Workload:
    """The grid workload whose :attr:`Workload.label` is ``label``."""
    for workloads in GRIDS.values():
        for w in workloads:
            if w.label == label:
                return w
    raise KeyError(f"no workload labelled {label!r} in GRIDS")


def hsp_point(text: str) -> tuple[int, int, float]:
    """An HSP point as the benchmark scripts take it on the command line: "LQ,MAX_KV,SPARSITY"."""
    lq, max_kv, sparsity = text.split(",")
    return int(lq), int(max_kv), float(sparsity)


def select_workload(grid: str | None = None, *, Lq: int | None = None, max_kv: int | None = None,
                    sparsity: float | None = None, seed: int | None = None) -> Workload:
    """The first workload of `grid` (default "hsp") matching the fields given; the CLI's
    `--grid/--lq/--max-kv/--sparsity/--seed` options land here. ValueError names what was asked."""
    grid = grid or "hsp"
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}: one of {', '.join(GRIDS)}")
    if grid == "hsp":
        Lq, max_kv, sparsity = Lq or 256, max_kv or 2048, sparsity if sparsity is not None else 0.5
    for w in GRIDS[grid]:
        if all(v is None or getattr(w, k) == v for k, v in (("Lq", Lq), ("max_kv", max_kv), ("sparsity", sparsity))):
            return replace(w, seed=seed) if seed is not None else w
    raise ValueError(f"no {grid} workload with Lq={Lq} max_kv={max_kv} sparsity={sparsity}")
