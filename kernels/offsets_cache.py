"""What the op derives from an offsets tensor, kept across calls that pass the same tensor.

Every attention layer of a model sees the same offsets, and a training step calls the forward of
each: the work list depends only on the offsets, the mask and the shapes, so it is built once per
batch and reused. (The offsets checks, `jfa_prof.kernels.checks`, run on every call.)

An entry belongs to one offsets tensor *object* at one *version*: it holds weak references to
the tensors (a new tensor, even at a recycled address, never matches) and their version counters
(`t._version`, which every in-place change through torch bumps, views included), so an in-place
update rebuilds it. Some writes bypass the version counter (`.data`, collectives such as
`dist.broadcast`, a CUDA-graph replay, torch.compile reusing a buffer), so the op keeps entries only
where a stale one cannot give a wrong answer: broadcast-Q in eager mode, where every (batch, head,
query block) tile has rows whatever the lengths, so a stale list can only order the tiles less
well (the kernels read each tile's lengths from the offsets themselves). Jagged-Q lists (which tiles
exist depends on the query lengths) and calls under torch.compile are built, and checked, every
call. Nothing is kept while a CUDA graph is being captured (the list must then be rebuilt inside
the graph, so that a replay on new offsets copied into the same tensor builds its own), nor for
inference-mode tensors, which have no version counter. The cache is small and bounded: a model
sees one or two offsets tensors per step.

The dynamic schedule's tile counter must be zero at each launch. A reused list hands out counters
from a block of zeros it owns, one per launch, and zeroes the block again in the stream when it is
used up: one fill per `_COUNTERS` launches instead of an allocation and a fill per launch. Stream
order makes that safe, and entries are per stream.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

CAPACITY = 8
_COUNTERS = 64


@dataclass
class Entry:
    refs: tuple  # weak references to (kv_offsets, q_offsets or None)
    versions: tuple
    work: Any = None  # a WorkList, built on first use
    _counters: torch.Tensor | None = None
    _views: list = field(default_factory=list)
    _next: int = 0

    def counter(self, device) -> torch.Tensor:
        """A zero int32 [1] counter for one launch, from this entry's block. Locked: two threads
        launching on one stream must never be handed the same counter."""
        with _counter_lock:
            if self._counters is None:
                self._counters = torch.zeros(_COUNTERS, dtype=torch.int32, device=device)
                self._views = list(self._counters.split(1))
            elif self._next == _COUNTERS:
                self._counters.zero_()
                self._next = 0
            view = self._views[self._next]
            self._next += 1
            return view


_entries: OrderedDict[tuple, Entry] = OrderedDict()
_counter_lock = threading.Lock()


def version(t) -> int | None:
    """`t`'s version counter; None for no tensor or an inference tensor, which has none."""
    return None if t is None or t.is_inference() else t._version


def lookup(kv_offsets: torch.Tensor, q_offsets: torch.Tensor | None, key: tuple, *, keep: bool = True) -> Entry:
    """The entry for these tensors and `key` (everything else the derived data depends on), made
    empty on a miss. An entry that cannot or must not be kept (`keep=False`, graph capture,
    inference tensors) is returned but not stored."""
    cuda = kv_offsets.device.type == "cuda"
    if not keep or (cuda and torch.cuda.is_current_stream_capturing()) or kv_offsets.is_inference() or (
            q_offsets is not None and q_offsets.is_inference()):
        return Entry(refs=(), versions=())
    versions = (version(kv_offsets), version(q_offsets))
    stream = torch._C._cuda_getCurrentRawStream(kv_offsets.device.index) if cuda else 0
    full_key = (id(kv_offsets), id(q_offsets), stream, *key)
    entry = _entries.get(full_key)
    if entry is not None:
        kv_ref, q_ref = entry.refs
        alive = kv_ref() is kv_offsets and (q_ref is None or q_ref() is q_offsets)
        if alive and entry.versions == versions:
            _entries.move_to_end(full_key)
            return entry
        del _entries[full_key]
    entry = Entry(refs=(weakref.ref(kv_offsets), None if q_offsets is None else weakref.ref(q_offsets)),
                  versions=versions)
    _entries[full_key] = entry
    while len(_entries) > CAPACITY:
        _entries.popitem(last=False)
    return entry


def clear() -> None:
    _entries.clear()
