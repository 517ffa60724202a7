"""Reading what ptxas and cuobjdump say about a compiled kernel: registers, spills, local memory,
and how its instructions wait.

Two inputs, both plain text so they can come from a live compile or a file someone attached to
a bug report:

- the ``ptxas -v`` log (``parse_ptxas_log``): one record per function ptxas reports on, with its
  registers, spill traffic, stack frame and the performance warnings ptxas attached to it;
- ``cuobjdump --dump-sass`` output (``count_local_memory``): where the LDL/STL instructions that
  the spill bytes turn into actually sit, so a spill can be traced to the code around it; and
  (``count_waits``) how many wgmma groups the code issues before it waits for them, and how many
  barriers it holds, including those the compiler inserted that the source never wrote.

Standard library only.
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Mapping

from jfa_prof.errors import BadInputError


class PtxasLogError(BadInputError, ValueError):
    """Text that is not a ptxas ``-v`` log, or SASS with no instructions in it.

    Also a ValueError, so callers that only know the parser as a parser can catch it as one.
    """


@dataclass
class PtxasFunctionStats:
    """What ptxas reported for one function; ``None`` where this ptxas version does not print it."""

    name: str
    target: str | None = None
    # Entry functions (kernels) get a register line; device functions that survived inlining
    # (``noinline`` helpers) only get their stack and spill line.
    is_entry: bool = False
    registers: int | None = None
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    stack_frame_bytes: int = 0
    # Stack of the entry plus everything it calls; only printed when non-zero.
    cumulative_stack_bytes: int | None = None
    smem_bytes: int | None = None
    cmem_bytes: dict[int, int] = field(default_factory=dict)  # constant bank -> bytes
    barriers: int | None = None
    compile_time_ms: float | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes

    @property
    def spills(self) -> bool:
        return self.spill_bytes > 0


# The tool names itself by its file name: "ptxas info", but also "ptxas-blackwell info" for the
# second ptxas that Triton ships for sm_100+.
_TOOL = r"^[\w.-]*ptxas[\w.-]*"
_PREFIX = _TOOL + r"\s+(?:info|warning|error|fatal)?\s*:\s*"
_COMPILING = re.compile(_PREFIX + r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPERTIES = re.compile(_PREFIX + r"Function properties for (\S+)")
_USED = re.compile(_PREFIX + r"Used (\d+) registers?(.*)$")
_COMPILE_TIME = re.compile(_PREFIX + r"Compile time = ([\d.]+) ms")
_BYTES_ITEM = re.compile(r"(\d+) bytes ([a-z][a-z ]*?)(?:\[(\d+)\])?\s*(?:,|$)")
_BARRIERS = re.compile(r"used (\d+) barriers?")
# ptxas words its diagnostics three ways: "ptxas warning : ...", "ptxas <file>, line N; warning : ...",
# and, for the wgmma / setmaxnreg performance notes, "ptxas info : (C75xx) Potential Performance Loss".
_WARNING = re.compile(_TOOL + r"\b[^:]*?\bwarning\s*:\s*(.+)$")
_PERF_NOTE = re.compile(_TOOL + r"\s+info\s*:\s*(\(C\d+\).*|.*Potential Performance Loss.*)$")
_FATAL = re.compile(_TOOL + r"\b[^:]*?\b(?:fatal|error)\s*:\s*(.+)$")
_MESSAGE = re.compile(_TOOL + r"\b")
# Which function a diagnostic is about, in the phrasings ptxas uses.
_NAMED = re.compile(r"(?:function|entry)\s+'?([A-Za-z_$][\w$.]*)'?")


def _bytes_items(text: str) -> dict[tuple[str, int | None], int]:
    out: dict[tuple[str, int | None], int] = {}
    for m in _BYTES_ITEM.finditer(text):
        bank = int(m.group(3)) if m.group(3) is not None else None
        out[(m.group(2).strip(), bank)] = int(m.group(1))
    return out


def parse_ptxas_log(text: str) -> list[PtxasFunctionStats]:
    """Parse a ``ptxas -v`` log into one record per reported function, in log order.

    Accepts the log of one ptxas run or several runs pasted together (e.g. everything a process
    printed with ``TRITON_DUMP_PTXAS_LOG=1``); a function compiled twice appears twice. Performance
    notes and warnings go to the function they name, else to the entry compiled right after them
    (ptxas prints them before the summary of the function they concern).

    Raises ``PtxasLogError`` when the text holds no function statistics at all.
    """
    if not isinstance(text, str):
        raise PtxasLogError(f"expected ptxas log text, got {type(text).__name__}")
    records: list[PtxasFunctionStats] = []
    entry: PtxasFunctionStats | None = None  # the entry whose summary lines are being read
    pending_props: PtxasFunctionStats | None = None  # awaiting its "N bytes stack frame" line
    # (warning text, named function or None, number of records that existed when it was printed)
    diagnostics: list[tuple[str, str | None, int]] = []
    fatal: list[str] = []

    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if pending_props is not None and not _MESSAGE.match(line):
            items = _bytes_items(line)
            pending_props.stack_frame_bytes = items.get(("stack frame", None), 0)
            pending_props.spill_store_bytes = items.get(("spill stores", None), 0)
            pending_props.spill_load_bytes = items.get(("spill loads", None), 0)
            pending_props = None
            continue
        pending_props = None

        if m := _COMPILING.match(line):
            entry = PtxasFunctionStats(name=m.group(1), target=m.group(2), is_entry=True)
            records.append(entry)
        elif m := _PROPERTIES.match(line):
            name = m.group(1)
            if entry is not None and entry.name == name and entry is records[-1]:
                pending_props = entry
            else:
                pending_props = PtxasFunctionStats(name=name, target=entry.target if entry else None)
                records.append(pending_props)
        elif m := _USED.match(line):
            if entry is None:
                continue
            entry.registers = int(m.group(1))
            rest = m.group(2)
            if b := _BARRIERS.search(rest):
                entry.barriers = int(b.group(1))
            for (what, bank), n in _bytes_items(rest).items():
                if what == "smem":
                    entry.smem_bytes = n
                elif what == "cmem" and bank is not None:
                    entry.cmem_bytes[bank] = n
                elif what == "cumulative stack size":
                    entry.cumulative_stack_bytes = n
        elif m := _COMPILE_TIME.match(line):
            if entry is not None:
                entry.compile_time_ms = float(m.group(1))
        elif (m := _WARNING.match(line)) or (m := _PERF_NOTE.match(line)):
            message = m.group(1).strip()
            named = _NAMED.search(message)
            diagnostics.append((message, named.group(1) if named else None, len(records)))
        elif m := _FATAL.match(line):
            fatal.append(m.group(1).strip())

    if not records:
        if fatal:
            raise PtxasLogError("ptxas failed, no function statistics in the log: " + fatal[0])
        raise PtxasLogError("no ptxas function statistics found: expected lines such as "
                            "\"ptxas info : Compiling entry function 'k' for 'sm_90a'\" (from ptxas -v)")

    for message, named, position in diagnostics:
        _attach(records, message, named, position)
    return records


def _attach(records: list[PtxasFunctionStats], message: str, named: str | None, position: int) -> None:
    later, earlier = records[position:], records[:position][::-1]
    if named is not None:
        for candidates in (later, earlier):
            for rec in candidates:
                if rec.name == named:
                    rec.warnings.append(message)
                    return
    for candidates in (later, earlier):
        for rec in candidates:
            if rec.is_entry:
                rec.warnings.append(message)
                return
    records[min(position, len(records) - 1)].warnings.append(message)


def entry_stats(stats: list[PtxasFunctionStats], name: str) -> PtxasFunctionStats:
    """The (last) entry record for kernel ``name``; ``KeyError`` when ptxas did not report it."""
    for rec in reversed(stats):
        if rec.is_entry and rec.name == name:
            return rec
    raise KeyError(f"no ptxas entry statistics for {name!r}; reported: {[r.name for r in stats]}")


# ---------------------------------------------------------------------------------------------
# Local memory in SASS
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalMemorySite:
    function: str
    offset: int  # byte offset of the instruction within its function, as cuobjdump prints it
    line: int  # 1-based line in the SASS text
    opcode: str  # with modifiers, e.g. "LDL.64" or "STL.128"
    instruction: str
    # The instructions around the site, the site itself marked with "->".
    context: tuple[str, ...]

    @property
    def is_load(self) -> bool:
        return self.opcode.startswith("LDL")


@dataclass(frozen=True)
class LocalMemoryStats:
    loads: int
    stores: int
    sites: tuple[LocalMemorySite, ...]
    per_function: Mapping[str, tuple[int, int]]  # function -> (LDL count, STL count)
    instructions: int  # all SASS instructions seen, to put the counts in proportion

    @property
    def total(self) -> int:
        return self.loads + self.stores


_SASS_FUNCTION = re.compile(r"Function[ \t]*:[ \t]*(\S+)")
# Anchored on the "/*0040*/" offset comment rather than on line starts: the regex engine then
# jumps between literal "/*" hits instead of trying every position of a multi-megabyte text.
# (The encoding comments, "/* 0x... */", have a space and never match.)
_SASS_INSTR = re.compile(
    r"/\*(?P<off>[0-9a-fA-F]{4,})\*/[ \t]*(?P<pred>@!?U?P[T\d]+[ \t]+)?"
    r"(?P<op>[A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)(?P<rest>[^;\n]*);")
_LOCAL_OPS = ("LDL", "STL")


def _sass_instructions(sass_text: str) -> list[re.Match]:
    """The instructions of ``cuobjdump --dump-sass`` text; ``PtxasLogError`` when there are none."""
    if not isinstance(sass_text, str):
        raise PtxasLogError(f"expected SASS text, got {type(sass_text).__name__}")
    instrs = list(_SASS_INSTR.finditer(sass_text))
    if not instrs:
        raise PtxasLogError("no SASS instructions found: expected cuobjdump --dump-sass output "
                            "with lines such as '/*0040*/ LDL R2, [R1+0x8] ;'")
    return instrs


def count_local_memory(sass_text: str, context_lines: int = 2) -> LocalMemoryStats:
    """Count LDL (local loads) and STL (local stores) in ``cuobjdump --dump-sass`` text and say where
    each one is. Spilled registers live in local memory, so these are the spill and refill points
    (plus any genuinely local arrays, which Triton kernels rarely have).

    Raises ``PtxasLogError`` when the text contains no SASS instructions.
    """
    instrs = _sass_instructions(sass_text)
    # A kernel's SASS runs to tens of thousands of lines and `spills` reads one per variant:
    # scan with whole-text regexes and only look closely at the few local-memory sites.
    functions = [(m.start(), m.group(1)) for m in _SASS_FUNCTION.finditer(sass_text)]
    starts = [pos for pos, _ in functions]

    def function_at(pos: int) -> str:
        i = bisect.bisect_right(starts, pos) - 1
        return functions[i][1] if i >= 0 else ""

    def text_of(m: re.Match) -> str:
        return " ".join(((m.group("pred") or "") + m.group("op") + m.group("rest")).split())

    sites: list[LocalMemorySite] = []
    per_function: dict[str, list[int]] = {}
    for i, m in enumerate(instrs):
        op = m.group("op")
        base = op.split(".", 1)[0]
        if base not in _LOCAL_OPS:
            continue
        fn = function_at(m.start())
        counts = per_function.setdefault(fn, [0, 0])
        counts[0 if base == "LDL" else 1] += 1
        lo, hi = max(0, i - context_lines), min(len(instrs), i + context_lines + 1)
        context = tuple(
            f"{'->' if j == i else '  '} /*{int(instrs[j].group('off'), 16):04x}*/ {text_of(instrs[j])}"
            for j in range(lo, hi) if function_at(instrs[j].start()) == fn)
        sites.append(LocalMemorySite(function=fn, offset=int(m.group("off"), 16),
                                     line=sass_text.count("\n", 0, m.start()) + 1, opcode=op,
                                     instruction=text_of(m), context=context))
    loads = sum(1 for s in sites if s.is_load)
    return LocalMemoryStats(
        loads=loads, stores=len(sites) - loads, sites=tuple(sites),
        per_function={fn: (c[0], c[1]) for fn, c in per_function.items()},
        instructions=len(instrs))


@dataclass(frozen=True)
class WaitStats:
    """How a kernel's SASS waits, counted statically (each instruction once, loops not unrolled)."""

    wgmma_groups: int  # wgmma groups issued: HGMMA instructions that close a group (`gsb0`)
    wgmma_waits: int  # WARPGROUP.DEPBAR: waits for earlier groups
    # The most groups issued between two waits. 1 means every matmul is waited for before the next
    # one starts, so no two ever overlap, whatever the source asked for.
    wgmma_in_flight: int
    barriers: int  # BAR.SYNC: CTA-wide or named barriers, written in the source or inserted


def count_waits(sass_text: str) -> WaitStats:
    """Count wgmma groups, the waits between them and barriers in ``cuobjdump --dump-sass`` text.

    Raises ``PtxasLogError`` when the text contains no SASS instructions.
    """
    groups = waits = barriers = most = run = 0
    for m in _sass_instructions(sass_text):
        op = m.group("op")
        if op.startswith("HGMMA") and "gsb0" in m.group("rest"):
            groups += 1
            run += 1
            most = max(most, run)
        elif op.startswith("WARPGROUP.DEPBAR"):
            waits += 1
            run = 0
        elif op.startswith("BAR.SYNC"):
            barriers += 1
    return WaitStats(wgmma_groups=groups, wgmma_waits=waits, wgmma_in_flight=most, barriers=barriers)


@dataclass(frozen=True)
class MatmulLoopStats:
    """The innermost SASS loops that issue wgmma, counted per iteration. A warp-specialized kernel
    has one copy per consumer; the figures are the worst copy's, since its consumer sets the pace."""

    loops: int  # innermost loops with wgmma, every copy
    instructions: int  # the longest body
    shuffles: int  # PRMT: byte permutes, e.g. a register operand's halves swapped before a matmul
    fences: int  # FENCE.VIEW.ASYNC: generic-to-async proxy fences, each also a MEMBAR
    local: int  # LDL + STL: spill traffic paid on every iteration
    # Of the loop's MUFU instructions (exp2 and the like), the share issued while a wgmma group is
    # still in flight: 1.0 when a softmax overlaps its own P·V, 0.0 when the code waits first; None
    # when no loop has any (a plain GEMM).
    mufu_overlap: float | None
    # In that copy, what the wgmma wait holding its first exponentials back sits next to
    # (`MUFU_WAITS`); None when none is held back.
    mufu_wait: str | None = None


# What a loop's full wgmma wait (DEPBAR.LE gsb0, 0x0) ahead of its exponentials sits next to. In
# the forward's KV loop ptxas put that wait where the peeled mask's branch rejoins; with the block
# split into a masked and an unmasked body, so that no branch rejoins inside either, the unmasked
# one issued every exponential with its P·V in flight (benchmarks/results/variants/fwd_two_bodies_*).
MUFU_WAITS = {
    "branch join": "a branch inside the loop rejoins there",
    "mbarrier arrive": "it comes right after an mbarrier arrive",
    "elsewhere": "next to neither a branch join nor an mbarrier arrive",
}
_NEAR = 2  # instructions before a wait that count as next to it


def _loop_bodies(instrs: list[re.Match]) -> list[list[re.Match]]:
    """Bodies of the innermost loops that contain an HGMMA: the span from a backward branch's target
    to the branch, keeping only spans that hold no other such span."""
    index = {int(m.group("off"), 16): i for i, m in enumerate(instrs)}
    spans = []
    for i, m in enumerate(instrs):
        if not m.group("op").startswith("BRA"):
            continue
        target = re.search(r"0x([0-9a-fA-F]+)", m.group("rest"))
        start = index.get(int(target.group(1), 16)) if target else None
        body = instrs[start:i] if start is not None and start < i else []
        # Out-of-line code after the kernel's exit (a barrier wait's retry) also branches back
        # into a loop: a span with an EXIT in it is not a loop body.
        if any(x.group("op").startswith("HGMMA") for x in body) and not any(x.group("op") == "EXIT" for x in body):
            spans.append((start, i))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    return [instrs[a:b + 1] for a, b in sorted(set(inner))]


def _in_flight(state: bool, m: re.Match) -> bool:
    """Whether a wgmma group is in flight after instruction `m`, given whether one was before it."""
    op = m.group("op")
    if op.startswith("HGMMA") and "gsb0" in m.group("rest"):
        return True
    if op.startswith("WARPGROUP.DEPBAR"):
        pending = re.search(r"0x([0-9a-fA-F]+)", m.group("rest"))
        return bool(pending and int(pending.group(1), 16) > 0)
    return state


def _mufu_overlap(body: list[re.Match]) -> tuple[int, int, str | None]:
    """(MUFU instructions, those issued with a wgmma group in flight, what the wait ahead of the
    first one issued without sits next to: a `MUFU_WAITS` key) in one loop body. The state at the
    top of the body is the one its end leaves (the loop comes round)."""
    state = False
    emptied = None  # index of the wait that last emptied the matmul pipe (in the previous round first)
    for i, m in enumerate(body):
        after = _in_flight(state, m)
        if state and not after:
            emptied = i
        state = after
    total = overlapped = 0
    held = None
    for i, m in enumerate(body):
        if m.group("op").startswith("MUFU"):
            total += 1
            overlapped += state
            if not state and held is None and emptied is not None:
                held = _next_to(body, emptied)
        after = _in_flight(state, m)
        if state and not after:
            emptied = i
        state = after
    return total, overlapped, held


def _next_to(body: list[re.Match], w: int) -> str:
    """What the wait at body[w] sits next to (`MUFU_WAITS`)."""
    targets = set()
    for m in body:
        if m.group("op").startswith("BRA"):
            t = re.search(r"0x([0-9a-fA-F]+)", m.group("rest"))
            if t:
                targets.add(int(t.group(1), 16))
    near = body[max(0, w - _NEAR):w + 1]
    if any(int(m.group("off"), 16) in targets for m in near):
        return "branch join"
    if any(m.group("op").startswith("SYNCS.ARRIVE") for m in near[:-1]):
        return "mbarrier arrive"
    return "elsewhere"


def matmul_loops(sass_text: str) -> MatmulLoopStats:
    """The per-iteration anatomy of the innermost wgmma loops in ``cuobjdump --dump-sass`` text (see
    ``MatmulLoopStats``); zeros when there is none. Raises ``PtxasLogError`` without SASS."""
    bodies = _loop_bodies(_sass_instructions(sass_text))
    if not bodies:
        return MatmulLoopStats(loops=0, instructions=0, shuffles=0, fences=0, local=0, mufu_overlap=None)

    def count(body, *prefixes):
        return sum(1 for m in body if m.group("op").startswith(prefixes))
    overlaps = [_mufu_overlap(b) for b in bodies]
    worst = min((o for o in overlaps if o[0]), key=lambda o: o[1] / o[0], default=None)
    return MatmulLoopStats(
        loops=len(bodies), instructions=max(len(b) for b in bodies),
        shuffles=max(count(b, "PRMT") for b in bodies), fences=max(count(b, "FENCE.VIEW.ASYNC") for b in bodies),
        local=max(count(b, *_LOCAL_OPS) for b in bodies),
        mufu_overlap=worst[1] / worst[0] if worst else None, mufu_wait=worst[2] if worst else None)
