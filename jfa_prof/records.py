"""The one definition of the instrumentation record layout (SPEC §4).

A kernel launched with PROFILE=True writes into one flat int64 buffer made of four sections:

    [ header | tile records | role spans | barrier waits ]

- header: HEADER_WORDS words; ``Header.DROPPED`` counts tile records that found no slot (the
  buffer was full) and were therefore not written.
- tile records: ``tile_capacity`` slots of TILE_WORDS words; slot = the tile's position in the
  schedule's work list, so every processed tile has its own slot and nothing is written past
  the end (a slot >= capacity bumps DROPPED instead).
- role spans: per CTA and warp role, SPAN_WORDS words (first start / last end of that role).
- barrier waits: per CTA, role and wait site, BARRIER_WORDS words (cycles waited, waits).

Kernels read the field indices below through ``jfa_prof.kernels.profiling`` as constexprs;
readers (``jfa_prof.trace``) decode with the same names. Nothing else may hard-code an offset.
This module imports neither torch nor triton so analyses and the CLI stay light.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

LAYOUT_VERSION = 1


class Header(IntEnum):
    DROPPED = 0  # tile records not written because their slot was past the capacity
    CAPACITY = 1  # tile slots, written by the host when the buffer is made


HEADER_WORDS = 8


class Tile(IntEnum):
    """Fields of one tile record (int64 each)."""
    CTA = 0  # persistent program id
    SMID = 1  # %smid of the SM that ran it
    TILE = 2  # tile id (batch, head, block) in grid order, before any schedule
    BATCH = 3
    HEAD = 4
    BLOCK = 5  # query block (forward) or KV block (backward)
    KV_LEN = 6  # keys of this batch element
    N_BLOCKS = 7  # inner-loop iterations the tile ran (KV blocks visited)
    T_START = 8  # %globaltimer, ns
    T_END = 9
    C_START = 10  # clock64, cycles of this SM
    C_END = 11
    ROLE = 12  # warp role that wrote the record (a consumer replica)
    VALID = 13  # 1 once written: unwritten slots stay 0


TILE_WORDS = 16


class Span(IntEnum):
    """Fields of one (CTA, role) span: from the role's first tile to its last."""
    SMID = 0
    T_START = 1
    T_END = 2
    C_START = 3
    C_END = 4
    N_TILES = 5
    VALID = 6


SPAN_WORDS = 8


class Wait(IntEnum):
    """Fields of one (CTA, role, site) barrier-wait accumulator."""
    CYCLES = 0
    COUNT = 1


BARRIER_WORDS = 2

# Warp roles of the forward kernel, in replica order: the TMA producer and the consumer warpgroups.
FWD_ROLES = ("producer", "consumer0", "consumer1")
# Barrier wait sites of the forward kernel; a site is one barrier_wait call in the source.
# "queue" is the hand-off of the next tile through the mailbox (under the dynamic schedule the
# producer takes its position from the global queue first).
FWD_SITES = ("q_empty", "k_empty", "v_empty", "q_full", "k_full", "v_full", "mma_turn", "queue")
# Warp roles of the backward kernel: the producer warpgroup and the two consumers, recorded as one
# role by the first. Its one wait site is the consumers' (TMA mode): waiting for a free dQ staging
# buffer, one the producer's reduce-add has finished reading.
BWD_ROLES = ("producer", "compute")
BWD_SITES = ("dq_stage", )


@dataclass(frozen=True)
class Layout:
    """Word offsets of each section for one launch."""
    tile_capacity: int
    n_ctas: int
    n_roles: int
    n_sites: int

    @property
    def tiles_offset(self) -> int:
        return HEADER_WORDS

    @property
    def spans_offset(self) -> int:
        return self.tiles_offset + self.tile_capacity * TILE_WORDS

    @property
    def waits_offset(self) -> int:
        return self.spans_offset + self.n_ctas * self.n_roles * SPAN_WORDS

    @property
    def total_words(self) -> int:
        return self.waits_offset + self.n_ctas * self.n_roles * self.n_sites * BARRIER_WORDS

    def split(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        """Views of a host copy of the buffer: header, tiles[slot, field], spans[cta, role, field],
        waits[cta, role, site, field]."""
        buf = np.asarray(buf)
        if buf.dtype != np.int64 or buf.ndim != 1:
            raise ValueError(f"record buffer must be 1-D int64, got {buf.dtype} with shape {buf.shape}")
        if buf.size != self.total_words:
            raise ValueError(f"record buffer has {buf.size} words, the layout needs {self.total_words}")
        return {
            "header": buf[:HEADER_WORDS],
            "tiles": buf[self.tiles_offset:self.spans_offset].reshape(self.tile_capacity, TILE_WORDS),
            "spans": buf[self.spans_offset:self.waits_offset].reshape(self.n_ctas, self.n_roles, SPAN_WORDS),
            "waits": buf[self.waits_offset:].reshape(self.n_ctas, self.n_roles, self.n_sites, BARRIER_WORDS),
        }
