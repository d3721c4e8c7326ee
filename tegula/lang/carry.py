"""Values carried through run-time control flow: names rebound inside `tg.range`,
`tg.pipeline`, `tg.if_` and `tg.else_`.

A run-time block is traced once, so `acc = acc * alpha + x` in a loop body only rebinds a
Python name to a new register tile; the next iteration, being the same traced body, would
read the old tile again. So each block compares the locals of the user's frame before and
after it is traced (names, and the register tiles in the lists, tuples and dicts they hold,
at any depth). A name that held a register tile before the block and holds another one after
it is *carried*:

* its value lives in a fresh tile C, set from the old tile just before the block
  (`C ← old`) and from the new tile at the end of the block (`C ← new`); in a loop, the
  body's reads and in-place updates of the old tile become reads and updates of C, so
  every iteration starts from the last one's value. The handle the name holds afterwards
  is re-pointed at C: after a loop it holds the last iteration's value (the value before
  the loop when the loop runs zero times), after a `tg.if_` the new value where the
  condition held and the old one elsewhere. A loop never writes the old tile, so other
  names holding it keep the value from before the loop.
* a `tg.else_` branch carries into the tile its `tg.if_` branch left, so after the pair
  the name holds whichever branch ran.

What cannot be honoured is a TraceError: a new tile of another shape or element type, a
tile made before the block (two names would share one variable), two carried names ending
bound to one tile, a loop rebinding a name whose tile another name also holds, and a
kernel scalar or Python number rebound in the block (trace-time values, not run-time
variables: the message says how to write it instead). Tiles first made inside a block are
local to it; `TraceContext.check_readable` refuses reads of them after it ends.
"""
from __future__ import annotations

import linecache
import numbers
import re
from dataclasses import dataclass, fields
from types import FrameType
from typing import Any, Callable

from tegula.errors import SourceLocation, TraceError
from tegula.ir.ops import Copy, Op
from tegula.ir.scalar import Condition, Scalar, is_loop_index
from tegula.ir.values import RegisterTile, describe
from tegula.lang.tensors import RegisterValue, same_shape
from tegula.lang.trace import Scope, TraceContext, user_frame


def _labelled_locals(frame: FrameType | None) -> dict[str, Any]:
    """The frame's locals by label: each name, plus `name[i]` / `name['key']` (and
    `name[i][j]`, … at any depth) for the register tiles in the lists, tuples and dicts a
    name holds — a tile nested deeper that a block rebinds is carried like any other, not
    silently left at its value from before the block."""
    if frame is None:
        return {}
    out: dict[str, Any] = {}
    for name, value in list(frame.f_locals.items()):
        out[name] = value
        _label_nested(name, value, out, set())
    return out


def _label_nested(label: str, value: Any, out: dict[str, Any], seen: set[int]) -> None:
    """The register tiles inside container `value`, labelled from `label`."""
    if isinstance(value, (list, tuple)):
        items = enumerate(value)
    elif isinstance(value, dict):
        items = ((k, v) for k, v in list(value.items()) if isinstance(k, (str, int)))
    else:
        return
    if id(value) in seen:   # a container holding itself
        return
    seen.add(id(value))
    for key, item in items:
        if isinstance(item, RegisterValue):
            out[f"{label}[{key!r}]"] = item
        else:
            _label_nested(f"{label}[{key!r}]", item, out, seen)


@dataclass
class BlockEntry:
    """The user's frame and its bindings when a run-time block opened."""

    frame: FrameType | None
    values: dict[str, Any]            # label -> value
    tiles: dict[str, RegisterTile]    # label -> the register tile its handle held
    written: set[int]                 # ids of those tiles that held a value

    @classmethod
    def capture(cls, ctx: TraceContext) -> BlockEntry:
        frame = user_frame()
        values = _labelled_locals(frame)
        tiles = {label: v._tile for label, v in values.items() if isinstance(v, RegisterValue)}
        written = {t.id for t in tiles.values() if ctx.is_written(t)}
        return cls(frame, values, tiles, written)


@dataclass
class _Carry:
    """One tile-valued binding group the block rebinds: the labels that held `old` before
    it and all hold `handle` (of tile `new`) after it."""

    labels: list[str]
    old: RegisterTile
    old_handles: list[RegisterValue]
    handle: RegisterValue
    new: RegisterTile


def carry_out(ctx: TraceContext, entry: BlockEntry, scope: Scope, block_op: Op, body: list[Op],
              then_scope: Scope | None = None) -> Callable[[], None]:
    """Called at the end of a block's body, while it is still the innermost block: check
    the rebindings, emit the copies that carry them, and return what to run once the block
    is closed (re-pointing the rebound names' handles at their carried tiles).
    `then_scope` is given for a `tg.else_` branch: its tg.if_ branch's block."""
    after = _labelled_locals(entry.frame)
    entry.frame = None  # no frame kept alive past the block
    _refuse_rebound_values(entry, after, scope)
    carries = _rebound_tiles(ctx, entry, after, scope)
    is_loop = scope.is_loop
    if is_loop:
        _refuse_aliases(entry, after, carries, scope)
    moves: list[tuple[RegisterValue, RegisterTile]] = []
    for c in carries:
        ctx.check_readable(c.new, f"{scope.op} (carrying `{c.labels[0]}` out)")
        if then_scope is not None and _made_by(ctx, c.old, then_scope):
            # The tg.if_ branch made or carried this tile: the else branch fills it too.
            target = c.old
        else:
            target = _carried_tile(ctx, c.old, scope)
            if c.old.id in entry.written:
                ctx.emit_before(block_op, Copy(src=c.old, dst=target))
                ctx.mark_written(target)
            if is_loop:
                _replace_tile(body, c.old, target)
        ctx.emit(Copy(src=c.new, dst=target, loc=c.new.loc or scope.loc))
        ctx.mark_written(target)
        scope.carried.add(target.id)
        moves.append((c.handle, target))
    expiring = _expire_inner_aliases(entry, after, carries, scope) if is_loop else []

    def after_close() -> None:
        for handle, target in moves:
            handle._retarget(target)
            if ctx.scope_of(target).closed:
                ctx.move_to_scope(target, scope.parent)  # an else branch filled it too
        for handle, message in expiring:
            handle._expire(message)
    return after_close


def _carried_tile(ctx: TraceContext, old: RegisterTile, scope: Scope) -> RegisterTile:
    """A fresh tile of the block's parent scope to hold a carried value (pinned to the old
    tile's layout if that was pinned)."""
    tile = RegisterTile(dtype=old.dtype, shape=tuple(old.shape), name=ctx.fresh_name("r"),
                        loc=old.loc, layout=old.layout if old.pinned else None,
                        pinned=old.pinned)
    return ctx.add_register_tile(tile, scope.parent)


def _made_by(ctx: TraceContext, tile: RegisterTile, block: Scope) -> bool:
    scope = ctx.scope_of(tile)
    return tile.id in block.carried or (scope is not None and scope.within(block))


def _replace_tile(ops: list, old: RegisterTile, new: RegisterTile) -> None:
    """Make every op in `ops` (nested blocks included) use `new` where it used `old`."""
    for op in ops:
        for f in fields(op):
            if f.name in ("loc", "choices"):
                continue
            value = getattr(op, f.name)
            if value is old:
                setattr(op, f.name, new)
            elif isinstance(value, list) and value and isinstance(value[0], Op):
                _replace_tile(value, old, new)
            elif isinstance(value, (list, tuple)) and any(v is old for v in value):
                replaced = [new if v is old else v for v in value]
                setattr(op, f.name, replaced if isinstance(value, list) else tuple(replaced))


# -- checks ---------------------------------------------------------------------------------
def _rebound_tiles(ctx: TraceContext, entry: BlockEntry, after: dict, scope: Scope) -> list:
    """The carried binding groups, each checked: same shape and type, a new tile made in
    the block, one tile per group."""
    groups: dict[int, _Carry] = {}
    for label, old in entry.tiles.items():
        if label not in after:
            continue  # deleted in the block: nothing reads it afterwards
        value = after[label]
        if isinstance(value, RegisterValue) and value._tile is old:
            continue  # unchanged, or updated in place
        if not isinstance(value, RegisterValue):
            raise TraceError(
                f"{scope.op}: `{label}` held the register tile {describe(old)} before "
                f"{scope.where} and is rebound to {_kind(value)} inside it; a name carried "
                f"through a run-time block must stay a register tile of the same shape and "
                f"type (use another name for the new value)", *_at(label, scope))
        new = value._tile
        _check_same_type(label, old, new, scope)
        made = ctx.scope_of(new)
        if made is None or not made.within(scope):
            raise TraceError(
                f"{scope.op}: `{label}` is rebound inside {scope.where} to "
                f"{describe(new)}, a tile made before the block"
                f"{_line(new)}, so two names would share one run-time variable. Copy the "
                f"value instead: {label}.assign(...) writes `{label}`'s own tile", *_at(label, scope))
        group = groups.get(old.id)
        if group is None:
            groups[old.id] = _Carry([label], old, [entry.values[label]], value, new)
        elif group.handle is not value:
            raise TraceError(
                f"{scope.op}: `{group.labels[0]}` and `{label}` hold the same tile "
                f"{describe(old)} before {scope.where} and are rebound to different tiles "
                f"inside it; give each its own tile before the block (e.g. "
                f"`{label} = tg.zeros(...)`)", *_at(label, scope))
        else:
            group.labels.append(label)
            group.old_handles.append(entry.values[label])
    by_handle: dict[int, _Carry] = {}
    for group in groups.values():
        other = by_handle.setdefault(id(group.handle), group)
        if other is not group:
            raise TraceError(
                f"{scope.op}: `{other.labels[0]}` and `{group.labels[0]}` are both "
                f"carried through {scope.where} and both end it bound to {describe(group.new)}; "
                f"each carried name needs its own tile: write "
                f"`{group.labels[0]}.assign({other.labels[0]})` instead of "
                f"`{group.labels[0]} = {other.labels[0]}`", *_at(group.labels[0], scope))
    return list(groups.values())


def _check_same_type(label: str, old: RegisterTile, new: RegisterTile, scope: Scope) -> None:
    if same_shape(old.shape, new.shape) and old.dtype == new.dtype:
        if old.pinned and new.pinned and old.layout != new.layout:
            raise TraceError(
                f"{scope.op}: `{label}` is carried through {scope.where} in the layout "
                f"{old.layout} pinned for {describe(old)}{_line(old)}, but is rebound to "
                f"{describe(new)}, pinned to {new.layout}; a carried tile has one layout. "
                f"Pin the same layout, or leave one unpinned (the compiler then converts)",
                new.loc or scope.loc, old.loc)
        return
    if old.dtype != new.dtype and same_shape(old.shape, new.shape):
        change = f"element type {old.dtype} to {new.dtype} (convert with .to({old.dtype}))"
    else:
        change = (f"shape {_shape(old)} to {_shape(new)} (reduce or broadcast back to "
                  f"{_shape(old)})")
    raise TraceError(
        f"{scope.op}: `{label}` is carried through {scope.where} (it held "
        f"{describe(old)} before it) but is rebound to {describe(new)}, changing its "
        f"{change}; a carried tile keeps its shape and element type", new.loc or scope.loc,
        scope.loc)


def _refuse_aliases(entry: BlockEntry, after: dict, carries: list, scope: Scope) -> None:
    """A loop body traced once cannot tell its reads of a carried name's old tile from
    reads of another name holding that tile, which must keep the value from before."""
    for c in carries:
        for label, old in entry.tiles.items():
            if old is not c.old or label in c.labels:
                continue
            value = after.get(label)
            if isinstance(value, RegisterValue) and value._tile is old:
                name = c.labels[0]
                raise TraceError(
                    f"{scope.op}: `{label}` and `{name}` hold the same tile "
                    f"{describe(old)} before {scope.where}, and the loop rebinds `{name}`: "
                    f"the body is traced once, so its reads of `{label}` could not be told "
                    f"apart from reads of the carried `{name}`. Give `{name}` a tile of its "
                    f"own before the loop (e.g. `{name} = tg.zeros(shape, dtype)` then "
                    f"`{name}.assign({label})`)", *_at(name, scope))


def _expire_inner_aliases(entry: BlockEntry, after: dict, carries: list,
                          scope: Scope) -> list[tuple[RegisterValue, str]]:
    """Names bound inside a loop to a carried name's value from before its rebinding
    (`prev = acc` ahead of `acc = ...`): inside the loop they read the carried tile, but
    after it no tile holds that value, so their handle refuses any later use."""
    expiring = []
    for c in carries:
        for old_handle in {id(h): h for h in c.old_handles}.values():
            inner = [label for label, value in after.items()
                     if value is old_handle and entry.values.get(label) is not old_handle]
            if inner:
                name = c.labels[0]
                expiring.append((old_handle, (
                    f"`{inner[0]}` holds the value `{name}` had in an iteration of "
                    f"{scope.where} before `{name}` was rebound; that value exists only "
                    f"inside the loop. Use it inside the loop, or carry it too: define "
                    f"`{inner[0]}` before the loop and rebind it inside")))
    return expiring


def _refuse_rebound_values(entry: BlockEntry, after: dict, scope: Scope) -> None:
    """Kernel scalars and Python numbers are trace-time values: the block runs once at
    trace time, so a rebinding would not reach the next iteration (or would happen whether
    or not a tg.if_ condition holds)."""
    for label, old in entry.values.items():
        if "[" in label or isinstance(old, RegisterValue) or label not in after:
            continue
        new = after[label]
        if not _is_value(old) or new is old or is_loop_index(new) or \
                _same_number(old, new):
            continue
        kind = "loop" if scope.is_loop else "block"
        if not scope.is_loop:
            how = ("it cannot depend on a run-time condition. Choose per element with "
                   "tg.where, or keep the value in a register tile defined before the block")
        else:
            how = ("it is not carried from one iteration to the next. Compute it from the "
                   "loop index instead (e.g. `off = start + k * BK`), or keep the value in a "
                   "register tile defined before the loop")
        raise TraceError(
            f"{scope.op}: `{label}` is rebound inside {scope.where} (it was {_show(old)} "
            f"before the {kind} and is {_show(new)} at the end of its body): the body is "
            f"traced once, so as a kernel scalar or Python value {how}. If `{label}` is "
            f"only a temporary inside the {kind}, give it a name not used before it",
            *_at(label, scope))


_ASSIGNMENT = re.compile(r"(?<![=!<>])(?:[-+*/%@&|^]|//|\*\*|<<|>>)?=(?!=)")


def _at(label: str, scope: Scope) -> tuple:
    """(loc, other_loc) of an error about rebinding `label`: its line, and the block's."""
    loc = _rebinding_loc(label, scope)
    return (loc, scope.loc) if loc is not scope.loc else (loc, None)


def _rebinding_loc(label: str, scope: Scope) -> SourceLocation | None:
    """The line of the block's body that (first) assigns `label`'s name, found in the
    source by indentation; else the block's own line. Only an error's location uses it."""
    loc = scope.loc
    if loc is None or not loc.filename:
        return loc
    name = re.compile(rf"\b{re.escape(label.split('[')[0])}\b")
    header = linecache.getline(loc.filename, loc.lineno)
    indent = len(header) - len(header.lstrip())
    lineno = loc.lineno + 1
    while True:
        line = linecache.getline(loc.filename, lineno)
        if not line:
            return loc
        if line.strip() and not line.strip().startswith("#"):
            if len(line) - len(line.lstrip()) <= indent:
                return loc
            assignment = _ASSIGNMENT.search(line.split("#")[0])
            if assignment and name.search(line[:assignment.start()]):
                return SourceLocation(loc.filename, lineno, line.strip(), loc.function)
        lineno += 1


def _is_value(x: Any) -> bool:
    """A kernel scalar, condition or Python number: a value fixed when tracing."""
    return isinstance(x, (Scalar, Condition)) or isinstance(x, numbers.Number)


def _same_number(a: Any, b: Any) -> bool:
    if not (isinstance(a, numbers.Number) and isinstance(b, numbers.Number)):
        return False
    return type(a) is type(b) and (a == b or (a != a and b != b))


def _show(x: Any) -> str:
    if isinstance(x, RegisterValue):
        return f"the register tile {describe(x._tile)}"
    if isinstance(x, (Scalar, Condition)):
        return f"the kernel scalar {x}"
    return repr(x)


def _kind(x: Any) -> str:
    return _show(x) if _is_value(x) else f"{type(x).__name__} {x!r}"


def _shape(t: RegisterTile) -> str:
    return "(" + ", ".join(map(str, t.shape)) + ("," if t.rank == 1 else "") + ")"


def _line(t: RegisterTile) -> str:
    return f" (at line {t.loc.lineno})" if t.loc else ""


__all__ = ["BlockEntry", "carry_out"]
