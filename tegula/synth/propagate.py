"""Thread-value layout propagation (Hexcute Algorithm 1, with its gaps closed).

Every register tile needs one TV layout. Anchors fix some of them: gemm accumulators and
register operands get the tiled MMA fragment layouts (chosen in `synth.gemm`), and a tile
loaded from or stored to global memory, when nothing else decides it, gets the coalesced
partition of that global tile. Constraints then carry layouts along the ops in both
directions until nothing changes:

* elementwise / cast / register-to-register copy: all full-shape operands share the
  output's layout; a broadcast operand (size-1 dims) gets the output's layout projected
  onto its shape (where that projection is no CuTe layout, the check computes the op in a
  coalesced partition between conversions);
* reduce: the output is the input's layout projected along the reduced axis;
* reshape: each thread keeps its registers, the flat indices renamed (the same layout
  where only size-1 dims change, `layout/reshape.py`); `indices` has no operand and
  takes the layout its users want.

Unlike Hexcute, which drops constraints whose variables are already fixed, every
constraint is *checked* once all its layouts are known (`check_constraints`); a violated
one becomes an explicit `Rearrange` (a layout conversion) in front of the op — after it,
for a reduction whose output layout was fixed elsewhere — unless both layouts were pinned
by the user, which is reported with both source lines.

The visit order is the op order of the kernel, and anchors are taken in op order, so the
result does not depend on dictionary or set iteration order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tegula.errors import SynthesisError
from tegula.ir.ops import (Bitcast, Copy, Elementwise, Op, Rearrange, Reduce, Reshape,
                           TracedKernel, walk_ops)
from tegula.ir.values import GlobalTile, RegisterTile, Tile, describe
from tegula.layout.cute import Layout
from tegula.layout.errors import LayoutError
from tegula.layout.reshape import (bitcast_source_tv, bitcast_tv, is_plain_reshape,
                                   reshape_sources, reshaped_tv)
from tegula.ir.ops import Scan
from tegula.synth.scan import scan_conversions
from tegula.layout.tv import (coalesced_tv, match_values, project_flat_indices, projected_tv,
                              tile_size, tv_table)


@dataclass
class LayoutState:
    """The layouts decided so far, by tile id, and why each was decided (for `explain`)."""

    layouts: dict = field(default_factory=dict)
    reasons: dict = field(default_factory=dict)

    def get(self, tile: Tile) -> Layout | None:
        return self.layouts.get(tile.id)

    def set(self, tile: Tile, layout: Layout, reason: str) -> bool:
        """Record a layout for `tile`; returns True if it was new."""
        if tile.id in self.layouts:
            return False
        self.layouts[tile.id] = layout
        self.reasons[tile.id] = reason
        return True


def broadcast_layout(out_layout: Layout, out_shape: tuple, in_shape: tuple) -> Layout | None:
    """The layout a broadcast operand of `in_shape` needs so each thread holds, in the same
    register positions, the elements the output's registers are computed from; None where
    that projection is not a CuTe layout (an output spread over the threads in flat order
    across a dim whose extent does not divide the thread count, e.g. a (3, 32) tile read
    through a transposed shared view: thread t's registers cross rows irregularly). The
    check then computes the op in a coalesced partition instead (`_elementwise_in_coalesced`).
    """
    layout = out_layout
    for axis, (o, i) in enumerate(zip(out_shape, in_shape)):
        if i == 1 and o != 1:
            try:
                layout = projected_tv(layout, tuple(1 if d < axis and in_shape[d] == 1 else s
                                                    for d, s in enumerate(out_shape)), axis)
            except LayoutError:
                return None
    return layout


def _full_shape_operands(op: Elementwise) -> list[Tile]:
    return [t for t in op.inputs if tuple(t.shape) == tuple(op.out.shape)]


def _propagate_elementwise(op: Elementwise, state: LayoutState) -> bool:
    changed = False
    out_layout = state.get(op.out)
    if out_layout is None:
        for t in _full_shape_operands(op):
            if isinstance(t, RegisterTile) and state.get(t) is not None:
                changed |= state.set(op.out, state.get(t), f"same as {t.name} ({op.op})")
                out_layout = state.get(op.out)
                break
    if out_layout is None:
        return changed
    for t in op.inputs:
        if not isinstance(t, RegisterTile) or state.get(t) is not None:
            continue
        if tuple(t.shape) == tuple(op.out.shape):
            changed |= state.set(t, out_layout, f"same as {op.out.name} ({op.op})")
            continue
        projected = broadcast_layout(out_layout, op.out.shape, t.shape)
        if projected is not None:  # else left open: fixed elsewhere, converted at the check
            changed |= state.set(t, projected, f"broadcast into {op.out.name}")
    return changed


def propagate_once(ops: list[Op], state: LayoutState) -> bool:
    """One sweep over all ops applying every constraint that can fix a new layout."""
    changed = False
    for op in walk_ops(ops):
        if isinstance(op, Elementwise):
            changed |= _propagate_elementwise(op, state)
        elif isinstance(op, Reduce):
            x_layout = state.get(op.x)
            if x_layout is not None and state.get(op.out) is None:
                out_layout = reduction_layout(x_layout, op.x.shape, op.axis)
                if out_layout is not None:  # else converted at the check (_reduced_layout)
                    changed |= state.set(op.out, out_layout,
                                         f"reduction of {op.x.name} along axis {op.axis}")
        elif isinstance(op, Copy) and isinstance(op.src, RegisterTile) \
                and isinstance(op.dst, RegisterTile):
            src, dst = state.get(op.src), state.get(op.dst)
            if src is not None and dst is None:
                changed |= state.set(op.dst, src, f"copied from {op.src.name}")
            elif dst is not None and src is None:
                changed |= state.set(op.src, dst, f"copied into {op.dst.name}")
        elif isinstance(op, Bitcast):
            x, out = state.get(op.x), state.get(op.out)
            split = op.x.rank != op.out.rank
            if x is not None and out is None:
                changed |= state.set(op.out, bitcast_tv(x, tuple(op.x.shape), split),
                                     f"bitcast from {op.x.name}")
            elif out is not None and x is None:
                x = bitcast_source_tv(out, tuple(op.out.shape), split)
                if x is not None:
                    changed |= state.set(op.x, x, f"bitcast into {op.out.name}")
        elif isinstance(op, Reshape):
            x, out = state.get(op.x), state.get(op.out)
            if x is not None and out is None:
                out = reshape_layout(op, x)
                if out is not None:  # else converted at the check
                    changed |= state.set(op.out, out, f"reshaped from {op.x.name}")
            elif out is not None and x is None:
                x = reshape_layout(op, out, inverse=True)
                if x is not None:
                    changed |= state.set(op.x, x, f"reshaped into {op.out.name}")
    return changed


def reshape_layout(op: Reshape, layout: Layout, inverse: bool = False) -> Layout | None:
    """The layout of a reshape's output given its input's (or with `inverse` the input's
    given the output's): the same registers, flat indices renamed (`layout/reshape.py`);
    the very layout where only size-1 dims change. None where the renaming is no CuTe
    layout."""
    if is_plain_reshape(tuple(op.x.shape), op.order, tuple(op.out.shape)):
        return layout
    return reshaped_tv(layout, tuple(op.x.shape), op.order, tuple(op.out.shape), inverse)


def propagate(ops: list[Op], state: LayoutState) -> None:
    """Apply constraints until no layout changes (each sweep fixes at least one more)."""
    while propagate_once(ops, state):
        pass


def first_undecided_global_copy(ops: list[Op], state: LayoutState):
    """The first copy (in program order) between global memory and a register tile whose
    layout is still open: the next anchor."""
    for op in walk_ops(ops):
        if isinstance(op, Copy):
            for reg, other in ((op.dst, op.src), (op.src, op.dst)):
                if isinstance(reg, RegisterTile) and isinstance(other, GlobalTile) \
                        and state.get(reg) is None:
                    return op, reg, other
    return None


# --------------------------------------------------------------------------------------
# Constraint checking
# --------------------------------------------------------------------------------------

def layouts_agree(holder: Layout, holder_shape: tuple, user: Layout, user_shape: tuple) -> bool:
    """True if every thread holds, somewhere in its registers of `holder`, each element its
    registers of `user` need (with size-1 dims of holder_shape broadcast)."""
    user_table = tv_table(user)
    if user_table.shape[0] != tv_table(holder).shape[0]:
        return False
    wanted = project_flat_indices(user_table, user_shape, holder_shape)
    return match_values(holder, wanted) is not None


def operand_constraints(op: Op) -> list[tuple[Tile, Tile]]:
    """(holder, user) pairs an op requires to agree: the holder's layout must supply the
    user's elements."""
    if isinstance(op, Elementwise):
        return [(t, op.out) for t in op.inputs if isinstance(t, RegisterTile)]
    if isinstance(op, Copy) and isinstance(op.src, RegisterTile) and isinstance(op.dst, RegisterTile):
        return [(op.src, op.dst)]
    if isinstance(op, (Reshape, Bitcast)):
        return [(op.x, op.out)]
    if isinstance(op, Reduce):
        return [(op.out, op.x)]  # the output must hold each input row's result
    return []


def describe_conflict(op: Op, holder: Tile, user: Tile, state: LayoutState) -> str:
    return (f"{type(op).__name__.lower()} needs {describe(holder)} laid out like "
            f"{describe(user)}, but they have the layouts {state.get(holder)} "
            f"({state.reasons.get(holder.id)}) and {state.get(user)} "
            f"({state.reasons.get(user.id)})")


def insert_conversions(kernel: TracedKernel, state: LayoutState) -> list[Rearrange]:
    """Check every constraint whose layouts are all known; where one fails, convert the
    holder into a fresh tile with the layout the op needs (a `Rearrange` in front of it).

    Returns the conversions inserted. Pinned-against-pinned conflicts are errors.
    """
    inserted: list[Rearrange] = []

    def rewrite(ops: list[Op]) -> list[Op]:
        result: list[Op] = []
        for op in ops:
            for attr in ("body", "then", "otherwise"):
                if hasattr(op, attr) and isinstance(getattr(op, attr), list):
                    setattr(op, attr, rewrite(getattr(op, attr)))
            after: list[Rearrange] = []
            if isinstance(op, Elementwise) and _broadcast_has_no_layout(op, state):
                before, conversion = _elementwise_in_coalesced(op, state, kernel)
                inserted.extend(before)
                result.extend(before)
                after.append(conversion)
            for holder, user in operand_constraints(op):
                h, u = state.get(holder), state.get(user)
                if h is None or u is None or _constraint_holds(op, holder, user, h, u):
                    continue
                if isinstance(op, Reduce):
                    before, conversion = _reduce_then_convert(op, state, kernel)
                    inserted.extend(before)
                    result.extend(before)
                    after.append(conversion)
                    continue
                conversion = _conversion_for(op, holder, user, state, kernel)
                inserted.append(conversion)
                result.append(conversion)
            if isinstance(op, Scan):  # it runs in its own layout (synth/scan.py)
                before, after = scan_conversions(op, state, kernel)
                inserted.extend(before)
                result.extend(before)
            result.append(op)
            inserted.extend(after)
            result.extend(after)
        return result

    kernel.body = rewrite(kernel.body)
    return inserted


def _constraint_holds(op: Op, holder: Tile, user: Tile, h: Layout, u: Layout) -> bool:
    if isinstance(op, Reshape):  # x must hold, in each thread, the elements out names
        wanted = reshape_sources(tuple(op.x.shape), op.order, tuple(op.out.shape))
        return tv_table(h).shape[0] == tv_table(u).shape[0] and \
            match_values(h, wanted[tv_table(u)]) is not None
    if isinstance(op, Bitcast):  # x must hold, in each thread, each word out reads
        size = tile_size(tuple(op.x.shape))
        return tv_table(h).shape[0] == tv_table(u).shape[0] and \
            match_values(h, tv_table(u) % size) is not None
    return layouts_agree(h, tuple(holder.shape), u, user.shape)


def _conversion_for(op: Op, holder: Tile, user: Tile, state: LayoutState,
                    kernel: TracedKernel) -> Rearrange:
    if getattr(holder, "pinned", False) and getattr(user, "pinned", False):
        raise SynthesisError("the layouts you pinned disagree: " +
                             describe_conflict(op, holder, user, state),
                             loc=op.loc, other_loc=holder.loc)
    needed = state.get(user)
    if isinstance(op, Reshape):
        needed = reshape_layout(op, needed, inverse=True)
        if needed is None:
            raise SynthesisError(
                f"reshape {describe(op.x)} -> {describe(op.out)}: the layout "
                f"{state.get(user)} of the result ({state.reasons.get(user.id)}) has no "
                f"counterpart on the source's shape; reshape in steps whose extents divide "
                f"each other, or pin a layout", loc=op.loc)
    elif isinstance(op, Bitcast):
        needed = bitcast_source_tv(needed, tuple(op.out.shape), op.x.rank != op.out.rank)
        if needed is None:
            raise SynthesisError(
                f"bitcast {describe(op.x)} -> {describe(op.out)}: the layout "
                f"{state.get(user)} of the result ({state.reasons.get(user.id)}) keeps the "
                f"two halves of a word in different threads; pin a layout", loc=op.loc)
    elif tuple(holder.shape) != tuple(user.shape):
        needed = broadcast_layout(needed, user.shape, holder.shape)
    converted = RegisterTile(holder.dtype, tuple(holder.shape), f"{holder.name}_cvt", op.loc)
    state.set(converted, needed, f"converted from {holder.name} for {type(op).__name__}")
    kernel.register_tiles.append(converted)
    _replace_operand(op, holder, converted)
    return Rearrange(holder, converted, loc=op.loc)


def _broadcast_has_no_layout(op: Elementwise, state: LayoutState) -> bool:
    """True if a broadcast operand of `op` would need a layout that does not exist (the
    output's layout has no projection onto the operand's shape, see `broadcast_layout`)."""
    out_layout = state.get(op.out)
    if out_layout is None:
        return False
    return any(broadcast_layout(out_layout, op.out.shape, t.shape) is None
               for t in op.inputs if isinstance(t, RegisterTile)
               and tuple(t.shape) != tuple(op.out.shape))


def _elementwise_in_coalesced(op: Elementwise, state: LayoutState,
                              kernel: TracedKernel) -> tuple[list[Rearrange], Rearrange]:
    """Compute an elementwise op whose output layout gives a broadcast operand no layout
    in a coalesced partition of the output's shape instead, which projects onto every
    broadcast shape: its operands are converted into that partition (or its projection)
    before the op, and the result converted back into the output's layout after it.
    Returns (conversions before the op, the conversion after it)."""
    target = op.out
    shape = tuple(target.shape)
    space = coalesced_tv(shape, len(shape) - 1, 1, kernel.threads)
    computed = RegisterTile(target.dtype, shape, f"{target.name}_bc", op.loc)
    state.set(computed, space,
              f"{op.op} computed in a coalesced partition (a broadcast operand has no "
              f"projection of {target.name}'s layout), then converted")
    kernel.register_tiles.append(computed)
    op.out = computed
    before = []
    operands = {t.id: t for t in op.inputs if isinstance(t, RegisterTile)}  # x * x: once
    for t in operands.values():
        needed = broadcast_layout(space, shape, tuple(t.shape))
        if layouts_agree(state.get(t), tuple(t.shape), needed, tuple(t.shape)):
            continue
        converted = RegisterTile(t.dtype, tuple(t.shape), f"{t.name}_cvt", op.loc)
        state.set(converted, needed, f"converted from {t.name} for {op.op}")
        kernel.register_tiles.append(converted)
        _replace_operand(op, t, converted)
        before.append(Rearrange(t, converted, loc=op.loc))
    return before, Rearrange(computed, target, loc=op.loc)


def _reduce_then_convert(op: Reduce, state: LayoutState,
                         kernel: TracedKernel) -> tuple[list[Rearrange], Rearrange]:
    """A reduction whose output layout was fixed elsewhere (e.g. `rowsum += tg.sum(t, 1)`
    with `rowsum` laid out like a gemm accumulator's rows and `t` read from shared memory)
    reduces into a fresh tile laid out as its input's projection, which a `Rearrange`
    after the op converts into the output's layout. Returns (conversions to put before the
    op, the conversion after it)."""
    target = op.out
    reduced = RegisterTile(target.dtype, tuple(target.shape), f"{target.name}_red", op.loc)
    layout, before = _reduced_layout(op, state, kernel)
    state.set(reduced, layout,
              f"reduction of {op.x.name} along axis {op.axis}, then converted into "
              f"{target.name}'s layout ({state.reasons.get(target.id)})")
    kernel.register_tiles.append(reduced)
    op.out = reduced
    return before, Rearrange(reduced, target, loc=op.loc)


def reduction_layout(x_layout: Layout, shape: tuple, axis: int) -> Layout | None:
    """The output layout a reduction of a tile laid out as `x_layout` gets (the input's
    projection along `axis`), or None where the projection is not a CuTe layout (e.g. a
    tile spread over threads in flat order, whose registers cross rows irregularly)."""
    try:
        return projected_tv(x_layout, shape, axis)
    except LayoutError:
        return None


def _reduced_layout(op: Reduce, state: LayoutState,
                    kernel: TracedKernel) -> tuple[Layout, list[Rearrange]]:
    """The reduction output layout for `op`; where the input's layout has no projection,
    the input is first converted (in place of op.x) into a coalesced partition, which
    always has one."""
    layout = reduction_layout(state.get(op.x), op.x.shape, op.axis)
    if layout is not None:
        return layout, []
    shape = tuple(op.x.shape)
    converted = RegisterTile(op.x.dtype, shape, f"{op.x.name}_cvt", op.loc)
    state.set(converted, coalesced_tv(shape, len(shape) - 1, 1, kernel.threads),
              f"converted from {op.x.name} so that its reduction has a layout")
    kernel.register_tiles.append(converted)
    before = Rearrange(op.x, converted, loc=op.loc)
    op.x = converted
    return projected_tv(state.get(converted), shape, op.axis), [before]


def _replace_operand(op: Op, old: Tile, new: Tile) -> None:
    if isinstance(op, Elementwise):
        op.inputs = [new if t is old else t for t in op.inputs]
    elif isinstance(op, Copy) and op.src is old:
        op.src = new
    elif isinstance(op, (Reshape, Bitcast)) and op.x is old:
        op.x = new


def default_layout_for_unused(tile: RegisterTile, threads: int) -> Layout:
    """A layout for a register tile nothing constrains (e.g. filled and never read):
    spread its elements over the threads in order."""
    size = tile_size(tuple(tile.shape))
    if size >= threads and size % threads == 0:
        return Layout((threads, size // threads), (1, threads))
    if threads % size == 0:
        return Layout(((size, threads // size), 1), ((1, 0), 0))
    # Sizes that neither divide nor are divided by the thread count (a 5-element tg.arange
    # over 128 threads): the coalesced partition takes any extents, replicating as needed.
    return coalesced_tv(tuple(tile.shape), len(tile.shape) - 1, 1, threads)
