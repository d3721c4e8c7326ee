"""The tracing context: where ops go while a kernel body runs, and which user line made them.

A `TraceContext` exists only while `Kernel.trace` runs the user's function. It holds a stack
of op lists (the kernel body at the bottom; each open `tg.range` / `tg.if_` pushes its
body), the shared buffers and register tiles made so far, and counters for readable names.
Every language function asks `current()` for the context, so using `tg.copy` outside a
kernel is a clear error instead of a silent no-op.
"""
from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from types import FrameType, TracebackType

from tegula.errors import SourceLocation, TraceError
from tegula.ir.ops import Op
from tegula.ir.scalar import LoopIndex
from tegula.ir.values import RegisterTile, SharedAlloc, Tile, describe

# Frames in these folders are tegula's tracing machinery, never the user's kernel; a
# kernel written inside the package (tegula/kernels) still counts as user code.
_TEGULA_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MACHINERY_DIRS = tuple(os.path.join(_TEGULA_DIR, sub) + os.sep for sub in ("lang", "ir"))


def _is_machinery(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_MACHINERY_DIRS)


def _location_of(frame: FrameType, lineno: int | None = None) -> SourceLocation:
    code = frame.f_code
    lineno = frame.f_lineno if lineno is None else lineno
    line = linecache.getline(code.co_filename, lineno, frame.f_globals)
    return SourceLocation(code.co_filename, lineno, line.strip(), code.co_name)


def user_frame() -> FrameType | None:
    """The innermost caller outside the tracing machinery."""
    frame = sys._getframe(1)
    while frame is not None and _is_machinery(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def user_location() -> SourceLocation | None:
    """The innermost caller outside the tracing machinery: the user's line."""
    frame = user_frame()
    return _location_of(frame) if frame is not None else None


def traceback_location(tb: TracebackType | None) -> SourceLocation | None:
    """The innermost user frame of an exception's traceback (where the user's code failed)."""
    found = None
    while tb is not None:
        if not _is_machinery(tb.tb_frame.f_code.co_filename):
            found = _location_of(tb.tb_frame, tb.tb_lineno)
        tb = tb.tb_next
    return found


def innermost_frame_is_machinery(tb: TracebackType | None) -> bool:
    """True when an exception was raised inside tegula rather than in the user's code."""
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return last is not None and _is_machinery(last.tb_frame.f_code.co_filename)


@dataclass(eq=False)
class Scope:
    """The kernel body, or one block of run-time control flow being traced (a loop body, a
    `tg.if_` / `tg.else_` branch). A register tile made inside a block belongs to it: once
    the block is closed the tile holds a value only on the paths that ran the block (none,
    for a loop that runs zero times), so reading it is an error (`check_readable`)."""

    op: str                     # "tg.range", "tg.pipeline", "tg.if_", "tg.else_", "kernel"
    loc: SourceLocation | None
    parent: Scope | None
    closed: bool = False
    # Tiles this block carries values into (see tegula.lang.carry), by id.
    carried: set = field(default_factory=set)

    def within(self, other: Scope) -> bool:
        """True if this block is `other` or is nested inside it."""
        scope: Scope | None = self
        while scope is not None:
            if scope is other:
                return True
            scope = scope.parent
        return False

    @property
    def is_loop(self) -> bool:
        return self.op in ("tg.range", "tg.pipeline")

    @property
    def what(self) -> str:
        """`the tg.range loop`, `the tg.if_ block`: how messages name the block."""
        return f"the {self.op} {'loop' if self.is_loop else 'block'}"

    @property
    def where(self) -> str:
        """`the tg.range loop at line 12`: the block and its line, for messages."""
        return f"{self.what} at line {self.loc.lineno}" if self.loc else self.what


class TraceContext:
    """Everything recorded while one kernel body is being traced."""

    def __init__(self, kernel_name: str):
        self.kernel_name = kernel_name
        self.body: list[Op] = []
        self._blocks: list[list[Op]] = [self.body]
        self.shared_allocs: list[SharedAlloc] = []
        self.register_tiles: list[RegisterTile] = []
        self._written: set[int] = set()     # ids of register tiles some op has written
        self.scope = Scope("kernel", None, None)   # the innermost open block
        self._tile_scopes: dict[int, Scope] = {}            # register tile id -> its block
        self.branch_scopes: dict[int, Scope] = {}           # id(IfThen) -> its tg.if_ block
        self.loop_scopes: dict[int, Scope] = {}             # id(LoopIndex) -> its loop body
        self.block_indices: dict = {}        # grid axis -> its BlockIndex (one object each)
        self.grid_sizes: dict = {}           # grid axis -> its GridSize (tg.num_programs)
        self.sm_count = None                 # the SMCount of tg.num_sms(), once made
        self.cluster = (1, 1, 1)             # tg.cluster: blocks per thread-block cluster
        self.open_region = None              # the tg.producer / tg.consumer block open now
        self._counters: dict[str, int] = {}
        # An error noticed where it cannot be raised (a generator being closed by `break`);
        # the driver raises it when the body returns.
        self.deferred_error: TraceError | None = None

    # -- op lists -------------------------------------------------------------------------
    def emit(self, op: Op) -> Op:
        """Append `op` to the innermost open block, stamping the user's line on it."""
        if op.loc is None:
            op.loc = user_location()
        self._refuse_ended_loop_indices(op)
        self._blocks[-1].append(op)
        return op

    def _refuse_ended_loop_indices(self, op: Op) -> None:
        """A loop index (and any value computed from it) exists only inside its loop."""
        for index in _loop_indices(op):
            scope = self.loop_scopes.get(id(index))
            if scope is not None and scope.closed:
                frame = user_frame()
                names = [n for n, v in frame.f_locals.items() if v is index] if frame else []
                name = f"`{names[0]}` ({index})" if names else f"`{index}`"
                raise TraceError(
                    f"{name}, the index of {scope.where}, is used after that loop ended; a "
                    f"loop index, and every value computed from it, exists only inside its "
                    f"loop. Compute what is needed after the loop from the loop bounds",
                    op.loc)

    def open_block(self, ops: list[Op], op: str = "block",
                   loc: SourceLocation | None = None) -> Scope:
        """Trace the following ops into `ops`, the body of a block of `op` (see `Scope`)."""
        self._blocks.append(ops)
        self.scope = Scope(op, loc, self.scope)
        return self.scope

    def close_block(self, ops: list[Op]) -> None:
        if self._blocks[-1] is not ops:
            raise TraceError("a tg.range / tg.if_ block was closed out of order (did a loop "
                             "body `break` or `return`?)", user_location())
        self._blocks.pop()
        self.scope.closed = True
        self.scope = self.scope.parent

    def emit_before(self, anchor: Op, op: Op) -> Op:
        """Insert `op` just before `anchor` (an op of an enclosing open block): how a block
        initializes the tiles it carries values in before it starts."""
        if op.loc is None:
            op.loc = anchor.loc
        for block in reversed(self._blocks):
            for at in range(len(block) - 1, -1, -1):
                if block[at] is anchor:
                    block.insert(at, op)
                    return op
        raise TraceError(f"tegula bug: {type(anchor).__name__} is in no open block",
                         anchor.loc)

    def enclosing_op(self) -> Op | None:
        """The loop or branch whose body is being traced now (None in the kernel body, or
        in a block of no op such as a `tg.scan` combine function's)."""
        if len(self._blocks) < 2 or not self._blocks[-2]:
            return None
        owner = self._blocks[-2][-1]  # opened last in its block, so still its last op
        for attr in ("body", "then", "otherwise"):
            if getattr(owner, attr, None) is self._blocks[-1]:
                return owner
        return None

    @property
    def innermost_block(self) -> list[Op]:
        return self._blocks[-1]

    @property
    def depth(self) -> int:
        return len(self._blocks)

    # -- values ---------------------------------------------------------------------------
    def fresh_name(self, prefix: str) -> str:
        """`prefix` + a per-prefix counter: r0, r1, s0, a.0 … (stable across runs)."""
        n = self._counters.get(prefix, 0)
        self._counters[prefix] = n + 1
        return f"{prefix}{n}"

    def add_register_tile(self, tile: RegisterTile, scope: Scope | None = None) -> RegisterTile:
        """Register `tile`, made in the innermost open block (or in `scope`)."""
        self.register_tiles.append(tile)
        self._tile_scopes[tile.id] = scope or self.scope
        return tile

    def scope_of(self, tile: Tile) -> Scope | None:
        """The block a register tile was made in (None for tiles made outside tracing)."""
        return self._tile_scopes.get(tile.id)

    def move_to_scope(self, tile: Tile, scope: Scope) -> None:
        self._tile_scopes[tile.id] = scope

    def require_readable(self, tile: Tile, op: str) -> None:
        """What every op reading a register tile checks: some op wrote it (else it holds
        garbage registers), and not only inside a block that has ended."""
        if not isinstance(tile, RegisterTile):
            return
        if tile.id not in self._written:
            raise fail(op, f"{describe(tile)} is read before anything wrote it; initialize "
                           f"it (tg.zeros / tg.full / tg.fill) or write it with tg.copy first")
        self.check_readable(tile, op)

    def check_readable(self, tile: Tile, op: str) -> None:
        """A register tile made inside a block that has been closed has no value on the
        paths that skipped the block: reading it is a TraceError naming both lines."""
        scope = self._tile_scopes.get(tile.id)
        if scope is None or not scope.closed:
            return
        while scope.parent is not None and scope.parent.closed:
            scope = scope.parent  # name the outermost closed block: the one the read is past
        name = handle_name_of(tile)
        made = f" (made at line {tile.loc.lineno})" if tile.loc else ""
        if not scope.is_loop:
            why = ("it has a value only when that branch ran. Define it before the block "
                   "(or in both tg.if_ and tg.else_) and rebind or update it inside")
        else:
            why = ("it has no value if the loop runs zero times. Define it before the loop "
                   "(e.g. with tg.zeros) and rebind or update it inside, so it is carried "
                   "out of the loop")
        raise fail(op, f"{name}{describe(tile)}{made} was computed inside "
                       f"{scope.where} and is read after that block ended; {why}")

    def add_shared_alloc(self, alloc: SharedAlloc) -> SharedAlloc:
        self.shared_allocs.append(alloc)
        return alloc

    def mark_written(self, tile: Tile) -> None:
        """`tile` was wholly written by the op just emitted. A tile of a closed block that
        is overwritten like this holds a value from here on: it now belongs here."""
        self._written.add(tile.id)
        scope = self._tile_scopes.get(tile.id)
        if scope is not None and scope.closed:
            self._tile_scopes[tile.id] = self.scope

    def is_written(self, tile: Tile) -> bool:
        return tile.id in self._written


def _loop_indices(value, depth: int = 0):
    """The loop indices an op (or a scalar, tile or view in it) refers to; nested op
    lists (loop and branch bodies) are not entered."""
    if isinstance(value, LoopIndex):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            if not isinstance(item, Op):
                yield from _loop_indices(item, depth)
    elif is_dataclass(value) and not isinstance(value, type) and depth < 200:
        for f in fields(value):
            if f.name not in ("loc", "choices", "layout", "alloc", "arg"):
                yield from _loop_indices(getattr(value, f.name), depth + 1)


_active: list[TraceContext] = []


def current(what: str = "this") -> TraceContext:
    """The context of the kernel being traced; `what` names the caller for the error."""
    if not _active:
        raise TraceError(f"{what} can only be used inside the body of a @tg.kernel function "
                         f"while it is traced (kernel.trace(...) or a launch)",
                         user_location())
    return _active[-1]


def push_context(ctx: TraceContext) -> None:
    _active.append(ctx)


def pop_context(ctx: TraceContext) -> None:
    if _active and _active[-1] is ctx:
        _active.pop()


def handle_name_of(tile: Tile) -> str:
    """The name of a local of the user's current frame holding a handle of `tile`, quoted
    and followed by a space (so an error can name the variable), else ""."""
    frame = user_frame()
    if frame is None:
        return ""
    for name, value in list(frame.f_locals.items()):
        if getattr(value, "_tile", None) is tile:
            return f"`{name}` "
    return ""


def fail(op: str, message: str) -> TraceError:
    """A TraceError for language function `op` at the user's current line (raise it)."""
    return TraceError(f"{op}: {message}", user_location())
