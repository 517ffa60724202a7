import dataclasses
import json
import re
from dataclasses import dataclass, field
from io import StringIO
from types import SimpleNamespace

import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from jfa_prof.analyses import spills as analysis
from jfa_prof.analyses.spills import VariantResources
from jfa_prof.kernels.registry import KernelVariant
from jfa_prof.render import spills as render

runner = CliRunner()

WGMMA_NOTE = ("(C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
              "insufficient register resources for the wgmma pipeline in the function 'k'")


def _res(variant, **kw):
    tags = kw.pop("tags", {"pass": "fwd", "peel": "true"})
    return VariantResources(variant=variant, kernel="_jfa_fwd", tags=tags, **kw)


PEEL = _res("fwd/bcast/peel", registers=168, spill_store_bytes=188, spill_load_bytes=184, stack_bytes=80,
            smem_bytes=229688, ldl=46, stl=47, wgmma_in_flight=2, barriers=31, loop_instructions=612,
            mufu_overlap=1.0, compile_seconds=9.04, cached=True)
NOPEEL = _res("fwd/bcast/nopeel", tags={"pass": "fwd", "peel": "false"}, registers=168, spill_store_bytes=248,
              spill_load_bytes=228, stack_bytes=88, smem_bytes=229688, ldl=57, stl=62, compile_seconds=8.2,
              warnings=(WGMMA_NOTE,))


def _console():
    return Console(file=StringIO(), width=200, highlight=False, color_system=None)


# ---- analysis ------------------------------------------------------------------------------------

def test_spill_table_rows_and_columns():
    broken = analysis.failed("bwd/x", "_jfa_bwd", "ptxas rejected _jfa_bwd: boom", {"pass": "bwd", "dq": "atomic"})
    df = analysis.spill_table([PEEL, NOPEEL, broken])
    assert list(df["variant"]) == ["fwd/bcast/peel", "fwd/bcast/nopeel", "bwd/x"]
    # tags become columns, in first-seen order, between the names and the numbers
    assert list(df.columns[:5]) == ["variant", "kernel", "pass", "peel", "dq"]
    assert list(df["dq"]) == ["", "", "atomic"]
    assert list(df["spill_bytes"][:2]) == [372, 476]
    assert df.loc[1, "warnings"] == [WGMMA_NOTE]
    assert df["registers"].dtype == "Int64"
    assert df.loc[2, "registers"] is pd.NA and df.loc[2, "error"] == "ptxas rejected _jfa_bwd: boom"
    assert df.loc[0, "cached"] and not df.loc[1, "cached"]


def test_spill_table_empty():
    df = analysis.spill_table([])
    assert len(df) == 0 and "spill_bytes" in df.columns


def test_compare_reports_what_b_freed():
    cmp = analysis.compare(NOPEEL, PEEL)
    assert cmp.delta("spill_bytes") == 372 - 476
    assert cmp.delta("registers") == 0
    assert cmp.delta("ldl") == -11 and cmp.delta("stl") == -15
    assert [d.metric for d in cmp.deltas] == list(analysis.METRICS)
    assert cmp.tag_differences == {"peel": ("false", "true")}
    assert cmp.warnings_only_in_a == (WGMMA_NOTE,) and cmp.warnings_only_in_b == ()
    with pytest.raises(KeyError):
        cmp.delta("nope")


def test_compare_with_a_failed_variant_has_no_deltas():
    cmp = analysis.compare(analysis.failed("a", "k", "boom"), PEEL)
    assert all(d.delta is None for d in cmp.deltas)
    assert cmp.deltas[0].b == 168


def _fake(name, fn="_jfa_fwd", **tags):
    return SimpleNamespace(name=name, tags=tags, kernel=SimpleNamespace(__name__=fn))


VARIANTS = [
    _fake("fwd/bcast/bf16/d128/lpt/peel/noprof", **{"pass": "fwd"}),
    _fake("fwd/bcast/bf16/d128/lpt/nopeel/noprof", **{"pass": "fwd"}),
    _fake("fwd/jagged/fp16/d64/lpt/peel/prof", **{"pass": "fwd"}),
    _fake("bwd/bcast/bf16/d128/rr/noprof", fn="_jfa_bwd", **{"pass": "bwd"}),
    _fake("fwdish/x", fn="_other"),
]


@pytest.mark.parametrize("kernel, pattern, expected", [
    (None, None, [0, 1, 2, 3, 4]),
    ("fwd", None, [0, 1, 2]),
    ("_jfa_bwd", None, [3]),
    ("bwd", None, [3]),
    (None, "fwd/*/peel/*", [0, 2]),
    (None, "*/bf16/*", [0, 1, 3]),
    (None, "fwd/bcast", [0, 1]),  # a name prefix of whole segments
    (None, "fwd", [0, 1, 2]),  # not "fwdish"
    (None, "fwd/jagged/fp16/d64/lpt/peel/prof", [2]),
    ("fwd", "*prof", [0, 1, 2]),
    ("bwd", "fwd*", []),
])
def test_select_variants(kernel, pattern, expected):
    got = analysis.select_variants(VARIANTS, kernel=kernel, pattern=pattern)
    assert got == [VARIANTS[i] for i in expected]


# ---- rendering -----------------------------------------------------------------------------------

def test_render_table():
    broken = analysis.failed("bwd/x", "_jfa_bwd", "ptxas rejected _jfa_bwd: boom")
    clean = _res("fwd/clean", registers=255, smem_bytes=1024, compile_seconds=1.0)
    console = _console()
    render.render_table(analysis.spill_table([PEEL, NOPEEL, clean, broken]), target="sm_90a", console=console)
    text = console.file.getvalue()
    assert "registers and spills, sm_90a: 2 of 4 variants spill, 1 failed to compile" in text
    lines = text.splitlines()
    peel = next(ln for ln in lines if ln.lstrip().startswith("fwd/bcast/peel"))
    # registers, spill bytes (stores + loads), smem KiB, LDL, STL, wgmma groups in flight, barriers,
    # KV-loop instructions, its exp2 overlapping a matmul, build s
    assert peel.split()[1:] == ["168", "372", "224.3", "46", "47", "2", "31", "612", "100%", "9.0"]
    nopeel = next(ln for ln in lines if ln.lstrip().startswith("fwd/bcast/nopeel"))
    assert nopeel.split()[1:3] == ["[1]", "168"]
    clean_line = next(ln for ln in lines if ln.lstrip().startswith("fwd/clean"))
    assert clean_line.split()[1:8] == ["255", "0", "1.0", "0", "0", "0", "0"]
    assert clean_line.split()[9] == "-"  # no exponentials in its loop, no overlap share
    broken_line = next(ln for ln in lines if ln.lstrip().startswith("bwd/x"))
    assert broken_line.split()[1:] == ["[2]"] + ["-"] * 10
    assert "1: every matmul waited for before the next" in text
    assert f"[1] ptxas: {WGMMA_NOTE}" in text
    assert "[2] failed: ptxas rejected _jfa_bwd: boom" in text
    assert "from the compile cache" in text


def test_render_table_lists_a_shared_warning_once():
    twin = _res("fwd/bcast/nopeel2", registers=168, warnings=(WGMMA_NOTE,))
    console = _console()
    render.render_table(analysis.spill_table([PEEL, NOPEEL, twin]), target="sm_90a", console=console)
    text = console.file.getvalue()
    assert text.count("ptxas:") == 1 and text.count("[1]") == 3 and "[2]" not in text


def test_render_comparison():
    console = _console()
    render.render_comparison(analysis.compare(NOPEEL, PEEL), console=console)
    text = console.file.getvalue()
    assert "A  fwd/bcast/nopeel" in text and "B  fwd/bcast/peel" in text
    assert "peel: false -> true" in text
    rows = {ln.split("  ")[0].strip(): ln.split() for ln in text.splitlines() if ln.startswith(" ")}
    assert rows["spill bytes"][-3:] == ["476", "372", "-104"]
    assert rows["regs"][-3:] == ["168", "168", "0"]
    assert rows["smem KiB"][-3:] == ["224.3", "224.3", "0"]
    assert rows["mma flight"][-3:] == ["0", "2", "+2"] and rows["BAR"][-3:] == ["0", "31", "+31"]
    assert "overlaps" not in text  # A has no matmuls at all: nothing to say
    assert "B frees 104 spill bytes per thread" in text
    assert f"only A: ptxas: {WGMMA_NOTE}" in text


def test_render_comparison_says_when_matmuls_stop_overlapping():
    serial = _res("bwd/stages2", wgmma_in_flight=1)
    overlapped = _res("bwd/stages1", wgmma_in_flight=3)
    for a, b, line in ((serial, overlapped, "B overlaps its matmuls (3 wgmma groups in flight); A waits for each one"),
                       (overlapped, serial, "B waits for each matmul before the next (3 wgmma groups in flight in A)")):
        console = _console()
        render.render_comparison(analysis.compare(a, b), console=console)
        assert line in console.file.getvalue()


def test_json_forms():
    table = render.table_to_dict(analysis.spill_table([PEEL, analysis.failed("x", "k", "boom")]), target="sm_90a")
    data = json.loads(render.to_json(table))
    assert data["target"] == "sm_90a"
    first, failed = data["variants"]
    assert first["spill_bytes"] == 372 and first["peel"] == "true" and first["compile_seconds"] == 9.04
    assert (first["stack_bytes"], first["wgmma_in_flight"], first["barriers"]) == (80, 2, 31)
    assert failed["registers"] is None and failed["error"] == "boom"
    cmp = json.loads(render.to_json(render.comparison_to_dict(analysis.compare(NOPEEL, PEEL), target="sm_90a")))
    by_metric = {m["metric"]: m for m in cmp["metrics"]}
    assert by_metric["spill_bytes"] == {"metric": "spill_bytes", "a": 476, "b": 372, "delta": -104}
    assert by_metric["wgmma_in_flight"]["delta"] == 2
    assert cmp["tag_differences"] == {"peel": ["false", "true"]}


# ---- the command, on real compiles of the test kernels ------------------------------------------

pytest.importorskip("triton.language.extra.tlx", reason="needs fbtriton (TLX)")

from jfa_prof.cli import app  # noqa: E402
from tests.tlx_kernels import REGISTER_HOG_SIGNATURE, register_hog_kernel, ws_gemm_variant  # noqa: E402


@dataclass(frozen=True)
class _VariantWithOptions(KernelVariant):
    # Backend options beyond warps and stages, which compile_variant passes through.
    options: dict = field(default_factory=dict)


def _hog_variant():
    return _VariantWithOptions(
        name="test/hog/maxnreg64", kernel=register_hog_kernel, signature=REGISTER_HOG_SIGNATURE,
        constexprs={"ROWS": 64, "COLS": 64}, num_warps=4, num_stages=1, tags={"pass": "test", "kind": "hog"},
        options={"maxnreg": 64})


def _broken_variant():
    sig = {**REGISTER_HOG_SIGNATURE, "x_ptr": "i32"}  # loads through an integer: the frontend refuses
    return KernelVariant(name="test/broken", kernel=register_hog_kernel, signature=sig,
                         constexprs={"ROWS": 16, "COLS": 16}, num_warps=4, tags={"pass": "test"})


@pytest.fixture
def cli_variants(monkeypatch, tmp_path_factory):
    from jfa_prof.kernels import registry

    # Same cache as tests/test_compile.py, so the kernels are built once per session.
    monkeypatch.setenv("JFA_PROF_CACHE", str(tmp_path_factory.getbasetemp() / "jfa-prof-cache"))
    variants = [ws_gemm_variant(), _hog_variant()]
    monkeypatch.setattr(registry, "all_variants", lambda: list(variants))
    return variants


def _invoke(*args, env=None):
    return runner.invoke(app, ["spills", "--jobs", "1", *args], env={"COLUMNS": "200", **(env or {})})


def test_cli_json(cli_variants):
    result = _invoke("--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["target"] == "sm_90a"
    ws, hog = data["variants"]
    assert (ws["variant"], hog["variant"]) == ("test/ws_gemm/bf16", "test/hog/maxnreg64")
    assert ws["kernel"] == "ws_gemm_kernel" and ws["kind"] == "ws_gemm" and hog["kind"] == "hog"
    assert 64 < ws["registers"] <= 255 and ws["spill_bytes"] == 0 and ws["ldl"] == ws["stl"] == 0
    assert hog["registers"] <= 64 and hog["spill_bytes"] > 0 and hog["ldl"] > 0 and hog["stl"] > 0
    assert hog["stack_bytes"] > 0 and ws["smem_bytes"] > 0
    # the GEMM's matmuls are wgmma groups; the hog has none
    assert ws["wgmma_in_flight"] >= 1 and hog["wgmma_in_flight"] == 0
    assert all(v["compile_seconds"] > 0 and v["error"] is None for v in data["variants"])
    again = json.loads(_invoke("--json").stdout)
    assert all(v["cached"] for v in again["variants"])


def test_cli_table_and_filters(cli_variants):
    result = _invoke("--variant", "test/hog*")
    assert result.exit_code == 0, result.output
    assert "test/hog/maxnreg64" in result.stdout and "test/ws_gemm" not in result.stdout
    assert "1 of 1 variants spill" in result.stdout
    result = _invoke("--kernel", "ws_gemm_kernel", "--json")
    assert [v["variant"] for v in json.loads(result.stdout)["variants"]] == ["test/ws_gemm/bf16"]


def test_cli_compare(cli_variants):
    result = _invoke("--compare", "test/ws_gemm/*", "test/hog/maxnreg64", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["a"], data["b"]) == ("test/ws_gemm/bf16", "test/hog/maxnreg64")
    spill = next(m for m in data["metrics"] if m["metric"] == "spill_bytes")
    assert spill["a"] == 0 and spill["delta"] == spill["b"] > 0
    table = _invoke("--compare", "test/ws_gemm/bf16", "test/hog/maxnreg64")
    assert table.exit_code == 0 and "B spills" in table.stdout and "kind: ws_gemm -> hog" in table.stdout


@pytest.mark.parametrize("args, message", [
    (["--variant", "nothing/*"], "no kernel variant matches"),
    (["--compare", "test/*", "test/hog/maxnreg64"], "must match exactly one variant, matched 2"),
    (["--target", "sm_90"], "use sm_90a"),
    (["--target", "sm_100a"], "lacks, so no variant can build for it"),
    (["--target", "sm_120a"], "use sm_90a"),
])
def test_cli_bad_input(cli_variants, args, message):
    result = _invoke(*args)
    assert result.exit_code == 2
    assert message in result.output


def test_cli_reports_a_variant_that_fails(cli_variants, monkeypatch):
    cli_variants.append(_broken_variant())
    result = _invoke("--variant", "test/broken", "--json")
    assert result.exit_code == 1
    (row,) = json.loads(result.stdout)["variants"]
    assert row["variant"] == "test/broken" and "register_hog_kernel failed to compile" in row["error"]
    # the reason, not the caret that ends the source excerpt of Triton's message
    assert "Unsupported ptr type" in row["error"] and "tl.load" in row["error"], row["error"]
    assert "1 of 1 variants failed to compile" in result.output


def test_cli_compare_takes_a_full_name_over_longer_names_it_starts(cli_variants):
    hog = next(v for v in cli_variants if v.name == "test/hog/maxnreg64")
    cli_variants.append(dataclasses.replace(hog, name="test/hog/maxnreg64/again"))
    result = _invoke("--compare", "test/ws_gemm/bf16", "test/hog/maxnreg64", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["b"] == "test/hog/maxnreg64"
    assert "matched 2" in _invoke("--compare", "test/ws_gemm/bf16", "test/hog").output


def test_cli_says_up_front_what_it_compiles_and_logs_a_line_per_variant(cli_variants):
    result = _invoke("--json")
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # stdout stays the JSON document
    lines = result.stderr.strip().splitlines()
    assert re.fullmatch(r"2 variant\(s\) for sm_90a: \d cached, \d to compile.*", lines[0]), lines
    # output is no terminal here: one line per variant, as a log would show it
    names = sorted(v.name for v in cli_variants)
    logged = sorted(re.fullmatch(r"\[[12]/2\] (\S+): (cached|compiled in \d+ s)", ln).group(1) for ln in lines[1:])
    assert logged == names


def test_cli_warns_when_every_variant_is_selected_cold(cli_variants, monkeypatch):
    from jfa_prof import compile as compile_mod

    monkeypatch.setattr(compile_mod, "cache_misses", lambda variants, target, **k: [True] * len(variants))
    result = _invoke("--json")
    assert result.exit_code == 0, result.output
    first, second = result.stderr.splitlines()[:2]
    assert first == "2 variant(s) for sm_90a: 0 cached, 2 to compile, roughly 52 s with 1 process(es)"
    assert second.startswith("no --kernel or --variant: every one of the 2 variants is selected")
    # a filter is a choice: no warning
    result = _invoke("--variant", "test/*", "--json")
    assert "every one of" not in result.stderr


def test_cache_misses_follow_the_cache(tmp_path):
    from jfa_prof.compile import cache_misses, compile_many

    variants = [ws_gemm_variant()]
    assert cache_misses(variants, cache_dir=tmp_path) == [True]
    compile_many(variants, cache_dir=tmp_path)
    assert cache_misses(variants, cache_dir=tmp_path) == [False]


def test_render_table_at_100_columns_breaks_names_between_components_and_titles_the_shared_prefix():
    names = [f"fwd/bcast/bf16/d64/{s}/{p}/{lv}/n64" for s in ("static", "dynamic") for p in ("peel", "nopeel")
             for lv in ("noprof", "prof-tiles")]
    table = analysis.spill_table([_res(n, registers=168) for n in names])
    console = Console(file=StringIO(), width=100, highlight=False, color_system=None)
    render.render_table(table, target="sm_90a", console=console)
    text = console.file.getvalue()
    assert "variants fwd/bcast/bf16/d64/…" in text and "variant (fwd/bcast/bf16/d64/…)" in text
    rows = [ln.split()[0] for ln in text.splitlines() if ln.lstrip().startswith(("static/", "dynamic/"))]
    assert rows == [n.removeprefix("fwd/bcast/bf16/d64/") for n in names]  # whole, on one line each
    assert all(len(ln) <= 100 for ln in text.splitlines())

    # At 80 columns, narrower than a name: it breaks after a "/", never inside a component.
    console = Console(file=StringIO(), width=80, highlight=False, color_system=None)
    render.render_table(analysis.spill_table([_res(n, registers=168) for n in names + ["bwd/x"]]),
                        target="sm_90a", console=console)
    lines = console.file.getvalue().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("fwd/"))
    cell = lines[first].split()[0]
    assert cell.endswith("/") and names[0].startswith(cell)
    assert names[0].startswith(cell + lines[first + 1].split()[0])
    legend = [ln for ln in lines if "mma flight:" in ln or "every matmul" in ln]
    assert legend and all(len(ln) <= 80 for ln in lines)


def test_wrap_path_and_shared_prefix():
    assert render.wrap_path("a/bb/ccc/dddd", 7) == "a/bb/\nccc/\ndddd"
    assert render.wrap_path("averyverylongpart/x", 4) == "averyverylongpart/\nx"
    assert render.shared_prefix(["fwd/a/x", "fwd/a/y/z"]) == "fwd/a/"
    assert render.shared_prefix(["fwd/a", "bwd/a"]) == "" and render.shared_prefix(["fwd/a/b"]) == ""
