"""Output files: written whole or not at all, and a path that cannot be written is one line and
exit code 2 in every command that writes one, before the command's work."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import tracegen
from jfa_prof.cli import app
from jfa_prof.commands import heatmap as heatmap_cmd
from jfa_prof.errors import BadInputError
from jfa_prof.files import check_writable, write_atomic
from jfa_prof.trace import write_trace
from tests.resultgen import write_waterfall

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks/results/bench/superseded/fwd_hsp_h200_2026-11-30.json"
runner = CliRunner()


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".tmp"))


# ---- the helper ------------------------------------------------------------------------------

def test_write_atomic_replaces_the_file_whole(tmp_path):
    target = tmp_path / "sub" / "page.html"
    write_atomic(target, "first")
    write_atomic(target, b"second")
    assert target.read_text() == "second"
    assert _leftovers(target.parent) == []
    # the mode of any new file here, not mkstemp's private 0600
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_write_keeps_the_earlier_file_and_leaves_no_partial_one(tmp_path):
    target = tmp_path / "page.html"
    target.write_text("the good page")

    def full_disk(f):
        f.write(b"half a pa")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(BadInputError, match="No space left on device") as info:
        write_atomic(target, full_disk)
    assert str(target) in info.value.message and info.value.exit_code == 2
    assert target.read_text() == "the good page"
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("where, reason", [
    ("dir", "is a directory"),
    ("/proc/jfa-prof-test/out.html", "cannot write"),
    ("/proc/out.html", "cannot write"),
])
def test_check_writable_names_the_path_and_the_reason(tmp_path, where, reason):
    path = tmp_path if where == "dir" else Path(where)
    with pytest.raises(BadInputError, match=reason) as info:
        check_writable(path)
    assert str(path) in info.value.message


def test_a_trace_that_cannot_be_written_is_bad_input(tmp_path):
    buf, meta, _ = tracegen.persistent_run([4, 2], n_ctas=2, n_sms=2)
    with pytest.raises(BadInputError, match="cannot write trace"):
        write_trace(tmp_path, buf, meta)


# ---- the commands ----------------------------------------------------------------------------

@pytest.fixture
def trace_file(tmp_path):
    buf, meta, _ = tracegen.persistent_run(np.arange(1, 40) % 7 + 1, n_ctas=8, n_sms=8, schedule="dynamic")
    return write_trace(tmp_path / "run.jfatrace", buf, meta)


@pytest.fixture
def no_live(monkeypatch):
    monkeypatch.setattr(heatmap_cmd, "_record_live", lambda *a, **k: None)


def _one_line_error(result, path) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write") and str(path) in lines[0], lines


@pytest.mark.parametrize("bad", ["dir", "/proc/jfa-prof-test/x.html"])
def test_heatmap_refuses_an_unwritable_out(tmp_path, trace_file, no_live, bad):
    out = tmp_path if bad == "dir" else Path(bad)
    _one_line_error(runner.invoke(app, ["heatmap", "--trace", str(trace_file), "--out", str(out)]), out)


def test_timeline_refuses_an_unwritable_out_or_html(tmp_path, trace_file):
    _one_line_error(runner.invoke(app, ["timeline", "--trace", str(trace_file), "--out", str(tmp_path)]), tmp_path)
    bad = Path("/proc/jfa-prof-test/g.html")
    result = runner.invoke(app, ["timeline", "--trace", str(trace_file), "--out", str(tmp_path / "t.json"),
                                 "--html", str(bad)])
    _one_line_error(result, bad)
    assert not (tmp_path / "t.json").exists()  # refused before anything was written


def test_report_refuses_an_unwritable_out_before_gathering(tmp_path, monkeypatch):
    monkeypatch.setattr("jfa_prof.report.gather", lambda **k: pytest.fail("gathered before checking --out"))
    _one_line_error(runner.invoke(app, ["report", "-o", str(tmp_path), "--no-doctor"]), tmp_path)


def test_waterfall_refuses_an_unwritable_out_or_save(tmp_path):
    recorded = write_waterfall(tmp_path / "wf.json")
    _one_line_error(runner.invoke(app, ["waterfall", "--results", str(recorded), "--out", str(tmp_path)]), tmp_path)
    # live: refused before looking for a GPU (which would be exit code 3 here)
    bad = Path("/proc/jfa-prof-test/w.json")
    _one_line_error(runner.invoke(app, ["waterfall", "--out", str(tmp_path / "w.html"), "--save", str(bad)]), bad)


def test_bench_refuses_an_unwritable_html_or_out(tmp_path):
    _one_line_error(runner.invoke(app, ["bench", "--results", str(BENCH), "--html", str(tmp_path)]), tmp_path)
    # live: refused before looking for a GPU (which would be exit code 3 here)
    _one_line_error(runner.invoke(app, ["bench", "--out", str(tmp_path)]), tmp_path)


def test_heatmap_on_a_full_disk_keeps_the_earlier_page(tmp_path, trace_file):
    """A file size limit makes the write fail part way (EFBIG), as a full disk does (ENOSPC)."""
    out = tmp_path / "heatmap.html"
    out.write_text("the good page")
    code = ("import resource, sys\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))\n"
            "from jfa_prof.commands import heatmap as h\n"
            "h._record_live = lambda *a, **k: None\n"
            "from jfa_prof.cli import app\n"
            f"sys.argv = ['jfa-prof', 'heatmap', '--trace', {str(trace_file)!r}, '--out', {str(out)!r}]\n"
            "app()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"error: cannot write output {out}: File too large"]
    assert out.read_text() == "the good page"
    assert _leftovers(tmp_path) == []
