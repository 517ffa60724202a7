import dataclasses
import importlib.metadata
import importlib.util
import io
import json
import os
import re
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

import jfa_prof.doctor as doctor
from jfa_prof.cli import app
from jfa_prof.doctor import Environment, GpuInfo, Mode, Status, ToolInfo, probe_environment
from jfa_prof.errors import ToolMissingError
from jfa_prof.render import doctor as report

runner = CliRunner()


@pytest.fixture(scope="module")
def env() -> Environment:
    return probe_environment()


@pytest.fixture
def cpu_only(env):
    if env.torch.cuda_available:
        pytest.skip("checks the verdict on a machine without CUDA")


def _check(env, name):
    return next(c for c in env.checks if c.name == name)


def test_tlx_fork_is_detected(env):
    tri = env.triton
    assert tri.importable and tri.tlx_importable
    assert tri.is_tlx_fork
    assert tri.fbtriton_version == doctor.FBTRITON_PIN
    assert not tri.conflict
    # An upstream triton may sit further down sys.path as long as the fork shadows it whole.
    assert tri.upstream_version is None or tri.shadows_upstream
    assert "fbtriton" in tri.owners
    assert Path(tri.file).name == "__init__.py"
    assert _check(env, "TLX").status is Status.OK


def test_no_gpu_gives_compile_only_with_a_reason(env, cpu_only):
    assert env.gpu is None
    verdict = env.verdict
    assert verdict.mode is Mode.COMPILE_ONLY
    assert verdict.reasons and ("CPU build" in verdict.reasons[0] or "CUDA" in verdict.reasons[0])
    assert verdict.summary.startswith("compile-only: ")
    assert "spills" in verdict.note
    assert env.healthy
    assert _check(env, "GPU").status is Status.WARN


@pytest.mark.gpu
def test_hopper_gpu_gives_live(env, cuda_device):
    assert env.gpu is not None and env.gpu.capability == (9, 0)
    assert env.gpu.sm_count > 0
    assert env.verdict.mode is Mode.LIVE
    assert env.verdict.summary == "live profiling available"


def test_bundled_ptxas_is_found_and_is_cuda_12(env):
    ptxas = env.tools["ptxas"]
    assert ptxas.found, ptxas.error
    assert re.fullmatch(r"12\.\d+\.\d+", ptxas.version)
    assert ptxas.source in ("bundled", "TRITON_PTXAS_PATH")
    if ptxas.source == "bundled":
        assert Path(ptxas.path).parts[-5:] == ("triton", "backends", "nvidia", "bin", "ptxas")
    for name in ("cuobjdump", "nvdisasm"):
        assert env.tools[name].found, env.tools[name].error
        assert Path(env.tools[name].path).parent == Path(ptxas.path).parent or ptxas.source != "bundled"


def test_missing_optional_tools_are_warnings_not_failures(env):
    for name in ("ncu", "compute-sanitizer"):
        check = _check(env, name)
        assert check.status is (Status.OK if env.tools[name].found else Status.WARN)


def test_a_missing_plotly_is_a_warning_naming_the_charts(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    check = _check(probe_environment(), "plotly")
    assert check.status is Status.WARN and "charts" in check.detail and check.fix == "pip install plotly"


def test_json_output_parses_and_has_the_keys(env):
    result = runner.invoke(app, ["doctor", "--json"])
    assert result.exit_code == (0 if env.healthy else 1)
    data = json.loads(result.stdout)
    assert {"jfa_prof_version", "python_version", "python_executable", "torch", "triton", "gpu",
            "tools", "checks", "verdict"} <= data.keys()
    assert {"version", "cuda_build", "cuda_available"} <= data["torch"].keys()
    assert {"version", "file", "fbtriton_version", "upstream_version", "tlx_importable",
            "is_tlx_fork", "conflict"} <= data["triton"].keys()
    assert {"ptxas", "cuobjdump", "nvdisasm", "ncu", "compute-sanitizer", "ncu_report", "plotly"} <= data["tools"].keys()
    assert {"mode", "summary", "reasons", "note", "healthy"} <= data["verdict"].keys()
    assert data["verdict"]["mode"] in {m.value for m in Mode}
    assert all(c["status"] in {"ok", "warn", "fail"} for c in data["checks"])


def test_table_rendering(env):
    out = io.StringIO()
    report.render(env, file=out, width=200)
    text = out.getvalue()
    for name in ("python", "torch", "triton", "TLX", "ptxas", "ncu", "compute-sanitizer"):
        assert re.search(rf"│ {re.escape(name)}\s+│", text), name
    assert env.verdict.summary in text


def test_doctor_command_exit_code_when_healthy(env):
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == (0 if env.healthy else 1)
    assert env.verdict.mode.value in result.stdout


def test_errors_from_the_probe_exit_with_their_code(monkeypatch):
    def fail():
        raise ToolMissingError("ptxas not found")

    monkeypatch.setattr(doctor, "probe_environment", fail)
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 4
    assert "error: ptxas not found" in result.stderr


# ---- a broken triton install, simulated -----------------------------------------------------

@pytest.fixture
def upstream_triton_installed(monkeypatch):
    real = importlib.metadata.distribution

    class _UpstreamTriton:
        version = "3.8.0"

    def distribution(name):
        return _UpstreamTriton() if name == "triton" else real(name)

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)


def test_upstream_triton_beside_fbtriton_is_a_loud_failure(upstream_triton_installed):
    env = probe_environment()
    assert env.triton.conflict
    assert env.triton.upstream_version == "3.8.0"
    fork = _check(env, "triton fork")
    assert fork.status is Status.FAIL
    assert "CONFLICT" in fork.detail and "3.8.0" in fork.detail
    assert fork.fix == "pip uninstall -y triton && pip install --force-reinstall --no-deps fbtriton==3.7.4"
    assert env.verdict.mode is Mode.BROKEN
    assert not env.healthy


def test_doctor_exits_1_on_the_conflict(upstream_triton_installed):
    result = runner.invoke(app, ["doctor", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["triton"]["conflict"] is True
    assert data["verdict"]["mode"] == "broken"
    assert "pip uninstall -y triton" in data["verdict"]["note"]


def test_doctor_exits_1_when_tlx_is_not_importable(env, monkeypatch):
    broken = dataclasses.replace(env, triton=dataclasses.replace(
        env.triton, tlx_importable=False, tlx_file=None,
        tlx_error="ModuleNotFoundError: No module named 'triton.language.extra.tlx'"))
    monkeypatch.setattr(doctor, "probe_environment", lambda: broken)
    result = runner.invoke(app, ["doctor"])
    assert result.exit_code == 1
    assert _check(broken, "TLX").status is Status.FAIL
    assert "triton.language.extra.tlx is not importable" in broken.verdict.summary


def test_upstream_triton_shadowed_by_the_fork_is_only_a_warning(env, tmp_path, monkeypatch):
    # The fork unpacked into a folder that comes first on sys.path, upstream triton left in
    # site-packages: every import gets the fork whole, so nothing is mixed.
    real = importlib.metadata.distribution

    class _UpstreamElsewhere:
        version = "3.6.0"

        def locate_file(self, path):
            return tmp_path / "site-packages" / path

    monkeypatch.setattr(importlib.metadata, "distribution",
                        lambda name: _UpstreamElsewhere() if name == "triton" else real(name))
    tri = doctor.probe_triton()
    assert tri.shadows_upstream and not tri.conflict
    shadowed = dataclasses.replace(env, triton=tri)
    fork = _check(shadowed, "triton fork")
    assert fork.status is Status.WARN and "shadows upstream triton 3.6.0" in fork.detail
    assert shadowed.healthy


def test_upstream_triton_alone_is_not_the_fork(env):
    upstream = dataclasses.replace(env.triton, fbtriton_version=None, upstream_version="3.8.0",
                                   owners=["triton"], tlx_importable=False, tlx_file=None)
    broken = dataclasses.replace(env, triton=upstream)
    assert not upstream.is_tlx_fork and not upstream.conflict
    assert _check(broken, "triton fork").status is Status.FAIL
    assert broken.verdict.mode is Mode.BROKEN


# ---- robustness and tool discovery -----------------------------------------------------------

def test_a_crashing_probe_does_not_crash_doctor(monkeypatch):
    def explode():
        raise RuntimeError("driver exploded\nsecond line")

    monkeypatch.setattr(doctor, "probe_torch", explode)
    env = probe_environment()
    assert env.torch.version is None
    assert env.torch.error == "probe failed: RuntimeError: driver exploded"
    assert env.verdict.mode in (Mode.COMPILE_ONLY, Mode.BROKEN)
    report.render(env, file=io.StringIO())


def _fake_tool(directory: Path, name: str, output: str, code: int = 0) -> Path:
    path = directory / name
    # Shell builtins only: some tests run it with PATH pointing at nothing else.
    echoes = "".join(f"echo '{line}'\n" for line in output.splitlines())
    path.write_text(f"#!/bin/sh\n{echoes}exit {code}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_ncu_and_sanitizer_found_on_path_with_their_versions(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "ncu", "NVIDIA (R) Nsight Compute Command Line Profiler\n"
                                "Copyright (c) 2018-2025 NVIDIA Corporation\n"
                                "Version 2025.3.1.0 (build 36398880) (public-release)")
    _fake_tool(tmp_path, "compute-sanitizer", "NVIDIA (R) Compute Sanitizer\n"
                                              "Version 2025.3.0.0 (build 36369212)")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    tools = doctor.probe_tools()
    assert tools["ncu"] == ToolInfo("ncu", str(tmp_path / "ncu"), "2025.3.1.0", "PATH")
    assert tools["compute-sanitizer"].version == "2025.3.0.0"


def test_ncu_found_in_the_newest_nsight_compute_install(tmp_path, monkeypatch):
    for version in ("2024.1.0", "2025.3.1"):
        (tmp_path / version).mkdir()
        _fake_tool(tmp_path / version, "ncu", f"Version {version}.0 (build 1)")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(doctor, "NCU_CANDIDATES", (str(tmp_path / "*" / "ncu"),))
    ncu = doctor.probe_tools()["ncu"]
    assert ncu.path == str(tmp_path / "2025.3.1" / "ncu")
    assert ncu.version == "2025.3.1.0"


def test_a_tool_that_fails_to_run_is_recorded(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "ncu", "==ERROR== libcuda.so not found", code=1)
    monkeypatch.setenv("PATH", str(tmp_path))
    env = probe_environment()
    ncu = env.tools["ncu"]
    assert ncu.found and ncu.version is None
    assert "exited 1" in ncu.error and "libcuda.so" in ncu.error
    assert _check(env, "ncu").status is Status.WARN


def test_ptxas_override_that_does_not_run_falls_back_to_bundled(env, tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(tmp_path / "no-such-ptxas"))
    ptxas = doctor.probe_tools(env.triton)["ptxas"]
    assert ptxas.source == "bundled" and ptxas.found


def test_missing_ptxas_is_broken(env):
    tools = dict(env.tools, ptxas=ToolInfo("ptxas", error="missing"))
    broken = dataclasses.replace(env, tools=tools)
    assert _check(broken, "ptxas").status is Status.FAIL
    assert broken.verdict.mode is Mode.BROKEN


def test_gpu_of_another_architecture_is_compile_only(env):
    if env.torch.cuda_build is None:
        torch_info = dataclasses.replace(env.torch, cuda_build="12.8", cuda_available=True, device_count=1)
    else:
        torch_info = dataclasses.replace(env.torch, cuda_available=True, device_count=1)
    b200 = GpuInfo("NVIDIA B200", (10, 0), 148, 180 * 2**30, spec_key="b200")
    other = dataclasses.replace(env, torch=torch_info, gpu=b200)
    assert other.verdict.mode is Mode.COMPILE_ONLY
    assert "sm_100" in other.verdict.summary
    live = dataclasses.replace(other, gpu=GpuInfo("NVIDIA H200", (9, 0), 132, 140 * 2**30, "h200-sxm"))
    assert live.verdict.mode is Mode.LIVE
    assert _check(live, "GPU").status is Status.OK


def test_pin_matches_pyproject():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert f'"fbtriton=={doctor.FBTRITON_PIN}"' in pyproject


def test_launch_cache_is_reported_with_its_switch(env, monkeypatch):
    monkeypatch.delenv("JFA_PROF_C_CACHE", raising=False)
    assert env.triton.c_launch_cache  # fbtriton 3.7.4 has it
    assert _check(env, "launch cache").status is Status.OK
    monkeypatch.setenv("JFA_PROF_C_CACHE", "0")
    off = _check(env, "launch cache")
    assert off.status is Status.WARN and "JFA_PROF_C_CACHE=0" in off.detail and off.fix == "unset JFA_PROF_C_CACHE"
    monkeypatch.delenv("JFA_PROF_C_CACHE")
    missing = doctor._launch_cache_check(dataclasses.replace(env.triton, c_launch_cache=False), None)
    assert missing.status is Status.WARN and "no C launch cache" in missing.detail


def test_launch_cache_switch_reaches_every_launched_kernel():
    import subprocess
    import sys

    code = ("from jfa_prof.kernels import bwd, fwd, plan\n"
            "print(*(k.c_cache for k in (fwd._jfa_fwd, plan._plan_keys, plan._plan_deal, bwd._jfa_bwd_delta,"
            " bwd._jfa_bwd, bwd._jfa_bwd_dq)))")
    for value, expected in (("0", "False"), ("1", "True")):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             env={**os.environ, "JFA_PROF_C_CACHE": value})
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == [expected] * 6
