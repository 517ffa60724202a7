"""``jfa-prof waterfall``: where the kernel's time goes, by switching its components off.

Each ablation (``ABLATIONS`` of ``jfa_prof.kernels.fwd`` / ``.bwd``) removes one piece of work:
forward, the output stores, the exponentials, the K/V reloads, the mask arithmetic; backward,
dQ altogether, the dQ reduction (plain stores instead of adds), the mask arithmetic. The kernel is timed with none,
with each alone and, with ``--cumulative``, with each added on top of the ones before; the
baseline is timed twice for the noise. On a machine without a GPU, ``--results FILE`` renders
a waterfall recorded elsewhere (``--save FILE`` writes one).
"""
from __future__ import annotations

import json as _json
from pathlib import Path
from typing import Optional

import typer

from jfa_prof.commands import options as opt


def waterfall(
    pass_: Optional[str] = typer.Option(None, "--pass", help="Which kernel: fwd (default) or bwd. With "
                                                             "--results, checked against the file's."),
    grid: opt.Grid = None,
    lq: opt.Lq = None,
    max_kv: opt.MaxKv = None,
    sparsity: opt.Sparsity = None,
    seed: opt.Seed = None,
    causal: opt.Causal = False,
    schedule: Optional[str] = typer.Option(
        None, "--schedule", help="fwd: static, lpt or dynamic (default); bwd: static (round-robin, broadcast-Q's "
                                 "default) or dynamic (the queue, jagged Q's)."),
    dq: Optional[str] = typer.Option(
        None, "--dq", help="bwd: the dQ reduction: tma1 (TMA reduce-add, one staging buffer, dK/dV "
                           "stored by TMA from buffers of their own; the op's default), tma (two dQ staging "
                           "buffers, dK/dV through the K/V buffers) or atomic (per-element atomic adds)."),
    ablate: Optional[str] = typer.Option(
        None, "--ablate", help="Comma-separated ablations, in the order --cumulative applies them. Default: all, "
                               "in the kernel's order."),
    cumulative: bool = typer.Option(
        False, "--cumulative", help="Also time each ablation on top of the ones before it: the bars then add up "
                                    "exactly to the baseline."),
    rep_ms: int = typer.Option(100, "--rep-ms", min=1, help="Milliseconds of repeats per timing (median taken)."),
    out: Path = typer.Option(Path("waterfall.html"), "--out", help="Where to write the chart (HTML)."),
    save: Optional[Path] = typer.Option(None, "--save", help="Also write the measured timings (JSON), for --results."),
    json: bool = typer.Option(False, "--json", help="Print the record and its decomposition as JSON."),
    results: Optional[Path] = typer.Option(
        None, "--results", help="Render a recorded waterfall (from --save or --json) instead of measuring; "
                                "no GPU needed."),
) -> None:
    """Waterfall of the kernel's time by component, from ablations timed on the GPU.

    Bars step down from the baseline by each component's saving (baseline − ablated time).
    Savings within the noise (the gap between two baseline timings) are marked.
    """
    from rich.console import Console

    from jfa_prof.ablations import load_waterfall
    from jfa_prof.analyses.waterfall import waterfall as decompose
    from jfa_prof.errors import ToolMissingError
    from jfa_prof.files import check_writable, write_atomic
    from jfa_prof.render import waterfall as render
    from jfa_prof.render.figures import have_plotly

    # Before the minutes of timing, so an impossible path or a chart that cannot be drawn fails at
    # once. Without plotly a live run still measures when its timings are saved (--save).
    for path in (out, save):
        if path is not None:
            check_writable(path)
    chart = have_plotly()
    if not chart and (results is not None or save is None):
        raise ToolMissingError(
            "the waterfall chart needs plotly, which is not installed here",
            hint="pip install plotly; or measure here with --save FILE and draw the chart elsewhere with --results FILE")
    if results is not None:
        opt.refuse_with_files("--results", grid=grid, lq=lq, max_kv=max_kv, sparsity=sparsity, seed=seed,
                              causal=causal or None)
        live_only = {"--save": save, "--schedule": schedule, "--dq": dq, "--ablate": ablate,
                     "--cumulative": cumulative or None}
        given = [flag for flag, v in live_only.items() if v is not None]
        if given:
            from jfa_prof.errors import BadInputError

            raise BadInputError(f"{', '.join(given)} applies to a live run; with --results nothing is measured",
                                hint=f"drop {' '.join(given)}")
        rec = load_waterfall(results)
        if pass_ is not None and pass_ != rec.timings.pass_:
            from jfa_prof.errors import BadInputError

            raise BadInputError(f"--pass {pass_}, but {results} holds a waterfall of the {rec.timings.pass_} pass",
                                hint=f"drop --pass, or give a {pass_} waterfall")
        origin = "recorded"
        provenance = f"recorded on {rec.meta.get('gpu', 'an unknown GPU')} on {str(rec.meta.get('date', '?'))[:10]}"
    else:
        rec = _measure(pass_ or "fwd", grid=grid, lq=lq, max_kv=max_kv, sparsity=sparsity, seed=seed, causal=causal,
                       schedule=schedule, dq=dq, ablate=ablate, cumulative=cumulative, rep_ms=rep_ms)
        origin = "live"
        provenance = f"measured on {rec.meta.get('gpu', 'this GPU')} on {str(rec.meta.get('date', '?'))[:10]}"
        if save is not None:
            write_atomic(save, _json.dumps(rec.to_dict(), indent=1))

    wf = decompose(rec.timings)
    label = rec.label or "?"
    tflops = rec.baseline_tflops
    title = f"{wf.pass_} kernel time by component · {label} · {rec.variant}"
    subtitle = provenance + (f" · baseline {tflops:.0f} TFLOPS" if tflops else "")
    if chart:
        from jfa_prof.render.heatmap import write_html

        write_html(render.waterfall_figure(wf, title=title, subtitle=subtitle), out)

    if json:
        typer.echo(_json.dumps({**rec.to_dict(), "origin": origin, "provenance": provenance,
                                "waterfall": wf.to_dict(), "html": str(out) if chart else None}, indent=2))
        return
    console = Console(highlight=False, soft_wrap=True)
    console.print(f"[bold]{wf.pass_}[/] · {label} · schedule {rec.variant} · {provenance}"
                  + (f" · baseline {tflops:.0f} TFLOPS" if tflops else ""))
    render.waterfall_table(wf, console)
    if save is not None and results is None:
        console.print(f"saved timings to {save}")
    if chart:
        console.print(f"wrote {out}")
    else:
        console.print(f"[yellow]no chart written: plotly is not installed here[/] (draw it with "
                      f"`jfa-prof waterfall --results {save} --out {out}` where it is)")


def _measure(pass_: str, *, grid, lq, max_kv, sparsity, seed, causal, schedule, dq, ablate, cumulative, rep_ms):
    """Time the ablations live; a WaterfallRecord."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from jfa_prof import ablations, timing
    from jfa_prof.inputs import workload_dict

    workload = opt.resolve_workload(grid, lq, max_kv, sparsity, seed, causal)
    schedule = ablations.pass_options(pass_, schedule, dq, broadcast_q=workload.broadcast_q)
    if pass_ == "bwd" and dq is None:
        dq = ablations.DEFAULT_DQ_NAME
    device = timing.require_gpu("jfa-prof waterfall", hint="pass --results FILE to render a recorded waterfall")
    names = [n.strip() for n in ablate.split(",") if n.strip()] if ablate else None
    plan = ablations.ablation_plan(pass_, names)
    x = workload.make(device)
    launcher = ablations.make_launcher(x, pass_, schedule, dq)

    # On stderr, so that --json output stays parseable; gone once done, the table is what stays.
    progress = Progress(TextColumn(f"timing {workload.label}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), TextColumn("{task.description}"),
                        console=Console(stderr=True), transient=True)
    with progress:
        task = progress.add_task("", total=ablations.n_steps(plan, cumulative))
        started = []

        def step(desc: str) -> None:
            if started:
                progress.advance(task)
            started.append(desc)
            progress.update(task, description=desc)

        timings = ablations.measure_waterfall(launcher, plan, pass_=pass_, cumulative=cumulative, rep_ms=rep_ms,
                                              on_step=step)
        progress.advance(task)
    return ablations.WaterfallRecord(timings=timings, workload=workload_dict(x), schedule=schedule,
                                     meta=timing.measurement_meta(), flops=x.flops(pass_), dq=dq)
