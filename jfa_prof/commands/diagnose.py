"""``jfa-prof diagnose``: why the kernel takes its time, as a ranked list of causes.

Reads a level-3 trace (``--trace``), or records one live on a GPU, or falls back to a bundled
level-3 H200 recording (and says so). With the compiled kernel's spills, ncu counters and a
short waterfall when asked, the causes carry that evidence too.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from jfa_prof.commands import options as opt


def diagnose(
    trace: Optional[Path] = typer.Option(
        None, "--trace", help="Recorded .jfatrace file (level 3 for every cause). Default: record one live on a GPU, "
                              "else a bundled level-3 H200 recording."),
    pass_: Optional[str] = typer.Option(None, "--pass", help="fwd (default) or bwd. With --trace, checked against "
                                                             "the file's."),
    grid: opt.Grid = None,
    lq: opt.Lq = None,
    max_kv: opt.MaxKv = None,
    sparsity: opt.Sparsity = None,
    seed: opt.Seed = None,
    causal: opt.Causal = False,
    schedule: Optional[str] = typer.Option(
        None, "--schedule", help="Live: fwd static, lpt or dynamic (default); bwd static (broadcast-Q's default) "
                                 "or dynamic (jagged Q's)."),
    dq: Optional[str] = typer.Option(None, "--dq", help="Live bwd: the dQ reduction, tma, tma1 or atomic."),
    ncu_rep: Optional[Path] = typer.Option(
        None, "--ncu-rep", metavar="FILE", help="An .ncu-rep of the same kernel: tensor-pipe and DRAM throughput as "
                                                "evidence."),
    ncu: bool = typer.Option(False, "--ncu", help="Live: also profile the kernel under ncu (needs ncu; the report "
                                                  "is written to the current directory)."),
    waterfall: bool = typer.Option(False, "--waterfall", help="Live: also time the pass's ablations alone (a "
                                                              "short waterfall) as evidence."),
    spills: Optional[bool] = typer.Option(
        None, "--spills/--no-spills", help="Compile the recorded kernel variant here and check its spills (no GPU "
                                           "needed). Default: on for a live recording."),
    json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON on stdout."),
) -> None:
    """Why the kernel takes its time: ranked causes, each with its evidence and the experiment that confirms it.

    From the per-tile event records of a level-3 trace: which role held each tile up, where the tensor cores sat idle.

    A level-1/2 trace gives the idle CTAs and the wait totals only. Without --trace and without a GPU it reads a
    bundled level-3 H200 recording, and says so.
    """
    from rich.console import Console

    from jfa_prof import ablations
    from jfa_prof.analyses.diagnose import diagnose as analyse
    from jfa_prof.errors import BadInputError
    from jfa_prof.render import diagnose as render

    if pass_ is not None:
        ablations.check_pass(pass_)
    if ncu_rep is not None and not ncu_rep.is_file():
        raise BadInputError(f"--ncu-rep {ncu_rep}: no such file")
    if ncu_rep is not None and ncu:
        raise BadInputError("--ncu profiles live, --ncu-rep reads a report: give one of them")
    err = Console(stderr=True, highlight=False, soft_wrap=True)

    if trace is not None:
        opt.refuse_with_files("--trace", grid=grid, lq=lq, max_kv=max_kv, sparsity=sparsity, seed=seed,
                              causal=causal or None)
        live_only = {"--schedule": schedule, "--dq": dq, "--ncu": ncu or None, "--waterfall": waterfall or None}
        given = [flag for flag, v in live_only.items() if v is not None]
        if given:
            raise BadInputError(f"{', '.join(given)} applies to a live recording, not to --trace",
                                hint=f"drop {' '.join(given)}, or drop --trace to record on this machine's GPU")
        from jfa_prof.trace import read_trace

        tr = read_trace(trace)
        if pass_ is not None and pass_ != tr.pass_:
            raise BadInputError(f"--pass {pass_}, but {trace} is a recording of the {tr.pass_} pass",
                                hint=f"drop --pass, or give a {pass_} recording")
        workload = None
    else:
        pass_ = pass_ or "fwd"
        asked = [flag for flag, v in (("--schedule", schedule), ("--dq", dq)) if v is not None]
        ablations.pass_options(pass_, schedule, dq)  # bad options before anything is recorded or read
        tr, workload = _live_or_bundled(pass_, schedule, dq, err, grid=grid, lq=lq, max_kv=max_kv,
                                        sparsity=sparsity, seed=seed, causal=causal)
        if workload is None and asked:
            err.print(f"[yellow]{' and '.join(asked)} choose what a live recording runs; the bundled one ran "
                      f"{tr.schedule}[/]")
    if tr.level < 3:
        err.print(f"[yellow]{tr.describe_origin()} is a level-{tr.level} trace: no per-tile events, so the "
                  "epilogue and the critical path per tile are missing[/]")

    compiled = _compile_report(tr, err) if (spills if spills is not None else tr.origin == "live") else None
    ncu_metrics, ncu_source = (None, "ncu")
    if ncu_rep is not None:
        ncu_metrics, ncu_source = _ncu_metrics(ncu_rep, tr.pass_), ncu_rep.name
    elif ncu:
        if workload is None:
            raise BadInputError("--ncu profiles the live workload: there is none with a bundled recording",
                                hint="run it on a GPU machine, or pass --ncu-rep FILE")
        path = _profile_ncu(workload, tr.pass_, tr.schedule, dq, err)
        ncu_metrics, ncu_source = _ncu_metrics(path, tr.pass_), path.name
    wf = None
    if waterfall:
        if workload is None:
            raise BadInputError("--waterfall times the live workload: there is none with a bundled recording",
                                hint="run it on a GPU machine")
        wf = _short_waterfall(workload, tr.pass_, tr.schedule, dq, err)

    diag = analyse(tr, spills=compiled, spills_source="ptxas (compiled here)", ncu=ncu_metrics, ncu_source=ncu_source,
                   waterfall=wf, waterfall_source="waterfall (timed here)")
    if json:
        # Where and when the recording was made, so a saved document is a result file on its own.
        recorded = {k: tr.meta.get(k) for k in ("gpu", "versions", "date", "command", "kernel_ms")}
        typer.echo(render.to_json(diag, origin=tr.origin, trace=str(tr.path) if tr.path else None,
                                  workload=tr.workload_label, schedule=tr.schedule, kernel=tr.kernel_label,
                                  recorded=recorded))
        return
    console = Console(highlight=False, soft_wrap=False)
    render.render(diag, console, title=f"why the {tr.pass_} kernel takes its time · {tr.kernel_label} · "
                                        f"{tr.workload_label}")


def _live_or_bundled(pass_: str, schedule: str | None, dq: str | None, err, **options) -> tuple[Any, Any]:
    """A level-3 trace recorded on this machine's GPU (and its workload), else a bundled one (and None).
    `schedule`: None for the op's for the workload."""
    from jfa_prof import ablations
    from jfa_prof.errors import BadInputError
    from jfa_prof.report import can_record_live, level3_recordings
    from jfa_prof.trace import read_trace

    if can_record_live():
        from jfa_prof.recording import record_bwd_workload, record_workload

        workload = opt.resolve_workload(options["grid"], options["lq"], options["max_kv"], options["sparsity"],
                                        options["seed"], options["causal"])
        schedule = ablations.pass_options(pass_, schedule, dq, broadcast_q=workload.broadcast_q)
        with err.status(f"recording the {pass_} of {workload.label} ({schedule}) at level 3 on the GPU…"):
            if pass_ == "fwd":
                tr = record_workload(workload, schedule, level=3)
            else:
                tr = record_bwd_workload(workload, schedule, dq=dq, level=3)
        tr.origin = "live"
        return tr, workload
    if options["seed"] is not None:
        raise BadInputError("--seed chooses the lengths of a live recording; the bundled ones were made with seed 0",
                            hint="drop --seed, or run on a GPU machine")
    # The mask always: without --causal a causal recording is not the workload asked for.
    wanted = {"grid": options["grid"], "Lq": options["lq"], "max_kv": options["max_kv"],
              "sparsity": options["sparsity"], "causal": bool(options["causal"])}
    # The op as built: a recording of a build with a planted bottleneck would diagnose that build.
    found = level3_recordings(pass_, modified=False, **wanted)
    if not found:
        asked = ", ".join(f"{k}={v}" for k, v in wanted.items() if v is not None)
        raise BadInputError(f"no GPU here and no bundled level-3 {pass_} recording{' of ' + asked if asked else ''}",
                            hint="run `jfa-prof diagnose` on a GPU machine (it records one live), or pass --trace "
                                 "FILE of a level-3 recording")
    return read_trace(found[0], origin="bundled"), None


def _compile_report(tr, err):
    """The recorded variant's compile report (``analyses.spills.VariantResources``), or None with a
    line on stderr saying why not."""
    from jfa_prof.analyses import spills as analysis
    from jfa_prof.errors import JfaProfError

    name = str((tr.meta.get("kernel") or {}).get("variant") or "")
    try:
        from jfa_prof.compile import CompileFailure, compile_many
        from jfa_prof.kernels import registry

        variants = {v.name: v for v in registry.all_variants()}
    except (ImportError, JfaProfError) as e:
        err.print(f"[dim]no compile report: the kernels do not import here ({e})[/]")
        return None
    # The backward's recordings name their schedule; the registry leaves out each mode's default one.
    chosen = variants.get(name) or variants.get(name.replace(f"/{tr.schedule}/", "/"))
    if chosen is None:
        err.print(f"[dim]no compile report: {name or 'the recording'} is not a registered kernel variant[/]")
        return None
    with err.status(f"compiling {chosen.name} for its spills…"):
        (outcome,) = compile_many([chosen], "sm_90a", jobs=1)
    if isinstance(outcome, CompileFailure):
        err.print(f"[dim]no compile report: {chosen.name} did not compile ({outcome.message})[/]")
        return None
    return analysis.from_result(outcome)


def _ncu_metrics(path: Path, pass_: str) -> dict[str, float | None]:
    from jfa_prof.analyses.ncu import read_report
    from jfa_prof.ncu_live import KERNEL_REGEX

    report = read_report(path)
    kernel = report.kernel(KERNEL_REGEX[pass_]) if len(report.kernels) > 1 else report.kernel()
    return dict(kernel.metrics)


def _profile_ncu(workload, pass_: str, schedule: str, dq: str | None, err) -> Path:
    """One uninstrumented launch of the workload under ncu; the report's path."""
    from jfa_prof import ablations, ncu_live

    ncu_path = ncu_live.require_ncu()
    ncu_live.require_gpu_driver()
    run = ncu_live.LiveRun(schedule=schedule, grid=workload.grid, lq=workload.Lq, max_kv=workload.max_kv,
                           sparsity=workload.sparsity, pass_=pass_, causal=workload.causal,
                           dq=(dq or ablations.DEFAULT_DQ_NAME) if pass_ == "bwd" else None)
    out = ncu_live.report_path(Path(f"diagnose_{pass_}_{run.tag}"))
    argv = ncu_live.ncu_argv(ncu_path, out, ncu_live.target_argv(run), pass_=pass_)
    with err.status(f"profiling {workload.label} under ncu…"):
        return ncu_live.run_ncu(argv, out)


# A short waterfall: each ablation alone, briefly timed; evidence, not a measurement to publish.
WATERFALL_REP_MS = 30


def _short_waterfall(workload, pass_: str, schedule: str, dq: str | None, err):
    from jfa_prof import ablations, timing
    from jfa_prof.analyses.waterfall import waterfall as decompose

    device = timing.require_gpu("jfa-prof diagnose --waterfall")
    plan = ablations.ablation_plan(pass_)
    launcher = ablations.make_launcher(workload.make(device), pass_, schedule, dq)
    with err.status(f"timing {len(plan)} ablations of the {pass_} kernel…") as status:
        timings = ablations.measure_waterfall(launcher, plan, pass_=pass_, rep_ms=WATERFALL_REP_MS,
                                              on_step=lambda desc: status.update(f"timing {desc}…"))
    return decompose(timings)
