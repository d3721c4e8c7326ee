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
from types import FrameType, TracebackType

from tegula.errors import SourceLocation, TraceError
from tegula.ir.ops import Op
from tegula.ir.values import RegisterTile, SharedAlloc, Tile

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


class TraceContext:
    """Everything recorded while one kernel body is being traced."""

    def __init__(self, kernel_name: str):
        self.kernel_name = kernel_name
        self.body: list[Op] = []
        self._blocks: list[list[Op]] = [self.body]
        self.shared_allocs: list[SharedAlloc] = []
        self.register_tiles: list[RegisterTile] = []
        self._written: set[int] = set()     # ids of register tiles some op has written
        self.block_indices: dict = {}        # grid axis -> its BlockIndex (one object each)
        self._counters: dict[str, int] = {}
        # An error noticed where it cannot be raised (a generator being closed by `break`);
        # the driver raises it when the body returns.
        self.deferred_error: TraceError | None = None

    # -- op lists -------------------------------------------------------------------------
    def emit(self, op: Op) -> Op:
        """Append `op` to the innermost open block, stamping the user's line on it."""
        if op.loc is None:
            op.loc = user_location()
        self._blocks[-1].append(op)
        return op

    def open_block(self, ops: list[Op]) -> None:
        self._blocks.append(ops)

    def close_block(self, ops: list[Op]) -> None:
        if self._blocks[-1] is not ops:
            raise TraceError("a tg.range / tg.if_ block was closed out of order (did a loop "
                             "body `break` or `return`?)", user_location())
        self._blocks.pop()

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

    def add_register_tile(self, tile: RegisterTile) -> RegisterTile:
        self.register_tiles.append(tile)
        return tile

    def add_shared_alloc(self, alloc: SharedAlloc) -> SharedAlloc:
        self.shared_allocs.append(alloc)
        return alloc

    def mark_written(self, tile: Tile) -> None:
        self._written.add(tile.id)

    def is_written(self, tile: Tile) -> bool:
        return tile.id in self._written


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


def fail(op: str, message: str) -> TraceError:
    """A TraceError for language function `op` at the user's current line (raise it)."""
    return TraceError(f"{op}: {message}", user_location())
