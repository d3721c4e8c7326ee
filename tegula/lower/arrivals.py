"""`tg.last_arrival` in thread IR: one statement, `LastArrival`.

The statement is the whole arrival (`lang/arrivals.py`): a block barrier, thread 0's
`atom.acq_rel.gpu.global.inc.u32` on the counter element with bound count − 1, and a
`bar.red.or.pred` that gives every thread "thread 0 read count − 1" in `var`. It stays one
statement so that the emitter (`codegen/arrivals.py`) and the emulator
(`emulate/arrivals.py`) each see the protocol whole: the emulator models its ordering
(release / acquire between blocks), which separate barrier and atomic statements would
not say.
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.errors import SynthesisError
from tegula.ir.ops import LastArrival
from tegula.ir.values import GlobalTile, describe
from tegula.lower.addressing import global_address, scalar_expr
from tegula.lower.context import LoweringContext
from tegula.lower.thread_ir import Comment, Const, Expr, Stmt, Var, walk


@dataclass
class LastArrivalStmt(Stmt):
    """`var` = 1 in the block whose arrival on `tensor[index]` is the `count`-th, else 0,
    in every thread (block-uniform); the counter wraps to 0 at that arrival. `pred`: the
    element is inside the tensor (where it is not, the GPU traps and the emulator
    raises). Every thread of the block must execute it (it holds two block barriers)."""

    var: Var
    tensor: str
    index: Expr
    count: Expr
    pred: Expr | None = None
    loc: object = None      # the user's line (for refusals)


def lower_last_arrival(ctx: LoweringContext, op: LastArrival) -> list:
    if not isinstance(op.counter, GlobalTile):
        raise SynthesisError(f"last_arrival needs a global counter, got {describe(op.counter)}",
                             loc=op.loc)
    index, pred = global_address(op.counter, [Const(0)] * op.counter.rank, None)
    return [Comment(f"last_arrival {describe(op.counter)}, count={op.count}"),
            LastArrivalStmt(Var(op.flag.name), op.counter.arg.name, index,
                            scalar_expr(op.count), pred, op.loc)]


def refuse_arrivals_in_roles(body: list[Stmt]) -> None:
    """A warp-specialized pipeline splits the kernel body into roles around it
    (`lower/hopper.py`), and an arrival after it lands in the consumer role: its block
    barriers would wait forever for the producer warpgroup. Refused at the user's line."""
    for s in walk(body):
        for role in getattr(s, "roles", ()):
            found = next((x for x in walk(role.body) if isinstance(x, LastArrivalStmt)), None)
            if found is not None:
                raise SynthesisError(
                    "tg.last_arrival: the kernel runs in warp roles here (a producer warpgroup "
                    "issues a tg.pipeline's copies), and every thread of the block must "
                    "arrive; build with warp_specialize=False (or load_path=\"cp.async\")",
                    loc=found.loc)


__all__ = ["LastArrivalStmt", "lower_last_arrival", "refuse_arrivals_in_roles"]
