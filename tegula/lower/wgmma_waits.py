"""Late `wgmma.wait_group`: let register arithmetic run while the tensor cores work.

A gemm lowered onto wgmma ends in `WgmmaCommit(); WgmmaWait(pending)` (`hopper.py`
`lower_wgmma_gemm`). Inside a pipeline body that does more than the gemm, the wait is 0:
everything after it may read the accumulator. But the statements right after a gemm need
not: promoting the *previous* K block's partial product while this block's wgmmas run
(`acc += prev * prev_scale; prev = part`), the multiply-adds touch `acc`, `prev` and the
scales, not `part`, and waiting before them idles the tensor cores meanwhile. (Measured on
an H100, the blockwise FP8 GEMM written that way was still slower than promoting each
block after its own wait — 702 against 802 TFLOP/s: a third live 128×128 f32 tile — so
`kernels/fp8.py` does not.) The attention forward's overlapped key loop
(`kernels/attention.py`, OVERLAP) is FlashAttention-3's order: it issues s_{j+1} = q @
k_{j+1}ᵀ and acc += p_j @ v_j, and the softmax of block j+1 runs on the first while the
second still computes.

`defer_wgmma_waits` drops each `WgmmaWait(0)` that has groups to wait for and tracks the
committed groups (the register arrays each one's wgmmas read or write: the accumulator
`d`, a register A fragment). It pays the debt where it falls due:

* before a register statement (`Assign`, `Shuffle`, or a branch on scalars holding only
  those; `Comment`s pass freely) touching a group's registers: `wait_group n`, n the
  groups committed after that one, which stay in flight;
* a later gemm's `WgmmaFence`, wgmmas and commit go by unless they touch an in-flight
  group's registers (then its wait comes before the fence) — except a wgmma accumulating
  into exactly the registers of an in-flight wgmma of the same instruction (the same
  `d` list, a K step of the same product): the PTX ISA orders accumulator accesses
  across wgmma.mma_async instructions of the same shape by itself (`wgmma.fence`,
  "an ordering guarantee is provided by default"), as a K loop's wgmmas into one
  accumulator rely on. So a second gemm into an accumulator in flight (two k-steps an
  iteration, each with its own register A operand) issues at once;
* before a global access, a shared load, a scalar `Let` or a proxy fence only where it
  touches a group's registers (wgmmas read registers and shared memory only); before a
  shared store or stmatrix also where a group's wgmmas read its buffer (the backward's
  dQ staging store runs while dK's wgmmas do);
* before anything else — barriers, mbarriers, TMA, branches, loops, other async
  operations — and at the end of the body: a wait retiring every group a dropped wait
  covered, so shared memory a wgmma reads (another thread may write it past a barrier)
  and the stage release after the body keep their order.

`carry_wgmma_groups` goes one step further for a pipeline loop's body: the groups still
in flight at its end (the attention forward's p @ v, whose result the next iteration
needs only after its own q @ kᵀ) are not waited for there; the next iteration starts
with them in flight and retires them under the same rules, at the latest by its end, and
the loop releases the stage they read only after that wait (`lower/hopper.py`
`_carried_consumer_loop`; in one role, the release barrier ends the iteration). A body
is carried only where that keeps the registers its wgmmas hold in flight at once within
two thirds of a thread's register budget (or does not raise them).

The emulator checks the result: it keeps a wgmma's registers busy until the wait that
retires it and reports any other statement touching them, and it reports a TMA write
into shared bytes an in-flight wgmma still reads.

`split_reused_products` serves a body that fills a product tile again for a second gemm
after reading the first product: it repeats the stage's wait before the refill, which
ends ptxas's scheduling region (else ptxas issues the second gemm first, into registers
of its own).
"""
from __future__ import annotations

import dataclasses

from tegula.lower.async_ir import (FenceProxyAsync, MBarrierWait, SmemDesc, StMatrix, Wgmma,
                                   WgmmaCommit, WgmmaFence, WgmmaWait)
from tegula.lower.thread_ir import (Assign, Comment, Const, GlobalAtomicAdd, GlobalLoad,
                                    GlobalStore, If, Let, LoadScalar, Reg, SharedLoad,
                                    SharedStore, Shuffle, Stmt, walk)

#: Statements a wait may move past: register-only arithmetic, warp shuffles (registers of
#: the warp's lanes; no memory) and comments.
_REGISTER_ONLY = (Assign, Shuffle, Comment)
#: Memory statements a wait may move past unless they touch an in-flight group's registers:
#: wgmmas read only registers and shared memory, so global accesses, shared loads, scalar
#: lets and a proxy fence (this thread's generic writes made visible to later async reads)
#: race with none of them.
_NO_SHARED_WRITE = (GlobalLoad, GlobalStore, GlobalAtomicAdd, SharedLoad, Let,
                    FenceProxyAsync)
#: Shared stores: also not past a group whose wgmmas read their buffer.
_SHARED_WRITE = (SharedStore, StMatrix)


def register_arrays(node) -> set[str]:
    """Names of the register arrays a statement or expression reads or writes."""
    found: set[str] = set()
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, Reg):
            found.add(x.array.name)
            stack.append(x.index)
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
    return found


def _wgmma_arrays(stmt: Wgmma) -> set[str]:
    """The registers an in-flight wgmma owns: its accumulator, and A when in registers."""
    arrays = register_arrays(stmt.d)
    if isinstance(stmt.a, list):
        arrays |= register_arrays(stmt.a)
    return arrays


def defer_wgmma_waits(stmts: list[Stmt], register_a: bool = True) -> list[Stmt]:
    """`stmts` (one straight-line body) with each `WgmmaWait(0)` replaced by waits at the
    first statements that need its groups retired (module docstring): before a register
    statement touching a group's registers, `wait_group n` with n the groups committed
    after it (those stay in flight); before anything else — memory, barriers, branches —
    and at the end, a wait for every group the dropped wait covered. A later gemm's
    fence, wgmmas and commit go by, unless they touch an in-flight group's registers
    other than by accumulating into the same registers with the same instruction.
    Statements keep their relative order otherwise. `register_a` False keeps each wait
    that retires a wgmma reading A from registers where it is (the one-role pipeline:
    ptxas serializes every wgmma, C7513, where its stage — first wgmma to the wait —
    holds an instruction defining a wgmma's A registers, which the C compiler may give
    the in-flight operand's registers)."""
    return _Deferral(register_a, []).run(stmts, pay_at_end=True)


def carry_wgmma_groups(stmts: list[Stmt], register_a: bool = True,
                       registers: int | None = None) -> tuple | None:
    """A pipeline loop body (`stmts`, straight-line, run once per iteration) whose last
    wgmma groups stay in flight into the next iteration, or None where none would (every
    group is needed before the body ends). Returns (body, at): `body` as
    `defer_wgmma_waits` makes it, but with the groups still in flight at its end left
    running, and every group carried in from the previous iteration (the same ones: the
    body is the same each time) retired where its registers are first needed or, at the
    latest, before a memory or control statement or at the end; `at` is the index in
    `body` right after the wait that retires the last carried group, where the caller
    releases the previous iteration's stage (its readers, the carried wgmmas, retired
    there). The first iteration's waits find fewer groups in flight and return at once.
    After the loop the caller waits for every group (wait_group 0). None also where the
    carried groups would be retired before the next iteration issues a gemm of its own
    (nothing would overlap them: the overlapped attention loop, whose first statement
    writes the carried p @ v's A fragment), and where carrying would raise the registers
    its in-flight wgmmas own at once above two thirds of `registers` (a thread's budget,
    the consumer's setmaxnreg; by default `CARRY_WORDS`)."""
    first = _Deferral(register_a, [])
    first.run(stmts, pay_at_end=False)
    if not first.committed:
        return None
    carried = _Deferral(register_a, first.committed)
    body = carried.run(stmts, pay_at_end=False)
    if [g.arrays for g in carried.committed] != [g.arrays for g in first.committed]:
        return None     # not a fixed point (cannot happen for a straight-line body)
    limit = registers * 2 // 3 if registers else CARRY_WORDS
    if carried.peak > max(first.peak, limit):
        return None     # too many registers in flight at once (`CARRY_WORDS`)
    at = carried.carried_retired_at
    if not any(isinstance(stmt, WgmmaCommit) for stmt in body[:at]):
        return None     # retired before the next iteration issues anything: no overlap
    return body, at


#: The most 32-bit registers a thread's in-flight wgmmas may own at once in a carrying
#: body (where carrying raises that peak at all) when its register budget is not known;
#: else two thirds of the budget. ptxas needs them all allocated together and serializes
#: every wgmma where it cannot (C7511 / C7512). Measured with ptxas (CUDA 13, sm_90a): the
#: stated attention forward at D = 128 carries p @ v into the next q @ k^T at 160 of 240
#: registers, no warning; at 160 of 160 (three consumer warpgroups, 192-row tiles) C7511;
#: the stated dQ backward kernel would carry dS K into the next Q K^T and dO V^T at 224 of
#: 240, C7512.
CARRY_WORDS = 160


class _Deferral:
    """The pass of `defer_wgmma_waits` / `carry_wgmma_groups` over one body: `carried`,
    groups in flight when it starts (the previous iteration's), owed from the start."""

    def __init__(self, register_a: bool, carried: list):
        self.register_a = register_a
        self.committed: list[_Group] = list(carried)   # not known retired, oldest first
        self.carried = len(carried)     # the oldest `carried` of them: the previous body's
        self.owed = len(carried)        # the oldest `owed`: a dropped wait(0) covered them
        self.carried_retired_at = 0 if not carried else None
        self.out: list[Stmt] = []
        self.peak = 0       # the most 32-bit registers a thread's groups in flight own

    def retire_through(self, last: int) -> None:
        """Emit the wait that retires groups 0 … last (the newer ones stay in flight)."""
        self.out.append(WgmmaWait(len(self.committed) - 1 - last))
        self._retired(last + 1)

    def _retired(self, count: int) -> None:
        self.committed = self.committed[count:]
        self.owed = max(0, self.owed - count)
        if self.carried and count >= self.carried:
            self.carried_retired_at = len(self.out)
        self.carried = max(0, self.carried - count)

    def _memory_touch(self, stmt: Stmt) -> int | None:
        """The newest group a memory or control statement must see retired: for a global
        access, a shared load, a scalar `Let` or a proxy fence, only a group owning one of
        its registers (none of them writes shared memory a wgmma reads); for a shared
        store or stmatrix, also the newest group reading its buffer; for anything else
        (barriers, mbarriers, TMA, branches, loops) every group a dropped wait covered."""
        if not isinstance(stmt, _NO_SHARED_WRITE + _SHARED_WRITE):
            return self.owed - 1 if self.owed else None
        hits = [_touched_group(self.committed, register_arrays(stmt))]
        if isinstance(stmt, _SHARED_WRITE):
            hits.append(_reader_group(self.committed, stmt.buffer))
        hits = [h for h in hits if h is not None]
        return max(hits) if hits else None

    def run(self, stmts: list[Stmt], pay_at_end: bool) -> list[Stmt]:
        issued: list[Wgmma] = []        # the wgmmas issued since the last commit
        for index, stmt in enumerate(stmts):
            if isinstance(stmt, WgmmaWait):
                if stmt.pending == 0 and self.committed and \
                        (self.register_a or not any(g.register_a for g in self.committed)):
                    self.owed = len(self.committed)  # dropped: paid where needed
                    continue
                self.out.append(stmt)
                self._retired(max(0, len(self.committed) - stmt.pending))
                continue
            if isinstance(stmt, WgmmaFence):
                touched = _hazard_group(self.committed, _gemm_wgmmas(stmts, index))
            elif isinstance(stmt, (Wgmma, WgmmaCommit)):
                touched = None                  # checked at the gemm's fence
            elif isinstance(stmt, _REGISTER_ONLY) or _register_only_branch(stmt):
                touched = _touched_group(self.committed, register_arrays(stmt))
            else:
                touched = self._memory_touch(stmt)
            if touched is not None:
                self.retire_through(touched)
            if isinstance(stmt, Wgmma):
                issued.append(stmt)
            if isinstance(stmt, WgmmaCommit):
                self.committed.append(_Group(issued))
                issued = []
                self.peak = max(self.peak, _in_flight_words(self.committed))
            self.out.append(stmt)
        if pay_at_end and self.owed:
            self.retire_through(self.owed - 1)
        elif self.carried:
            self.retire_through(self.carried - 1)
        return self.out


def _reader_group(committed: list, buffer: str) -> int | None:
    """The newest in-flight group with a wgmma reading shared buffer `buffer`, or None."""
    hits = [i for i, group in enumerate(committed)
            if any(isinstance(x, SmemDesc) and x.buffer == buffer
                   for w in group.wgmmas for x in (w.a, w.b))]
    return hits[-1] if hits else None


def _in_flight_words(groups: list) -> int:
    """The 32-bit registers a thread's in-flight `groups` own (accumulators, register A
    fragments), each counted once."""
    owned = {(r.array.name, r.index) for g in groups for w in g.wgmmas for r in _owned(w)}
    sizes = {r.array.name: r.array.dtype.bits for g in groups for w in g.wgmmas
             for r in _owned(w)}
    return sum(sizes[name] for name, _ in owned) // 32


class _Group:
    """One committed wgmma group: its wgmmas, and the register arrays they own while in
    flight (each one's accumulator `d`, and its A fragment where A is in registers)."""

    def __init__(self, wgmmas: list[Wgmma]):
        self.wgmmas = wgmmas
        self.arrays: set[str] = set().union(*map(_wgmma_arrays, wgmmas)) if wgmmas else set()
        self.register_a = any(isinstance(w.a, list) for w in wgmmas)


def _owned(stmt: Wgmma) -> list:
    """The registers a wgmma owns while in flight (`d`, and A when in registers)."""
    return list(stmt.d) + (list(stmt.a) if isinstance(stmt.a, list) else [])


def _overlap(regs: list, others: list) -> bool:
    """Whether two register lists share a register (an index that is not a constant
    stands for its whole array)."""
    (exact, whole), (exact2, whole2) = _register_keys(regs), _register_keys(others)
    names = whole | {name for name, _ in exact}
    names2 = whole2 | {name for name, _ in exact2}
    return bool(exact & exact2 or whole & names2 or whole2 & names)


def _register_keys(regs: list) -> tuple[set, set]:
    """((array, index) of the registers at constant indices, arrays indexed otherwise)."""
    exact = {(r.array.name, r.index.value) for r in regs if isinstance(r.index, Const)}
    return exact, {r.array.name for r in regs if not isinstance(r.index, Const)}


def _chained(new: Wgmma, old: Wgmma) -> bool:
    """`new` accumulates into exactly `old`'s accumulator registers with the same
    instruction (shape and types), both reading A from shared memory: the hardware
    orders the two (module docstring), no wait needed between them. (A register A
    operand would be defined between the first wgmma and its wait, inside ptxas's
    pipeline stage, and ptxas then serializes every wgmma, C7513: the paired W4A16 and
    4-bit MoE steps measured 16 waits a loop in the SASS against 2.)"""
    return new.instr == old.instr and list(new.d) == list(old.d) and \
        not isinstance(new.a, list) and not isinstance(old.a, list)


def _hazard_group(committed: list[_Group], wgmmas: list[Wgmma]) -> int | None:
    """The newest in-flight group one of whose wgmmas shares registers with one of
    `wgmmas` (a later gemm's) other than as a same-instruction chain on one accumulator,
    or None."""
    hits = [i for i, group in enumerate(committed)
            if any(_overlap(_owned(new), _owned(old)) and not _chained(new, old)
                   for new in wgmmas for old in group.wgmmas
                   if group.arrays & _wgmma_arrays(new))]
    return hits[-1] if hits else None


def _register_only_branch(stmt: Stmt) -> bool:
    """A branch on scalars (no memory read in its condition) whose both sides are register
    arithmetic only: a wait moves past it as past its statements (the attention forward
    masks only the key blocks that reach past the diagonal or the end)."""
    if not isinstance(stmt, If) or any(isinstance(x, LoadScalar) for x in _nodes(stmt.cond)):
        return False
    return all(isinstance(x, _REGISTER_ONLY) for x in walk(stmt.then + stmt.otherwise))


def _nodes(expr):
    """Every node of an expression tree."""
    stack = [expr]
    while stack:
        x = stack.pop()
        yield x
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
        elif isinstance(x, (list, tuple)):
            stack.extend(x)


def _touched_group(committed: list[_Group], arrays: set[str]) -> int | None:
    """The newest in-flight group owning one of `arrays` (waiting for it retires every
    older one too), or None."""
    hits = [i for i, group in enumerate(committed) if group.arrays & arrays]
    return hits[-1] if hits else None


def _gemm_wgmmas(stmts: list[Stmt], fence: int) -> list[Wgmma]:
    """The wgmmas from the fence at `fence` to their commit."""
    found: list[Wgmma] = []
    for stmt in stmts[fence + 1:]:
        if isinstance(stmt, WgmmaCommit):
            break
        if isinstance(stmt, Wgmma):
            found.append(stmt)
    return found


def split_reused_products(stmts: list[Stmt], stage_wait: MBarrierWait) -> list[Stmt]:
    """`stmts` (a consumer's loop body after `defer_wgmma_waits`) with `stage_wait` — the
    body's wait on its stage's full mbarrier — repeated before the first write of a
    product tile that an earlier gemm of the body wrote and register statements since
    read (a tile reused for a second gemm: the blockwise FP8 kernel's row halves). Its
    phase is complete (the body holds the stage), so it returns at once; but its loop
    ends ptxas's scheduling region, and without it ptxas hoists the second gemm's
    wgmmas above the reads of the first product, giving the second its own registers
    (a 256x128 tile on two warpgroups: 64 more a thread, spills). Only where no wgmma
    group is in flight: ptxas retires every group before a branch (C7517), so a repeat
    there would cost a wait that the deferral had saved."""
    again = dataclasses.replace(stage_wait, repeat=True)
    out: list[Stmt] = []
    products: set[str] = set()      # accumulators of the wgmmas issued so far
    read: set[str] = set()          # of those, read by register statements since
    in_flight = 0                   # wgmma groups committed and not yet waited for
    for stmt in stmts:
        if isinstance(stmt, Assign) and stmt.dst.array.name in read and not in_flight and \
                stmt.dst.array.name not in register_arrays(stmt.value):
            out.append(again)
            read.clear()
        elif isinstance(stmt, _REGISTER_ONLY):    # what it reads (an Assign's target is not)
            read |= products & register_arrays(stmt.value if isinstance(stmt, Assign) else stmt)
        if isinstance(stmt, Wgmma):
            products |= register_arrays(stmt.d)
        in_flight = stmt.pending if isinstance(stmt, WgmmaWait) else \
            in_flight + isinstance(stmt, WgmmaCommit)
        out.append(stmt)
    return out


__all__ = ["carry_wgmma_groups", "defer_wgmma_waits", "register_arrays",
           "split_reused_products"]
