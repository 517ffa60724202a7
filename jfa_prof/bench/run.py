"""Measuring: one point of a run, and a run over a grid's workloads (:func:`run_bench`).

One point of a run: build the inputs of a workload, then for each implementation build what it
needs (padded tensors, a block mask, a work list: outside the timed region), run it once and
check its output, measure the memory one call allocates, and take the median time
(:mod:`jfa_prof.timing`). The first implementation (the baseline) is timed twice to show the
noise; with more than one round, every implementation is timed again in turn per round and its
median round is the figure. On the first point every output is also checked against the fp32 reference; an
implementation that is wrong there is reported and not timed again, and one that raises is
reported for that point only. Neither stops the run.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from jfa_prof.ablations import check_pass
from jfa_prof.bench.checks import DEFAULT_TOL, reference_output, rel_err
from jfa_prof.bench.impls import Impl, _scale, jfa_impls
from jfa_prof.bench.limits import record_split
from jfa_prof.bench.peers import PEERS, peer_impls, peer_status
from jfa_prof.bench.results import _derive
from jfa_prof.errors import BadInputError
from jfa_prof.schedule import DEFAULT_SCHEDULE

__all__ = ["causal_variants", "fwd_host_breakdown", "impl_names", "run_bench", "select_workloads"]


def select_workloads(grid: str, labels: Sequence[str] | None = None, *, causal: bool = False) -> list:
    """The workloads of a SPEC §6 grid, or those of it with the given labels (the grid's own,
    without " causal"); `causal`: each with the causal mask (jagged-Q grids only)."""
    from jfa_prof.inputs import GRIDS

    if grid not in GRIDS:
        raise BadInputError(f"unknown grid {grid!r}", hint=f"one of {', '.join(GRIDS)}")
    ws = GRIDS[grid]
    if causal:
        causal_variants(grid, ws)  # refused before the labels are looked at
    if labels:
        by_label = {w.label: w for w in ws}
        missing = [lab for lab in labels if lab not in by_label]
        if missing:
            raise BadInputError(f"no {grid} workload labelled {', '.join(map(repr, missing))}",
                                hint=f"labels look like {ws[0].label!r}")
        ws = [by_label[lab] for lab in labels]
    return causal_variants(grid, ws) if causal else list(ws)


def causal_variants(grid: str, ws: Sequence) -> list:
    """`ws` (workloads of `grid`), each with the causal mask; refused for a broadcast-Q grid."""
    from dataclasses import replace

    from jfa_prof.inputs import GRIDS

    if any(w.broadcast_q for w in ws):
        raise BadInputError(f"the {grid} grid broadcasts Q: the causal mask is defined for jagged Q only",
                            hint="--causal with --grid " + " or ".join(g for g, v in GRIDS.items()
                                                                       if not any(w.broadcast_q for w in v)))
    return [replace(w, causal=True) for w in ws]


def impl_names(peers: Iterable[str], schedules: Sequence[str] = (DEFAULT_SCHEDULE,), pass_: str = "fwd") -> list[str]:
    """The implementation names :func:`run_bench` times by default, in order."""
    ours = (lambda s: (f"jfa-{s}",)) if pass_ == "bwd" else (lambda s: (f"jfa-{s}", f"jfa-{s}-planned"))
    return [n for s in schedules for n in ours(s)] + [PEERS[k] for k in peers]


def fwd_host_breakdown(x, *, n: int = 20, schedule: str = DEFAULT_SCHEDULE) -> dict[str, dict[str, float]]:
    """Host time per call of the work-list build, of a launch with a list built beforehand, and
    of a whole call: how much of a call is host work when kernels are short."""
    import torch

    from jfa_prof import timing
    from jfa_prof.kernels import fwd
    from jfa_prof.kernels.attention import fwd_launch
    from jfa_prof.schedule import fwd_work_list

    w = x.workload
    q_off = None if w.broadcast_q else x.q_offsets
    n_sms = torch.cuda.get_device_properties(x.q.device).multi_processor_count

    def build():
        return fwd_work_list(x.kv_offsets, q_off, x.q.shape[0] if w.broadcast_q else None, w.H, x.max_seq_len_q,
                             block_m=fwd.BLOCK_M, window=w.window, causal=w.causal,
                             schedule=schedule, n_ctas=n_sms)

    def launch(wl):
        return fwd_launch(x.q, x.k, x.v, q_off, x.kv_offsets, x.max_seq_len_q, sm_scale=_scale(x), window=w.window,
                          causal=w.causal, broadcast_q=w.broadcast_q, schedule=schedule, work=wl)

    wl = build()
    return timing.host_breakdown({"work_list": build, "launch_with_list": lambda: launch(wl),
                                  "full_call": lambda: launch(None)}, n=n)


def _to_float(out):
    return tuple(t.float() for t in out) if isinstance(out, (tuple, list)) else out.float()


def _measure_impl(impl: Impl, *, ref, rows, first_out, tol: float, timer, twice: bool,
                  timer_kw: dict, per_call: bool = True) -> tuple[dict[str, Any], Any, str | None]:
    """(entry, output kept for comparing the later implementations or None, reason to drop the
    implementation from later points or None)."""
    import torch

    from jfa_prof import timing

    entry: dict[str, Any] = {}
    before = torch.cuda.memory_allocated()
    run, output = impl.build()
    entry["setup_mb"] = (torch.cuda.memory_allocated() - before) / 2**20
    result = run()
    out = output(result)
    torch.cuda.synchronize()
    if ref is not None:
        err = rel_err(out, ref, rows)
        entry["rel_err_vs_ref"] = err
        if not err <= tol:  # NaN fails too
            reason = (f"wrong output on the first point: relative error {err:.3g} against the fp32 reference "
                      f"(tolerance {tol:g})")
            entry["error"] = reason
            return entry, None, reason
    entry["rel_err_vs_first"] = 0.0 if first_out is None else rel_err(out, first_out, rows)
    keep = _to_float(out) if first_out is None else None
    del result, out
    # Memory one call allocates beyond what its inputs and setup hold (workspaces, outputs).
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    r = run()
    torch.cuda.synchronize()
    entry["peak_mem_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    del r
    if twice:
        t = timing.time_twice(run, timer=timer, **timer_kw)
        entry["ms"], entry["ms_repeat"] = t.ms, t.ms_repeat
    else:
        entry["ms"] = timer(run, **timer_kw)
    if per_call:
        # As a training loop sees a call: host time with calls enqueued back to back, and the GPU
        # work each call puts on the device (host gaps left out).
        entry["host_us"] = timing.host_us_per_call(run)
        entry["gpu_ms"] = timing.gpu_ms(run)
    return entry, keep, None


def _more_rounds(point: Sequence[Impl], entries: dict[str, dict[str, Any]], rounds: int, *, timer,
                 timer_kw: dict, on_round: Callable[[int], None] | None = None) -> None:
    """Rounds 2..``rounds`` of a point, every implementation timed once per round in turn.

    A GPU's clock moves by several percent over a point (the power and thermal state that a
    compute-bound kernel brings about), so implementations timed one after the other can differ by
    that much with no difference between them. Each is built again per round (setup stays out of
    the timing; only one's buffers are alive at a time, as in the first round)."""
    import statistics

    import torch

    timed = [impl for impl in point if isinstance(entries.get(impl.name, {}).get("ms"), (int, float))]
    for impl in timed:
        entries[impl.name]["rounds_ms"] = [entries[impl.name]["ms"]]
    for r in range(2, rounds + 1):
        if on_round:
            on_round(r)
        for impl in timed:
            e = entries[impl.name]
            try:
                run, _ = impl.build()
                e["rounds_ms"].append(timer(run, **timer_kw))
                del run
            except Exception as exc:  # it ran in round 1: keep its rounds so far and say why it stopped
                e.setdefault("rounds_error", f"round {r}: {type(exc).__name__}: {exc}"[:300])
            torch.cuda.empty_cache()
    for impl in timed:
        e = entries[impl.name]
        e["ms"] = statistics.median(e["rounds_ms"])


def run_bench(workloads: Sequence, *, pass_: str = "fwd", peers: Sequence[str] = tuple(PEERS),
              schedules: Sequence[str] = (DEFAULT_SCHEDULE,), impls: Callable[[Any], list[Impl]] | None = None,
              baseline: str | None = None, rep_ms: float | None = None, warmup_ms: float | None = None,
              tol: float = DEFAULT_TOL, check_reference: bool = True, host: bool = True,
              timer: Callable[..., float] | None = None, device=None,
              on_impl: Callable[[str, str], None] | None = None,
              on_point: Callable[[dict[str, Any]], None] | None = None, limits: bool = False,
              per_call: bool = True, rounds: int = 1) -> list[dict[str, Any]]:
    """Time every implementation on every workload; returns the records (without ``meta``).

    ``impls(x)`` replaces the default list (``jfa_impls(x, schedules)`` then the available
    ``peers``); ``baseline`` names the implementation timed twice (default: the first).
    ``on_impl(label, name)`` is called before each implementation, ``on_point(record)`` after
    each point. Peers that are not installed are left out here;
    :func:`~jfa_prof.bench.peers.peer_status` says why.
    ``per_call`` (default on): also take each implementation's host time per call with calls
    enqueued back to back (``host_us``: `jfa_prof.timing.host_us_per_call`) and its GPU time per
    call (``gpu_ms``, host gaps left out: `jfa_prof.timing.gpu_ms`). ``limits``: record our kernel
    (the first schedule) at each point after the timings, and keep the split of its time
    (:func:`~jfa_prof.bench.limits.record_split`) as ``record["time_split"]`` (it needs ``gpu_ms``).
    ``rounds`` > 1: after the first timing of every implementation at a point, time them all
    again ``rounds - 1`` times in turn (:func:`_more_rounds`); ``ms`` is then the median of the
    rounds (``rounds_ms``), so a clock that drifts during the point is shared by all of them.
    """
    import torch

    from jfa_prof import timing
    from jfa_prof.inputs import rows_seeing_keys, workload_dict

    check_pass(pass_)
    device = device or timing.require_gpu("the benchmark")
    timer = timer or timing.bench
    timer_kw = {k: v for k, v in (("rep_ms", rep_ms), ("warmup_ms", warmup_ms)) if v is not None}
    usable = [k for k, st in peer_status(peers).items() if st.available]
    dropped: dict[str, str] = {}
    records = []
    for n_point, w in enumerate(workloads):
        x = w.make(device)
        flops = x.flops(pass_)
        point = impls(x) if impls is not None else jfa_impls(x, schedules, pass_) + peer_impls(x, usable, pass_)
        base_name = baseline or (point[0].name if point else None)
        # The backward's gradients cover every row (rows that see no key get zero upstream gradient).
        rows = rows_seeing_keys(x) if pass_ == "fwd" else None
        ref = reference_output(x, pass_) if check_reference and n_point == 0 else None
        entries: dict[str, dict[str, Any]] = {}
        first_out = None
        for impl in point:
            if on_impl:
                on_impl(w.label, impl.name)
            if impl.name in dropped:
                entries[impl.name] = {"error": dropped[impl.name], "skipped": True}
                continue
            try:
                entry, out, reason = _measure_impl(impl, ref=ref, rows=rows, first_out=first_out, tol=tol,
                                                   timer=timer, twice=impl.name == base_name, timer_kw=timer_kw,
                                                   per_call=per_call)
            except Exception as e:  # a peer that fails is reported, not fatal
                entry, out, reason = {"error": f"{type(e).__name__}: {e}"[:500]}, None, None
            if reason:
                dropped[impl.name] = reason
            if first_out is None and out is not None:
                first_out = out
            entries[impl.name] = entry
            torch.cuda.empty_cache()  # the next implementation's setup starts from the inputs alone
        if rounds > 1:
            _more_rounds(point, entries, rounds, timer=timer, timer_kw=timer_kw,
                         on_round=(lambda r: on_impl(w.label, f"round {r} of {rounds}")) if on_impl else None)
        best = _derive(entries, flops)
        record = {"pass": pass_, "workload": workload_dict(x), "flops": flops, "impls": entries,
                  "best_peer": best, "baseline": base_name}
        if host and pass_ == "fwd":
            try:
                record["host_ms"] = fwd_host_breakdown(x, schedule=schedules[0] if schedules else DEFAULT_SCHEDULE)
            except Exception as e:
                record["host_ms"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        if limits:
            if on_impl:
                on_impl(w.label, "recording")
            try:
                record["time_split"] = record_split(w, pass_, schedules[0] if schedules else DEFAULT_SCHEDULE)
            except Exception as e:  # the timings stand without it
                record["time_split"] = {"error": f"{type(e).__name__}: {e}"[:300]}
        records.append(record)
        if on_point:
            on_point(record)
        del x, ref, first_out, point
        torch.cuda.empty_cache()
    return records
