"""Fresh wgmma products: clear by the instruction, not by register writes.

`part = tg.zeros(...); tg.gemm(part, a, b)` lowers to one `Assign(r[i], 0.0)` a register
and then the gemm's wgmmas, each `D = A·B + D` (`scale_d` 1). The first wgmma into a
register could as well compute `D = A·B` (`scale_d` 0) and the zeros never be written.
ptxas finds that itself for a lone product (the blockwise FP8 kernel's `RZ, !UPT`
operand), but not where two fresh products are issued back to back: it then moves the
second product's zero writes between the first product's wgmmas and waits for those
before issuing the second (`WARPGROUP.DEPBAR.LE gsb0, 0x0`; ptxas 13.0, sm_90a, the
blockwise FP8 kernel with two K blocks an iteration), so the two never overlap.

`clear_fresh_accumulators` rewrites each statement list (loop and branch bodies
included): a `Wgmma` whose every `d` register was last set to the constant 0.0 by an
`Assign` of the same list, with another gemm's group committed in between (the case
ptxas mishandles) and nothing in between touching those registers, gets `scale_d` 0, and
those `Assign`s are dropped. A lone fresh product keeps its zeros, for ptxas to fold as
it does: clearing those too changed ptxas's register allocation elsewhere (the attention
forward's 192-row tiles at 160 registers a thread spilled 24-32 B, session 14). Between
the zeros and the wgmma only statements that do not name the registers may stand (the
gemm's `WgmmaFence`, comments, other arrays' arithmetic, memory operations); a statement
naming a register (reading it, a branch or loop whose body names it) keeps its zero.
Nothing changes for a product accumulated across loop iterations (its zeros stand before
the loop, the wgmmas inside).
"""
from __future__ import annotations

import dataclasses

from tegula.lower.async_ir import Wgmma, WgmmaCommit, WgmmaFence
from tegula.lower.thread_ir import Assign, Comment, Const, Literal, Reg, Stmt

#: Statement fields holding nested statement lists (loop, branch and role bodies).
_BODIES = ("body", "then", "otherwise", "roles")


def _registers(node) -> set[tuple[str, object]]:
    """(array name, index) of every register element a statement or expression names;
    an index that is not a constant names the whole array as (name, None)."""
    found: set[tuple[str, object]] = set()
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, Reg):
            index = x.index.value if isinstance(x.index, Const) else None
            found.add((x.array.name, index))
            stack.append(x.index)
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            stack.extend(getattr(x, f.name) for f in dataclasses.fields(x))
    return found


def _zero_assign(s: Stmt) -> tuple[str, int] | None:
    """(array, index) where `s` sets one register element to the constant 0.0."""
    if (isinstance(s, Assign) and isinstance(s.value, Literal) and s.value.value == 0.0
            and isinstance(s.dst.index, Const)):
        return s.dst.array.name, s.dst.index.value
    return None


def _clear_list(stmts: list[Stmt]) -> list[Stmt]:
    """One statement list rewritten (its nested lists first)."""
    stmts = [_clear_nested(s) for s in stmts]
    fresh: dict[tuple[str, int], int] = {}       # register -> position of its zero Assign
    dropped: set[int] = set()
    commits: list[int] = []                      # positions of the WgmmaCommits so far
    for i, s in enumerate(stmts):
        zero = _zero_assign(s)
        if zero is not None:
            fresh[zero] = i
            continue
        if isinstance(s, WgmmaCommit):
            commits.append(i)
        if isinstance(s, (Comment, WgmmaFence, WgmmaCommit)):
            continue
        if isinstance(s, Wgmma):
            d = [(r.array.name, r.index.value) for r in s.d if isinstance(r.index, Const)]
            if (len(d) == len(s.d) and all(key in fresh for key in d)
                    and isinstance(s.scale_d, Const) and s.scale_d.value == 1
                    and commits and commits[-1] > max(fresh[key] for key in d)):
                dropped.update(fresh.pop(key) for key in d)
                stmts[i] = dataclasses.replace(s, scale_d=Const(0))
                named = _registers(s.a) if isinstance(s.a, list) else set()
            else:
                named = _registers(s)
        else:
            named = _registers(s)
        whole = {name for name, index in named if index is None}
        for key in [k for k in fresh if k in named or k[0] in whole]:
            del fresh[key]
    return [s for i, s in enumerate(stmts) if i not in dropped]


def _clear_nested(s: Stmt) -> Stmt:
    """`s` with its nested statement lists rewritten."""
    if not dataclasses.is_dataclass(s):
        return s
    changes = {}
    for name in _BODIES:
        value = getattr(s, name, None)
        if isinstance(value, list) and value and all(dataclasses.is_dataclass(x)
                                                     for x in value):
            changes[name] = (_clear_list(value) if name != "roles"
                             else [_clear_nested(r) for r in value])
    return dataclasses.replace(s, **changes) if changes else s


def clear_fresh_accumulators(stmts: list[Stmt]) -> list[Stmt]:
    """`stmts` with fresh wgmma products cleared by `scale_d` 0 (module docstring)."""
    return _clear_list(stmts)


__all__ = ["clear_fresh_accumulators"]
