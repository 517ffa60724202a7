"""``jfa-prof ncu``: Nsight Compute metrics of the forward or backward kernel, from a report or a live run."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from jfa_prof.commands import options as opt
from jfa_prof.ncu_target import PROFILE_LEVELS_HELP


def ncu(
    report: Optional[Path] = typer.Option(
        None, "--report", metavar="FILE", help="Read this .ncu-rep (recorded anywhere) instead of running ncu."),
    compare: Optional[Path] = typer.Option(
        None, "--compare", metavar="FILE_B", help="Show this report's kernel against A (--report, or the live run)."),
    kernel: Optional[str] = typer.Option(
        None, "--kernel", metavar="REGEX", help="Only kernels whose name matches, for reports holding several."),
    pass_: str = typer.Option("fwd", "--pass", help="Live: the forward (fwd) or the backward (bwd) kernel."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="Live: fwd static, lpt or dynamic (default); "
                                                                    "bwd static (broadcast-Q's default) or "
                                                                    "dynamic (jagged Q's)."),
    dq: Optional[str] = typer.Option(None, "--dq", help="Live bwd: the dQ reduction, tma, tma1 or atomic "
                                                        "(default: the op's)."),
    vs_dq: Optional[str] = typer.Option(None, "--vs-dq", help="Live bwd: also profile this dQ reduction and "
                                                              "compare it (B)."),
    grid: opt.Grid = None,
    lq: opt.Lq = None,
    max_kv: opt.MaxKv = None,
    sparsity: opt.Sparsity = None,
    seed: opt.Seed = None,
    causal: opt.Causal = False,
    no_peel: bool = typer.Option(False, "--no-peel", help="Live: mask every KV block (no peeled mask tail)."),
    vs_schedule: Optional[str] = typer.Option(
        None, "--vs-schedule", help="Live: also profile this schedule and compare it (B) against --schedule (A)."),
    vs_peel: Optional[bool] = typer.Option(
        None, "--vs-peel/--vs-no-peel", help="Live: also profile with peeling on/off and compare it (B)."),
    profile: int = typer.Option(0, "--profile", metavar="LEVEL",
                                help=f"Live: the kernel's instrumentation level: {PROFILE_LEVELS_HELP}."),
    vs_profile: Optional[int] = typer.Option(
        None, "--vs-profile", metavar="LEVEL", help="Live: also profile at this instrumentation level and compare "
                                                    "it (B): where the instrumentation's cost goes."),
    out: Optional[Path] = typer.Option(
        None, "-o", "--out", help="Live: report to write (default: named after the workload, in the current "
                                  "directory); a comparison's B goes beside it."),
    arch: str = typer.Option("sm_90", "--arch", help="Live: architecture whose metric names ncu collects."),
    top: int = typer.Option(8, "--top", min=1, help="Stall reasons to show."),
    json: bool = typer.Option(False, "--json", help="Print the result as JSON on stdout."),
) -> None:
    """Nsight Compute counters of the forward or backward kernel: tensor pipe, throughput, spills, stalls.

    Tensor-pipe use, SM and DRAM throughput, local-memory (spill) traffic, registers, SM
    imbalance and warp stall reasons.

    [bold]--report FILE[/] reads a report made anywhere, no GPU needed; [bold]--compare FILE_B[/] adds deltas.

    Without --report, ncu profiles one launch on this machine's GPU, e.g. [bold]--vs-schedule lpt[/],
    [bold]--pass bwd --dq tma --vs-dq atomic[/], or [bold]--vs-profile 1[/] (what the instrumentation
    costs).
    """
    from jfa_prof.analyses import ncu as analysis
    from jfa_prof.errors import BadInputError
    from jfa_prof.ncu_metrics import normalize_arch

    live_options = {"--schedule": schedule, "--grid": grid, "--lq": lq, "--max-kv": max_kv,
                    "--sparsity": sparsity, "--seed": seed, "--causal": causal or None, "--no-peel": no_peel or None,
                    "--vs-schedule": vs_schedule, "--vs-peel/--vs-no-peel": vs_peel, "-o": out,
                    "--pass": None if pass_ == "fwd" else pass_, "--dq": dq, "--vs-dq": vs_dq,
                    "--profile": profile or None, "--vs-profile": vs_profile}
    if report is not None:
        given = [k for k, v in live_options.items() if v is not None]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise BadInputError(f"{', '.join(given)} {verb} only to a live run, not to --report",
                                hint="drop --report to profile on this machine's GPU")
        a = analysis.read_report(report)
        b = analysis.read_report(compare) if compare is not None else None
        runs: list[dict[str, Any]] = []
        label_a = label_b = None
    else:
        if compare is not None and any(v is not None for v in (vs_schedule, vs_peel, vs_dq, vs_profile)):
            raise BadInputError("compare with either --compare FILE_B or --vs-schedule/--vs-peel/--vs-dq/--vs-profile, "
                                "not both")
        a, b, runs = _live(pass_=pass_, schedule=schedule, peel=not no_peel, dq=dq, grid=grid or "hsp", lq=lq,
                           max_kv=max_kv, sparsity=sparsity, seed=seed, causal=causal, vs_schedule=vs_schedule,
                           vs_peel=vs_peel, vs_dq=vs_dq, profile=profile, vs_profile=vs_profile, out=out,
                           arch=normalize_arch(arch), compare=compare)
        label_a = runs[0]["label"]
        label_b = runs[1]["label"] if len(runs) > 1 else None

    _show(analysis, a, b, kernel=kernel, top=top, json=json, runs=runs, label_a=label_a, label_b=label_b)


def _show(analysis, a, b, *, kernel, top, json, runs, label_a, label_b) -> None:
    from jfa_prof.render import ncu as render

    if b is not None:
        cmp = analysis.compare(a.kernel(kernel), b.kernel(kernel), label_a=label_a, label_b=label_b)
        data = render.comparison_to_dict(cmp)
        if not json:
            render.render_comparison(cmp, top=top)
    else:
        a = a.select(kernel)
        data = render.report_to_dict(a)
        if not json:
            render.render_report(a, top=top)
    if json:
        if runs:
            data["runs"] = runs
        typer.echo(render.to_json(data))


def _live(*, pass_, schedule, peel, dq, grid, lq, max_kv, sparsity, seed, causal, vs_schedule, vs_peel, vs_dq, profile,
          vs_profile, out, arch, compare):
    """Profile A (and B when a --vs option asks), read the reports; (A, B or None, run records)."""
    from dataclasses import replace

    from rich.console import Console

    from jfa_prof import ablations, ncu_live
    from jfa_prof.analyses import ncu as analysis
    from jfa_prof.errors import BadInputError
    from jfa_prof.ncu_target import check_profile_level

    # Bad options first, then the cheapest checks, before torch is imported to check the workload.
    ablations.pass_options(pass_, schedule, dq)
    ablations.pass_options(pass_, vs_schedule or schedule, vs_dq, dq_flag="--vs-dq")
    if pass_ == "bwd" and (not peel or vs_peel is not None):
        raise BadInputError("--no-peel and --vs-peel apply to the forward only: the backward's peeling has no switch")
    check_profile_level(profile)
    if vs_profile is not None:
        check_profile_level(vs_profile)
    ncu_path = ncu_live.require_ncu()
    ncu_live.require_gpu_driver()
    workload = opt.resolve_workload(grid, lq, max_kv, sparsity, seed, causal)
    schedule = ablations.pass_options(pass_, schedule, dq, broadcast_q=workload.broadcast_q)
    if pass_ == "bwd" and dq is None:
        dq = ablations.DEFAULT_DQ_NAME

    # The resolved workload, so the B run and the file names match what A ran.
    run_a = ncu_live.LiveRun(schedule=schedule, peel=peel, grid=workload.grid, lq=workload.Lq,
                             max_kv=workload.max_kv, sparsity=workload.sparsity, seed=seed, pass_=pass_, dq=dq,
                             profile=profile, causal=workload.causal)
    runs = [run_a]
    if any(v is not None for v in (vs_schedule, vs_peel, vs_dq, vs_profile)):
        run_b = replace(run_a, schedule=vs_schedule or schedule, peel=peel if vs_peel is None else vs_peel,
                        dq=vs_dq or dq, profile=profile if vs_profile is None else vs_profile)
        if run_b == run_a:
            raise BadInputError("the comparison run is the same as the first one",
                                hint="--vs-schedule needs another schedule, --vs-peel/--vs-no-peel the "
                                     "other peeling, --vs-dq another reduction, --vs-profile another level")
        runs.append(run_b)

    base = _default_name(workload, run_a) if out is None else out
    paths = [ncu_live.report_path(base)]
    if len(runs) > 1:
        first = paths[0]
        stem = first.name[: -len(ncu_live.REPORT_SUFFIX)]
        paths.append(first.with_name(f"{stem}.vs-{runs[1].tag}{ncu_live.REPORT_SUFFIX}"))

    err = Console(stderr=True, highlight=False)
    records, reports = [], []
    for run, path in zip(runs, paths):
        label = f"{run.tag}: {workload.label}"
        argv = ncu_live.ncu_argv(ncu_path, path, ncu_live.target_argv(run), arch=arch, pass_=run.pass_)
        with err.status(f"profiling {label} under ncu (one launch, replayed per metric pass)…"):
            written = ncu_live.run_ncu(argv, path)
        err.print(f"[dim]report: {written}[/]")
        reports.append(analysis.read_report(written))
        records.append({"label": label, "report": str(written), "pass": run.pass_, "dq": run.dq,
                        "schedule": run.schedule, "peel": run.peel, "profile": run.profile,
                        "workload": workload.label, "arch": arch, "command": argv})
    for rep in reports:
        for k in rep.kernels:
            if k.arch is not None and k.arch != arch:
                err.print(f"[yellow]{k.name} ran on {k.arch} but --arch {arch} chose the metric names; "
                          f"rerun with --arch {k.arch}[/]")
    b = reports[1] if len(reports) > 1 else (analysis.read_report(compare) if compare is not None else None)
    return reports[0], b, records


def _default_name(workload, run) -> Path:
    """``ncu_hsp_lq128_kv1024_s0.5_lpt.ncu-rep``: the workload and variant, file-name safe."""
    parts = ["ncu", workload.grid] if run.pass_ == "fwd" else ["ncu", "bwd", workload.grid]
    if workload.broadcast_q:
        parts.append(f"lq{workload.Lq}")
    parts += [f"kv{workload.max_kv}", f"s{workload.sparsity:g}"] + (["causal"] if workload.causal else []) + [run.tag]
    if run.seed is not None:
        parts.append(f"seed{run.seed}")
    return Path("_".join(parts) + ".ncu-rep")
