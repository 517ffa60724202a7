"""Probe the environment and judge what jfa-prof can do in it.

``probe_environment`` gathers facts (versions, paths, the GPU) into an ``Environment``;
``assess`` turns them into ok/warn/fail checks and ``verdict`` into one of three answers:

- ``live``: a CUDA sm_90 GPU, TLX importable, no triton clash - every command runs.
- ``compile-only``: no usable GPU, but TLX kernels compile for sm_90a on the CPU through the
  bundled ptxas, so ``spills`` is live and recorded traces and ``.ncu-rep`` files render.
- ``broken``: TLX cannot be used (fbtriton missing, clobbered by upstream triton, or no
  ptxas); only this case makes ``jfa-prof doctor`` exit non-zero.

Every probe catches its own failures and records the error text: doctor is what people run
when things are broken, so it must never be the thing that crashes. Rendering lives in
``jfa_prof.render.doctor``.
"""
from __future__ import annotations

import enum
import glob
import importlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable, TypeVar

from jfa_prof import __version__
from jfa_prof.kernels import C_CACHE_ENV

# Keep in step with the pin in pyproject.toml (tests/test_doctor.py checks they agree).
FBTRITON_PIN = "3.7.4"
TRITON_FIX = f"pip uninstall -y triton && pip install --force-reinstall --no-deps fbtriton=={FBTRITON_PIN}"

LIVE_CAPABILITY = (9, 0)
_MIN_PTXAS = (12, 0)  # first ptxas that knows sm_90a
_TOOL_TIMEOUT_S = 20.0

# Where Nsight tools land when they are not on PATH: standalone Nsight Compute installs,
# then the CUDA toolkit. Globs are tried newest version first.
NCU_CANDIDATES = ("/opt/nvidia/nsight-compute/*/ncu", "/usr/local/cuda/bin/ncu")
SANITIZER_CANDIDATES = (
    "/usr/local/cuda/bin/compute-sanitizer",
    "/usr/local/cuda/compute-sanitizer/compute-sanitizer",
)
BUNDLED_TOOLS = ("ptxas", "cuobjdump", "nvdisasm")
ALL_TOOLS = (*BUNDLED_TOOLS, "ncu", "compute-sanitizer", "ncu_report", "plotly")


# ---- facts -----------------------------------------------------------------------------------

@dataclass
class ToolInfo:
    name: str
    path: str | None = None
    version: str | None = None
    source: str | None = None  # how it was found: "PATH", "bundled", an env var, a fixed path
    error: str | None = None

    @property
    def found(self) -> bool:
        return self.path is not None


@dataclass
class TorchInfo:
    version: str | None = None
    cuda_build: str | None = None  # torch.version.cuda; None for a CPU build
    cuda_available: bool = False
    device_count: int = 0
    error: str | None = None


@dataclass
class TritonInfo:
    version: str | None = None  # triton.__version__ of the imported package
    file: str | None = None
    owners: list[str] = field(default_factory=list)  # distributions that ship files in triton/
    fbtriton_version: str | None = None
    upstream_version: str | None = None  # the `triton` distribution, which must not be there
    # The triton/ folder each distribution installed into (None when unknown), to tell a
    # clobbered install (same folder) from one shadowed earlier on sys.path (two folders).
    fbtriton_dir: str | None = None
    upstream_dir: str | None = None
    tlx_importable: bool = False
    tlx_file: str | None = None
    error: str | None = None
    tlx_error: str | None = None
    # fbtriton's C launch cache (`triton.jit(c_cache=True)`), which the op's kernels opt into.
    c_launch_cache: bool = False

    @property
    def importable(self) -> bool:
        return self.file is not None

    @property
    def is_tlx_fork(self) -> bool:
        return self.fbtriton_version is not None and self.tlx_importable

    @property
    def shadows_upstream(self) -> bool:
        """Both installed in different folders, and the fork's comes first on sys.path.

        Every import in this process then gets the fork whole; only a process started with
        another path order would get upstream triton.
        """
        return (self.fbtriton_version is not None and self.upstream_version is not None
                and None not in (self.fbtriton_dir, self.upstream_dir, self.file)
                and self.fbtriton_dir != self.upstream_dir
                and _same_dir(Path(self.file).parent, self.fbtriton_dir))

    @property
    def conflict(self) -> bool:
        """fbtriton and upstream triton both installed and not cleanly shadowed: when they share
        a folder, whichever installed last won file by file."""
        return (self.fbtriton_version is not None and self.upstream_version is not None
                and not self.shadows_upstream)


@dataclass
class GpuInfo:
    name: str
    capability: tuple[int, int]
    sm_count: int
    total_memory_bytes: int
    spec_key: str | None = None  # entry in jfa_prof.hardware, None for a GPU it lacks
    driver_version: str | None = None

    @property
    def sm_arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


@dataclass
class Environment:
    jfa_prof_version: str
    python_version: str
    python_executable: str
    platform: str
    torch: TorchInfo
    triton: TritonInfo
    gpu: GpuInfo | None
    gpu_error: str | None
    tools: dict[str, ToolInfo]  # ptxas, cuobjdump, nvdisasm, ncu, compute-sanitizer, ncu_report

    @property
    def checks(self) -> list[Check]:
        return assess(self)

    @property
    def verdict(self) -> Verdict:
        return verdict(self)

    @property
    def healthy(self) -> bool:
        return self.verdict.mode is not Mode.BROKEN


# ---- judgement -------------------------------------------------------------------------------

class Status(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


class Mode(str, enum.Enum):
    LIVE = "live"
    COMPILE_ONLY = "compile-only"
    BROKEN = "broken"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str | None = None


@dataclass(frozen=True)
class Verdict:
    mode: Mode
    reasons: tuple[str, ...] = ()

    @property
    def summary(self) -> str:
        if self.mode is Mode.LIVE:
            return "live profiling available"
        return f"{self.mode.value}: " + "; ".join(self.reasons)

    @property
    def note(self) -> str:
        if self.mode is Mode.LIVE:
            return "every command runs here"
        if self.mode is Mode.COMPILE_ONLY:
            return ("compile-only is still useful: `jfa-prof spills` compiles for sm_90a on the CPU, "
                    "recorded traces and .ncu-rep files render, schedules can be simulated")
        return f"fix the triton install first: {TRITON_FIX}"


def assess(env: Environment) -> list[Check]:
    """One check per component, in the order a person would fix them."""
    checks = [Check("python", Status.OK, f"{env.python_version} ({env.python_executable})")]
    checks.append(_torch_check(env.torch))
    checks.extend(_triton_checks(env.triton))
    if env.triton.tlx_importable:
        checks.append(_launch_cache_check(env.triton, os.environ.get(C_CACHE_ENV)))
    checks.append(_gpu_check(env))
    for name in BUNDLED_TOOLS:
        checks.append(_bundled_tool_check(env.tools.get(name) or ToolInfo(name)))
    checks.append(_optional_tool_check(
        env.tools.get("ncu") or ToolInfo("ncu"),
        "live `jfa-prof ncu` needs it; reports recorded elsewhere are still readable"))
    checks.append(_optional_tool_check(
        env.tools.get("ncu_report") or ToolInfo("ncu_report"),
        "reading .ncu-rep files needs it", fix="pip install ncu-report"))
    checks.append(_optional_tool_check(
        env.tools.get("plotly") or ToolInfo("plotly"),
        "the charts need it: heatmap, waterfall, bench --html, timeline --html", fix="pip install plotly"))
    checks.append(_optional_tool_check(
        env.tools.get("compute-sanitizer") or ToolInfo("compute-sanitizer"),
        "memcheck/racecheck runs need it"))
    return checks


def verdict(env: Environment) -> Verdict:
    broken = _broken_reasons(env)
    if broken:
        return Verdict(Mode.BROKEN, tuple(broken))
    no_gpu = _not_live_reasons(env)
    if no_gpu:
        return Verdict(Mode.COMPILE_ONLY, tuple(no_gpu))
    return Verdict(Mode.LIVE)


def _broken_reasons(env: Environment) -> list[str]:
    tri = env.triton
    reasons = []
    if tri.conflict:
        reasons.append(f"upstream triton {tri.upstream_version} is installed beside "
                       f"fbtriton {tri.fbtriton_version}")
    if not tri.importable:
        reasons.append("triton is not importable")
    elif tri.fbtriton_version is None and not tri.shadows_upstream:
        reasons.append("the imported triton is not the TLX fork (fbtriton is not installed)")
    if tri.importable and not tri.tlx_importable:
        reasons.append("triton.language.extra.tlx is not importable")
    ptxas = env.tools.get("ptxas")
    if ptxas is None or not ptxas.found:
        reasons.append("no ptxas to compile with")
    return reasons


def _not_live_reasons(env: Environment) -> list[str]:
    t = env.torch
    if t.version is None:
        return ["torch is not importable"]
    if t.cuda_build is None:
        return [f"torch {t.version} is a CPU build"]
    if not t.cuda_available or env.gpu is None:
        return [f"no CUDA device visible (torch {t.version}, CUDA {t.cuda_build})"]
    if env.gpu.capability != LIVE_CAPABILITY:
        return [f"{env.gpu.name} is {env.gpu.sm_arch}; the kernels target sm_90a (Hopper)"]
    return []


def _torch_check(t: TorchInfo) -> Check:
    if t.version is None:
        return Check("torch", Status.WARN, f"not importable: {t.error}",
                     fix="install torch before jfa-prof (a CPU build on machines without a GPU)")
    build = f"CUDA {t.cuda_build}" if t.cuda_build else "CPU build"
    avail = f", {t.device_count} device(s) visible" if t.cuda_available else ""
    return Check("torch", Status.OK, f"{t.version} ({build}{avail})")


def _triton_checks(tri: TritonInfo) -> list[Check]:
    if not tri.importable:
        imported = Check("triton", Status.FAIL, f"not importable: {tri.error}", fix=TRITON_FIX)
    else:
        owners = ", ".join(tri.owners) or "no distribution"
        imported = Check("triton", Status.OK, f"{tri.version} from {tri.file} (installed by {owners})")

    if tri.tlx_importable:
        tlx = Check("TLX", Status.OK, f"triton.language.extra.tlx from {tri.tlx_file}")
    else:
        tlx = Check("TLX", Status.FAIL, f"not importable: {tri.tlx_error or tri.error}", fix=TRITON_FIX)

    if tri.conflict:
        fork = Check("triton fork", Status.FAIL,
                     f"CONFLICT: upstream triton {tri.upstream_version} and fbtriton "
                     f"{tri.fbtriton_version} both own triton/; whichever installed last won, "
                     "file by file", fix=TRITON_FIX)
    elif tri.shadows_upstream:
        fork = Check("triton fork", Status.WARN,
                     f"fbtriton {tri.fbtriton_version} at {tri.fbtriton_dir} shadows upstream triton "
                     f"{tri.upstream_version} at {tri.upstream_dir}; a process with another "
                     "sys.path order would import upstream", fix=TRITON_FIX)
    elif tri.fbtriton_version is None:
        upstream = f" (upstream triton {tri.upstream_version} is)" if tri.upstream_version else ""
        fork = Check("triton fork", Status.FAIL, f"fbtriton is not installed{upstream}", fix=TRITON_FIX)
    elif tri.fbtriton_version != FBTRITON_PIN:
        fork = Check("triton fork", Status.WARN,
                     f"fbtriton {tri.fbtriton_version}, jfa-prof is tested with {FBTRITON_PIN}",
                     fix=f"pip install --force-reinstall --no-deps fbtriton=={FBTRITON_PIN}")
    else:
        fork = Check("triton fork", Status.OK, f"fbtriton {tri.fbtriton_version}, no upstream triton")
    return [imported, tlx, fork]


def _launch_cache_check(tri: TritonInfo, env_value: str | None) -> Check:
    slower = "short calls spend more host time per launch (benchmarks/host_path.py)"
    if not tri.c_launch_cache:
        return Check("launch cache", Status.WARN, f"this triton has no C launch cache: {slower}", fix=TRITON_FIX)
    if env_value == "0":
        return Check("launch cache", Status.WARN, f"off ({C_CACHE_ENV}=0): {slower}", fix=f"unset {C_CACHE_ENV}")
    return Check("launch cache", Status.OK, "on: the kernels' repeat launches are keyed in C (fbtriton c_cache)")


def _gpu_check(env: Environment) -> Check:
    gpu = env.gpu
    if gpu is None:
        reasons = _not_live_reasons(env)
        detail = reasons[0] if reasons else "none"
        if env.gpu_error:
            detail += f" ({env.gpu_error})"
        return Check("GPU", Status.WARN, detail)
    mem = gpu.total_memory_bytes / 2**30
    detail = f"{gpu.name}, {gpu.sm_count} SMs, {gpu.sm_arch}, {mem:.0f} GiB"
    if gpu.driver_version:
        detail += f", driver {gpu.driver_version}"
    if gpu.capability != LIVE_CAPABILITY:
        return Check("GPU", Status.WARN, detail + "; the kernels target sm_90a")
    if gpu.spec_key is None:
        return Check("GPU", Status.WARN, detail + "; not in jfa_prof.hardware, so no peak numbers")
    return Check("GPU", Status.OK, detail + f" (spec {gpu.spec_key})")


def _bundled_tool_check(tool: ToolInfo) -> Check:
    if not tool.found:
        status = Status.FAIL if tool.name == "ptxas" else Status.WARN
        return Check(tool.name, status, f"not found: {tool.error}",
                     fix=f"pip install --force-reinstall --no-deps fbtriton=={FBTRITON_PIN}")
    detail = f"{tool.version or '?'} ({tool.source}: {tool.path})"
    if tool.name == "ptxas" and _version_tuple(tool.version) < _MIN_PTXAS:
        return Check(tool.name, Status.WARN, detail + "; sm_90a needs ptxas 12.0 or newer")
    if tool.error:
        return Check(tool.name, Status.WARN, detail + f"; {tool.error}")
    return Check(tool.name, Status.OK, detail)


def _optional_tool_check(tool: ToolInfo, why: str, fix: str | None = None) -> Check:
    if not tool.found:
        detail = f"not found ({why})"
        if tool.error:
            detail += f": {tool.error}"
        return Check(tool.name, Status.WARN, detail, fix=fix)
    detail = f"{tool.version or '?'} ({tool.path})"
    if tool.error:
        return Check(tool.name, Status.WARN, detail + f"; {tool.error}")
    return Check(tool.name, Status.OK, detail)


# ---- probes ----------------------------------------------------------------------------------

def probe_environment() -> Environment:
    """Gather every fact doctor reports. Never raises."""
    torch_info = _safely(probe_torch, lambda err: TorchInfo(error=err))
    gpu, gpu_error = _safely(lambda: probe_gpu(torch_info), lambda err: (None, err))
    triton_info = _safely(probe_triton, lambda err: TritonInfo(error=err))
    tools = _safely(lambda: probe_tools(triton_info),
                    lambda err: {name: ToolInfo(name, error=err) for name in ALL_TOOLS})
    return Environment(
        jfa_prof_version=__version__,
        python_version=platform.python_version(),
        python_executable=sys.executable,
        platform=platform.platform(),
        torch=torch_info,
        triton=triton_info,
        gpu=gpu,
        gpu_error=gpu_error,
        tools=tools,
    )


def probe_torch() -> TorchInfo:
    info = TorchInfo()
    try:
        import torch
    except Exception as err:  # a broken install raises more than ImportError
        info.error = _describe(err)
        return info
    info.version = str(torch.__version__)
    info.cuda_build = torch.version.cuda
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            info.cuda_available = bool(torch.cuda.is_available())
            info.device_count = torch.cuda.device_count() if info.cuda_available else 0
        except Exception as err:
            info.error = _describe(err)
    # torch reports a driver/runtime mismatch as a warning and then says "not available".
    if caught and not info.cuda_available and info.cuda_build:
        info.error = info.error or str(caught[0].message).strip().splitlines()[0]
    return info


def probe_gpu(torch_info: TorchInfo) -> tuple[GpuInfo | None, str | None]:
    if not torch_info.cuda_available:
        return None, None
    import torch

    from jfa_prof import hardware

    try:
        props = torch.cuda.get_device_properties(0)
    except Exception as err:
        return None, _describe(err)
    capability = (int(props.major), int(props.minor))
    spec = hardware.lookup(props.name, capability)
    return GpuInfo(
        name=props.name,
        capability=capability,
        sm_count=int(props.multi_processor_count),
        total_memory_bytes=int(props.total_memory),
        spec_key=spec.key if spec and spec.compute_capability == capability else None,
        driver_version=_driver_version(),
    ), None


def probe_triton() -> TritonInfo:
    info = TritonInfo()
    info.fbtriton_version, info.fbtriton_dir = _installed("fbtriton")
    info.upstream_version, info.upstream_dir = _installed("triton")
    try:
        info.owners = sorted(set(metadata.packages_distributions().get("triton", [])))
    except Exception:
        info.owners = [d for d, v in (("fbtriton", info.fbtriton_version),
                                      ("triton", info.upstream_version)) if v]
    try:
        triton = importlib.import_module("triton")
        info.version = str(getattr(triton, "__version__", "unknown"))
        info.file = str(getattr(triton, "__file__", None) or "namespace package")
    except Exception as err:
        info.error = _describe(err)
        return info
    info.c_launch_cache = hasattr(getattr(getattr(triton, "_C", None), "libtriton", None), "native_fast_dispatch")
    try:
        tlx = importlib.import_module("triton.language.extra.tlx")
        info.tlx_importable = True
        info.tlx_file = getattr(tlx, "__file__", None)
    except Exception as err:
        info.tlx_error = _describe(err)
    return info


def probe_tools(triton_info: TritonInfo | None = None) -> dict[str, ToolInfo]:
    tools: dict[str, ToolInfo] = {}
    bin_dir = _bundled_bin_dir(triton_info)
    for name in BUNDLED_TOOLS:
        tools[name] = _safely(lambda name=name: _probe_bundled(name, bin_dir),
                              lambda err, name=name: ToolInfo(name, error=err))
    tools["ncu"] = _safely(lambda: _probe_external("ncu", NCU_CANDIDATES),
                           lambda err: ToolInfo("ncu", error=err))
    tools["compute-sanitizer"] = _safely(
        lambda: _probe_external("compute-sanitizer", SANITIZER_CANDIDATES),
        lambda err: ToolInfo("compute-sanitizer", error=err))
    for module, dist in (("ncu_report", "ncu-report"), ("plotly", "plotly")):
        tools[module] = _safely(lambda module=module, dist=dist: _probe_module(module, dist),
                                lambda err, module=module: ToolInfo(module, error=err))
    return tools


def _bundled_bin_dir(triton_info: TritonInfo | None) -> Path | None:
    """triton/backends/nvidia/bin, found even when importing triton itself fails."""
    if triton_info is not None and triton_info.file and triton_info.file.endswith(".py"):
        return Path(triton_info.file).parent / "backends" / "nvidia" / "bin"
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "backends" / "nvidia" / "bin"


def _probe_bundled(name: str, bin_dir: Path | None) -> ToolInfo:
    # Triton runs the binary named by TRITON_<NAME>_PATH first and falls back to its own copy.
    env_var = f"TRITON_{name.upper()}_PATH"
    candidates = []
    if os.environ.get(env_var):
        candidates.append((Path(os.environ[env_var]), env_var))
    if bin_dir is not None:
        candidates.append((bin_dir / name, "bundled"))
    errors = []
    for path, source in candidates:
        if not (path.is_file() and os.access(path, os.X_OK)):
            errors.append(f"{path} is missing or not executable")
            continue
        version, error = _run_version(str(path), r"release [\d.]+, V([\d.]+)")
        if version is None:
            errors.append(error or f"{path}: no version")
            continue
        return ToolInfo(name, str(path), version, source)
    if not candidates:
        errors.append("the triton package was not found")
    return ToolInfo(name, error="; ".join(errors))


def _probe_external(name: str, candidates: tuple[str, ...]) -> ToolInfo:
    path, source = _locate(name, candidates)
    if path is None:
        return ToolInfo(name, error=f"not on PATH nor in {', '.join(candidates)}")
    version, error = _run_version(path, r"Version\s+([\d.]+)")
    return ToolInfo(name, path, version, source, error)


def _locate(name: str, candidates: tuple[str, ...]) -> tuple[str | None, str | None]:
    found = shutil.which(name)
    if found:
        return found, "PATH"
    for pattern in candidates:
        for path in sorted(glob.glob(pattern), key=_path_version, reverse=True):
            if os.path.isfile(path) and os.access(path, os.X_OK):
                return path, pattern
    return None, None


def _probe_module(module: str, dist: str) -> ToolInfo:
    spec = importlib.util.find_spec(module)
    if spec is None:
        return ToolInfo(module, error="module not installed")
    return ToolInfo(module, spec.origin, _installed_version(dist), "python module")


def _run_version(path: str, pattern: str) -> tuple[str | None, str | None]:
    """(version, error) from ``<tool> --version``."""
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=_TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"`{path} --version` timed out after {_TOOL_TIMEOUT_S:.0f} s"
    except OSError as err:
        return None, _describe(err)
    text = (proc.stdout or "") + (proc.stderr or "")
    match = re.search(pattern, text)
    if match:
        return match.group(1), None
    last = text.strip().splitlines()[-1] if text.strip() else "no output"
    return None, f"`{path} --version` exited {proc.returncode}: {last}"


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return lines[0].strip() if out.returncode == 0 and lines else None


def _installed_version(dist: str) -> str | None:
    return _installed(dist)[0]


def _installed(dist: str) -> tuple[str | None, str | None]:
    """(version, the triton/ folder it installed into) of a distribution, Nones if absent."""
    try:
        found = metadata.distribution(dist)
    except metadata.PackageNotFoundError:
        return None, None
    try:
        folder = os.path.realpath(str(found.locate_file("triton")))
    except Exception:  # distributions not on a file system cannot say
        folder = None
    return found.version, folder


# ---- helpers ---------------------------------------------------------------------------------

T = TypeVar("T")


def _safely(probe: Callable[[], T], fallback: Callable[[str], T]) -> T:
    try:
        return probe()
    except Exception as err:
        return fallback(f"probe failed: {_describe(err)}")


def _describe(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _same_dir(a: str | Path, b: str | Path) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _version_tuple(version: str | None) -> tuple[int, ...]:
    if not version:
        return ()
    return tuple(int(part) for part in re.findall(r"\d+", version))


def _path_version(path: str) -> tuple[int, ...]:
    return _version_tuple(Path(path).parent.name)
