import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from jfa_prof import __version__
from jfa_prof.cli import ErrorReportingGroup, app
from jfa_prof.errors import BadInputError, JfaProfError, NoGpuError, TlxUnavailableError, ToolMissingError

runner = CliRunner()


def test_help_lists_doctor():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "doctor" in result.stdout


def test_no_args_shows_help():
    result = runner.invoke(app, [])
    assert "Usage" in result.output


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"jfa-prof {__version__}"


def test_importing_the_cli_loads_neither_torch_nor_triton():
    # get_command builds every registered command's click object (parameters included),
    # which is what `--help` does, so this covers the registration block too.
    code = (
        "import json, sys, typer; import jfa_prof.cli as cli; typer.main.get_command(cli.app); "
        "print(json.dumps(sorted(m for m in ('torch', 'triton') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def _entry_point() -> list[str]:
    script = Path(sys.executable).with_name("jfa-prof")
    if script.is_file():
        return [str(script)]
    found = shutil.which("jfa-prof")
    if found:
        return [found]
    return [sys.executable, "-c", "from jfa_prof.cli import app; app()"]


def test_help_is_instant():
    cmd = _entry_point() + ["--help"]
    timings = []
    for _ in range(3):
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        timings.append(time.perf_counter() - start)
        assert proc.returncode == 0, proc.stderr
    # The fastest of three, so one slow start on a busy machine does not fail the test.
    assert min(timings) < 1.0, timings


def _app_raising(err: Exception) -> typer.Typer:
    t = typer.Typer(cls=ErrorReportingGroup)

    @t.callback()
    def _root():
        pass

    @t.command()
    def boom():
        raise err

    return t


@pytest.mark.parametrize("err, code", [
    (JfaProfError("generic"), 1),
    (BadInputError("bad --shape"), 2),
    (NoGpuError("no CUDA device"), 3),
    (ToolMissingError("ncu not found"), 4),
    (TlxUnavailableError("tlx missing"), 5),
    (JfaProfError("custom", exit_code=7), 7),
])
def test_jfa_prof_errors_exit_with_their_code(err, code):
    result = runner.invoke(_app_raising(err), ["boom"])
    assert result.exit_code == code
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: {err.message}"]
    assert "Traceback" not in result.output


def test_error_hint_stays_on_the_same_line():
    err = ToolMissingError("ncu not found", hint="install Nsight Compute or put ncu on PATH")
    result = runner.invoke(_app_raising(err), ["boom"])
    assert result.exit_code == 4
    assert result.stderr.strip().splitlines() == [
        "error: ncu not found (install Nsight Compute or put ncu on PATH)"]


def test_markup_in_messages_is_not_interpreted():
    result = runner.invoke(_app_raising(BadInputError("bad value [bold]x[/bold]")), ["boom"])
    assert result.stderr.strip() == "error: bad value [bold]x[/bold]"


def test_other_exceptions_are_not_swallowed():
    result = runner.invoke(_app_raising(RuntimeError("a bug")), ["boom"])
    assert result.exit_code == 1
    assert isinstance(result.exception, RuntimeError)



COMMANDS = ["heatmap", "spills", "waterfall", "ncu", "timeline", "barriers", "bench", "record", "report", "doctor",
            "diagnose"]


@pytest.mark.parametrize("name", COMMANDS)
def test_help_points_at_nothing_a_user_lacks(name):
    result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "SPEC" not in result.output


def test_each_command_summary_is_one_whole_sentence():
    import typer.main

    group = typer.main.get_command(app)
    for name in COMMANDS:
        summary = (group.commands[name].help or "").strip().split("\n\n")[0]
        # the listing of `jfa-prof --help` shows this paragraph, line breaks and all
        assert "\n" not in summary and summary.endswith(".") and len(summary) <= 110, (name, summary)
        # click's own listing (help without rich) shows it whole, not cut at 45 characters
        assert group.commands[name].get_short_help_str(limit=45) == summary


def test_record_without_a_gpu_does_not_suggest_an_option_it_lacks(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(app, ["record", "-o", str(tmp_path / "r.jfatrace")])
    assert result.exit_code == 3, result.output
    assert "use --trace" not in result.stderr and "read the file" in result.stderr
