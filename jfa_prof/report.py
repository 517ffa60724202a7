"""What ``jfa-prof report`` puts on its page, gathered for one workload.

Each source has its own function, returning the results of ``jfa_prof.analyses`` (dataclasses,
DataFrames), never anything drawn:

- traces: recorded here on a GPU (:func:`record_traces`), given as files, or the H200
  recordings bundled with the package (:func:`bundled_schedule_traces`), analysed by
  :func:`analyse_traces` into occupancy, imbalance, predicted-vs-measured and barrier waits;
- the environment (``jfa_prof.doctor``), the compiled forward's registers and spills
  (:func:`compile_spills`), an Nsight Compute report, a recorded waterfall, a bench result file;
- the diagnosis (``jfa_prof.analyses.diagnose``) of every level-3 trace among them, and the
  level-3 recordings shipped with the package or committed with the tests (:func:`level3_recordings`).

:func:`gather` puts them in a :class:`Report`; ``jfa_prof.render.report`` draws that as one HTML
page. The notebooks in ``notebooks/`` use these functions too, and :func:`newest_result` to find
the latest recorded results under ``benchmarks/results/``.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from jfa_prof.errors import BadInputError

__all__ = [
    "MAIN_VARIANTS",
    "SCHEDULE_ORDER",
    "Report",
    "TraceResult",
    "analyse_traces",
    "bundled_schedule_traces",
    "can_record_live",
    "compile_spills",
    "diagnose_traces",
    "gather",
    "level3_recordings",
    "load_traces",
    "newest_result",
    "record_traces",
    "results_dir",
    "trace_label",
]

# The order panels and columns appear in: the schedule axis from no balancing to the most.
SCHEDULE_ORDER = ("static", "lpt", "dynamic")

# The forward's main variants for the spills section: bf16, D=128, broadcast-Q under the LPT list
# (the dynamic default differs only in how a CTA finds its next tile), with and without the
# peeled mask tail, and at both profiling levels.
# Four, because each cold compile takes seconds to tens of seconds on one core.
MAIN_VARIANTS = (
    "fwd/bcast/bf16/d128/lpt/peel/noprof",
    "fwd/bcast/bf16/d128/lpt/nopeel/noprof",
    "fwd/bcast/bf16/d128/lpt/peel/prof-tiles",
    "fwd/bcast/bf16/d128/lpt/peel/prof",
)


# ---------------------------------------------------------------------------------------------
# recorded results on disk
# ---------------------------------------------------------------------------------------------

SUPERSEDED = "superseded"  # a study's folder for files a later run replaced


def results_dir() -> Path | None:
    """``benchmarks/results`` of the source checkout this package runs from, or None when it
    is installed without one (a wheel carries no results)."""
    d = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    return d if d.is_dir() else None


def _recorded_at(path: Path) -> _dt.datetime:
    """When a result file was measured: its ``meta.date`` (ISO 8601; UTC when it names no zone),
    else the file's modification time. Copying a file changes its mtime, not what it measured."""
    try:
        doc = json.loads(path.read_text())
        date = _dt.datetime.fromisoformat(str(doc["meta"]["date"]))
    except (OSError, ValueError, TypeError, KeyError):
        return _dt.datetime.fromtimestamp(path.stat().st_mtime, _dt.timezone.utc)
    return date if date.tzinfo is not None else date.replace(tzinfo=_dt.timezone.utc)


def newest_result(pattern: str, directory: str | os.PathLike | None = None,
                  accept: Callable[[Path], bool] | None = None) -> Path | None:
    """The most recently measured file matching ``pattern`` (a glob on file names, e.g.
    ``"waterfall_*.json"``) anywhere under ``directory`` (default :func:`results_dir`, a folder per
    study), or None when there is none. Files under a ``superseded`` folder are history, kept for
    the record: never picked.

    ``accept(path)`` filters candidates, e.g. to files a loader can read; "recently measured"
    is the date the file records, see :func:`_recorded_at`.
    """
    d = Path(directory) if directory is not None else results_dir()
    if d is None or not d.is_dir():
        return None
    found = [p for p in d.rglob(pattern) if p.is_file() and SUPERSEDED not in p.relative_to(d).parts
             and (accept is None or accept(p))]
    if not found:
        return None
    return max(found, key=lambda p: (_recorded_at(p), p.name))


# ---------------------------------------------------------------------------------------------
# traces
# ---------------------------------------------------------------------------------------------

def trace_label(tr: Any) -> str:
    """How a trace is named in panels and columns: its side of ``--clc`` and its schedule."""
    side = "on" if tr.schedule == "dynamic" else "off"
    return f"clc {side} · {tr.schedule}"


def _schedule_rank(tr: Any) -> int:
    return SCHEDULE_ORDER.index(tr.schedule) if tr.schedule in SCHEDULE_ORDER else len(SCHEDULE_ORDER)


def _matches(workload: dict[str, Any], wanted: dict[str, Any]) -> bool:
    return all(workload.get(k) == v for k, v in wanted.items() if v is not None)


def bundled_schedule_traces(**workload: Any) -> list[Any]:
    """The bundled recordings of one workload, one per schedule, in :data:`SCHEDULE_ORDER`.

    ``workload`` fields that are not None (``grid``, ``Lq``, ``max_kv``, ``sparsity``) must match
    the recordings' metadata; among several workloads the first by file name wins.
    """
    from jfa_prof.trace import bundled_dir, bundled_traces, read_meta, read_trace

    groups: dict[str, list[Path]] = {}
    for path in bundled_traces("h200_*.jfatrace"):
        meta = read_meta(path)
        w = meta.get("workload") or {}
        if _matches(w, workload):
            groups.setdefault(str(w.get("label") or path.name), []).append(path)
    if not groups:
        asked = ", ".join(f"{k}={v}" for k, v in workload.items() if v is not None)
        raise BadInputError(f"no bundled recording{' for ' + asked if asked else ''} in {bundled_dir()}",
                            hint="pass --trace FILE (record one on a GPU with `jfa-prof record`)")
    paths = next(iter(groups.values()))
    return sorted((read_trace(p, origin="bundled") for p in paths), key=_schedule_rank)


def load_traces(paths: Iterable[str | os.PathLike]) -> list[Any]:
    """Trace files, in :data:`SCHEDULE_ORDER` (files of the same schedule keep their order)."""
    from jfa_prof.trace import read_trace

    return sorted((read_trace(p) for p in paths), key=_schedule_rank)


def can_record_live() -> bool:
    """Whether this machine can record a trace: torch with CUDA and a visible device.

    Checked cheaply first (no driver device node, no torch: no), so a CPU machine does not pay
    for importing torch just to learn it has no GPU."""
    import importlib.util
    import sys

    if importlib.util.find_spec("torch") is None:
        return False
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/dxg")):
        return False
    import torch

    return bool(torch.cuda.is_available())


def record_traces(workload: Any = None, schedules: Sequence[str] = SCHEDULE_ORDER, *,
                  level: int = 2, on_schedule: Callable[[str], None] | None = None) -> list[Any]:
    """One instrumented launch per schedule of ``workload`` (default: the hsp grid's first point)
    on this machine's GPU, as traces marked live."""
    from jfa_prof.inputs import select_workload
    from jfa_prof.recording import record_workload

    workload = workload if workload is not None else select_workload()
    out = []
    for s in schedules:
        if on_schedule is not None:
            on_schedule(s)
        tr = record_workload(workload, s, level=level)
        tr.origin = "live"
        out.append(tr)
    return out


def level3_recordings(pass_: str | None = None, *, modified: bool = True, **workload: Any) -> list[Path]:
    """The level-3 H200 recordings at hand (``*_level3*.jfatrace``): bundled with the package, then
    committed anywhere under ``tests/data/traces`` of a source checkout; of the ``pass_`` kernel when
    given, and whose ``meta["workload"]`` matches the ``workload`` fields that are not None.
    Recordings of the op as built come first, then, unless ``modified`` is False, those of builds
    changed on purpose (``meta["build"]``: a planted bottleneck, an ablation)."""
    from jfa_prof.trace import bundled_dir, read_meta

    dirs = [bundled_dir(), Path(__file__).resolve().parent.parent / "tests" / "data" / "traces"]
    found = []
    for d in dirs:
        for path in sorted(d.rglob("*_level3*.jfatrace")) if d.is_dir() else []:
            meta = read_meta(path)
            kernel = meta.get("kernel") or {}
            recorded = str(kernel.get("pass") or kernel.get("name") or "")
            if pass_ is not None and ("bwd" if recorded.endswith("bwd") else "fwd") != pass_:
                continue
            changed = meta.get("build") not in (None, "op")
            if _matches(meta.get("workload") or {}, workload) and (modified or not changed):
                found.append((changed, path))
    return [path for _, path in sorted(found, key=lambda f: f[0])]


@dataclass
class TraceResult:
    """One recording and what the heatmap and barrier commands compute from it."""

    trace: Any  # jfa_prof.trace.Trace
    label: str
    occupancy: Any  # analyses.occupancy.Occupancy, on the time axis shared by every trace
    imbalance: Any  # analyses.imbalance.Imbalance
    prediction: Any = None  # analyses.predict.Prediction, when asked for
    barriers: Any = None  # analyses.barriers.BarrierAttribution; None for a level-1 recording

    @property
    def level(self) -> int | None:
        """The instrumentation level the trace was recorded at (None where it does not say)."""
        level = self.trace.meta.get("profile_level")
        return None if level is None else int(level)


def analyse_traces(traces: Sequence[Any], *, bins: int = 200, predict: bool = True) -> list[TraceResult]:
    """Occupancy on one shared time axis (equal widths mean equal times in every panel),
    imbalance figures, the CPU simulation of each trace's own schedule, and barrier waits."""
    from jfa_prof.analyses.barriers import barrier_attribution
    from jfa_prof.analyses.imbalance import imbalance
    from jfa_prof.analyses.occupancy import occupancy_matrix
    from jfa_prof.analyses.predict import SCHEDULES, predict_trace

    if not traces:
        raise BadInputError("no traces to analyse")
    t_end = max(tr.makespan_ns for tr in traces) or None
    labels = [trace_label(tr) for tr in traces]
    out = []
    for tr, label in zip(traces, labels):
        if labels.count(label) > 1 and tr.path is not None:
            label = f"{label} · {tr.path.name}"
        pred = None
        if predict and len(tr.tiles) and tr.schedule in SCHEDULES:
            pred = predict_trace(tr.tiles, tr.n_ctas, tr.schedule, clock_khz=tr.clock_khz)
        waits = None
        if tr.meta.get("profile_level") != 1 and len(tr.waits):
            kernel_cycles = tr.makespan_ns * tr.clock_khz / 1e6 if tr.clock_khz else None
            waits = barrier_attribution(tr.waits, tr.spans, kernel_cycles=kernel_cycles)
        out.append(TraceResult(
            trace=tr, label=label,
            occupancy=occupancy_matrix(tr.tiles, tr.n_sms, n_bins=bins, t_end_ns=t_end),
            imbalance=imbalance(tr.tiles, tr.n_sms, dropped=tr.dropped),
            prediction=pred, barriers=waits))
    return out


# ---------------------------------------------------------------------------------------------
# compiled variants
# ---------------------------------------------------------------------------------------------

def compile_spills(variants: Sequence[str] | str | None = None, *, target: str = "sm_90a", jobs: int = 1,
                   use_cache: bool = True, on_result: Callable[[Any, Any], None] | None = None):
    """The spills table (``analyses.spills.spill_table``) of the named variants (default
    :data:`MAIN_VARIANTS`), or of those matching a glob, compiled here - no GPU needed."""
    from jfa_prof.analyses import spills as analysis
    from jfa_prof.compile import CompileFailure, compile_many, parse_kernel_target
    from jfa_prof.kernels import registry

    target, _ = parse_kernel_target(target)
    available = registry.all_variants()
    if isinstance(variants, str):
        chosen = analysis.select_variants(available, pattern=variants)
    else:
        names = list(variants or MAIN_VARIANTS)
        by_name = {v.name: v for v in available}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise BadInputError(f"unknown kernel variant(s): {', '.join(unknown)}",
                                hint="`jfa-prof spills` lists them")
        chosen = [by_name[n] for n in names]
    if not chosen:
        raise BadInputError(f"no kernel variant matches {variants!r}")
    outcomes = compile_many(chosen, target, use_cache=use_cache, jobs=jobs, on_result=on_result)
    resources = [analysis.failed(o.variant, o.kernel, o.message, o.tags) if isinstance(o, CompileFailure)
                 else analysis.from_result(o) for o in outcomes]
    return analysis.spill_table(resources)


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------

@dataclass
class Report:
    """Everything one page shows; sections without data are None or empty and left out."""

    title: str
    origin: str  # "live", "bundled" or "files": where the traces come from
    source: str  # that, in the words the page prints
    traces: list[TraceResult] = field(default_factory=list)
    environment: Any = None  # jfa_prof.doctor.Environment
    spills: Any = None  # DataFrame of analyses.spills.spill_table
    spills_target: str = "sm_90a"
    ncu: list[Any] = field(default_factory=list)  # analyses.ncu.NcuReport, one per file
    waterfall: Any = None  # (ablations.WaterfallRecord, analyses.waterfall.Waterfall)
    waterfall_source: str | None = None
    bench: Any = None  # bench.BenchResults
    diagnoses: list[tuple[str, Any]] = field(default_factory=list)  # (trace label, analyses.diagnose.Diagnosis)
    notes: list[str] = field(default_factory=list)  # warnings the page shows at the top
    created: str = ""
    version: str = ""

    @property
    def workload_label(self) -> str:
        labels = list(dict.fromkeys(t.trace.workload_label for t in self.traces))
        return " / ".join(labels) if labels else "no traces"

    def sections(self) -> list[str]:
        """The sections present, in page order: the findings first, the machine that made them last."""
        have = {"diagnosis": bool(self.diagnoses),
                "heatmap": bool(self.traces), "barriers": any(t.barriers is not None for t in self.traces),
                "spills": self.spills is not None, "ncu": bool(self.ncu), "waterfall": self.waterfall is not None,
                "bench": self.bench is not None, "environment": self.environment is not None}
        return [k for k, v in have.items() if v]


def gather(*, traces: Sequence[str | os.PathLike] | None = None, live: bool | None = None,
           workload: dict[str, Any] | None = None, ncu: Sequence[str | os.PathLike] = (),
           waterfall: str | os.PathLike | None = None, bench: str | os.PathLike | None = None,
           spills: bool = False, variants: Sequence[str] | str | None = None, jobs: int = 1,
           environment: bool = True, bins: int = 200, predict: bool = True,
           on_step: Callable[[str], None] | None = None, on_compiled: Callable[[Any, Any], None] | None = None,
           ) -> Report:
    """Read, record or compile what the report shows.

    Traces, first match wins: ``traces`` files; a live recording of every schedule when ``live``
    is True, or None and this machine can record; the bundled H200 recordings. ``workload``
    (``grid``, ``Lq``, ``max_kv``, ``sparsity``, ``seed``) picks the live workload or the bundled one.
    ``on_step(description)`` is called before each slow step, for progress display.
    """
    from jfa_prof import __version__

    step = on_step or (lambda _desc: None)
    workload = {k: v for k, v in (workload or {}).items() if v is not None}
    notes: list[str] = []

    if traces:
        step("reading traces")
        recorded = load_traces(traces)
        origin, source = "files", "recorded traces: " + ", ".join(str(Path(p)) for p in traces)
    elif live or (live is None and can_record_live()):
        from jfa_prof.inputs import select_workload

        try:
            wl = select_workload(workload.get("grid"), Lq=workload.get("Lq"), max_kv=workload.get("max_kv"),
                                 sparsity=workload.get("sparsity"), seed=workload.get("seed"))
        except ValueError as e:
            raise BadInputError(str(e)) from None
        recorded = record_traces(wl, on_schedule=lambda s: step(f"recording {s} on the GPU"))
        origin, source = "live", f"recorded live on {recorded[0].gpu_name} for this report"
    else:
        step("reading the bundled recordings")
        recorded = bundled_schedule_traces(**workload)
        gpu = recorded[0].gpu_name.removeprefix("NVIDIA ")
        origin = "bundled"
        source = (f"bundled {gpu} recordings (not live: no GPU to record on here): "
                  + ", ".join(tr.path.name for tr in recorded if tr.path is not None))
    labels = {tr.workload_label for tr in recorded}
    if len(labels) > 1:
        notes.append("the traces are of different workloads (" + "; ".join(sorted(labels))
                     + "): their panels are not comparable")
    for tr in recorded:
        notes.extend(f"{tr.describe_origin()}: {w}" for w in tr.warnings)
        if tr.dropped:
            notes.append(f"{tr.describe_origin()}: {tr.dropped} tile record(s) dropped (buffer full)")
    step("analysing traces")
    results = analyse_traces(recorded, bins=bins, predict=predict)

    report = Report(title=f"jfa-prof report · {' / '.join(sorted(labels))}", origin=origin, source=source,
                    traces=results, notes=notes, version=__version__,
                    created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    if environment:
        from jfa_prof.doctor import probe_environment

        step("probing the environment")
        report.environment = probe_environment()
    for path in ncu:
        from jfa_prof.analyses.ncu import read_report

        step(f"reading {Path(path).name}")
        report.ncu.append(read_report(path))
    if waterfall is not None:
        from jfa_prof.ablations import load_waterfall
        from jfa_prof.analyses.waterfall import waterfall as decompose

        step(f"reading {Path(waterfall).name}")
        rec = load_waterfall(waterfall)
        report.waterfall = (rec, decompose(rec.timings))
        report.waterfall_source = (f"{waterfall}: recorded on {rec.meta.get('gpu', 'an unknown GPU')} "
                                   f"on {str(rec.meta.get('date', '?'))[:10]}")
    if bench is not None:
        from jfa_prof.bench import load_results

        step(f"reading {Path(bench).name}")
        res = load_results(bench)
        if not res.records:
            raise BadInputError(f"{bench} holds no results")
        report.bench = res
    if spills:
        step("compiling the forward's variants")
        report.spills = compile_spills(variants, target=report.spills_target, jobs=jobs, on_result=on_compiled)
    report.diagnoses = diagnose_traces(report, on_step=step)
    return report


def diagnose_traces(report: Report, *, on_step: Callable[[str], None] | None = None) -> list[tuple[str, Any]]:
    """The diagnosis of each level-3 trace of ``report``, with its waterfall when it is of the same pass."""
    from jfa_prof.analyses.diagnose import diagnose

    out = []
    for r in report.traces:
        if r.level is None or r.level < 3 or not len(r.trace.events):
            continue
        if on_step is not None:
            on_step(f"diagnosing {r.label}")
        # A waterfall is evidence for the causes of its own pass only.
        same = report.waterfall is not None and report.waterfall[1].pass_ == r.trace.pass_
        out.append((r.label, diagnose(r.trace, waterfall=report.waterfall[1] if same else None,
                                      waterfall_source=report.waterfall_source or "waterfall")))
    return out
