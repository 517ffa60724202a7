"""Live ``ncu`` runs: find Nsight Compute, build its command line, run it, and turn its failures
into errors a user can act on.

The command line is built by plain functions (``target_argv``, ``ncu_argv``) so tests check it
without a GPU; only ``run_ncu`` starts a process. The profiled program is
``python -m jfa_prof.ncu_target`` with the interpreter running jfa-prof, so it sees the same
packages.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from jfa_prof import ncu_metrics
from jfa_prof.errors import JfaProfError, NoGpuError, ToolMissingError
from jfa_prof.ncu_target import PROFILED_LAUNCHES, WARMUP_LAUNCHES
from jfa_prof.schedule import DEFAULT_SCHEDULE

# The forward kernel's name as ncu sees it (the jitted function's name).
# The main kernel of each pass; anchored so that the backward's delta and dQ kernels are left out.
KERNEL_REGEX = {"fwd": "^_jfa_fwd$", "bwd": "^_jfa_bwd$"}
REPORT_SUFFIX = ".ncu-rep"
# Lines of ncu's output kept in an error message: ncu prints its ==ERROR== lines and the
# target's traceback last.
_TAIL_LINES = 15
_PERM_ERROR = "ERR_NVGPUCTRPERM"
_PERM_HINT = ("profiling counters are restricted to admin users: run as root, or set the driver option "
              "NVreg_RestrictProfilingToAdminUsers=0 (https://developer.nvidia.com/ERR_NVGPUCTRPERM)")


def find_ncu() -> str | None:
    """Path of the ncu binary: on PATH, else the newest Nsight Compute install, else the CUDA
    toolkit's; the same search ``jfa-prof doctor`` reports."""
    from jfa_prof import doctor

    path, _ = doctor._locate("ncu", doctor.NCU_CANDIDATES)
    return path


def require_ncu() -> str:
    from jfa_prof import doctor

    path = find_ncu()
    if path is None:
        raise ToolMissingError(
            f"ncu (Nsight Compute) not found: not on PATH nor in {', '.join(doctor.NCU_CANDIDATES)}",
            hint="install Nsight Compute or put ncu on PATH; --report FILE reads a report made elsewhere")
    return path


def require_gpu_driver() -> None:
    """A cheap check before starting ncu (and torch in the target): no NVIDIA device node, no GPU.

    Linux only: elsewhere the target's own check reports a missing GPU.
    """
    if sys.platform.startswith("linux") and not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/dxg")):
        raise NoGpuError("no NVIDIA GPU driver here: a live ncu run needs an sm_90 GPU",
                         hint="read a report recorded elsewhere with --report FILE.ncu-rep")


@dataclass(frozen=True)
class LiveRun:
    """One workload and kernel variant to profile: what ``ncu_target`` takes."""

    schedule: str = DEFAULT_SCHEDULE
    peel: bool = True
    grid: str = "hsp"
    lq: int | None = None
    max_kv: int | None = None
    sparsity: float | None = None
    seed: int | None = None
    pass_: str = "fwd"
    dq: str | None = None  # backward: the dQ reduction (jfa_prof.ablations.BWD_DQ)
    profile: int = 0  # instrumentation level (kernels/profiling.py): what it costs shows against level 0
    causal: bool = False  # the workload with the causal mask (jagged-Q grids)

    @property
    def tag(self) -> str:
        """Short name of the variant: ``lpt``, ``lpt-nopeel``, ``bwd-static-tma``, ``static-prof1``."""
        if self.pass_ == "bwd":
            tag = f"bwd-{self.schedule}-{self.dq}"
        else:
            tag = self.schedule if self.peel else f"{self.schedule}-nopeel"
        return f"{tag}-prof{self.profile}" if self.profile else tag

    def target_args(self) -> list[str]:
        args = ["--pass", self.pass_, "--schedule", self.schedule, "--grid", self.grid]
        if self.dq is not None:
            args += ["--dq", self.dq]
        for flag, value in (("--lq", self.lq), ("--max-kv", self.max_kv), ("--sparsity", self.sparsity),
                            ("--seed", self.seed)):
            if value is not None:
                args += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
        if self.causal:
            args.append("--causal")
        if not self.peel:
            args.append("--no-peel")
        if self.profile:
            args += ["--profile", str(self.profile)]
        return args


def target_argv(run: LiveRun, *, python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", "jfa_prof.ncu_target", *run.target_args(),
            "--launches", str(WARMUP_LAUNCHES + PROFILED_LAUNCHES)]


def report_path(out: str | Path) -> Path:
    """Where ncu writes for ``-o out``: it appends ``.ncu-rep`` unless already there."""
    out = Path(out)
    return out if out.name.endswith(REPORT_SUFFIX) else out.with_name(out.name + REPORT_SUFFIX)


def ncu_argv(ncu: str, out: str | Path, target: Sequence[str], *, arch: str = "sm_90",
             pass_: str = "fwd") -> list[str]:
    """The full ncu command line that profiles one launch of the ``pass_`` kernel into ``out``."""
    stem = str(report_path(out))[: -len(REPORT_SUFFIX)]
    return [
        ncu,
        # Profile at the clocks the benchmarks run at; ncu's default locks the base clock.
        "--clock-control", "none",
        "-k", f"regex:{KERNEL_REGEX[pass_]}",
        "-s", str(WARMUP_LAUNCHES), "-c", str(PROFILED_LAUNCHES),
        "--metrics", ncu_metrics.metric_list(arch),
        "--section", "WarpStateStats",
        # Without the suffix ncu adds one; -f replaces an older report of the same name.
        "-o", stem, "-f",
        *target,
    ]


def _tail(text: str, n: int = _TAIL_LINES) -> str:
    lines = [line.rstrip() for line in text.strip().splitlines() if line.strip()]
    return "\n".join("  " + line for line in lines[-n:]) or "  (no output)"


def run_ncu(argv: Sequence[str], out: str | Path, *,
            runner: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> Path:
    """Run ncu and return the report it wrote.

    ToolMissingError when ncu does not start or may not read the counters (ERR_NVGPUCTRPERM,
    whatever its exit code: some ncu versions exit 0 after it); JfaProfError with the tail of
    the output when ncu or the target fails, or no report was written (no kernel matched).
    """
    report = report_path(out)
    # ncu can exit 0 without writing (no kernel matched), leaving an older report in place:
    # only a file written during this run counts.
    before = report.stat().st_mtime_ns if report.exists() else None
    try:
        proc = runner(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                      errors="replace", stdin=subprocess.DEVNULL)
    except OSError as err:
        raise ToolMissingError(f"cannot run {argv[0]}: {err.strerror or err}") from None
    text = proc.stdout or ""
    if _PERM_ERROR in text:
        raise ToolMissingError("ncu may not read the GPU performance counters (ERR_NVGPUCTRPERM)",
                               hint=_PERM_HINT)
    if proc.returncode != 0:
        raise JfaProfError(f"ncu exited {proc.returncode}; the end of its output:\n{_tail(text)}")
    if not report.exists() or report.stat().st_mtime_ns == before:
        kernels = argv[argv.index("-k") + 1] if "-k" in argv else "the -k filter"
        raise JfaProfError(f"ncu wrote no report (did a kernel match {kernels}?); "
                           f"the end of its output:\n{_tail(text)}")
    return report
