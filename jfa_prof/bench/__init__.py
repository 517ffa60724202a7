"""Benchmarking the kernel against its peers (SPEC §6, §7), and reading the result files.

One module per concern:

- :mod:`~jfa_prof.bench.impls`: the implementation a run times at a point (:class:`Impl`), ours.
- :mod:`~jfa_prof.bench.peers`: which peers exist here and how each is called.
- :mod:`~jfa_prof.bench.checks`: the fp32 reference and the relative error to it.
- :mod:`~jfa_prof.bench.run`: measuring a point, and a run over workloads (:func:`run_bench`).
- :mod:`~jfa_prof.bench.limits`: the targets against FA4, and the split of our recorded time.
- :mod:`~jfa_prof.bench.results`: the result-file format, :func:`load_results`, :class:`BenchResults`.

The names below are the package's public ones, as callers, notebooks and scripts use them
(``from jfa_prof import bench; bench.load_results(...)``).
"""
from __future__ import annotations

from typing import Any

from jfa_prof.ablations import PASSES, check_pass  # noqa: F401 - check_pass
from jfa_prof.bench.checks import DEFAULT_TOL, bitwise_equal, reference_output, rel_err  # noqa: F401 - DEFAULT_TOL
from jfa_prof.bench.impls import Impl, impl_kind, jfa_impls
from jfa_prof.bench.limits import TARGETS, record_split
from jfa_prof.bench.peers import (PEER_NOTES, PEERS, PeerStatus, document_block_mask, peer_impls,  # noqa: F401
                                  peer_status)
from jfa_prof.bench.results import FORMAT, FRAME_COLUMNS, BenchResults, load_results, results_document  # noqa: F401
from jfa_prof.bench.run import fwd_host_breakdown, impl_names, run_bench, select_workloads

# As the single module had it; check_pass, DEFAULT_TOL, PEER_NOTES, FORMAT, FRAME_COLUMNS,
# results_document and the names in __getattr__ are public here too, without being star-imported.
__all__ = ["PASSES", "PEERS", "TARGETS", "BenchResults", "Impl", "PeerStatus", "bitwise_equal", "document_block_mask",
           "fwd_host_breakdown", "impl_kind", "impl_names", "jfa_impls", "load_results", "peer_impls", "peer_status",
           "reference_output", "record_split", "rel_err", "run_bench", "select_workloads", "upstream_grad"]


def __getattr__(name: str) -> Any:
    # upstream_grad, rows_seeing_keys and workload_dict live beside the workload, in jfa_prof.inputs;
    # they are still served from here for the callers that take them from this module, on first
    # use because jfa_prof.inputs imports torch and reading result files (`bench --results`) does not.
    if name in ("upstream_grad", "rows_seeing_keys", "workload_dict"):
        from jfa_prof import inputs

        return getattr(inputs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
