"""Late `wgmma.wait_group 0`: let register arithmetic run while the tensor cores work.

A gemm lowered onto wgmma ends in `WgmmaCommit(); WgmmaWait(pending)` (`hopper.py`
`lower_wgmma_gemm`). Inside a pipeline body that does more than the gemm, the wait is 0:
everything after it may read the accumulator. But the statements right after a gemm need
not: promoting the *previous* K block's partial product while this block's wgmmas run
(`acc += prev * prev_scale; prev = part`), the multiply-adds touch `acc`, `prev` and the
scales, not `part`, and waiting before them idles the tensor cores meanwhile. (Measured on
an H100, the blockwise FP8 GEMM written that way was still slower than promoting each
block after its own wait — 702 against 802 TFLOP/s: a third live 128×128 f32 tile — so
`kernels/fp8.py` does not. What this moves today: in the attention forward on sm_90a,
the causal mask's index arithmetic after q @ k.T and the loop-carried row statistics after
p @ v — not yet measured on the GPU against the early wait.)

`defer_wgmma_waits` moves each `WgmmaWait(0)` down past the register statements
(`Assign`, `Comment`) that follow it and touch no register array an in-flight wgmma of its
group reads or writes (the accumulator `d`, a register A fragment). It stops at the first
statement that does, and at anything else — memory accesses, barriers, branches, loops,
other async operations — so shared memory a wgmma reads and the stage release after the
body keep their order. The emulator checks the result: it keeps a wgmma's registers busy
until the wait that retires it and reports any other statement touching them.
"""
from __future__ import annotations

import dataclasses

from tegula.lower.async_ir import Wgmma, WgmmaWait
from tegula.lower.thread_ir import Assign, Comment, Reg, Stmt

#: Statements a wait may move past: register-only arithmetic and comments.
_REGISTER_ONLY = (Assign, Comment)


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
    """`stmts` (one straight-line body) with each `WgmmaWait(0)` moved past the register
    statements after it that touch none of its group's wgmma registers (module
    docstring). Statements keep their relative order otherwise."""
    out: list[Stmt] = []
    busy: set[str] = set()          # registers of the wgmmas issued since the last wait
    waiting: Stmt | None = None     # a WgmmaWait(0) being carried down
    for stmt in stmts:
        if waiting is not None:
            if isinstance(stmt, _REGISTER_ONLY) and not register_arrays(stmt) & busy:
                out.append(stmt)
                continue
            out.append(waiting)
            waiting, busy = None, set()
        if isinstance(stmt, Wgmma):
            busy |= _wgmma_arrays(stmt)
        if isinstance(stmt, WgmmaWait) and stmt.pending == 0 and busy:
            waiting = stmt
            continue
        if isinstance(stmt, WgmmaWait) and stmt.pending == 0:
            busy = set()
        out.append(stmt)
    if waiting is not None:
        out.append(waiting)
    return out


__all__ = ["defer_wgmma_waits", "register_arrays"]
