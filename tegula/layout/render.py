"""Pictures of layouts: text grids and SVG.

People read layouts as pictures, so every layout kind renders (docs/design.md, "Layouts"):

- `render_text(layout)`: a plain layout as an aligned grid of offsets.
- `render_tv_text(tv, tile_shape)`: a thread-value layout as the tile it covers, each cell
  labelled with every `T#V#` that lands on it.
- `render_bank_text(layout, tile_shape, elem_bytes)`: the shared-memory bank of each cell.
- `svg_layout`, `svg_tv_layout`, `svg_shared_layout`, `svg_mma_atom`: the same as SVG
  (plain text, no LaTeX, no dependency beyond the standard library).

The renderers are duck-typed: a layout is anything callable on a flat integer index
(`layout(i)`, CuTe's colexicographic convention) with a `.shape` (a nested tuple of ints or
an int). A `ComposedLayout` (a swizzled layout) without a `.shape` of its own is read
through its `.inner` layout.

Conventions.
- A rank-2 layout of shape (M, N) is drawn with M rows and N columns; cell (m, n) shows
  `layout(m + n*M)`, i.e. nested modes are flattened colexicographically, as CuTe does.
  Rank 1 is one row; rank >= 3 draws mode 0 as rows and the remaining modes flattened
  as columns, with `|` separating the column groups of the last mode.
- A TV layout maps (thread, value) to a flat index into the tile; tile cell
  (row, col) = (idx % M, idx // M) for tile_shape (M, N) (colexicographic `idx2crd`).
  Without a tile_shape the tile is taken as (M, cosize // M) with M the largest power of
  two <= sqrt(cosize) that divides cosize -- a square-ish guess; pass tile_shape whenever
  the real tile is known.
"""
from __future__ import annotations

import colorsys
import math
from collections.abc import Callable, Sequence
from typing import Any
from xml.sax.saxutils import escape

from tegula.layout.errors import LayoutError

__all__ = [
    "render_text", "render_tv_text", "render_bank_text", "svg_layout", "svg_tv_layout", "svg_shared_layout",
    "svg_mma_atom", "default_tile_shape", "tv_cells", "thread_color", "bank_color",
]

Cell = tuple[int, int]
TV = tuple[int, int]


# --------------------------------------------------------------------------- shapes

def _size(shape: Any) -> int:
    """Number of coordinates of a (nested) shape."""
    if isinstance(shape, int):
        return shape
    return math.prod(_size(s) for s in shape)


def _shape_of(layout: Any) -> Any:
    """The domain shape of a layout, looking through composed (swizzled) layouts."""
    shape = getattr(layout, "shape", None)
    if shape is None and hasattr(layout, "inner"):
        shape = getattr(layout.inner, "shape", None)
    if shape is None:
        raise LayoutError(f"cannot render {layout!r}: it has no shape")
    return shape


def _modes(shape: Any) -> tuple[Any, ...]:
    """Top-level modes of a shape (an int is one mode)."""
    return (shape,) if isinstance(shape, int) else tuple(shape)


def _at(layout: Callable[[int], Any], i: int) -> int:
    """Evaluate a layout at a flat index; the value must be an integer offset."""
    value = layout(i)
    try:
        return int(value)
    except TypeError:
        raise LayoutError(f"layout value at {i} is {value!r}, not an integer; "
                          "only layouts with integer codomains render") from None


def _cosize(layout: Any, size: int) -> int:
    """cosize of a layout: its own if it has one, else one past the largest value."""
    cosize = getattr(layout, "cosize", None)
    if isinstance(cosize, int):
        return cosize
    return max(_at(layout, i) for i in range(size)) + 1 if size else 0


def _tile_dims(tile_shape: Any) -> tuple[int, int]:
    """(rows, cols) of a tile given as an int, (M,) or (M, N) (modes may be nested)."""
    modes = _modes(tile_shape)
    if len(modes) == 1:
        return _size(modes[0]), 1
    if len(modes) == 2:
        return _size(modes[0]), _size(modes[1])
    raise LayoutError(f"tile_shape {tile_shape!r} must have rank 1 or 2")


def default_tile_shape(cosize: int) -> tuple[int, int]:
    """The tile a TV layout is drawn on when none is given: (M, cosize // M), with M the
    largest power of two <= sqrt(cosize) that divides cosize (so 128 -> (8, 16))."""
    if cosize <= 0:
        return (1, 0)
    m = 1
    while (2 * m) ** 2 <= cosize and cosize % (2 * m) == 0:
        m *= 2
    return (m, cosize // m)


def _grid_dims(layout: Any, tile_shape: Any) -> tuple[int, int, int]:
    """(rows, cols, column group) for drawing a plain layout; group 0 means none."""
    size = _size(_shape_of(layout))
    if tile_shape is not None:
        rows, cols = _tile_dims(tile_shape)
        if rows * cols != size:
            raise LayoutError(f"tile_shape {tile_shape!r} has {rows * cols} cells but the "
                              f"layout {layout} has size {size}")
        return rows, cols, 0
    modes = _modes(_shape_of(layout))
    if len(modes) == 1:
        return 1, size, 0
    rows = _size(modes[0])
    group = _size(modes[-2]) if len(modes) >= 3 else 0
    group *= math.prod(_size(m) for m in modes[1:-2])
    return rows, size // rows if rows else 0, group


def _plain_cells(layout: Any, tile_shape: Any) -> tuple[list[list[int]], int]:
    """The grid of offsets of a plain layout (row-major list of rows) and its column group."""
    rows, cols, group = _grid_dims(layout, tile_shape)
    if tile_shape is None and len(_modes(_shape_of(layout))) == 1:
        return [[_at(layout, j) for j in range(cols)]], 0
    return [[_at(layout, m + n * rows) for n in range(cols)] for m in range(rows)], group


# --------------------------------------------------------------------------- TV layouts

def _tv_extents(tv: Any) -> tuple[int, int]:
    """(threads, values) of a TV layout: sizes of its two top-level modes."""
    modes = _modes(_shape_of(tv))
    if len(modes) == 1:
        return _size(modes[0]), 1
    if len(modes) == 2:
        return _size(modes[0]), _size(modes[1])
    raise LayoutError(f"a TV layout has rank 2 (thread, value); {tv} has rank {len(modes)}")


def tv_cells(tv: Any, tile_shape: Any = None) -> tuple[tuple[int, int], dict[Cell, list[TV]]]:
    """Which (thread, value) pairs land on each tile cell.

    Returns ((M, N), {(row, col): [(t, v), ...]}), lists sorted by (t, v). Every (t, v) of
    the layout appears exactly once; replicated (broadcast) cells hold several pairs.
    """
    threads, values = _tv_extents(tv)
    if tile_shape is None:
        tile_shape = default_tile_shape(_cosize(tv, threads * values))
    rows, cols = _tile_dims(tile_shape)
    cells: dict[Cell, list[TV]] = {}
    for t in range(threads):
        for v in range(values):
            idx = _at(tv, t + v * threads)
            if not 0 <= idx < rows * cols:
                raise LayoutError(f"TV layout {tv} maps (T{t}, V{v}) to index {idx}, outside "
                                  f"the {rows}x{cols} tile")
            cells.setdefault((idx % rows, idx // rows), []).append((t, v))
    return (rows, cols), cells


def _tv_label(pairs: Sequence[TV]) -> str:
    """`T0V0|T4V0` for the pairs of one cell, `.` for an uncovered cell."""
    return "|".join(f"T{t}V{v}" for t, v in pairs) if pairs else "."


# --------------------------------------------------------------------------- text

def _text_grid(labels: list[list[str]], group: int = 0) -> str:
    """Aligned grid with column indices on top and row indices on the left."""
    rows = len(labels)
    cols = len(labels[0]) if labels else 0
    width = max([len(s) for row in labels for s in row] + [len(str(cols - 1))])
    rw = len(str(max(rows - 1, 0)))

    def line(head: str, items: list[str]) -> str:
        parts = []
        for j, item in enumerate(items):
            if group and j and j % group == 0:
                parts.append("|")
            parts.append(item.rjust(width))
        return f"{head.rjust(rw)} | " + " ".join(parts)

    out = [line("", [str(j) for j in range(cols)])]
    out.append("-" * len(out[0]))
    out += [line(str(i), row) for i, row in enumerate(labels)]
    return "\n".join(line_.rstrip() for line_ in out)


def render_text(layout: Any, tile_shape: Any = None) -> str:
    """The layout in CuTe notation followed by its grid of offsets (see module docstring
    for how ranks other than 2 are laid out). tile_shape (M, N) reinterprets the domain."""
    grid, group = _plain_cells(layout, tile_shape)
    labels = [[str(x) for x in row] for row in grid]
    return f"{layout}\n{_text_grid(labels, group)}"


def render_bank_text(layout: Any, tile_shape: Any, elem_bytes: int, banks: int = 32,
                     bank_bytes: int = 4) -> str:
    """The bank of every cell of a (possibly swizzled) shared layout:
    offset*elem_bytes // bank_bytes % banks, laid out like `render_text`."""
    grid, group = _plain_cells(layout, tile_shape)
    labels = [[str(_bank(x, elem_bytes, banks, bank_bytes)) for x in row] for row in grid]
    head = f"banks of {layout} ({elem_bytes}-byte elements, {banks} banks x {bank_bytes} B)"
    return f"{head}\n{_text_grid(labels, group)}"


def _bank(offset: int, elem_bytes: int, banks: int, bank_bytes: int) -> int:
    """Bank holding the first byte of the element at `offset`."""
    return offset * elem_bytes // bank_bytes % banks


def render_tv_text(tv: Any, tile_shape: Any = None) -> str:
    """A TV layout drawn as its tile, each cell labelled with every `T#V#` landing on it
    (replicas joined by `|`; `.` marks a cell no (t, v) covers)."""
    (rows, cols), cells = tv_cells(tv, tile_shape)
    labels = [[_tv_label(cells.get((m, n), [])) for n in range(cols)] for m in range(rows)]
    threads, values = _tv_extents(tv)
    head = f"{tv}  (TV layout: {threads} threads x {values} values -> {rows}x{cols} tile)"
    return f"{head}\n{_text_grid(labels)}"


# --------------------------------------------------------------------------- colours

def _hls(h: float, l: float, s: float) -> str:
    """#rrggbb of a hue (degrees), lightness and saturation."""
    r, g, b = colorsys.hls_to_rgb((h % 360) / 360.0, l, s)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


# Eight hues spread so neighbours differ (like CuTe's print_latex's eight colours); the
# lightness steps tell thread groups of eight apart, so a warp uses 32 distinct colours.
_THREAD_HUES = (210, 120, 50, 0, 270, 170, 30, 320)
_THREAD_LIGHTNESS = (0.78, 0.64, 0.88, 0.71)


def thread_color(t: int) -> str:
    """Fill colour of thread t: hue by t % 8, lightness by thread group (t // 8) % 4."""
    return _hls(_THREAD_HUES[t % 8], _THREAD_LIGHTNESS[(t // 8) % 4], 0.75)


def bank_color(bank: int, banks: int = 32) -> str:
    """Fill colour of a shared-memory bank: the hue wheel, alternate banks lighter so
    neighbouring banks (close hues) still differ."""
    return _hls(360.0 * (bank % banks) / banks, 0.82 if bank % 2 else 0.68, 0.7)


def _offset_color(offset: int, cosize: int) -> str:
    """A light-to-mid blue ramp over the codomain, so strides read as gradients."""
    frac = offset / max(cosize - 1, 1)
    return _hls(215, 0.95 - 0.33 * frac, 0.6)


# --------------------------------------------------------------------------- SVG primitives

_CELL_H = 22
_FONT = "font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\""


class _Svg:
    """Accumulates SVG elements; `finish` wraps them in a document of the right size."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.width = 0.0
        self.height = 0.0

    def _grow(self, x: float, y: float) -> None:
        self.width, self.height = max(self.width, x), max(self.height, y)

    def rect(self, x: float, y: float, w: float, h: float, fill: str,
             stroke: str = "#555", tip: str | None = None) -> None:
        """A rectangle; `tip` becomes a hover tooltip (<title>) listing the cell's content."""
        body = f"<title>{escape(tip)}</title>" if tip else ""
        self.items.append(f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h:g}" '
                          f'fill="{fill}" stroke="{stroke}" stroke-width="0.6">{body}</rect>')
        self._grow(x + w, y + h)

    def text(self, x: float, y: float, s: str, size: float = 10, anchor: str = "middle",
             weight: str = "normal") -> None:
        """Text centred (by default) on x with its baseline set so it centres on y."""
        self.items.append(f'<text x="{x:g}" y="{y + size * 0.35:g}" font-size="{size:g}" '
                          f'text-anchor="{anchor}" font-weight="{weight}" {_FONT}>'
                          f"{escape(s)}</text>")
        extent = _char_w(size) * len(s)
        right = {"start": extent, "middle": extent / 2}.get(anchor, 0.0)
        self._grow(x + right, y + size)

    def finish(self, pad: float = 10) -> str:
        w, h = self.width + pad, self.height + pad
        return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:g}" height="{h:g}" '
                f'viewBox="0 0 {w:g} {h:g}">\n<rect width="100%" height="100%" fill="white"/>\n'
                + "\n".join(self.items) + "\n</svg>\n")


def _char_w(size: float) -> float:
    """Approximate advance of one monospace character at a font size."""
    return 0.62 * size


def _title(svg: _Svg, lines: Sequence[str], x: float = 10, y: float = 16) -> float:
    """Title lines at the top-left; returns the y below them."""
    for i, line in enumerate(lines):
        svg.text(x, y + 16 * i, line, size=13 if i == 0 else 11, anchor="start",
                 weight="bold" if i == 0 else "normal")
    return y + 16 * len(lines)


def _axes(svg: _Svg, x0: float, y0: float, cw: float, ch: float, rows: int, cols: int,
          row_label: str = "", col_label: str = "") -> None:
    """Row indices left of a grid and column indices above it."""
    for j in range(cols):
        svg.text(x0 + (j + 0.5) * cw, y0 - 8, str(j), size=9)
    for i in range(rows):
        svg.text(x0 - 4, y0 + (i + 0.5) * ch, str(i), size=9, anchor="end")
    if col_label:
        svg.text(x0 + cols * cw / 2, y0 - 22, col_label, size=10)
    if row_label:
        svg.text(x0 - 30, y0 + rows * ch / 2, row_label, size=10, anchor="end")


def _legend(svg: _Svg, x: float, y: float, entries: Sequence[tuple[str, str]],
            per_row: int = 8, cw: float = 50) -> float:
    """Rows of colour swatches with labels; returns the y below the legend."""
    for k, (label, color) in enumerate(entries):
        cx, cy = x + (k % per_row) * cw, y + (k // per_row) * 16
        svg.rect(cx, cy, 12, 12, color)
        svg.text(cx + 15, cy + 6, label, size=9, anchor="start")
    return y + 16 * math.ceil(len(entries) / per_row) + 4


# --------------------------------------------------------------------------- SVG pictures

def svg_layout(layout: Any, tile_shape: Any = None, title: str | None = None) -> str:
    """A plain layout as a grid of offsets, shaded from light (offset 0) to darker (cosize-1)."""
    grid, _ = _plain_cells(layout, tile_shape)
    rows, cols = len(grid), len(grid[0]) if grid else 0
    cosize = max((x for row in grid for x in row), default=0) + 1
    cw = max(28.0, _char_w(11) * len(str(cosize - 1)) + 10)
    svg = _Svg()
    y0 = _title(svg, [title or str(layout),
                      f"size {rows * cols}, cosize {cosize}; cell (row, col) shows the offset"])
    x0, y0 = 40.0, y0 + 30
    _axes(svg, x0, y0, cw, _CELL_H, rows, cols)
    for i, row in enumerate(grid):
        for j, off in enumerate(row):
            x, y = x0 + j * cw, y0 + i * _CELL_H
            svg.rect(x, y, cw, _CELL_H, _offset_color(off, cosize), tip=f"({i},{j}) -> {off}")
            svg.text(x + cw / 2, y + _CELL_H / 2, str(off), size=11)
    return svg.finish()


def _tv_cell(svg: _Svg, x: float, y: float, cw: float, ch: float, pairs: Sequence[TV],
             where: str) -> None:
    """One tile cell: a stripe per (t, v) coloured by thread, the labels stacked on top,
    and every pair in the tooltip (so heavy replication stays legible and complete)."""
    tip = f"{where}: " + (", ".join(f"T{t}V{v}" for t, v in pairs) or "not covered")
    if not pairs:
        svg.rect(x, y, cw, ch, "#f4f4f4", tip=tip)
        return
    stripe = cw / len(pairs)
    for k, (t, _) in enumerate(pairs):
        svg.rect(x + k * stripe, y, stripe, ch, thread_color(t), stroke="none")
    svg.rect(x, y, cw, ch, "none", tip=tip)
    shown = list(pairs) if len(pairs) <= 3 else list(pairs[:2])
    lines = [f"T{t}V{v}" for t, v in shown]
    if len(pairs) > 3:
        lines.append(f"+{len(pairs) - 2} more")
    size = min(10.0, (ch - 2) / len(lines) / 1.1)
    for k, line in enumerate(lines):
        svg.text(x + cw / 2, y + ch / 2 + (k - (len(lines) - 1) / 2) * size * 1.1, line,
                 size=size)


def _tv_block(svg: _Svg, x0: float, y0: float, tile: tuple[int, int],
              cells: dict[Cell, list[TV]], transpose: bool = False,
              labels: tuple[str, str] = ("", "")) -> tuple[float, float]:
    """Draw a TV tile with its top-left at (x0, y0); with `transpose` the tile's rows become
    columns (how B is drawn above C in an MMA picture). Returns (width, height)."""
    rows, cols = tile
    drows, dcols = (cols, rows) if transpose else (rows, cols)
    reps = max((len(p) for p in cells.values()), default=1)
    ch = _CELL_H * min(reps, 3) if reps > 1 else _CELL_H
    cw = 44.0 if reps == 1 else 48.0
    _axes(svg, x0, y0, cw, ch, drows, dcols, *labels)
    for m in range(rows):
        for n in range(cols):
            i, j = (n, m) if transpose else (m, n)
            _tv_cell(svg, x0 + j * cw, y0 + i * ch, cw, ch, cells.get((m, n), []),
                     f"({m},{n})")
    return dcols * cw, drows * ch


def _thread_legend(svg: _Svg, x: float, y: float, threads: int) -> float:
    """Swatches for the first 32 threads (colours repeat every 32)."""
    shown = min(threads, 32)
    note = "" if threads <= 32 else f" (colours repeat every 32 threads; {threads} threads)"
    svg.text(x, y + 6, "thread colours" + note, size=10, anchor="start")
    return _legend(svg, x, y + 16, [(f"T{t}", thread_color(t)) for t in range(shown)])


def svg_tv_layout(tv: Any, tile_shape: Any = None, title: str | None = None) -> str:
    """A TV layout as its tile: each cell coloured by the thread(s) holding it and labelled
    `T#V#`; replicated cells are split into one stripe per (t, v)."""
    tile, cells = tv_cells(tv, tile_shape)
    threads, values = _tv_extents(tv)
    svg = _Svg()
    y0 = _title(svg, [title or str(tv), f"{threads} threads x {values} values -> "
                      f"{tile[0]}x{tile[1]} tile; cell (row, col) = (idx % {tile[0]}, "
                      f"idx // {tile[0]})"])
    _, h = _tv_block(svg, 40, y0 + 30, tile, cells)
    _thread_legend(svg, 10, y0 + 30 + h + 12, threads)
    return svg.finish()


def svg_shared_layout(layout: Any, tile_shape: Any, elem_bytes: int, banks: int = 32,
                      bank_bytes: int = 4, title: str | None = None) -> str:
    """A (possibly swizzled) shared-memory layout drawn as the logical tile: each cell shows
    its element offset and is coloured by its bank, offset*elem_bytes // bank_bytes % banks."""
    grid, _ = _plain_cells(layout, tile_shape)
    rows, cols = len(grid), len(grid[0]) if grid else 0
    width = max(len(str(x)) for row in grid for x in row) if grid else 1
    cw = max(30.0, _char_w(10) * width + 8)
    svg = _Svg()
    y0 = _title(svg, [title or str(layout),
                      f"{rows}x{cols} tile of {elem_bytes}-byte elements; cell: offset, "
                      f"bank = offset*{elem_bytes} // {bank_bytes} % {banks}"])
    x0, y0, ch = 40.0, y0 + 30, 28.0
    _axes(svg, x0, y0, cw, ch, rows, cols)
    for i, row in enumerate(grid):
        for j, off in enumerate(row):
            bank = _bank(off, elem_bytes, banks, bank_bytes)
            x, y = x0 + j * cw, y0 + i * ch
            svg.rect(x, y, cw, ch, bank_color(bank, banks),
                     tip=f"({i},{j}) -> offset {off}, bank {bank}")
            svg.text(x + cw / 2, y + 9, str(off), size=10)
            svg.text(x + cw / 2, y + 20, f"b{bank}", size=8)
    y = y0 + rows * ch + 12
    svg.text(10, y + 6, "bank colours", size=10, anchor="start")
    _legend(svg, 10, y + 16, [(f"b{b}", bank_color(b, banks)) for b in range(banks)])
    return svg.finish()


def svg_mma_atom(a_tv: Any, b_tv: Any, c_tv: Any, shape_mnk: tuple[int, int, int],
                 title: str | None = None) -> str:
    """An MMA atom's fragments in CuTe's arrangement: B (an N x K TV layout, drawn K rows by
    N columns) above C (M x N), A (M x K) left of C; cells coloured by thread, `T#V#`."""
    m, n, k = shape_mnk
    a_tile, a_cells = tv_cells(a_tv, (m, k))
    b_tile, b_cells = tv_cells(b_tv, (n, k))
    c_tile, c_cells = tv_cells(c_tv, (m, n))
    svg = _Svg()
    y0 = _title(svg, [title or f"MMA atom {m}x{n}x{k}",
                      f"A {m}x{k} (left), B {n}x{k} drawn as k x n (top), C {m}x{n} (right)"])
    probe = _Svg()  # measure A and B so C sits to the right of A and below B
    aw, _ = _tv_block(probe, 0, 0, a_tile, a_cells)
    _, bh = _tv_block(probe, 0, 0, b_tile, b_cells, transpose=True)
    left, top = 60.0, y0 + 40
    cx, cy = left + aw + 50, top + bh + 50
    _tv_block(svg, cx, top, b_tile, b_cells, transpose=True, labels=("k", "B: n"))
    aw, ah = _tv_block(svg, left, cy, a_tile, a_cells, labels=("m", "A: k"))
    _, ch = _tv_block(svg, cx, cy, c_tile, c_cells, labels=("", "C: n"))
    threads = max(_tv_extents(x)[0] for x in (a_tv, b_tv, c_tv))
    _thread_legend(svg, 10, cy + max(ah, ch) + 12, threads)
    return svg.finish()
