"""Registers per thread from liveness: how many 32-bit registers a lowered kernel keeps
alive at once, and the per-thread limit its launch gives ptxas.

The estimate reads the *thread IR* (`tegula.lower.thread_ir`), whose register arrays are
what CUDA keeps in registers (their indices are constants after unrolling). The method:

1. Number the statements in program order (loop and branch bodies inline, both branches
   of an `If` one after the other). Each register array is live from the first statement
   that names it to the last.
2. Loops: an array named inside a loop (unrolled or not) whose interval reaches outside
   the loop, or whose first mention in the loop body is a read (a value carried from the
   previous iteration), is live across the whole loop: the back edge keeps it.
3. The pressure at a statement is the sum of the live arrays' sizes in 32-bit words
   (narrow types packed: 8 f16 values take 4 registers); the estimate is the maximum over
   the program, plus `ADDRESS_OVERHEAD` (`SIMPLE_OVERHEAD` without MMAs) registers for
   what the thread IR does not hold in arrays — addresses, loop counters, indices, predicates, the pipeline's stage offsets.
4. Warp roles (`async_ir.Roles`) run different code on different warps: each role is
   measured on its own (the statements around the `Roles` plus that role's body), and the
   kernel's figure is the largest role's.

5. An mma's operand fragments are live from the group of loads one k-step before their
   own (ptxas loads the next k-step's fragments while this one's mmas run):
   `_load_one_k_step_ahead`.
6. Outside loops some values are computed where they are used (`_compute_at_use`): a
   widening conversion (f16 to f32) at each of its reads (where one statement combines
   n of them, a balanced tree, about log2(n) + 1 at once), a product only a sum reads
   inside the sum.
7. Compile-time constants (literals, constant indices, what only they compute) and index
   expressions (a scalar plus a constant per element) hold no registers:
   `_fold_constants`.
8. A copy shares its source's register where the source is not overwritten while the
   copy is read (`_coalesce_copies`): a row vector of a wgmma tile is one value per row
   copied into each of a thread's elements, and tile copies rename.
9. Where the tile ops' order would hold more than the launch allows (`_estimate_under`),
   element-wise chains are evaluated element by element (`_sink_elementwise`): a tile
   temporary is computed just above its first element-wise reader where that costs no
   bits, so `gelu(acc)` holds the accumulator and a few values, not whole-tile
   temporaries.

`ADDRESS_OVERHEAD` is calibrated against ptxas (`nvcc 13.0`, `--ptxas-options=-v`) on the
library's kernels: see `tests/synth/test_cost_registers.py`, which records the measured
counts next to the estimates, and `benchmarks/register_table.py`, which compares the
estimate with the registers the SASS uses on the library's kernels (sm_90a and sm_80;
the errors are in docs/performance.md, session 12).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass

#: Registers beyond the live register arrays: addresses, loop counters, thread
#: coordinates, predicates. Calibrated against ptxas on the library kernels (module doc):
#: `ADDRESS_OVERHEAD` on kernels with MMAs (the median gap on the GEMMs: operand
#: addresses, stage offsets, descriptors), `SIMPLE_OVERHEAD` on kernels without (copy,
#: elementwise, softmax, norms, GEMV: gaps of -17 to +17, median 12, ptxas 13 on sm_90a,
#: session 9). One constant for both had every 512- and 1024-thread softmax block 10
#: registers over ptxas's count, at half its true occupancy (1 block per SM, not 2).
ADDRESS_OVERHEAD = 24
SIMPLE_OVERHEAD = 12

#: Register fields of statements that are written (all others are read). A wgmma's or an
#: mma's accumulator `d` is read as well when it accumulates: counted by `_READ_TOO`.
_WRITTEN = ("dst", "d")
_READ_TOO = ("Wgmma",)


@dataclass
class RegisterEstimate:
    """The liveness estimate of one kernel (or role): `live_words` at the peak, the arrays
    live there, and the estimate `registers` = live words + overhead. `roles` holds one
    estimate per warp role (empty when the kernel has one role)."""

    live_words: int
    peak_arrays: tuple[str, ...]   # "array: live elements of size dtype" at the peak
    overhead: int = ADDRESS_OVERHEAD
    role: str = ""
    roles: list["RegisterEstimate"] = field(default_factory=list)
    budget: int | None = None   # a warp role's setmaxnreg register budget

    @property
    def registers(self) -> int:
        return self.live_words + self.overhead

    def describe(self) -> str:
        """One line: the estimate, what is live at the peak."""
        arrays = ", ".join(self.peak_arrays) or "no register arrays"
        return (f"~{self.registers}, estimated from liveness ({self.live_words} words of "
                f"register arrays live at once, at the peak: {arrays}; + ~{self.overhead} "
                f"for addresses, indices and predicates)")


def per_thread_limit(target, threads: int, blocks_per_sm: int | None = None) -> int:
    """The most registers ptxas gives a thread of a block of `threads` compiled with
    `__launch_bounds__(threads)` (as codegen emits), or `__launch_bounds__(threads, B)` for
    `blocks_per_sm=B`: the register file shared by that many blocks, in the allocation unit
    of 8, at most the target's per-thread maximum."""
    share = target.regs_per_sm // max(1, threads * (blocks_per_sm or 1))
    return min(target.regs_per_thread_max, share // 8 * 8)


def over_limit(target, threads: int, live: RegisterEstimate,
               blocks_per_sm: int | None = None) -> list[str]:
    """Why the estimate exceeds what a thread may hold, one reason per role over its cap
    (a role's setmaxnreg budget, else the per-thread limit for `threads` and
    `blocks_per_sm`); [] when none."""
    limit = per_thread_limit(target, threads, blocks_per_sm)
    reasons = []
    for est in live.roles or [live]:
        cap = est.budget if est.budget is not None else limit
        if est.registers > cap:
            who = f"warp role {est.role}: " if est.role else ""
            why = "its setmaxnreg budget" if est.budget is not None else \
                f"what a block of {threads} threads allows" + (
                    f" at {blocks_per_sm} blocks per SM" if blocks_per_sm else "")
            reasons.append(f"{who}~{est.registers} registers per thread estimated from "
                           f"liveness, over {cap} ({why})")
    return reasons


def estimate_registers(thread_kernel) -> RegisterEstimate:
    """The liveness estimate of a lowered kernel (see the module docstring)."""
    roles = _roles_statement(thread_kernel.body)
    cap = _launch_cap(thread_kernel)
    if roles is None:
        return _estimate_under(thread_kernel.body, "", cap)
    per_role = []
    for role in roles.roles:
        body = [s for s in thread_kernel.body if s is not roles] + list(role.body)
        estimate = _estimate_under(body, role.name, role.max_registers or cap)
        if role.max_registers is not None:
            estimate.role = f"{role.name} (setmaxnreg {role.max_registers})"
            estimate.budget = role.max_registers
        per_role.append(estimate)
    top = max(per_role, key=lambda e: e.registers)
    return RegisterEstimate(top.live_words, top.peak_arrays, overhead=top.overhead,
                            role=top.role, roles=per_role)


def _launch_cap(thread_kernel) -> int:
    """The registers a thread may hold under the kernel's launch bounds: 65536 a block
    (an SM's register file on sm_80 and sm_90), shared by `blocks_per_sm` blocks, in
    units of 8, at most 255 (as `per_thread_limit`, which needs the target)."""
    share = 65536 // max(1, thread_kernel.threads * (thread_kernel.blocks_per_sm or 1))
    return min(255, share // 8 * 8)


def _estimate_under(body: list, role: str, cap: int) -> "RegisterEstimate":
    """The estimate of `body`, its element-wise chains interleaved (`_sink_elementwise`)
    only where the tile-op order would exceed `cap`: ptxas keeps the lowering's order and
    its whole-tile temporaries while registers allow (silu(a) * b on sm_80: 63 registers,
    the order's count), and computes element by element when they do not (the bias+silu
    GEMM epilogue: 168 registers, where the order holds 281)."""
    estimate = _estimate(body, role, sink=False)
    if estimate.registers <= cap:
        return estimate
    sunk = _estimate(body, role, sink=True)
    return sunk if sunk.registers < estimate.registers else estimate


def _roles_statement(body: list):
    return next((s for s in body if hasattr(s, "roles") and isinstance(s.roles, list)), None)


@dataclass
class _Interval:
    """The live range of one register element (array name, element index)."""

    bits: int
    first: int
    last: int
    mentions: list = field(default_factory=list)   # (position, is_read)


def _estimate(body: list, role: str, sink: bool = True) -> RegisterEstimate:
    intervals: dict[tuple, _Interval] = {}
    loops: list[tuple[int, int]] = []
    arrays: dict[str, object] = {}
    fragments: set[str] = set()
    defs: dict = {}
    end = _number(body, 0, intervals, loops, arrays, fragments, defs)
    _fold_constants(intervals, defs)
    _load_one_k_step_ahead(intervals, fragments)
    _compute_at_use(intervals, defs, loops)
    if sink:
        _sink_elementwise(intervals, defs)
    intervals = _coalesce_copies(intervals, defs.get("copies", {}), loops)
    # Nested loops: extend until nothing changes (intervals only grow, so this ends).
    while any([_extend_over(loop, intervals) for loop in loops]):
        pass
    change = [0] * (end + 2)             # live bits' differences, summed below
    for iv in intervals.values():
        change[iv.first] += iv.bits
        change[iv.last + 1] -= iv.bits
    pressure, running = [], 0
    for delta in change[:-1]:
        running += delta
        pressure.append(running)
    peak = max(range(len(pressure)), key=lambda p: pressure[p], default=0)
    live: dict[str, int] = {}
    for name, _ in {key[:2] for key, iv in intervals.items() if iv.first <= peak <= iv.last}:
        live[name] = live.get(name, 0) + 1   # elements (one may hold two values at once)
    described = tuple(f"{name}: {count} of {arrays[name].size} {arrays[name].dtype}"
                      for name, count in sorted(live.items(), key=lambda kv: -kv[1] *
                                                arrays[kv[0]].dtype.bits))
    words = -(-pressure[peak] // 32) if pressure else 0
    overhead = ADDRESS_OVERHEAD if _uses_tensor_cores(body) else SIMPLE_OVERHEAD
    return RegisterEstimate(words, described, overhead=overhead, role=role)


def _uses_tensor_cores(body: list) -> bool:
    """Whether any statement of `body` (through loops, branches and roles) is an MMA."""
    from tegula.lower.thread_ir import walk
    return any(type(st).__name__ in ("Mma", "Wgmma") for st in walk(body))


def _number(stmts: list, position: int, intervals: dict, loops: list, arrays: dict,
            fragments: set, defs: dict) -> int:
    """Give each statement a position, record each register element's mentions and each
    loop's span, and the arrays an mma reads (`fragments`); returns the next free
    position."""
    for stmt in stmts:
        name = type(stmt).__name__
        if name == "For":
            start = position
            position = _number(stmt.body, position + 1, intervals, loops, arrays, fragments,
                               defs)
            loops.append((start, position))
            defs.setdefault("regions", []).append((start + 1, position - 1))
            position += 1
        elif name == "If":
            for branch in (stmt.then, stmt.otherwise):
                start = position
                position = _number(branch, position, intervals, loops, arrays, fragments,
                                   defs)
                defs.setdefault("regions", []).append((start, position - 1))
        elif hasattr(stmt, "roles") and isinstance(stmt.roles, list):
            for r in stmt.roles:  # only reached for nested roles: measured together
                position = _number(r.body, position, intervals, loops, arrays, fragments, defs)
        else:
            constant = name == "Assign" and _record_def(stmt, position, defs)
            if name == "Assign":
                defs.setdefault("assigns", set()).add(position)
            if name == "Assign" and type(stmt.value).__name__ == "RegRead" and \
                    _constant(stmt.dst.index) and _constant(stmt.value.reg.index):
                defs.setdefault("copies", {})[(position, _key(stmt.dst))] = \
                    _key(stmt.value.reg)
            elif name == "Assign" and type(stmt.value).__name__ == "Literal" and \
                    _constant(stmt.dst.index):   # a constant: copied from no register
                defs.setdefault("copies", {})[(position, _key(stmt.dst))] = \
                    ("literal", repr(stmt.value))
            if name in ("Barrier", "Shuffle"):   # a reduction's exchanges
                defs.setdefault("exchanges", []).append(position)
            for reg, count, is_read, written in _registers_of(stmt):
                array = reg.array
                arrays[array.name] = array
                elements = _elements(reg, count)
                if name == "Mma" and is_read:
                    fragments.add(array.name)
                for element in elements:
                    key = (array.name, element)
                    if written and not constant:   # written by a load, an mma, ...
                        defs.setdefault("varying", set()).add(key)
                    iv = intervals.get(key)
                    if iv is None:
                        iv = intervals[key] = _Interval(array.dtype.bits, position, position)
                    iv.first, iv.last = min(iv.first, position), max(iv.last, position)
                    iv.mentions.append((position, is_read))
            position += 1
    return position


def _record_def(stmt, position: int, defs: dict) -> bool:
    """Note an element assignment whose element and operands are all at constant indices:
    (position, its operand elements) by the element it writes, and which of them widen a
    16-bit float to f32; True when the value is a compile-time constant."""
    regs = _regs_in(stmt.value)
    if all(_constant(r.index) for r in [stmt.dst] + regs):
        key, operands = (stmt.dst.array.name, stmt.dst.index.value), \
            [(r.array.name, r.index.value) for r in regs]
        defs.setdefault("elements", {})[key] = (position, operands)
        if key in operands:
            defs.setdefault("accumulations", set()).add(position)
        if _is_widening(stmt.value):
            defs.setdefault("widened", set()).add(key)
        # An index expression (`tg.arange` plus a loop's offset: a scalar plus a constant
        # per element) holds no register either: ptxas adds the constant where it is read,
        # or folds it into a compare's immediate (the attention mask's key indices).
        if _is_constant(stmt.value, defs.get("constants", {})) or \
                type(stmt.value).__name__ == "IndexValue":
            defs.setdefault("constants", {}).setdefault(key, []).extend(operands)
            return True
    return False


def _constant(index) -> bool:
    return type(index).__name__ == "Const"


def _compute_at_use(intervals: dict, defs: dict, loops: list) -> None:
    """ptxas computes a value where it is used, not where the tile program puts it (one
    op over the whole tile, then the next): step 6 of the module docstring. Outside loops,
    for an element assigned once at constant indices, from the last such assignment to
    the first:

    * a widening conversion (f16/bf16 to f32) read across a reduction's exchanges
      (shuffles, barriers) is redone at each of its reads: the element is live only
      there, its 16-bit source until the last of them. Measured (ptxas 13, sm_90a):
      RMSNorm keeps x and the weight in 16 bits across its reduction (64 of 1024 per
      thread on 1024 threads: 32 registers, estimated 46 holding x in f32); an
      elementwise silu(a) * b, with no exchange, keeps a and b in f32 (63 registers on
      sm_80, estimated 46 with the conversions moved);
    * a value read only by a sum, whose operands are live there anyway, is folded into
      the sum (x * x summed is one FFMA an element: RMSNorm 4 x 1024 on 128 threads, 63
      registers, was estimated at 109 holding x and x * x at once).

    (Computing every value read once at its read, where it keeps no more operand bits
    alive than it frees, as ptxas interleaves elementwise chains, took blocks per SM
    from the estimate = ptxas's on 312 softmax/RMSNorm configurations from 252 down to
    215: it undercounts by up to 31 registers.)"""
    def in_loop(position):
        return any(start <= position <= stop for start, stop in loops)

    elements = defs.get("elements", {})
    widened_at: dict = {}          # position -> the widened elements redone there
    for key, (position, operands) in sorted(elements.items(), key=lambda kv: -kv[1][0]):
        iv = intervals.get(key)
        if iv is None or in_loop(position):
            continue
        reads = sorted(p for p, is_read in iv.mentions if is_read)
        writes = [p for p, is_read in iv.mentions if not is_read]
        if writes != [position] or not reads or any(in_loop(p) for p in reads) \
                or any(op not in intervals for op in operands):
            continue
        if key in defs.get("widened", ()) and any(position < x < reads[-1]
                                                  for x in defs.get("exchanges", ())):
            _move_reads(intervals[operands[0]], position, reads)
            del intervals[key]
            for i, read in enumerate(reads):
                intervals[key + (i,)] = _Interval(iv.bits, read, read, [(read, True)])
                widened_at.setdefault(read, []).append(key + (i,))
            continue
        use = reads[0]
        if len(reads) != 1 or use not in defs.get("accumulations", ()) \
                or any(intervals[op].last < use for op in operands):
            continue
        for op in operands:
            _move_reads(intervals[op], position, [use])
        iv.first = iv.last = use
        iv.mentions = [(use, False), (use, True)]
    # A statement that combines n redone conversions as one expression (a row's max as a
    # balanced tree) holds about log2(n) + 1 of them at once, not n.
    for keys in widened_at.values():
        for key in keys[(len(keys)).bit_length():]:
            del intervals[key]


def _sink_elementwise(intervals: dict, defs: dict) -> None:
    """ptxas evaluates a chain of element-wise tile ops element by element (step 9 of the
    module docstring): the lowering writes `t = -x` over the whole tile, then `e = exp(t)`
    over it, but ptxas computes each element of t just before the exp that reads it, so a
    tile temporary holds no register of its own. An element written once, at constant
    indices (not a widening conversion: outside the exchanges of `_compute_at_use`
    ptxas converts 16-bit values up front, silu(a) * b on sm_80 holds a and b in f32),
    moves down to its first read when that read is an element-wise statement
    (not an mma reading a whole fragment) in the same loop body or branch, none of its
    operands is written in between, and the move costs no bits: the operands it keeps
    alive longer gain fewer bit-positions than the element frees (an operand live there
    anyway gains none; the latest elements first, so whole chains collapse).
    Measured (ptxas 13, sm_90a): the bias+silu GEMM epilogue held the 128-element
    accumulator and two 128-element temporaries (281 estimated), where ptxas uses 168."""
    elements, assigns = defs.get("elements", {}), defs.get("assigns", set())
    widened = defs.get("widened", set())   # converted up front: ptxas holds them in f32
    regions = sorted(defs.get("regions", []), key=lambda span: span[1] - span[0])

    def region(position):
        return next((span for span in regions if span[0] <= position <= span[1]), None)

    for key, (position, operands) in sorted(elements.items(), key=lambda kv: -kv[1][0]):
        iv = intervals.get(key)
        if iv is None or key in operands or key in widened or \
                [p for p, is_read in iv.mentions if not is_read] != [position]:
            continue
        reads = sorted(p for p, is_read in iv.mentions if is_read)
        if not reads or reads[0] <= position or reads[0] not in assigns or \
                region(reads[0]) != region(position):
            continue
        use = reads[0]
        live = [op for op in dict.fromkeys(operands) if op in intervals]   # folded: none
        if any(position < p < use for op in live
               for p, is_read in intervals[op].mentions if not is_read):
            continue
        # bit-positions the operands gain (live on to the new place) against those the
        # element frees (its own value from here to there)
        gained = sum(intervals[op].bits * (use - 1 - max(intervals[op].last, position))
                     for op in live if intervals[op].last < use - 1)
        if gained > iv.bits * (use - 1 - position):
            continue
        # Just above the reader (one position up: a write at its reader's position would
        # read as a value carried into the loop, `_extend_over`)
        for op in live:
            _move_reads(intervals[op], position, [use - 1])
        iv.mentions = [(use - 1 if (p, r) == (position, False) else p, r)
                       for p, r in iv.mentions]
        iv.first = use - 1


def _key(reg) -> tuple:
    return (reg.array.name, reg.index.value)


def _coalesce_copies(intervals: dict, copies: dict, loops: list) -> dict:
    """A copy holds no register of its own: ptxas gives a register's copy the register
    itself where the source is not overwritten while the copy is read (step 8 of the module
    docstring). The lowering writes many: a row vector of a wgmma tile (attention's m_i and
    l_i) holds one value per row in each of the 32 elements a thread has, written as copies
    of the row's first element, and tile copies (`s.assign(p)`, the masked scores) rename.
    An element all of whose writes are such copies (a copy of a folded constant aside)
    joins its sources' register; elements of one register share one interval (the union
    of theirs). Returns the intervals by register."""
    writes: dict = {}
    reads: dict = {}
    for key, iv in intervals.items():
        writes[key] = sorted(p for p, is_read in iv.mentions if not is_read)
        reads[key] = sorted(p for p, is_read in iv.mentions if is_read)
    parent: dict = {}
    starts: dict = {}

    def find(key):
        while parent.get(key, key) != key:
            key = parent[key]
        return key

    for key in intervals:
        sources = [copies.get((p, key)) for p in writes[key]]
        if not sources or None in sources:
            continue
        kept = [(p, src) for p, src in zip(writes[key], sources) if src in intervals]
        if kept and all(_copy_holds(p, key, src, writes, reads, loops) for p, src in kept):
            for _, src in kept:
                root, other = find(src), find(key)
                if root != other:
                    parent[other] = root
            # the constants it starts from (a literal, a folded tile's element): elements
            # starting from different ones are different values until the first copy
            starts[key] = tuple(sorted({repr(src) for src in sources if src not in intervals}))
    if not parent:
        return intervals
    merged: dict = {}
    for key, iv in intervals.items():
        root = find(key) + starts.get(key, ())
        into = merged.get(root)
        if into is None:
            merged[root] = _Interval(iv.bits, iv.first, iv.last, list(iv.mentions))
        else:
            into.bits = max(into.bits, iv.bits)
            into.first, into.last = min(into.first, iv.first), max(into.last, iv.last)
            into.mentions += iv.mentions
    return merged


def _copy_holds(position: int, dst: tuple, src: tuple, writes: dict, reads: dict,
                loops: list) -> bool:
    """Whether no write of `src` falls between the copy into `dst` at `position` and a read
    of `dst` that copy reaches: the later reads up to dst's next write, and where no write
    of dst follows in the innermost loop holding the copy, the reads at that loop's top
    before its first write of dst (the next iteration's)."""
    later = [p for p in writes[dst] if p > position]
    stop = later[0] if later else float("inf")
    spans = [(position, r) for r in reads[dst] if position < r < stop]
    inner = [loop for loop in loops if loop[0] <= position <= loop[1]]
    if inner:
        start, end = min(inner, key=lambda loop: loop[1] - loop[0])
        if not any(position < p <= end for p in writes[dst]):
            top = min([p for p in writes[dst] if p >= start] + [end + 1])
            spans += [(position, end), *((start - 1, r) for r in reads[dst] if start <= r < top)]
    return not any(a < p < b for a, b in spans for p in writes[src])


def _move_reads(iv: "_Interval", position: int, to: list) -> None:
    """An operand read at `position` is read at the positions `to` instead."""
    if (position, True) in iv.mentions:
        iv.mentions.remove((position, True))
    iv.mentions += [(p, True) for p in to]
    iv.last = max([iv.last] + list(to))


def _is_constant(value, constants: dict) -> bool:
    """Whether `value` is known when the kernel is compiled: literals, constant indices
    (`tg.indices` along a thread's own elements), and elements already known so."""
    kind = type(value).__name__
    if kind == "Literal":
        return True
    if kind == "IndexValue":
        return _constant(value.expr)
    if kind == "RegRead":
        return _constant(value.reg.index) and \
            (value.reg.array.name, value.reg.index.value) in constants   # so far
    parts = [getattr(value, f.name) for f in fields(value)] if is_dataclass(value) else []
    operands = [part for part in parts if hasattr(part, "dtype") and is_dataclass(part)]
    return bool(operands) and all(_is_constant(part, constants) for part in operands)


def _fold_constants(intervals: dict, defs: dict) -> None:
    """ptxas folds what the compiler knows: an element every assignment of which is a
    compile-time constant holds no register (W4A16's fragment kernel selects each word's
    pair slot by `tg.indices`, a constant per element: its 64 slot indices and 128
    comparisons were estimated live at once, 117 registers where ptxas uses 66)."""
    varying = defs.get("varying", set())
    folded = {key for key in defs.get("constants", {}) if key not in varying}
    while True:   # an operand assigned a varying value elsewhere (a loop) unfolds its users
        unfold = {key for key in folded
                  if any(op not in folded for op in defs["constants"][key])}
        if not unfold:
            break
        folded -= unfold
    for key in folded:
        intervals.pop(key, None)


def _is_widening(value) -> bool:
    """Whether `value` converts one register element of a narrower float type to a wider
    one (f16/bf16 to f32)."""
    return (type(value).__name__ == "Cast" and type(value.x).__name__ == "RegRead"
            and value.dtype.is_float and value.x.dtype.is_float
            and value.x.dtype.bits < value.dtype.bits)


def _load_one_k_step_ahead(intervals: dict, fragments: set) -> None:
    """ptxas loads the next k-step's operand fragments while this k-step's mmas run
    (hiding the ldmatrix latency): an mma operand array's elements written by one group of
    loads (a k-step: the writes between two runs of reads) are live from the start of
    the group before it. Measured (ptxas 13, mma.sync GEMM, BK = 64 = 4 k-steps): the
    whole array live at every mma overstated 128x128 tiles by ~40 registers (280 vs
    242), each k-step's own slice alone understated them by ~60."""
    for name in fragments:
        events = sorted((position, is_read, key) for key, iv in intervals.items()
                        if key[0] == name for position, is_read in iv.mentions)
        group_starts, previous_was_read = [], True
        for position, is_read, key in events:
            if not is_read and previous_was_read:
                group_starts.append(position)
            previous_was_read = is_read
            if not is_read and len(group_starts) > 1:
                iv = intervals[key]
                iv.first = min(iv.first, group_starts[-2])


def _elements(reg, count: int) -> range:
    """The elements `count` consecutive registers from `reg` name: exact for a constant
    index, the whole array for an index that varies (an unrolled loop's variable)."""
    index = getattr(reg.index, "value", None)
    if isinstance(index, int):
        return range(index, min(index + count, reg.array.size))
    return range(reg.array.size)


def _extend_over(loop: tuple[int, int], intervals: dict) -> bool:
    """Extend the arrays the loop's back edge keeps alive over the whole loop; True when
    some interval grew."""
    start, stop = loop
    grew = False
    for iv in intervals.values():
        # A statement reads its operands before it writes its result: reads sort first.
        inside = sorted((m for m in iv.mentions if start <= m[0] <= stop),
                        key=lambda m: (m[0], not m[1]))
        if not inside:
            continue
        carried = iv.first < start or iv.last > stop or inside[0][1]
        if carried and (iv.first > start or iv.last < stop):
            iv.first, iv.last = min(iv.first, start), max(iv.last, stop)
            grew = True
    return grew


def _registers_of(stmt) -> list:
    """(Reg, consecutive elements, is_read, written) for every register a statement names (values
    and lists of them walked), by field: `dst`/`d` are written, the rest read. Vector
    memory statements move `count` consecutive registers (ldmatrix: two 16-bit values per
    matrix)."""
    found = []
    if not is_dataclass(stmt):
        return found
    read_too = type(stmt).__name__ in _READ_TOO
    count = getattr(stmt, "count", 1)
    if type(stmt).__name__ == "LdMatrix":
        count = 2 * stmt.num
    for f in fields(stmt):
        written = f.name in _WRITTEN
        for reg in _regs_in(getattr(stmt, f.name)):
            vector = count if f.name in ("dst", "src") else 1
            found.append((reg, vector, not written or read_too, written))
    return found


def _regs_in(x) -> list:
    if hasattr(x, "array") and hasattr(x, "index"):   # thread_ir.Reg
        return [x]
    if isinstance(x, (list, tuple)):
        return [r for item in x for r in _regs_in(item)]
    if is_dataclass(x) and not isinstance(x, type):
        return [r for f in fields(x) for r in _regs_in(getattr(x, f.name))]
    return []
