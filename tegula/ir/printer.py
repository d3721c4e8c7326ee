"""Readable text of a traced kernel's tile IR.

    kernel scale(x: tensor<f32, rank 2>, y: tensor<f32, rank 2>) threads=128 BM=64  # line 3
      %r0: register<64x64, f32>                                 # line 6
      %x.0: global<64x64, f32> = view x origin ((block_id(0) * 64), 0) dims (64@d0, 64@d1)
      copy %x.0 -> %r0                                          # line 6

One line per op, loop and branch bodies indented; tiles print as `%name: scope<shape,
dtype>`. Shared buffers and register tiles are declared at the top (with their layouts in
CuTe notation once set); a global view is declared just before the first op that uses it,
since its origin may name loop indices. Synthesis results (`op.choices`) follow the op in
braces; the user's source line is a trailing comment.
"""
from __future__ import annotations

from typing import Any

from tegula.ir.ops import (AtomicAdd, Bitcast, Copy, Elementwise, Fill, ForLoop, Gemm, IfThen,
                           Indices, LastArrival, Op, Rearrange, Reduce, Reshape, Scan,
                           TracedKernel, tiles_read, tiles_written)
from tegula.ir.values import GlobalTile, RegisterTile, SharedAlloc, Tile, ViewDim, describe

_INDENT = "  "
_COMMENT_COLUMN = 56


def _number(x: Any) -> str:
    return repr(x) if isinstance(x, float) else str(x)


def _with_line(text: str, loc) -> str:
    if loc is None:
        return text
    return f"{text.ljust(_COMMENT_COLUMN)}  # line {loc.lineno}"


def _choices(op: Op) -> str:
    if not op.choices:
        return ""
    return " {" + ", ".join(f"{k}={op.choices[k]}" for k in sorted(op.choices)) + "}"


def _layout(layout: Any, pinned: bool) -> str:
    if layout is None:
        return ""
    return f" layout={layout}" + (" (pinned)" if pinned else "")


def _view_dim(d: ViewDim) -> str:
    step = "" if str(d.step) == "1" else f"*{d.step}"
    return f"{d.extent}@d{d.tensor_dim}{step}"


def global_view_text(t: GlobalTile) -> str:
    """`view a origin (…) dims (extent@dim*step, …)` — a global view's address map."""
    origin = ", ".join(str(o) for o in t.origin)
    dims = ", ".join(_view_dim(d) for d in t.dims)
    limits = "".join(f" d{d}<{upper}" for d, upper in t.limits)
    return f"view {t.arg.name} origin ({origin}) dims ({dims}){limits and ' limits' + limits}"


def _alloc_decl(a: SharedAlloc) -> str:
    dims = "x".join(str(s) for s in a.shape)
    return f"%{a.name}: shared<{dims}, {a.dtype}> x{a.stages} stages" + _layout(a.layout,
                                                                               a.pinned)


def _operand(t: Tile) -> str:
    return f"%{t.name}"


def _elementwise_text(op: Elementwise) -> str:
    tiles = iter(op.inputs)
    count = len(op.inputs) + len(op.scalars)
    operands = [_number(op.scalars[i]) if i in op.scalars else _operand(next(tiles))
                for i in range(count)]
    suffix = f" to {op.out.dtype}" if op.op == "cast" else ""
    return f"{_operand(op.out)} = {op.op} {', '.join(operands)}{suffix}"


def op_text(op: Op) -> str:
    """The one-line text of a non-block op (without choices and location)."""
    if isinstance(op, Copy):
        fill = f" fill={_number(op.fill)}" if op.fill != 0 else ""
        return f"copy {_operand(op.src)} -> {_operand(op.dst)}{fill}"
    if isinstance(op, Gemm):
        return f"gemm {_operand(op.c)}, {_operand(op.a)}, {_operand(op.b)}"
    if isinstance(op, Fill):
        return f"fill {_operand(op.dst)}, {_number(op.value)}"
    if isinstance(op, Elementwise):
        return _elementwise_text(op)
    if isinstance(op, Reduce):
        return f"{_operand(op.out)} = reduce.{op.kind} {_operand(op.x)}, axis={op.axis}"
    if isinstance(op, Scan):
        outs = ", ".join(_operand(t) for t in op.outs)
        xs = ", ".join(_operand(t) for t in op.xs)
        order = " reverse" if op.reverse else ""
        if op.initials:
            outs += "; carry " + ", ".join(_operand(t) for t in op.carries)
            xs += " from " + ", ".join(_operand(t) for t in op.initials)
        return f"{outs} = scan{order} {xs}, axis={op.axis}, combine={len(op.combine.ops)} op(s)"
    if isinstance(op, Rearrange):
        return f"{_operand(op.out)} = rearrange {_operand(op.x)}"
    if isinstance(op, Reshape):
        perm = f" transposed {tuple(op.perm)}" if op.perm else ""
        return f"{_operand(op.out)} = reshape {_operand(op.x)}{perm}"
    if isinstance(op, Bitcast):
        return f"{_operand(op.out)} = bitcast {_operand(op.x)}"
    if isinstance(op, Indices):
        offset = f" + {op.offset}" if not (isinstance(op.offset, int) and op.offset == 0) else ""
        return f"{_operand(op.out)} = indices axis={op.axis}{offset}"
    if isinstance(op, AtomicAdd):
        return f"atomic_add {_operand(op.src)} -> {_operand(op.dst)}"
    if isinstance(op, LastArrival):
        return f"{op.flag} = last_arrival {_operand(op.counter)}, count={op.count}"
    return f"<{type(op).__name__}>"


class _Printer:
    def __init__(self):
        self.lines: list[str] = []
        self.declared_views: set[int] = set()

    def role_blocks(self, loop: ForLoop, depth: int) -> None:
        """A pipeline body written as `tg.producer` / `tg.consumer` blocks: each block's
        ops under a `with` line (the body is one flat list; `loop.regions` names parts)."""
        for region in loop.regions:
            regs = f"regs={region.registers}" if region.registers else ""
            self.emit(depth, f"with {region.role}({regs}):", region.loc)
            self.block([op for op in loop.body if region.holds(op)], depth + 1)
        self.block([op for op in loop.body if not any(r.holds(op) for r in loop.regions)],
                   depth)  # what tracing added after the blocks (carried values)

    def emit(self, depth: int, text: str, loc=None) -> None:
        self.lines.append(_with_line(_INDENT * depth + text, loc))

    def block(self, ops: list[Op], depth: int) -> None:
        for op in ops:
            if isinstance(op, ForLoop):
                kind = "pipeline" if op.stages > 1 else "range"
                stages = f", stages={op.stages}" if op.stages > 1 else ""
                self.emit(depth, f"for {op.var} in {kind}({op.start}, {op.stop}, {op.step}"
                                 f"{stages}):{_choices(op)}", op.loc)
                if op.regions:
                    self.role_blocks(op, depth + 1)
                else:
                    self.block(op.body, depth + 1)
            elif isinstance(op, IfThen):
                self.emit(depth, f"if {op.cond}:{_choices(op)}", op.loc)
                self.block(op.then, depth + 1)
                if op.otherwise:
                    self.emit(depth, "else:")
                    self.block(op.otherwise, depth + 1)
            else:
                self.declare_views(op, depth)
                self.emit(depth, op_text(op) + _choices(op), op.loc)

    def declare_views(self, op: Op, depth: int) -> None:
        for t in tiles_read(op) + tiles_written(op):
            if isinstance(t, GlobalTile) and t.id not in self.declared_views:
                self.declared_views.add(t.id)
                self.emit(depth, f"{describe(t)} = {global_view_text(t)}")


def _signature(traced: TracedKernel) -> str:
    params = [f"{a.name}: tensor<{a.dtype}, rank {a.rank}>" for a in traced.args]
    params += [f"{name}: int" for name in traced.scalar_args]
    consts = "".join(f" {k}={v!r}" for k, v in traced.constexprs.items())
    return f"kernel {traced.name}({', '.join(params)}) threads={traced.threads}{consts}"


def format_kernel(traced: TracedKernel) -> str:
    """The whole kernel as text (see the module docstring for the format)."""
    p = _Printer()
    p.emit(0, _signature(traced), traced.loc)
    for a in traced.shared_allocs:
        p.emit(1, _alloc_decl(a), a.loc)
    for t in traced.register_tiles:
        p.emit(1, describe(t) + _layout(t.layout, t.pinned), t.loc)
    p.block(traced.body, 1)
    return "\n".join(p.lines) + "\n"


def format_tile(t: Tile) -> str:
    """One tile's declaration (`%name: scope<shape, dtype>` plus its layout or view)."""
    if isinstance(t, GlobalTile):
        return f"{describe(t)} = {global_view_text(t)}"
    if isinstance(t, RegisterTile):
        return describe(t) + _layout(t.layout, t.pinned)
    return describe(t)


__all__ = ["format_kernel", "format_tile", "op_text", "global_view_text"]
