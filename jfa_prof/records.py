"""The one definition of the instrumentation record layout (SPEC §4).

A kernel launched with PROFILE on writes into one flat int64 buffer made of five sections:

    [ header | tile records | role spans | barrier waits | role events ]

- header: HEADER_WORDS words; ``Header.DROPPED`` counts tile records that found no slot (the
  buffer was full) and were therefore not written.
- tile records: ``tile_capacity`` slots of TILE_WORDS words; slot = the tile's position in the
  schedule's work list, so every processed tile has its own slot and nothing is written past
  the end (a slot >= capacity bumps DROPPED instead).
- role spans: per CTA and warp role, SPAN_WORDS words (first start / last end of that role).
- barrier waits: per CTA, role and wait site, BARRIER_WORDS words (cycles waited, waits).
- role events (level 3 only): per sampled tile and warp role, one record of ``event_words(n_sites)``
  words: when the role started, marked and ended that tile, and its cumulative wait cycles at every
  site when it started and when it ended (the reader subtracts: a per-tile sum then costs the kernel
  stores, not registers held across the tile). Event slot = (list position // sample) * n_roles +
  role; ``Header.SAMPLE`` records every Nth tile, ``Header.EVENTS_DROPPED`` counts records past the end.

Kernels read the field indices below through ``jfa_prof.kernels.profiling`` as constexprs;
readers (``jfa_prof.trace``) decode with the same names. Nothing else may hard-code an offset.
This module imports neither torch nor triton so analyses and the CLI stay light.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

LAYOUT_VERSION = 2
# Layout 1 had no event section; it reads as layout 2 with event_capacity 0.
READ_LAYOUT_VERSIONS = (1, 2)


class Header(IntEnum):
    DROPPED = 0  # tile records not written because their slot was past the capacity
    CAPACITY = 1  # tile slots, written by the host when the buffer is made
    SAMPLE = 2  # level 3: event records are written for every SAMPLE-th list position
    EVENTS_DROPPED = 3  # level 3: event records not written because their slot was past the capacity


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
# The kernels accumulate waits in 32-bit unsigned counters (one register each): a role that ran this
# many cycles or more may have wrapped them, so readers refuse its waits.
WAIT_COUNTER_LIMIT = 2**32


class Event(IntEnum):
    """Fixed fields of one (tile, role) event record; the wait words follow (see `event_words`)."""
    CTA = 0
    SMID = 1
    T_START = 2  # %globaltimer, ns
    T_MARK = 3  # a point inside the window, by role (ROLE_MARKS)
    T_END = 4
    C_START = 5  # clock64 cycles of this SM
    C_END = 6
    VALID = 7  # 1 once the end is written


EVENT_FIXED_WORDS = 8


def event_words(n_sites: int) -> int:
    """Words of one event record: the fixed fields, then cumulative wait cycles per site at the
    window's start (EVENT_FIXED_WORDS + site) and at its end (EVENT_FIXED_WORDS + n_sites + site)."""
    return EVENT_FIXED_WORDS + 2 * n_sites

# Warp roles of the forward kernel, in replica order: the TMA producer and the consumer warpgroups.
FWD_ROLES = ("producer", "consumer0", "consumer1")
# Barrier wait sites of the forward kernel; a site is one barrier_wait call in the source.
# "queue" is the hand-off of the next tile through the mailbox (under the dynamic schedule the
# producer takes its position from the global queue first).
FWD_SITES = ("q_empty", "k_empty", "v_empty", "q_full", "k_full", "v_full", "mma_turn", "queue")
# Warp roles of the backward kernel: the producer warpgroup and the two consumers, recorded as one
# role by the first. Sites per role: ROLE_SITES ("dq_stage": a consumer waiting for a free dQ staging
# buffer, one the producer's reduce-add has finished reading).
BWD_ROLES = ("producer", "compute")
# "dq_reduce" is not a wait but the producer's time in its dQ reduce-adds (issue and drain), kept
# with the waits so that the same records carry it.
BWD_SITES = ("dq_stage", "kv_full", "step_full", "ds_pair", "kv_empty", "step_empty", "dq_full", "box", "dq_reduce")

# The sites each role waits at: the others stay zero in its records. The forward's v_full counts only
# each tile's last V wait: timing the one in every KV block cost more than all the records
# (benchmarks/results/instrumentation/roles_cost_*).
ROLE_SITES = {
    "fwd": {"producer": ("q_empty", "k_empty", "v_empty", "queue"),
            "consumer0": ("q_full", "k_full", "v_full", "mma_turn", "queue"),
            "consumer1": ("q_full", "k_full", "v_full", "mma_turn", "queue")},
    "bwd": {"producer": ("kv_empty", "step_empty", "dq_full", "box", "dq_reduce"),
            "compute": ("kv_full", "step_full", "dq_stage", "ds_pair")},
}
# What an event record's window and mark are, by pass and role (level 3).
ROLE_MARKS = {
    "fwd": {"producer": "tile posted to both consumers' mailboxes",
            "consumer0": "KV loop done, epilogue starts", "consumer1": "KV loop done, epilogue starts"},
    "bwd": {"producer": "K/V load issued", "compute": "step loop done, epilogue (dK/dV stores) starts"},
}


@dataclass(frozen=True)
class Layout:
    """Word offsets of each section for one launch."""
    tile_capacity: int
    n_ctas: int
    n_roles: int
    n_sites: int
    event_capacity: int = 0  # (tile, role) event records: level 3 only

    @staticmethod
    def event_capacity_for(tile_capacity: int, n_roles: int, sample: int) -> int:
        """Event slots a level-3 launch with `tile_capacity` tile slots needs when it records every
        `sample`-th tile: the kernel derives the same number, so no argument carries it."""
        return -(-tile_capacity // sample) * n_roles

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
    def events_offset(self) -> int:
        return self.waits_offset + self.n_ctas * self.n_roles * self.n_sites * BARRIER_WORDS

    @property
    def total_words(self) -> int:
        return self.events_offset + self.event_capacity * event_words(self.n_sites)

    def split(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        """Views of a host copy of the buffer: header, tiles[slot, field], spans[cta, role, field],
        waits[cta, role, site, field], events[slot, word]."""
        buf = np.asarray(buf)
        if buf.dtype != np.int64 or buf.ndim != 1:
            raise ValueError(f"record buffer must be 1-D int64, got {buf.dtype} with shape {buf.shape}")
        if buf.size != self.total_words:
            raise ValueError(f"record buffer has {buf.size} words, the layout needs {self.total_words}")
        return {
            "header": buf[:HEADER_WORDS],
            "tiles": buf[self.tiles_offset:self.spans_offset].reshape(self.tile_capacity, TILE_WORDS),
            "spans": buf[self.spans_offset:self.waits_offset].reshape(self.n_ctas, self.n_roles, SPAN_WORDS),
            "waits": buf[self.waits_offset:self.events_offset].reshape(self.n_ctas, self.n_roles, self.n_sites,
                                                                       BARRIER_WORDS),
            "events": buf[self.events_offset:].reshape(self.event_capacity, event_words(self.n_sites)),
        }
