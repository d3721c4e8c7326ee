"""One-line descriptions of thread-IR statements, for error messages and reports."""
from __future__ import annotations

from tegula.lower.async_ir import (BulkWait, MBarrierArrive, MBarrierInit, MBarrierWait,
                                   NamedBarrier, Role, Roles, SmemDesc, TmaLoad, TmaStore, Wgmma,
                                   WgmmaWait)
from tegula.lower.arrivals import LastArrivalStmt
from tegula.lower.thread_ir import (Assign, Barrier, Comment, CpAsync, CpAsyncCommit, CpAsyncWait,
                                    For, GlobalAtomicAdd, GlobalLoad, GlobalStore, If, LdMatrix,
                                    Mma, Reg, SharedLoad, SharedStore, Shuffle, Stmt)


def _regs(r: Reg, count: int) -> str:
    return f"{r.array.name}[{r.index}]" + (f"..+{count}" if count > 1 else "")


def _pred(p) -> str:
    return "" if p is None else f" if {p}"


def _operand(x) -> str:
    if isinstance(x, SmemDesc):
        return (f"desc({x.buffer}[{x.offset}], lbo {x.leading_bytes}, sbo {x.stride_bytes}, "
                f"swizzle {x.swizzle})")
    return _regs(x[0], len(x))


def _describe_async(s: Stmt) -> str | None:
    """The asynchronous statements (`lower/async_ir.py`), or None."""
    if isinstance(s, MBarrierInit):
        return f"MBarrierInit {s.barrier}[{s.index}] count {s.count}{_pred(s.pred)}"
    if isinstance(s, MBarrierArrive):
        tx = f" expect_tx {s.tx_bytes}" if s.tx_bytes else ""
        return f"MBarrierArrive {s.barrier}[{s.index}]{tx}{_pred(s.pred)}"
    if isinstance(s, MBarrierWait):
        return (f"MBarrierWait {s.barrier}[{s.index}] parity {s.parity}"
                + (" (repeated)" if s.repeat else ""))
    if isinstance(s, TmaLoad):
        return (f"TmaLoad {s.buffer}[{s.offset}] <- {s.tensor_map}"
                f"[{', '.join(map(str, s.coords))}] on {s.barrier}[{s.barrier_index}]"
                f"{_pred(s.pred)}")
    if isinstance(s, TmaStore):
        return (f"TmaStore {s.tensor_map}[{', '.join(map(str, s.coords))}] <- "
                f"{s.buffer}[{s.offset}]{_pred(s.pred)}")
    if isinstance(s, BulkWait):
        return f"BulkWait{'.read' if s.read_only else ''} {s.pending}"
    if isinstance(s, Wgmma):
        return (f"Wgmma {s.instr} d={_operand(s.d)} a={_operand(s.a)} b={_operand(s.b)} "
                f"scale_d {s.scale_d}")
    if isinstance(s, WgmmaWait):
        return f"WgmmaWait {s.pending}"
    if isinstance(s, NamedBarrier):
        return (f"NamedBarrier{' arrive' if s.arrive else ''} {s.id} "
                f"({s.threads} threads)")
    if isinstance(s, Roles):
        return "Roles " + ", ".join(_role(r) for r in s.roles)
    return None


def _role(r: Role) -> str:
    return f"{r.name!r} if {r.cond}" + (f" ({r.loc})" if r.loc else "")


def describe(s: Stmt) -> str:
    """A short readable form of one statement (bodies of loops/branches elided)."""
    text = _describe_async(s)
    if text is not None:
        return text
    if isinstance(s, GlobalLoad):
        return (f"GlobalLoad {_regs(s.dst, s.count)} <- {s.tensor}[{s.index}] x{s.count}"
                f"{_pred(s.pred)}")
    if isinstance(s, GlobalStore):
        return (f"GlobalStore {s.tensor}[{s.index}] x{s.count} <- {_regs(s.src, s.count)}"
                f"{_pred(s.pred)}")
    if isinstance(s, GlobalAtomicAdd):
        return f"GlobalAtomicAdd {s.tensor}[{s.index}] += {_regs(s.src, 1)}{_pred(s.pred)}"
    if isinstance(s, SharedLoad):
        return (f"SharedLoad {_regs(s.dst, s.count)} <- {s.buffer}[{s.offset}] x{s.count}"
                f"{_pred(s.pred)}")
    if isinstance(s, SharedStore):
        return (f"SharedStore {s.buffer}[{s.offset}] x{s.count} <- {_regs(s.src, s.count)}"
                f"{_pred(s.pred)}")
    if isinstance(s, CpAsync):
        return (f"CpAsync {s.buffer}[{s.offset}] <- {s.tensor}[{s.index}] x{s.count}"
                f"{_pred(s.pred)}")
    if isinstance(s, CpAsyncCommit):
        return "CpAsyncCommit"
    if isinstance(s, CpAsyncWait):
        return f"CpAsyncWait {s.pending}"
    if isinstance(s, LdMatrix):
        t = ".trans" if s.trans else ""
        return f"LdMatrix.x{s.num}{t} {_regs(s.dst, 2 * s.num)} <- {s.buffer}[{s.offset}]"
    if isinstance(s, Mma):
        return f"Mma {s.instr} d={_regs(s.d[0], len(s.d))} a={_regs(s.a[0], len(s.a))} " \
               f"b={_regs(s.b[0], len(s.b))} c={_regs(s.c[0], len(s.c))}"
    if isinstance(s, Shuffle):
        return f"Shuffle.{s.mode}({s.arg}) {_regs(s.dst, 1)} <- {_regs(s.src, 1)}"
    if isinstance(s, Assign):
        return f"Assign {_regs(s.dst, 1)} = {type(s.value).__name__}"
    if isinstance(s, Barrier):
        return "Barrier"
    if isinstance(s, For):
        return f"For {s.var} in [{s.start}, {s.stop}) step {s.step}"
    if isinstance(s, If):
        return f"If {s.cond}"
    if isinstance(s, Comment):
        return f"// {s.text}"
    if isinstance(s, LastArrivalStmt):
        return f"LastArrival {s.var} = last of {s.count} on {s.tensor}[{s.index}]"
    return type(s).__name__
