"""Compile TLX kernels for a GPU architecture without a GPU, and keep everything ptxas said.

``triton.compile`` only needs a driver to pick a default target; given an explicit
``GPUTarget`` it lowers Python to PTX with LLVM and assembles the cubin with the ptxas bundled in
the wheel, all on the CPU. That is what makes ``jfa-prof spills`` work on a laptop or in CI.

What comes back is a ``CompileResult``: PTX, cubin, SASS, the ``ptxas -v`` log and its parsed
per-function statistics, the launch metadata (registers, local memory, shared memory, warps),
and how long it took. Results are cached on disk, keyed by everything that can change the
binary, because a cold compile of a warp-specialized attention kernel takes seconds.

How the ptxas log is obtained: Triton runs ptxas with ``-v`` but writes the log to a temporary
file that it deletes (printing it only under ``TRITON_DUMP_PTXAS_LOG``, only on a cache miss of
its own cache, and to stdout). Instead of scraping stdout, the PTX Triton produced is assembled
once more here with the same ptxas and the same flags, and the resulting cubin is compared byte
for byte with Triton's (``CompileResult.log_matches_cubin``), so the log is known to describe
the binary that would be launched. This works identically whether or not Triton's own cache
answered, needs no global stdout redirection, and costs one extra ptxas run (a fraction of a
second next to the LLVM pipeline).

Triton is imported inside the functions: importing this module stays cheap.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from jfa_prof.errors import BadInputError, JfaProfError, ToolMissingError
from jfa_prof.ptxas import (LocalMemoryStats, MatmulLoopStats, PtxasFunctionStats, WaitStats, count_local_memory,
                            count_waits, entry_stats, matmul_loops, parse_ptxas_log)

# Bump when the cached layout or the meaning of a field changes; old entries then miss.
_CACHE_FORMAT = 4

# Capabilities this Triton build compiles for, by the arch name ptxas is given. From sm_90 on,
# Triton always emits the arch-specific ("a") variant - wgmma and setmaxnreg need it - so a
# plain "sm_90" would silently describe a different binary and is refused.
TARGETS: Mapping[str, int] = MappingProxyType({
    "sm_80": 80, "sm_86": 86, "sm_87": 87, "sm_89": 89,
    "sm_90a": 90, "sm_100a": 100, "sm_103a": 103, "sm_120a": 120,
})


# What jfa_prof.kernels build for. They issue wgmma and setmaxnreg, which exist only as sm_90a
# features: Blackwell (sm_100a, sm_120a) has no wgmma, and compiling there fails in every variant.
KERNEL_TARGETS: tuple[str, ...] = ("sm_90a",)


class KernelCompileError(JfaProfError):
    """The kernel did not compile: a frontend error in the kernel source, or ptxas refusing it."""

    exit_code = 1

    def __init__(self, message: str, *, kernel: str, stage: str, log: str = "", hint: str | None = None):
        super().__init__(message, hint=hint)
        self.kernel = kernel
        self.stage = stage  # "frontend" (Python -> TTIR ... PTX) or "ptxas"
        self.log = log


@dataclass(frozen=True)
class KernelMetadata:
    """What a launch of the compiled kernel needs and what the driver would report for it.

    Registers and local memory are read from the cubin (as the driver does on load), not from
    the ptxas log, so they stay right even if the log and the binary ever disagree.
    """

    name: str
    num_warps: int  # all warps of the CTA, warp-specialized tasks included
    num_stages: int
    num_ctas: int
    shared: int  # dynamic shared memory bytes requested at launch
    n_regs: int
    # Triton's convention for ``CompiledKernel.n_spills``: per-thread local memory (the
    # driver's LOCAL_SIZE_BYTES) divided by 4, i.e. 32-bit words.
    n_spills: int
    local_bytes: int  # per-thread local memory: stack frame plus local arrays
    static_shared: int
    const_bytes: int  # constant bank 0: kernel parameters and driver-provided constants
    maxnreg: int | None
    triton_hash: str


@dataclass
class CompileResult:
    kernel: str  # the entry function's name in PTX and SASS
    target: str  # e.g. "sm_90a"
    metadata: KernelMetadata
    ptx: str = field(repr=False)
    cubin: bytes = field(repr=False)
    sass: str = field(repr=False)
    ptxas_log: str = field(repr=False)
    functions: list[PtxasFunctionStats] = field(repr=False)
    compile_seconds: float  # triton.compile wall time when this binary was first built
    ptxas_seconds: float  # the extra ptxas run that produced the log
    stage_seconds: dict[str, float]  # per lowering stage (ttir, ttgir, llir, ptx, cubin)
    log_matches_cubin: bool
    options: dict[str, Any]
    cache_key: str
    triton_version: str
    ptxas_version: str
    variant: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    cached: bool = False  # served from the jfa-prof compile cache by this call

    @property
    def stats(self) -> PtxasFunctionStats:
        """ptxas statistics of the kernel's entry function."""
        return entry_stats(self.functions, self.kernel)

    @property
    def n_regs(self) -> int:
        return self.metadata.n_regs

    @property
    def n_spills(self) -> int:
        return self.metadata.n_spills

    @functools.cached_property
    def local_memory(self) -> LocalMemoryStats:
        return count_local_memory(self.sass)

    @functools.cached_property
    def waits(self) -> WaitStats:
        return count_waits(self.sass)

    @functools.cached_property
    def loops(self) -> MatmulLoopStats:
        return matmul_loops(self.sass)


# ---------------------------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------------------------

def parse_target(target: str) -> tuple[str, int]:
    """``"sm_90a"`` (also ``"sm90a"``, any case) -> ``("sm_90a", 90)``."""
    m = re.fullmatch(r"sm_?(\d+)([a-z]?)", str(target).strip().lower())
    if m is None:
        raise BadInputError(f"unknown target {target!r}", hint=f"one of {', '.join(TARGETS)}")
    name = f"sm_{m.group(1)}{m.group(2)}"
    if name not in TARGETS:
        cap = int(m.group(1))
        if f"sm_{cap}a" in TARGETS:
            raise BadInputError(
                f"target {target!r}: Triton compiles capability {cap} only as sm_{cap}a "
                "(arch-specific features such as wgmma and setmaxnreg)", hint=f"use sm_{cap}a")
        raise BadInputError(f"unknown target {target!r}", hint=f"one of {', '.join(TARGETS)}")
    return name, TARGETS[name]


def parse_kernel_target(target: str) -> tuple[str, int]:
    """:func:`parse_target`, limited to the architectures the JFA kernels build for."""
    name, cap = parse_target(target)
    if name not in KERNEL_TARGETS:
        raise BadInputError(f"target {name}: the JFA kernels use Hopper's wgmma and setmaxnreg, which {name} "
                            "lacks, so no variant can build for it", hint=f"use {' or '.join(KERNEL_TARGETS)}")
    return name, cap


def default_cache_dir() -> Path:
    root = os.environ.get("JFA_PROF_CACHE")
    if root:
        return Path(root).expanduser() / "compile"
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "jfa-prof" / "compile"


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------

def compile_variant(variant: Any, target: str = "sm_90a", *, use_cache: bool = True,
                    cache_dir: str | Path | None = None) -> CompileResult:
    """Compile one ``KernelVariant`` (see ``jfa_prof.kernels.registry``)."""
    result = compile_kernel(
        variant.kernel, variant.signature, variant.constexprs, variant.num_warps,
        variant.num_stages, target,
        # Backend options beyond warps and stages (maxnreg, ...), for variants that carry them.
        options=dict(getattr(variant, "options", None) or {}),
        use_cache=use_cache, cache_dir=cache_dir)
    result.variant = variant.name
    result.tags = dict(variant.tags)
    return result


def compile_kernel(kernel: Any, signature: Mapping[str, str], constexprs: Mapping[str, Any],
                   num_warps: int = 4, num_stages: int = 1, target: str = "sm_90a", *,
                   options: Mapping[str, Any] | None = None, use_cache: bool = True,
                   cache_dir: str | Path | None = None) -> CompileResult:
    """Compile a ``@triton.jit`` kernel for ``target`` on this machine, GPU or not.

    ``signature`` maps every argument name to a Triton type string - ``"*bf16"``, ``"i32"``,
    ``"fp32"``, ``"tensordesc<bf16[64,128]>"`` for a host-built TMA descriptor with that block
    shape, ``"constexpr"`` for the names whose values are in ``constexprs``. ``options`` are
    further backend options, e.g. ``{"maxnreg": 128}``. A cache miss always rebuilds from source
    (Triton's own cache is bypassed so the compile time is real); ``use_cache=False`` neither
    reads nor writes this cache.
    """
    job = _Job.prepare(kernel, signature, constexprs, num_warps, num_stages, target, options, cache_dir)
    if use_cache:
        hit = _load(job.entry)
        if hit is not None:
            return hit
    result = _build(job)
    if use_cache:
        _store(job.entry, result)
    return result


def cache_key(kernel: Any, signature: Mapping[str, str], constexprs: Mapping[str, Any], num_warps: int = 4,
              num_stages: int = 1, target: str = "sm_90a", *, options: Mapping[str, Any] | None = None) -> str:
    """The key ``compile_kernel`` files its result under, computed without compiling."""
    return _Job.prepare(kernel, signature, constexprs, num_warps, num_stages, target, options, None).key


@dataclass(frozen=True)
class CompileFailure:
    """A variant that did not compile, in place of its ``CompileResult`` in ``compile_many``."""

    variant: str
    kernel: str
    message: str
    stage: str
    log: str = ""
    tags: dict[str, str] = field(default_factory=dict)


def compile_many(variants: Sequence[Any], target: str = "sm_90a", *, use_cache: bool = True,
                 cache_dir: str | Path | None = None, jobs: int = 1,
                 on_result: Callable[[Any, CompileResult | CompileFailure], None] | None = None,
                 ) -> list[CompileResult | CompileFailure]:
    """Compile many variants, in input order; a variant that fails becomes a ``CompileFailure``.

    Cache hits are answered first, in this process. With ``jobs > 1`` the misses that are
    registered variants (``jfa_prof.kernels.registry.all_variants``) compile in that many worker
    processes - Triton compiles on one core, and a cold build of every variant is minutes -
    which look their variant up by name; other variants compile here, one after the other.
    ``on_result(variant, outcome)`` is called as each one completes (for progress bars).
    """
    parse_target(target)  # a bad target is the caller's error, not a failure per variant
    outcomes: dict[int, CompileResult | CompileFailure] = {}

    def done(i: int, outcome: CompileResult | CompileFailure) -> None:
        outcomes[i] = outcome
        if on_result is not None:
            on_result(variants[i], outcome)

    misses = []
    for i, v in enumerate(variants):
        hit = None
        if use_cache:
            try:
                job = _Job.prepare(v.kernel, v.signature, v.constexprs, v.num_warps, v.num_stages,
                                   target, getattr(v, "options", None), cache_dir)
            except JfaProfError as err:
                done(i, _failure(v, err))
                continue
            hit = _load(job.entry)
        if hit is not None:
            hit.variant, hit.tags = v.name, dict(v.tags)
            done(i, hit)
        else:
            misses.append(i)

    pooled: list[int] = []
    if jobs > 1 and len(misses) > 1:
        registered = _registered_variants()
        pooled = [i for i in misses if registered.get(variants[i].name) == variants[i]]
    for i in misses:
        if i not in pooled:
            done(i, _compile_one(variants[i], target, use_cache, cache_dir))
    if pooled:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # spawn, not fork: the parent has LLVM and Triton's native state loaded, which a fork
        # would copy mid-flight.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(jobs, len(pooled)), mp_context=ctx) as pool:
            futures = {pool.submit(_compile_registered, variants[i].name, target, use_cache,
                                   None if cache_dir is None else str(cache_dir)): i for i in pooled}
            for fut in as_completed(futures):
                done(futures[fut], fut.result())
    return [outcomes[i] for i in range(len(variants))]


# Cold compile of one JFA variant, in core-seconds: 27 forward variants took 350 s on 2 cores.
# Only for telling a user up front roughly how long a run will take.
COLD_SECONDS_PER_VARIANT = 26.0


def cache_misses(variants: Sequence[Any], target: str = "sm_90a", *,
                 cache_dir: str | Path | None = None) -> list[bool]:
    """Per variant, whether :func:`compile_many` would have to build it (no cache entry), without
    compiling or reading the entries. A variant whose job cannot even be prepared fails at once
    and counts as no miss."""
    out = []
    for v in variants:
        try:
            job = _Job.prepare(v.kernel, v.signature, v.constexprs, v.num_warps, v.num_stages, target,
                               getattr(v, "options", None), cache_dir)
        except JfaProfError:
            out.append(False)
            continue
        out.append(not (job.entry / "result.json").is_file())
    return out


def _failure(variant: Any, err: JfaProfError) -> CompileFailure:
    return CompileFailure(variant=variant.name, kernel=getattr(variant.kernel, "__name__", "?"),
                          message=str(err), stage=getattr(err, "stage", "input"),
                          log=getattr(err, "log", ""), tags=dict(variant.tags))


def _compile_one(variant: Any, target: str, use_cache: bool, cache_dir: Any) -> CompileResult | CompileFailure:
    try:
        return compile_variant(variant, target, use_cache=use_cache, cache_dir=cache_dir)
    except JfaProfError as err:
        if isinstance(err, ToolMissingError):
            raise  # no other variant will get further
        return _failure(variant, err)


@functools.lru_cache(maxsize=None)
def _registered_by_name() -> tuple[tuple[str, Any], ...]:
    from jfa_prof.kernels.registry import all_variants

    return tuple((v.name, v) for v in all_variants())


def _registered_variants() -> dict[str, Any]:
    return dict(_registered_by_name())


def _compile_registered(name: str, target: str, use_cache: bool, cache_dir: str | None):
    """Worker-process side of ``compile_many``: JIT functions do not pickle, names do."""
    variants = _registered_variants()
    if name not in variants:
        raise RuntimeError(f"variant {name!r} is not registered in the worker process")
    return _compile_one(variants[name], target, use_cache, cache_dir)


# ---------------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Job:
    """Everything decided before compiling: normalized inputs, the tools, the cache entry."""

    kernel: Any
    signature: dict[str, str]
    constexprs: dict[str, Any]
    options: dict[str, Any]
    target: str
    capability: int
    ptxas: Any  # triton.knobs.NvidiaTool
    key: str
    entry: Path

    @classmethod
    def prepare(cls, kernel, signature, constexprs, num_warps, num_stages, target, options, cache_dir) -> "_Job":
        import triton

        target_name, capability = parse_target(target)
        _check_signature(kernel, signature, constexprs)
        opts = {"num_warps": int(num_warps), "num_stages": int(num_stages), **dict(options or {})}
        ptxas = _tool("ptxas", capability)
        key = _cache_key(kernel, signature, constexprs, opts, target_name, triton.__version__, ptxas.version)
        root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        return cls(kernel, dict(signature), dict(constexprs), opts, target_name, capability, ptxas,
                   key, root / key[:2] / key)


def _check_signature(kernel: Any, signature: Mapping[str, str], constexprs: Mapping[str, Any]) -> None:
    # Triton reports a mismatch here as an IndexError or a failed assert deep in code generation.
    names = list(getattr(kernel, "arg_names", None) or [])
    if not names:
        raise BadInputError(f"{kernel!r} is not a @triton.jit function")
    kname = getattr(kernel, "__name__", repr(kernel))
    missing = [n for n in names if n not in signature]
    unknown = [n for n in signature if n not in names]
    if missing or unknown:
        raise BadInputError(f"signature of {kname} does not match its arguments: "
                            f"missing {missing}, unknown {unknown}")
    no_value = [n for n, t in signature.items() if t == "constexpr" and n not in constexprs]
    if no_value:
        raise BadInputError(f"{kname}: constexpr arguments without a value: {no_value}")
    not_constexpr = [n for n in constexprs if n in signature and signature[n] != "constexpr"]
    if not_constexpr:
        raise BadInputError(f"{kname}: values given for arguments not typed constexpr: {not_constexpr}")


def launch_attrs(arg_names: Sequence[str], signature: Mapping[str, str]) -> dict[tuple[int, ...], list]:
    """The argument attributes a launch gives Triton: every pointer 16-byte aligned, as torch's
    allocations are, so Triton marks it divisible by 16. Without them the build here is not the
    one that runs: the forward's instrumented builds spilled only when their pointers were known
    aligned. Integer arguments are compiled unspecialized: the backward's launches do the same
    (``do_not_specialize``), the forward's let Triton specialize a value of 1 or a multiple of 16,
    which changes the instructions around them but, in the builds checked, not the spills."""
    return {(i,): [["tt.divisibility", 16]] for i, name in enumerate(arg_names) if signature[name].startswith("*")}


def _build(job: _Job) -> CompileResult:
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kname = job.kernel.__name__
    seen: dict[str, Any] = {}

    def listener(*, src, metadata, metadata_group, times, cache_hit):
        seen["stages"] = {stage: us / 1e6 for stage, us in times.lowering_stages}

    # ASTSource keys constexprs by argument name here and turns them into (index,) tuples itself.
    src = ASTSource(fn=job.kernel, signature=job.signature, constexprs=job.constexprs,
                    attrs=launch_attrs(job.kernel.arg_names, job.signature))
    with knobs.compilation.scope():
        knobs.compilation.listener = listener
        # Always a real build: this cache already answered if the result was known, and a hit in
        # Triton's cache would report a compile time of a fraction of a second.
        knobs.compilation.always_compile = True
        t0 = time.perf_counter()
        try:
            compiled = triton.compile(src, target=GPUTarget("cuda", job.capability, 32), options=dict(job.options))
        except Exception as err:  # noqa: BLE001 - re-raised as a typed error below
            raise _compile_error(kname, err) from err
        compile_seconds = time.perf_counter() - t0

    ptx = compiled.asm["ptx"]
    cubin = compiled.asm["cubin"]
    md = compiled.metadata
    t0 = time.perf_counter()
    log, log_cubin = _run_ptxas(job.ptxas.path, ptx, job.target, md)
    ptxas_seconds = time.perf_counter() - t0
    sass = _cuobjdump(["--dump-sass"], cubin)
    usage = _resource_usage(_cuobjdump(["--dump-resource-usage"], cubin), md.name)

    functions = parse_ptxas_log(log)
    local_bytes = usage.get("STACK", 0) + usage.get("LOCAL", 0)
    metadata = KernelMetadata(
        name=md.name, num_warps=md.num_warps, num_stages=md.num_stages, num_ctas=md.num_ctas,
        shared=md.shared or 0, n_regs=usage["REG"], n_spills=local_bytes // 4, local_bytes=local_bytes,
        static_shared=usage.get("SHARED", 0), const_bytes=usage.get("CONSTANT[0]", 0),
        maxnreg=md.maxnreg, triton_hash=md.hash)
    return CompileResult(
        kernel=md.name, target=job.target, metadata=metadata, ptx=ptx, cubin=cubin, sass=sass,
        ptxas_log=log, functions=functions, compile_seconds=compile_seconds,
        ptxas_seconds=ptxas_seconds, stage_seconds=seen.get("stages", {}),
        log_matches_cubin=log_cubin == cubin,
        options=_jsonable(job.options), cache_key=job.key, triton_version=triton.__version__,
        ptxas_version=job.ptxas.version)


def _compile_error(kname: str, err: Exception) -> KernelCompileError:
    from triton.runtime.errors import PTXASError

    if isinstance(err, PTXASError):
        text = str(err)
        log = text.split("`ptxas` stderr:", 1)[-1].split("Repro command:", 1)[0].strip()
        first = next((ln for ln in log.splitlines() if "fatal" in ln or "error" in ln), log[:200])
        return KernelCompileError(f"ptxas rejected {kname}: {first.strip()}", kernel=kname,
                                  stage="ptxas", log=log)
    reason = _frontend_reason(err)
    # The whole chain, outermost first: each level names the call site that led to the next.
    chain, e = [], err
    while e is not None and len(chain) < 20:
        chain.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return KernelCompileError(f"{kname} failed to compile: {reason}", kernel=kname, stage="frontend",
                              log="\n\n".join(chain))


def _frontend_reason(err: Exception) -> str:
    """The sentence that says why, from Triton's errors: a CompilationError's text is a source
    excerpt ending in a caret under the column, and the reason sits deeper in the chain (an
    ``error_message``, or the error that was raised while compiling), often in a helper the
    kernel called."""
    chain, e = [], err
    while e is not None and len(chain) < 20:
        chain.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    reason = None
    for e in reversed(chain):
        msg = getattr(e, "error_message", None)
        if msg:
            reason = f"{type(e).__name__}: {str(msg).strip()}"
            break
        if not hasattr(e, "node"):  # not one of Triton's source-position wrappers: the cause itself
            lines = [ln.strip() for ln in str(e).strip().splitlines()]
            lines = [ln for ln in lines if ln and set(ln) != {"^"}]
            if lines:
                reason = f"{type(e).__name__}: {lines[-1]}"
                break
    if reason is None:
        reason = f"{type(err).__name__} without a message"
    where = next((w for w in map(_source_position, reversed(chain)) if w), None)
    return reason + (f" ({where})" if where else "")


def _source_position(err: Exception) -> str | None:
    node = getattr(err, "node", None)
    if node is None or not getattr(node, "lineno", None):
        return None
    src = getattr(err, "src", None)
    m = re.search(r"^\s*def\s+(\w+)", src, re.M) if isinstance(src, str) else None
    return f"line {node.lineno} of {m.group(1)}" if m else f"line {node.lineno}"


def _tool(name: str, capability: int):
    from triton import knobs

    try:
        if name == "ptxas":
            # Triton assembles sm_100 and newer with a separate, newer ptxas.
            return knobs.nvidia.ptxas_blackwell if capability >= 100 else knobs.nvidia.ptxas
        return getattr(knobs.nvidia, name)
    except RuntimeError as err:
        raise ToolMissingError(f"{name} not found: {err}",
                               hint=f"fbtriton ships it under triton/backends/nvidia/bin, or set "
                                    f"TRITON_{name.upper()}_PATH") from None


def _run_ptxas(ptxas: str, ptx: str, arch: str, md: Any) -> tuple[str, bytes]:
    """Assemble ``ptx`` as Triton's CUDA backend does, with ``-v``; return (log, cubin)."""
    from triton import knobs

    # Same flags, same order as the backend's _ptxas_compile: any difference shows up as
    # log_matches_cubin == False rather than as silently different numbers.
    if knobs.compilation.disable_line_info:
        debug = ["-lineinfo", "-suppress-debug-info"]
    elif knobs.nvidia.disable_ptxas_opt:
        debug = ["-g"]
    else:
        debug = ["-lineinfo"]
    fmad = [] if md.enable_fp_fusion else ["--fmad=false"]
    no_opt = ["--opt-level", "0"] if knobs.nvidia.disable_ptxas_opt else []
    extra = md.ptx_options.split(" ") if md.ptx_options else []
    with tempfile.TemporaryDirectory(prefix="jfa-prof-ptxas-") as tmp:
        src, out = Path(tmp) / "kernel.ptx", Path(tmp) / "kernel.cubin"
        src.write_text(ptx)
        cmd = [ptxas, *debug, *fmad, "-v", *no_opt, "--regAllocOptLevel=2", *extra,
               f"--gpu-name={arch}", str(src), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stderr + proc.stdout
        if proc.returncode != 0:
            raise KernelCompileError(f"ptxas -v failed on the PTX of {md.name} (exit {proc.returncode})",
                                     kernel=md.name, stage="ptxas", log=log)
        return log, out.read_bytes()


def _cuobjdump(args: list[str], cubin: bytes) -> str:
    tool = _tool("cuobjdump", 0)
    with tempfile.TemporaryDirectory(prefix="jfa-prof-sass-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        # stderr carries nvdisasm's format notices even on success: only the exit code counts.
        proc = subprocess.run([tool.path, *args, str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolMissingError(f"cuobjdump {' '.join(args)} failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[:300]}")
    return proc.stdout


def _resource_usage(text: str, function: str) -> dict[str, int]:
    # " Function k:\n  REG:168 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:960 ..."
    m = re.search(rf"^\s*Function {re.escape(function)}:\s*\n\s*(.+)$", text, flags=re.MULTILINE)
    if m is None:
        raise ToolMissingError(f"cuobjdump printed no resource usage for {function}")
    return {k: int(v) for k, v in re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", m.group(1))}


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------

def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)


def _cache_key(kernel, signature, constexprs, opts, target, triton_version, ptxas_version) -> str:
    from triton._C.libtriton import get_cache_invalidating_env_vars

    payload = {
        "format": _CACHE_FORMAT,
        "kernel": f"{getattr(kernel, '__module__', '')}.{kernel.__name__}",
        # Triton's own source hash: the kernel, every @triton.jit function it calls and the
        # global constexprs it reads, so editing a helper invalidates the entry.
        "source": kernel.cache_key,
        "signature": sorted((k, str(v)) for k, v in signature.items()),
        "constexprs": sorted((k, repr(v)) for k, v in constexprs.items()),
        "options": sorted((k, repr(v)) for k, v in opts.items()),
        "target": target,
        "triton": triton_version,
        "ptxas": ptxas_version,
        # Environment variables that change Triton's output (TRITON_*, LLVM flags, ...).
        "env": sorted(get_cache_invalidating_env_vars().items()),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


# PTX and SASS of an attention kernel are megabytes each and compress about tenfold.
_FILES = {"ptx": "kernel.ptx.gz", "sass": "kernel.sass.gz", "ptxas_log": "ptxas.log"}


def _write_text(path: Path, text: str) -> None:
    data = text.encode()
    path.write_bytes(gzip.compress(data, compresslevel=6) if path.suffix == ".gz" else data)


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode()


def _store(entry: Path, result: CompileResult) -> None:
    meta = {k: v for k, v in asdict(result).items()
            if k not in ("ptx", "cubin", "sass", "ptxas_log", "functions", "cached")}
    entry.parent.mkdir(parents=True, exist_ok=True)
    # Written next to the entry and renamed into place, so a reader never sees half an entry
    # and two processes compiling the same kernel do not corrupt each other.
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        for attr, fname in _FILES.items():
            _write_text(tmp / fname, getattr(result, attr))
        (tmp / "kernel.cubin").write_bytes(result.cubin)
        (tmp / "result.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / "result.json").is_file():
                shutil.rmtree(entry, ignore_errors=True)
                os.rename(tmp, entry)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load(entry: Path) -> CompileResult | None:
    try:
        meta = json.loads((entry / "result.json").read_text())
        texts = {attr: _read_text(entry / fname) for attr, fname in _FILES.items()}
        cubin = (entry / "kernel.cubin").read_bytes()
        meta["metadata"] = KernelMetadata(**meta["metadata"])
        return CompileResult(**meta, **texts, cubin=cubin, functions=parse_ptxas_log(texts["ptxas_log"]),
                             cached=True)
    except (OSError, EOFError, ValueError, TypeError, KeyError):
        # Missing, partial or from an older layout: treat as a miss and rebuild.
        return None
