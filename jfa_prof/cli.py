"""The ``jfa-prof`` command line: wiring only.

Each command lives in ``jfa_prof/commands/<name>.py`` and does its own heavy imports (torch,
triton) inside the function, so importing this module - and therefore ``jfa-prof --help`` -
stays instant and never initializes CUDA.
"""
from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperGroup

from jfa_prof import __version__
from jfa_prof.errors import JfaProfError


def print_error(err: JfaProfError) -> None:
    """One line on stderr: the message, and the hint when the error has one."""
    from rich.console import Console
    from rich.markup import escape

    # Built per call, not at import: the console must bind to the sys.stderr of the moment
    # (test runners swap it), and soft wrap keeps the message one logical line when piped.
    console = Console(stderr=True, soft_wrap=True, highlight=False)
    line = f"[bold red]error:[/] {escape(err.message)}"
    if err.hint:
        line += f" [dim]({escape(err.hint)})[/]"
    console.print(line)


class ErrorReportingGroup(TyperGroup):
    """Turns a JfaProfError from any command into its message and exit code, no traceback.

    Done in the click group rather than around ``app()`` so that ``typer.testing.CliRunner``,
    which bypasses ``app.__call__``, sees the same exit codes as a shell does.
    """

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except JfaProfError as err:
            print_error(err)
            raise typer.Exit(err.exit_code) from None


app = typer.Typer(
    name="jfa-prof",
    cls=ErrorReportingGroup,
    rich_markup_mode="rich",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    # Unexpected errors are bugs and keep their traceback, but locals may hold whole tensors.
    pretty_exceptions_show_locals=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"jfa-prof {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True,
        help="Print the jfa-prof version and exit.",
    ),
) -> None:
    """Profile Jagged Flash Attention kernels written in TLX: SM heatmaps, spills, ncu
    metrics, warp-role timelines, barrier waits, diagnoses, benchmarks.

    Start with [bold]jfa-prof doctor[/] to see what can run on this machine.
    """


# ---- command registration -------------------------------------------------------------------
# One import and one registration per command, in the order `--help` lists them. Command
# modules import only typer and the standard library at module level, so this block adds no
# start-up time; keep it that way (tests/test_cli.py checks that torch and triton stay unloaded).
from jfa_prof.commands.heatmap import heatmap as heatmap_cmd  # noqa: E402
from jfa_prof.commands.spills import spills as spills_cmd  # noqa: E402
from jfa_prof.commands.waterfall import waterfall as waterfall_cmd  # noqa: E402
from jfa_prof.commands.ncu import ncu as ncu_cmd  # noqa: E402
from jfa_prof.commands.timeline import timeline as timeline_cmd  # noqa: E402
from jfa_prof.commands.barriers import barriers as barriers_cmd  # noqa: E402
from jfa_prof.commands.diagnose import diagnose as diagnose_cmd  # noqa: E402
from jfa_prof.commands.bench import bench as bench_cmd  # noqa: E402
from jfa_prof.commands.doctor import doctor as doctor_cmd  # noqa: E402
from jfa_prof.commands.record import record as record_cmd  # noqa: E402
from jfa_prof.commands.report import report as report_cmd  # noqa: E402


def _summary(fn) -> str:
    """The first paragraph of a command's docstring, whole: click would otherwise cut the
    listing's summary at 45 characters, mid-sentence, wherever it formats help without rich."""
    import inspect

    return " ".join(inspect.cleandoc(fn.__doc__ or "").split("\n\n")[0].split())


for _name, _fn in (("heatmap", heatmap_cmd), ("spills", spills_cmd), ("waterfall", waterfall_cmd),
                   ("ncu", ncu_cmd), ("timeline", timeline_cmd), ("barriers", barriers_cmd),
                   ("diagnose", diagnose_cmd), ("bench", bench_cmd), ("record", record_cmd), ("report", report_cmd),
                   ("doctor", doctor_cmd)):
    app.command(_name, short_help=_summary(_fn))(_fn)
# ---- end of command registration ------------------------------------------------------------
