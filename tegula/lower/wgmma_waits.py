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
  group's registers (then its wait comes before the fence);
* before anything else — memory accesses, barriers, branches, loops, other async
  operations — and at the end of the body: a wait retiring every group a dropped wait
  covered, so shared memory a wgmma reads and the stage release after the body keep
  their order.

The emulator checks the result: it keeps a wgmma's registers busy until the wait that
retires it and reports any other statement touching them.

`split_reused_products` serves a body that fills a product tile again for a second gemm
after reading the first product: it repeats the stage's wait before the refill, which
ends ptxas's scheduling region (else ptxas issues the second gemm first, into registers
of its own).
"""
from __future__ import annotations

import dataclasses

from tegula.lower.async_ir import MBarrierWait, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait
from tegula.lower.thread_ir import Assign, Comment, If, LoadScalar, Reg, Shuffle, Stmt, walk

#: Statements a wait may move past: register-only arithmetic, warp shuffles (registers of
#: the warp's lanes; no memory) and comments.
_REGISTER_ONLY = (Assign, Shuffle, Comment)


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


def defer_wgmma_waits(stmts: list[Stmt]) -> list[Stmt]:
    """`stmts` (one straight-line body) with each `WgmmaWait(0)` replaced by waits at the
    first statements that need its groups retired (module docstring): before a register
    statement touching a group's registers, `wait_group n` with n the groups committed
    after it (those stay in flight); before anything else — memory, barriers, branches —
    and at the end, a wait for every group the dropped wait covered. A later gemm's
    fence, wgmmas and commit go by, unless they touch an in-flight group's registers.
    Statements keep their relative order otherwise."""
    out: list[Stmt] = []
    committed: list[set[str]] = []  # registers of each group not known retired, oldest first
    issued: set[str] = set()        # registers of the wgmmas issued since the last commit
    owed = 0                        # the oldest `owed` groups: a dropped wait(0) covered them

    def retire_through(last: int) -> None:
        """Emit the wait that retires groups 0 … last (the newer ones stay in flight)."""
        nonlocal committed, owed
        out.append(WgmmaWait(len(committed) - 1 - last))
        committed, owed = committed[last + 1:], max(0, owed - (last + 1))

    for index, stmt in enumerate(stmts):
        if isinstance(stmt, WgmmaWait):
            if stmt.pending == 0 and committed:
                owed = len(committed)       # dropped: paid where its groups are needed
                continue
            out.append(stmt)
            kept = committed[len(committed) - stmt.pending:] if stmt.pending else []
            owed = max(0, owed - (len(committed) - len(kept)))
            committed = kept
            continue
        if isinstance(stmt, WgmmaFence):
            touched = _touched_group(committed, _gemm_registers(stmts, index))
        elif isinstance(stmt, (Wgmma, WgmmaCommit)):
            touched = None                  # checked at the gemm's fence
        elif isinstance(stmt, _REGISTER_ONLY) or _register_only_branch(stmt):
            touched = _touched_group(committed, register_arrays(stmt))
        else:
            touched = owed - 1 if owed else None    # memory, control flow: pay every debt
        if touched is not None:
            retire_through(touched)
        if isinstance(stmt, Wgmma):
            issued |= _wgmma_arrays(stmt)
        if isinstance(stmt, WgmmaCommit):
            committed.append(issued)
            issued = set()
        out.append(stmt)
    if owed:
        retire_through(owed - 1)
    return out


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


def _touched_group(committed: list[set[str]], arrays: set[str]) -> int | None:
    """The newest in-flight group owning one of `arrays` (waiting for it retires every
    older one too), or None."""
    hits = [i for i, regs in enumerate(committed) if regs & arrays]
    return hits[-1] if hits else None


def _gemm_registers(stmts: list[Stmt], fence: int) -> set[str]:
    """The registers of the wgmmas from the fence at `fence` to their commit."""
    arrays: set[str] = set()
    for stmt in stmts[fence + 1:]:
        if isinstance(stmt, WgmmaCommit):
            break
        if isinstance(stmt, Wgmma):
            arrays |= _wgmma_arrays(stmt)
    return arrays


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


__all__ = ["defer_wgmma_waits", "register_arrays", "split_reused_products"]
