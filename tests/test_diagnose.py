"""The diagnosis: planted bottlenecks rank first, shares share one basis and add up, experiments
name real ablations; the level-1/2 fallback; ``jfa-prof diagnose`` on trace files; the report's section."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import tracegen
from jfa_prof import records
from jfa_prof.analyses.critical_path import critical_path
from jfa_prof.analyses.diagnose import Diagnosis, diagnose, rank_causes
from jfa_prof.analyses.spills import VariantResources
from jfa_prof.analyses.waterfall import AblationTiming, WaterfallTimings, waterfall
from jfa_prof.cli import app
from jfa_prof.trace import read_trace, trace_from_buffer, write_trace
from test_critical_path import BWD_SITES, bwd_frame, bwd_rows, events_frame, fwd_rows

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = {"grid": "hsp", "Lq": 256, "max_kv": 2048, "sparsity": 0.5}
runner = CliRunner()


def fwd(rows, **kw) -> Diagnosis:
    return rank_causes(critical_path(events_frame(rows)), workload=WORKLOAD, schedule="dynamic", **kw)


def bwd(rows, **kw) -> Diagnosis:
    return rank_causes(critical_path(bwd_frame(rows), pass_="bwd"), workload=WORKLOAD, schedule="static", **kw)


def time_shares(diag: Diagnosis) -> float:
    """The shares' sum, which is 1 when the losses fit in the whole: ``compute`` is the remainder,
    so a loss counted twice or on another basis shows as a negative compute."""
    shares = {c.name: c.share for c in diag.causes if c.share is not None}
    assert all(v >= 0 for v in shares.values()), shares
    return sum(shares.values())


# ---- planted bottlenecks ----------------------------------------------------------------------

PLANTED = {
    "slow producer": (lambda: fwd(fwd_rows((3, 3), k_full=1500, v_full=300, mma_turn=200, k_empty=0)), "kv_late"),
    "one-deep K/V ring": (lambda: fwd(fwd_rows((3, 3), k_full=700, v_full=700, mma_turn=100, k_empty=2500,
                                               v_empty=1000), config={"NUM_STAGES": 1}), "kv_late"),
    "slow epilogue": (lambda: fwd(fwd_rows((3, 3), epilogue=3000, k_full=200, mma_turn=300)), "epilogue"),
    "late hand-off": (lambda: fwd(fwd_rows((3, 3), queue=1200, k_full=100)), "handoff"),
    "imbalanced schedule": (lambda: fwd(fwd_rows((6, 1), k_full=100)), "tail"),
    # The producer is late with its loads: the compute role waits for steps and for the next K/V.
    "backward slow producer": (lambda: bwd(bwd_rows((3, 3), step_full=1300, kv_full=700, dq_stage=200,
                                                    epilogue=1500)), "step_late"),
    # The staging buffers are not freed in time.
    "backward contended dQ": (lambda: bwd(bwd_rows((3, 3), dq_stage=1500, step_full=300, ds_pair=100)), "dq_reduce"),
    # The producer's loop is busy with its reduce-adds, so its loads come late: the waits show on
    # step_full and kv_full (as on the H200), and the producer's own record says why.
    "backward slow reduce-adds": (lambda: bwd(bwd_rows((3, 3), step_full=1300, kv_full=900, dq_stage=150,
                                                       epilogue=1500, dq_reduce=3500)), "dq_reduce"),
}


@pytest.mark.parametrize("case", PLANTED)
def test_the_planted_cause_ranks_first(case):
    make, expected = PLANTED[case]
    diag = make()
    assert diag.top.name == expected, [(c.name, c.share) for c in diag.causes]
    assert time_shares(diag) == pytest.approx(1.0)
    shares = [c.share for c in diag.causes if c.name != "compute" and c.share is not None]
    assert shares == sorted(shares, reverse=True)
    assert diag.causes[-1].name == "compute"  # the remainder comes after every loss


def test_slow_producer_against_a_shallow_ring():
    slow = PLANTED["slow producer"][0]().cause("kv_late")
    ring = PLANTED["one-deep K/V ring"][0]().cause("kv_late")
    assert "the producer is busy" in slow.what and "NUM_STAGES" not in slow.expect
    assert "ring is too shallow" in ring.what and "NUM_STAGES 1 now" in ring.expect
    assert any(e.signal.startswith("tiles with the producer on their critical path") and e.figure == "6 of 6"
               for e in slow.evidence)
    # A producer blocked on a full ring while the consumers do not wait is the healthy case: nothing to say.
    healthy = fwd(fwd_rows((3, 3), k_full=50, k_empty=2500, v_empty=1000)).cause("kv_late")
    assert "ring" not in healthy.what and "busy" not in healthy.what


def test_backward_waits_are_blamed_on_what_kept_the_producer():
    slow = PLANTED["backward slow producer"][0]()
    reduce = PLANTED["backward slow reduce-adds"][0]()
    cp = slow.critical
    assert cp.critical_counts() == {"producer": 6}
    # producer-critical tiles: kv_full and step_full both on the producer's loads (no reduce-adds)
    assert slow.cause("step_late").share == pytest.approx(6 * (1300 + 700) / cp.basis_ns)
    assert "kv_late" not in [c.name for c in slow.causes]
    # the producer's loop: 4000 - 1000 + 100 + 2200 ns, of which 3500 in reduce-adds
    loop = 4 * 1000 + 2350 - 1000 + 100
    f = 3500 / loop
    assert reduce.cause("dq_reduce").share == pytest.approx(6 * (150 + f * 2200) / reduce.critical.basis_ns)
    assert reduce.cause("step_late").share == pytest.approx(6 * (1 - f) * 2200 / reduce.critical.basis_ns)
    ev = reduce.cause("dq_reduce").evidence
    assert any(f"{100 * f:.1f}% of that loop's work" in e.figure for e in ev)
    # tiles the compute role holds up itself: kv_full is the K/V reload after the epilogue
    reload = bwd(bwd_rows((3, 3), kv_full=300, epilogue=1500))
    assert reload.critical.critical_counts() == {"compute": 6}
    assert reload.cause("kv_late").share == pytest.approx(6 * 300 / reload.critical.basis_ns)


def test_share_is_the_measured_one():
    # Per CTA and tile the consumers wait 1500 + 300 ns for K/V: that over the kernel is kv_late's share.
    diag = PLANTED["slow producer"][0]()
    cp = diag.critical
    assert diag.cause("kv_late").share == pytest.approx(2 * 3 * 1800 / (cp.kernel_ns * 2))
    assert "−" + f"{100 * diag.cause('kv_late').share:.1f}%" in diag.cause("kv_late").expect
    assert diag.cause("mma_turn").share == pytest.approx(2 * 3 * 200 / (cp.kernel_ns * 2))


def test_experiments_name_real_ablations():
    def ablations(module: str) -> set[str]:
        tree = ast.parse((ROOT / "kernels" / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ABLATIONS" for t in node.targets):
                return {k.value for k in node.value.keys}
        raise AssertionError(f"no ABLATIONS in kernels/{module}.py")

    named = {"fwd": set(), "bwd": set()}
    for case, (make, _) in PLANTED.items():
        diag = make()
        for c in diag.causes:
            for m in re.finditer(r"--ablate (\S+)", c.experiment):
                named[diag.pass_].update(m.group(1).split(","))
    assert named["fwd"] and named["fwd"] <= ablations("fwd"), named
    assert named["bwd"] and named["bwd"] <= ablations("bwd"), named
    assert "--schedule dynamic" in PLANTED["slow epilogue"][0]().cause("epilogue").experiment


def test_findings_from_a_compile_report_and_ncu():
    spills = VariantResources(variant="fwd/bcast/bf16/d128/dynamic/peel/prof-roles", kernel="_jfa_fwd",
                              spill_store_bytes=40, spill_load_bytes=40)
    diag = fwd(fwd_rows((3, 3), k_full=900), spills=spills, ncu={"dram_throughput": 88.0, "tensor_pipe": 61.5},
               ncu_source="fwd.ncu-rep")
    names = [c.name for c in diag.causes]
    assert names[0] == "kv_late" and names[-2:] == ["spills", "memory_bound"]
    assert names.index("compute") == len(names) - 3
    assert diag.cause("spills").share is None and "40 + 40 B" in diag.cause("spills").evidence[0].figure
    assert "jfa-prof spills --variant fwd/bcast/bf16/d128/dynamic/peel/prof-roles" == diag.cause("spills").experiment
    compute = diag.cause("compute")
    assert any(e.figure == "61.5%" and e.source == "fwd.ncu-rep" for e in compute.evidence)
    assert any("at the bandwidth limit" in e.figure for e in diag.cause("kv_late").evidence)
    assert time_shares(diag) == pytest.approx(1.0)
    clean = fwd(fwd_rows((3, 3), k_full=900), spills=VariantResources(variant="v", kernel="k"),
                ncu={"dram_throughput": 30.0})
    assert "spills" not in [c.name for c in clean.causes] and "memory_bound" not in [c.name for c in clean.causes]


def test_waterfall_evidence():
    timings = WaterfallTimings(baseline_ms=2.0, baseline_repeat_ms=2.002, ablations=(
        AblationTiming("reuse_kv", alone_ms=1.7), AblationTiming("no_o_store", alone_ms=1.999)))
    diag = fwd(fwd_rows((3, 3), k_full=900), waterfall=waterfall(timings), waterfall_source="wf.json")
    ev = [e for e in diag.cause("kv_late").evidence if e.source == "wf.json"]
    assert len(ev) == 1 and ev[0].signal == "waterfall: reuse_kv alone" and "15.0%" in ev[0].figure
    assert any("within the noise" in e.figure for e in diag.cause("epilogue").evidence if e.source == "wf.json")


def test_json_document():
    diag = PLANTED["backward contended dQ"][0]()
    doc = json.loads(json.dumps(diag.to_dict()))
    assert doc["pass"] == "bwd" and doc["causes"][0]["name"] == "dq_reduce"
    assert doc["basis"] == "the compute role's time (kernel × CTAs)"
    assert doc["critical_path"]["critical_counts"] == {"producer": 6}
    assert "dq_no_reduce" in doc["causes"][0]["experiment"]


# ---- below level 3 -----------------------------------------------------------------------------

def _level2_trace(path: Path | None = None):
    buf, meta, _ = tracegen.persistent_run([6, 6, 4, 4, 2, 2, 1, 1], n_ctas=2, n_sms=4, schedule="dynamic")
    meta = {**meta, "profile_level": 2}
    if path is None:
        return trace_from_buffer(buf, meta)
    return write_trace(path, buf, meta)


def test_level2_trace_gives_the_wait_totals_and_the_tail():
    diag = diagnose(_level2_trace())
    names = [c.name for c in diag.causes]
    assert {"kv_late", "mma_turn", "handoff"} <= set(names) and "epilogue" not in names
    assert time_shares(diag) == pytest.approx(1.0)
    assert "level-2" in diag.notes[0] and "per-tile events" in diag.notes[0]
    assert "wait totals of a level-2 trace" in diag.cause("kv_late").evidence[0].signal
    assert "and the epilogue" in diag.cause("compute").what
    assert diag.critical.critical_counts() == {}


def test_level1_trace_gives_only_idle_time():
    diag = diagnose(read_trace(ROOT / "tests" / "data" / "traces" / "small_hsp_lq128_kv1024_s0.5_lpt_tiles.jfatrace"))
    assert {c.name for c in diag.causes} <= {"tail", "gaps", "compute"}
    assert diag.top.name == "tail"
    assert "--lq 128 --max-kv 1024 --sparsity 0.5 --clc both" in diag.top.experiment


# ---- the command ---------------------------------------------------------------------------------

def test_cli_on_a_level2_trace(tmp_path):
    path = _level2_trace(tmp_path / "l2.jfatrace")
    result = runner.invoke(app, ["diagnose", "--trace", str(path)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"source: {path}" in out and "tensor cores idle" in out and "(estimate)" in out
    for header in ("cause", "share", "evidence", "experiment"):
        assert header in out
    assert "kv_late" in out and "level-2 trace" in result.stderr

    result = runner.invoke(app, ["diagnose", "--trace", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["level"] == 2 and doc["origin"] == "file" and doc["pass"] == "fwd"
    assert abs(sum(c["share"] for c in doc["causes"] if c["share"] is not None) - 1) < 1e-9


def test_cli_refuses_what_does_not_apply(tmp_path):
    path = _level2_trace(tmp_path / "l2.jfatrace")
    for args in (["--schedule", "lpt"], ["--waterfall"], ["--grid", "hsp"], ["--pass", "bwd"], ["--pass", "up"]):
        result = runner.invoke(app, ["diagnose", "--trace", str(path), *args])
        assert result.exit_code == 2, (args, result.output)
    result = runner.invoke(app, ["diagnose", "--trace", str(path), "--ncu-rep", str(tmp_path / "none.ncu-rep")])
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_cli_without_a_gpu_or_a_bundled_recording(monkeypatch):
    import jfa_prof.report

    monkeypatch.setattr(jfa_prof.report, "can_record_live", lambda: False)
    monkeypatch.setattr(jfa_prof.report, "level3_recordings", lambda *a, **k: [])
    result = runner.invoke(app, ["diagnose", "--pass", "bwd"])
    assert result.exit_code == 2, result.output
    assert "no GPU here and no bundled level-3 bwd recording" in result.stderr
    assert "--trace" in result.stderr


# ---- level-3 trace files -----------------------------------------------------------------------

needs_events = pytest.mark.skipif(not hasattr(records, "ROLE_SITES"), reason="no level-3 record layout yet")


def write_level3(path: Path, rows, *, pass_: str = "fwd", n_sms: int = 8) -> Path:
    """A level-3 trace file of hand-written event records (the keys of ``events_frame``), with the
    tile records (consumer 0's / the compute role's view), spans and wait totals they imply."""
    from jfa_prof.records import Layout

    roles, sites = (records.FWD_ROLES, records.FWD_SITES) if pass_ == "fwd" else (records.BWD_ROLES, BWD_SITES)
    writer = "consumer0" if pass_ == "fwd" else "compute"
    ev = events_frame(rows, roles=roles, sites=sites)
    ev[["c_start", "c_end"]] += 10**9  # clock64 of the SM at the kernel's start
    tiles = ev[ev["role"] == writer].assign(slot=lambda t: t["pos"], role=roles.index(writer))
    n_ctas, capacity = int(ev["cta"].max()) + 1, int(ev["pos"].max()) + 1
    layout = Layout(tile_capacity=capacity, n_ctas=n_ctas, n_roles=len(roles), n_sites=len(sites),
                    event_capacity=Layout.event_capacity_for(capacity, len(roles), 1))
    spans = ev.groupby(["cta", "role_id"]).agg(smid=("smid", "first"), t_start=("t_start", "min"),
                                              t_end=("t_end", "max"), c_start=("c_start", "min"),
                                              c_end=("c_end", "max"), n_tiles=("pos", "size"))
    spans = spans.reset_index().rename(columns={"role_id": "role"})
    cycles = ev[[f"wait_{s}" for s in sites]].to_numpy(np.int64)
    waits = np.zeros((n_ctas, len(roles), len(sites), 2), dtype=np.int64)
    np.add.at(waits[..., 0], (ev["cta"].to_numpy(), ev["role_id"].to_numpy()), cycles)
    np.add.at(waits[..., 1], (ev["cta"].to_numpy(), ev["role_id"].to_numpy()), (cycles > 0).astype(np.int64))
    buf = tracegen.encode(layout, tiles, spans, waits)
    # The kernel stores the cumulative waits at each window's start and end: start from zero.
    buf = tracegen.encode_events(layout, buf, ev, np.zeros_like(cycles), cycles)
    meta = tracegen.make_meta(layout, n_sms=n_sms, schedule="dynamic" if pass_ == "fwd" else "static", roles=roles,
                              sites=sites, profile_level=3,
                              kernel={"name": f"_jfa_{pass_}", "pass": pass_, "variant": f"{pass_}/bcast/test",
                                      "config": {"NUM_STAGES": 2}})
    return write_trace(path, buf, meta)


@needs_events
def test_cli_on_a_level3_trace(tmp_path):
    path = write_level3(tmp_path / "slow_producer_level3.jfatrace",
                        fwd_rows((3, 3, 2), k_full=1500, v_full=300, mma_turn=200, k_empty=0))
    tr = read_trace(path)
    assert tr.level == 3 and len(tr.events) == 8 * 3
    result = runner.invoke(app, ["diagnose", "--trace", str(path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["level"] == 3 and doc["causes"][0]["name"] == "kv_late"
    assert doc["critical_path"]["critical_counts"] == {"producer": 8}
    assert "consumers waiting on k_full" in doc["summary"]
    # The document says where its recording was made, as a result file must.
    assert doc["recorded"]["gpu"] == tr.meta["gpu"] and doc["recorded"]["date"] == tr.meta["date"]
    result = runner.invoke(app, ["diagnose", "--trace", str(path)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "critical path per tile: producer 8 of 8 tiles" in result.stdout


@needs_events
def test_cli_on_a_bundled_backward_recording(tmp_path, monkeypatch):
    import jfa_prof.report

    path = write_level3(tmp_path / "h200_bwd_level3.jfatrace", bwd_rows((3, 3), dq_stage=1500), pass_="bwd")
    monkeypatch.setattr(jfa_prof.report, "can_record_live", lambda: False)
    monkeypatch.setattr(jfa_prof.report, "level3_recordings", lambda *a, **k: [path])
    result = runner.invoke(app, ["diagnose", "--pass", "bwd"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "bundled H200 recording (not live)" in result.stdout
    assert "dq_reduce" in result.stdout


@needs_events
def test_report_has_a_diagnosis_section(tmp_path):
    from jfa_prof.render.report import report_html
    from jfa_prof.report import gather

    path = write_level3(tmp_path / "epilogue_level3.jfatrace", fwd_rows((3, 3), epilogue=3000))
    rep = gather(traces=[path], environment=False, predict=False)
    assert rep.sections()[0] == "diagnosis"
    (label, diag), = rep.diagnoses
    assert diag.top.name == "epilogue"
    page = report_html(rep)
    assert '<section id="diagnosis"><h2>Diagnosis</h2>' in page and "no_o_store" in page


def test_report_without_level3_traces_has_no_diagnosis(tmp_path):
    from jfa_prof.report import gather

    rep = gather(traces=[_level2_trace(tmp_path / "l2.jfatrace")], environment=False, predict=False)
    assert rep.diagnoses == [] and "diagnosis" not in rep.sections()


# ---- recorded builds with a planted bottleneck -------------------------------------------------

# What each recorded build (``meta["build"]``, benchmarks/roles_record.py) must be diagnosed with first.
PLANTED_BUILDS = {("fwd", "plant-slow_producer"): "kv_late", ("fwd", "plant-kv_ring_1"): "kv_late",
                  ("fwd", "plant-slow_epilogue"): "epilogue", ("bwd", "plant-slow_producer"): "step_late",
                  ("bwd", "plant-slow_dq"): "dq_reduce"}


def _planted_recordings() -> list[Path]:
    from jfa_prof.report import level3_recordings
    from jfa_prof.trace import read_meta

    def key(p):
        meta = read_meta(p)
        return (str((meta.get("kernel") or {}).get("pass", "fwd")), meta.get("build"))

    return [p for p in level3_recordings() if key(p) in PLANTED_BUILDS]


@pytest.mark.parametrize("path", _planted_recordings(), ids=lambda p: p.name)
def test_recorded_planted_builds_are_diagnosed(path):
    tr = read_trace(path)
    diag = diagnose(tr)
    assert diag.top.name == PLANTED_BUILDS[(tr.pass_, tr.meta["build"])], [(c.name, c.share) for c in diag.causes]
    assert time_shares(diag) == pytest.approx(1.0)


def _recorded_builds() -> dict[tuple[str, str], Path]:
    from jfa_prof.report import level3_recordings
    from jfa_prof.trace import read_meta

    out = {}
    for p in level3_recordings():
        meta = read_meta(p)
        out.setdefault((str((meta.get("kernel") or {}).get("pass", "fwd")), str(meta.get("build"))), p)
    return out


def test_every_planted_and_ablated_build_is_recorded():
    builds = set(_recorded_builds())
    assert set(PLANTED_BUILDS) <= builds
    assert {("fwd", "op"), ("bwd", "op"), ("fwd", "ablate-reuse_kv"), ("fwd", "ablate-no_o_store"),
            ("bwd", "ablate-no_dq")} <= builds


def _share(diag, cause: str) -> float:
    """A cause's share; one under the diagnosis's floor is not listed: zero."""
    try:
        return diag.cause(cause).share
    except KeyError:
        return 0.0


def _shares_against_op(key: tuple[str, str], cause: str) -> tuple[float, float]:
    """The cause's share in the op's build and in the recorded build ``key`` of the same pass."""
    builds = _recorded_builds()
    return (_share(diagnose(read_trace(builds[(key[0], "op")])), cause),
            _share(diagnose(read_trace(builds[key])), cause))


# Each ablation removes the work behind one cause: its share must fall against the op's build.
ABLATED_BUILDS = {("fwd", "ablate-no_o_store"): "epilogue", ("fwd", "ablate-reuse_kv"): "kv_late",
                  ("bwd", "ablate-no_dq"): "dq_reduce"}


@pytest.mark.parametrize("key", sorted(ABLATED_BUILDS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_an_ablation_lowers_the_share_of_its_cause(key):
    op, ablated = _shares_against_op(key, ABLATED_BUILDS[key])
    assert ablated < op, (key, ablated, op)
    if key == ("bwd", "ablate-no_dq"):
        assert ablated < 0.005  # no dQ at all: nothing waits for a reduction


@pytest.mark.parametrize("key", sorted(PLANTED_BUILDS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_a_plant_raises_the_share_of_its_cause(key):
    op, planted = _shares_against_op(key, PLANTED_BUILDS[key])
    assert planted > 1.5 * op, (key, planted, op)


def test_a_causal_recording_is_diagnosed_with_experiments_on_the_causal_workload():
    """A live recording of causal jagged self-attention (H200): every experiment's command names --causal,
    or it would time the workload without the mask."""
    import json as _json
    from pathlib import Path

    from typer.testing import CliRunner

    from jfa_prof.cli import app

    trace = Path(__file__).parent / "data/traces/roles/h200_fwd_jagged_kv512_s1_causal_level3.jfatrace"
    result = CliRunner().invoke(app, ["diagnose", "--trace", str(trace), "--no-spills", "--json"])
    assert result.exit_code == 0, result.output
    doc = _json.loads(result.stdout)
    assert doc["workload"] == "jagged max=512 s=1 causal"
    commands = [c["experiment"] for c in doc["causes"] if "--grid" in c["experiment"]]
    assert commands and all("--causal" in c for c in commands), commands


# ---- recorded: a producer that found each tile between two tiles --------------------------------

DECODE_TRACES = {build: ROOT / f"tests/data/traces/h100_fwd_hsp_lq128_kv1024_s0.1_dynamic_decode_{build}.jfatrace"
                 for build in ("between", "two_ahead")}


def _between_share(cause) -> float:
    """The producer's time between its tiles, as the cause's evidence gives it (a fraction)."""
    figures = [e.figure for e in cause.evidence if "between its tiles" in e.signal]
    assert len(figures) == 1, cause.evidence
    return float(figures[0].split("%")[0]) / 100


def test_a_producer_held_between_its_tiles_is_named():
    # The H100 recordings of the forward before and after it decoded each next tile a tile ahead
    # (benchmarks/results/variants/fwd_ab_decode_ahead_*): the diagnosis must tell them apart.
    before = diagnose(read_trace(DECODE_TRACES["between"]))
    ahead = diagnose(read_trace(DECODE_TRACES["two_ahead"]))
    kv = before.cause("kv_late")
    assert "between tiles" in kv.what and "finds each next tile" in kv.expect
    assert _between_share(kv) > 0.4
    assert _between_share(before.cause("q_late")) == _between_share(kv)
    kv_ahead = ahead.cause("kv_late")
    assert "between tiles" not in kv_ahead.what and "finds each next tile" not in kv_ahead.expect
    assert _between_share(kv_ahead) < 0.1
    # The producer was on the critical path of more tiles before.
    assert before.critical.critical_counts()["producer"] > 2 * ahead.critical.critical_counts()["producer"]
