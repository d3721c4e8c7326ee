"""The `tegula` command line.

Each subcommand is one entry of `COMMANDS`: a name, a one-line help, a function that adds
its arguments and a function that runs it (returning the exit status). Later work adds
`explain`, `compile` and `bench` by appending entries; `main` needs no change.

Errors a user can cause (a layout that does not parse, a tile that does not fit) print one
line, `tegula: error: ...`, and exit with status 2 -- never a traceback.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tegula.layout.errors import LayoutError


class UsageError(Exception):
    """Bad command-line input; printed as one line, exit status 2."""


@dataclass(frozen=True)
class Command:
    """One subcommand: how to declare its arguments and how to run it."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --------------------------------------------------------------------------- argument parsing

def parse_tile(text: str) -> tuple[int, ...]:
    """`16x8`, `16,8` or `128` -> a tile shape tuple."""
    parts = text.lower().replace(",", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"--tile {text!r}: expected MxN, e.g. 16x8") from None
    if not 1 <= len(dims) <= 2 or min(dims) <= 0:
        raise UsageError(f"--tile {text!r}: expected one or two positive extents, e.g. 16x8")
    return dims


def parse_swizzle(text: str) -> tuple[int, int, int]:
    """`3,3,3` (CuTe Swizzle<B,M,S>) -> (bits, base, shift)."""
    try:
        b, m, s = (int(p) for p in text.split(","))
    except ValueError:
        raise UsageError(f"--swizzle {text!r}: expected B,M,S, e.g. 3,3,3") from None
    return b, m, s


def parse_layout(spec: str) -> Any:
    """A CuTe-notation layout, or a one-line UsageError saying why it is not one."""
    from tegula.layout.cute import Layout

    try:
        return Layout.parse(spec)
    except (LayoutError, ValueError, TypeError, IndexError, KeyError, SyntaxError) as err:
        why = str(err)
        # The parser's own messages already name the text; do not say it twice.
        raise UsageError(why if why.startswith("cannot parse") else
                         f"cannot parse layout {spec!r}: {why}") from None


def _swizzled(layout: Any, bits_base_shift: tuple[int, int, int]) -> Any:
    """Swizzle<B,M,S> composed with a layout (CuTe's ComposedLayout(sw, 0, layout))."""
    from tegula.layout.swizzle import ComposedLayout, Swizzle

    try:
        return ComposedLayout(Swizzle(*bits_base_shift), 0, layout)
    except (LayoutError, ValueError) as err:
        raise UsageError(f"--swizzle {','.join(map(str, bits_base_shift))}: {err}") from None


def _write(path: str, text: str) -> None:
    """Write a file, creating its directory."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# --------------------------------------------------------------------------- tegula layout

def _add_layout_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `tegula layout`."""
    p.add_argument("spec", help='a layout in CuTe notation, e.g. "((2,4),(2,2)):((8,1),(4,16))"')
    p.add_argument("--tv", action="store_true",
                   help="read it as a thread-value layout (thread, value) -> tile index")
    p.add_argument("--tile", type=str, default=None,
                   help="tile shape MxN (for --tv: the tile the layout indexes; default: "
                        "a square-ish factorization of cosize)")
    p.add_argument("--svg", metavar="FILE", default=None, help="also write an SVG picture")
    p.add_argument("--swizzle", metavar="B,M,S", default=None,
                   help="compose CuTe Swizzle<B,M,S> with the layout (a shared layout)")
    p.add_argument("--elem-bytes", type=int, default=None,
                   help="element size in bytes: show the shared-memory banks (default 2 "
                        "with --swizzle)")
    p.add_argument("--bank-bytes", type=int, default=4, help="bytes per bank (default 4)")
    p.add_argument("--banks", type=int, default=32, help="number of banks (default 32)")


def describe(layout: Any) -> str:
    """`layout: S:D` plus its size, cosize, rank and depth."""
    return (f"layout: {layout}\n"
            f"size {layout.size}, cosize {layout.cosize}, rank {layout.rank}, "
            f"depth {layout.depth}")


def _plain_tile(layout: Any, tile: tuple[int, ...] | None) -> tuple[int, ...]:
    """The tile a shared (bank) picture is drawn on: --tile, else the rank-2 shape."""
    if tile is not None:
        return tile
    if layout.rank == 2:
        return (layout[0].size, layout[1].size)
    return (layout.size,) if layout.rank == 1 else (layout[0].size, layout.size // layout[0].size)


def _run_layout(args: argparse.Namespace) -> int:
    """`tegula layout SPEC`: describe the layout, print its grid, optionally write an SVG."""
    layout = parse_layout(args.spec)
    tile = parse_tile(args.tile) if args.tile else None
    if args.tv and (args.swizzle or args.elem_bytes is not None):
        flag = "--swizzle" if args.swizzle else "--elem-bytes"
        raise UsageError(f"{flag} describes a shared-memory layout (offsets into banks); "
                         f"--tv reads the layout as (thread, value) -> tile coordinate, which "
                         f"has no banks. Drop --tv to draw a swizzled shared layout")
    print(describe(layout))
    if args.tv:
        picture = _show_tv(layout, tile, args)
    elif args.swizzle or args.elem_bytes is not None:
        picture = _show_shared(layout, tile, args)
    else:
        picture = _show_plain(layout, tile, args)
    if args.svg:
        _write(args.svg, picture())
        print(f"wrote {args.svg}")
    return 0


# Each _show_* prints the text picture and returns a thunk for the SVG, so the SVG is only
# built when --svg asks for it (a 128x128 tile is a large document).

def _show_tv(layout: Any, tile: tuple[int, ...] | None,
             args: argparse.Namespace) -> Callable[[], str]:
    from tegula.layout import render

    print(render.render_tv_text(layout, tile))
    (rows, cols), cells = render.tv_cells(layout, tile)
    if len(cells) < rows * cols:
        print(f"note: the layout covers {len(cells)} of the {rows * cols} cells of the "
              f"{rows}x{cols} tile ('.' marks the rest); a TV layout of a whole tile maps "
              f"threads x values onto every cell (e.g. the mma C fragment "
              f"{MMA_M16N8K16_C} --tile 16x8)")
    return lambda: render.svg_tv_layout(layout, tile)


def _show_plain(layout: Any, tile: tuple[int, ...] | None,
                args: argparse.Namespace) -> Callable[[], str]:
    from tegula.layout import render

    print(render.render_text(layout, tile))
    return lambda: render.svg_layout(layout, tile)


def _show_shared(layout: Any, tile: tuple[int, ...] | None,
                 args: argparse.Namespace) -> Callable[[], str]:
    """A shared layout (swizzled with --swizzle): offsets and banks (--elem-bytes, default 2)."""
    from tegula.layout import render

    shared = _swizzled(layout, parse_swizzle(args.swizzle)) if args.swizzle else layout
    elem = 2 if args.elem_bytes is None else args.elem_bytes
    for flag, value in (("--elem-bytes", elem), ("--banks", args.banks),
                        ("--bank-bytes", args.bank_bytes)):
        if value <= 0:
            raise UsageError(f"{flag} {value}: must be positive")
    tile = _plain_tile(layout, tile)
    print(render.render_text(shared, tile))
    print(render.render_bank_text(shared, tile, elem, args.banks, args.bank_bytes))
    return lambda: render.svg_shared_layout(shared, tile, elem, args.banks, args.bank_bytes)


# --------------------------------------------------------------------------- tegula demo

def _add_demo_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `tegula demo`."""
    p.add_argument("--out", metavar="DIR", default="tegula-demo",
                   help="where to write the SVG pictures (default ./tegula-demo/)")


def _run_demo(args: argparse.Namespace) -> int:
    """Print the demo layouts and write their pictures under --out."""
    os.makedirs(args.out, exist_ok=True)
    for part in (_demo_cute, _demo_mma, _demo_swizzle):
        part(args.out)
        print()
    _optional("F2 linear layout", _demo_f2)
    print()
    passed = _demo_gemm()
    print(f"pictures written to {os.path.abspath(args.out)}/")
    return 0 if passed else 1


def _optional(what: str, part: Callable[[], None]) -> None:
    """Run a demo part that depends on a module that may not exist yet; say so if not."""
    try:
        part()
    except ImportError as err:
        print(f"({what}: skipped, {err})")


def _heading(text: str) -> None:
    """A section title of the demo output."""
    print(f"== {text}")


def _save(out: str, name: str, svg: str) -> None:
    """Write one demo picture and say where."""
    path = os.path.join(out, name)
    _write(path, svg)
    print(f"   -> {path}")


# mma.sync.m16n8k16 f16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16") as CuTe
# TV layouts. Lane l = 4*groupID + threadID_in_group is thread mode (4, 8); tiles are
# A (M,K) = (16,16), B (N,K) = (8,16), C (M,N) = (16,8), indexed colexicographically.
MMA_M16N8K16_A = "((4,8),(2,2,2)):((32,1),(16,8,128))"
MMA_M16N8K16_B = "((4,8),(2,2)):((16,1),(8,64))"
MMA_M16N8K16_C = "((4,8),(2,2)):((32,1),(16,8))"


def ptx_m16n8k16_c(lane: int, i: int) -> tuple[int, int]:
    """(row, col) of accumulator c_i of `lane`, as the PTX ISA fragment table states it."""
    return lane // 4 + 8 * (i // 2), 2 * (lane % 4) + i % 2


def _demo_cute(out: str) -> None:
    from tegula.layout import render

    layout = parse_layout("((2,4),(2,2)):((8,1),(4,16))")
    _heading("a CuTe layout: cell (row, col) holds layout(row + 8*col)")
    print(describe(layout))
    print(render.render_text(layout))
    _save(out, "layout.svg", render.svg_layout(layout))


def _demo_mma(out: str) -> None:
    from tegula.layout import render

    a, b, c = (parse_layout(x) for x in (MMA_M16N8K16_A, MMA_M16N8K16_B, MMA_M16N8K16_C))
    ok = all(c(t + 32 * v) == row + 16 * col for t in range(32) for v in range(4)
             for row, col in [ptx_m16n8k16_c(t, v)])
    _heading("mma.sync.m16n8k16 accumulator fragment C as a TV layout (thread, value) -> (m, n)")
    print(f"matches the PTX ISA fragment table: {'yes' if ok else 'NO'}")
    print(render.render_tv_text(c, (16, 8)))
    _save(out, "mma_m16n8k16_c.svg", render.svg_tv_layout(c, (16, 8),
                                                          title=f"mma m16n8k16 C: {c}"))
    _save(out, "mma_m16n8k16.svg", render.svg_mma_atom(
        a, b, c, (16, 8, 16), title="mma.sync.aligned.m16n8k16 (f16 A/B, f32 C)"))


def _demo_swizzle(out: str) -> None:
    from tegula.layout import render
    from tegula.layout.cute import Layout

    plain = Layout((64, 64), (64, 1))
    tile = _swizzled(plain, (3, 3, 3))
    _heading("a 64x64 f16 shared tile, row-major, swizzled with Sw<3,3,3>")
    print(f"layout: {tile}")
    print("16-byte chunk of element (row, 8*chunk), first 8 rows (swizzle permutes chunks):")
    chunks = [[tile(r + 64 * 8 * c) % 64 // 8 for c in range(8)] for r in range(8)]
    print("\n".join("  " + " ".join(str(x) for x in row) for row in chunks))
    _optional("bank conflicts", lambda: _print_conflicts(plain, tile))
    _save(out, "shared_64x64_f16_sw333.svg",
          render.svg_shared_layout(tile, (64, 64), 2, title=f"64x64 f16 shared tile: {tile}"))


# Two ways one warp reads a 64x64 f16 tile (index = row + 64*col): along a row (lane t
# holds columns 2t, 2t+1 of row 0) and down a column of 16-byte chunks (lane t holds
# row t, columns 0..7: the ldmatrix pattern that row-major tiles serve 8-way conflicted).
READERS_64X64 = (("row read, 4 B per lane", "(32,2):(128,64)"),
                 ("column read, 16 B per lane", "(32,8):(1,64)"))


def _print_conflicts(plain: Any, swizzled: Any) -> None:
    """Wavefronts per warp-wide access, unswizzled vs swizzled, for both readers."""
    from tegula.layout.banks import bank_report
    from tegula.layout.cute_bridge import linear_from_cute, linear_from_cute_tv

    dims = [("dim0", 64), ("dim1", 64)]
    shared = {name: linear_from_cute(x, dims, [("offset", 64 * 64)]).invert()
              for name, x in (("row-major", plain), ("Sw<3,3,3>", swizzled))}
    print("bank conflicts (shared wavefronts per warp instruction; ideal in brackets):")
    for what, spec in READERS_64X64:
        reader = linear_from_cute_tv(parse_layout(spec), (64, 64))
        cells = []
        for name, s in shared.items():
            rep = bank_report(s, reader, 2)
            cells.append(f"{name} {rep.wavefronts} [{rep.ideal_wavefronts}]"
                         f" = {rep.conflict_factor}-way")
        print(f"  {what:28s} {spec:16s} " + ", ".join(cells))


def _demo_f2() -> None:
    """A CuTe layout and the C fragment as F2 linear layouts (basis vector per index bit)."""
    from tegula.layout.cute_bridge import linear_from_cute_tv
    from tegula.layout.linear import LinearLayout

    layout = parse_layout("((2,4),(2,2)):((8,1),(4,16))")
    _heading(f"F2: LinearLayout.from_cute({layout}): the image of each index bit")
    print(LinearLayout.from_cute(layout))
    print()
    c = parse_layout(MMA_M16N8K16_C)
    _heading(f"F2: the mma C fragment {c} as register/lane/warp -> (dim0=m, dim1=n)")
    print(linear_from_cute_tv(c, (16, 8)))


# Problem of the demo GEMM: odd extents, so boundary tiles are predicated.
DEMO_GEMM_SHAPE = (97, 130, 72)
DEMO_GEMM_TILES = {"BM": 64, "BN": 64, "BK": 32}


def _demo_gemm() -> bool:
    """Explain the README's GEMM, run it in the emulator at an odd shape, check it against
    numpy; True when it matches."""
    import numpy as np

    from tegula.build import build, emulate
    from tegula.dtypes import f16
    from tegula.explain import explain_build
    from tegula.kernels.gemm import gemm_kernel
    from tegula.synth.facts import TensorFacts

    gemm = gemm_kernel(f16)  # the library's copy of the README's GEMM (shared pipeline)

    m, n, k = DEMO_GEMM_SHAPE
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.zeros((m, n), dtype=np.float16)
    grid = (-(-m // DEMO_GEMM_TILES["BM"]), -(-n // DEMO_GEMM_TILES["BN"]))
    arrays = {"a": a, "b": b, "c": c}
    # The facts the emulator will specialize on (odd M and N: narrower vectors for c).
    facts = {name: TensorFacts.of(x.shape, tuple(s // x.itemsize for s in x.strides), 0, 2)
             for name, x in arrays.items()}
    _heading(f"the README's GEMM (examples/gemm.py) with {DEMO_GEMM_TILES}: what the "
             f"compiler decided")
    print(explain_build(build(gemm, DEMO_GEMM_TILES, facts), grid=grid,
                        shapes={name: x.shape for name, x in arrays.items()}))
    report = emulate(gemm, grid, a, b, c, **DEMO_GEMM_TILES)
    expected = a.astype(np.float32) @ b.astype(np.float32).T
    error = float(np.abs(c.astype(np.float32) - expected).max())
    # f16 output: half an ulp of the largest |c| (~|c| * 2^-11), with headroom.
    tolerance = 2.0 ** -9 * max(1.0, float(np.abs(expected).max()))
    passed = bool(np.isfinite(error) and error <= tolerance)
    _heading(f"emulated {m}x{n}x{k} on a {grid[0]}x{grid[1]} grid")
    print(report)
    print(f"max |c - a @ b.T| = {error:.3g} (tolerance {tolerance:.3g}): "
          f"{'PASS' if passed else 'FAIL'}")
    return passed


# --------------------------------------------------------------------------- tegula explain

def _add_explain_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `tegula explain`."""
    p.add_argument("kernel", metavar="FILE.py:KERNEL", nargs="?",
                   help="a Python file and the @tg.kernel in it, e.g. examples/gemm.py:gemm")
    p.add_argument("--w4a16", default=None, metavar="MxNxK",
                   help="instead of a kernel: rank W4A16's launch plans for an (M, N, K) "
                        "product on both stored weight layouts (plain, or pre-packed in the "
                        "MMA fragment's order), the layout a coordinate of the search "
                        "(--group G, --top, --budget)")
    p.add_argument("--group", type=int, default=128, metavar="G",
                   help="with --w4a16: the quantization group size (default 128)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                   help="set a constexpr, e.g. -D BM=64 (repeatable)")
    p.add_argument("--target", default="sm_90a", help="sm_80, sm_89, sm_90a, h200 (default sm_90a)")
    p.add_argument("--grid", default=None, metavar="GXxGY",
                   help="the launch grid, for a whole-grid time prediction, e.g. 32x32")
    p.add_argument("--shape", dest="shapes", action="append", default=[], metavar="NAME=AxB",
                   help="a tensor argument's shape, e.g. --shape a=4096x4096 (repeatable); "
                        "gives the model loop trip counts and the DRAM footprint")
    p.add_argument("--svg", metavar="DIR", default=None,
                   help="draw the kernel's layouts on one page, DIR/KERNEL.svg: each "
                        "distinct register TV layout and each shared buffer (coloured by bank)")
    p.add_argument("--svg-only", metavar="NAMES", default=None,
                   help="with --svg: draw only these tiles, e.g. r0,s1 (names as explain "
                        "prints them)")
    p.add_argument("--compile", action="store_true",
                   help="also build the cubin (NVRTC or nvcc, no GPU) and show the "
                        "compiler's report: registers, spill stores/loads, stack")
    p.add_argument("--recommend", action="store_true",
                   help="propose the constexprs left open (no default, or declared with "
                        "tg.constexpr(choices=...)): the top configurations by predicted "
                        "time within shared-memory and register limits, and why the others "
                        "lost (give --shape for every tensor)")
    p.add_argument("--top", type=int, default=5, metavar="K",
                   help="with --recommend: how many configurations to show (default 5)")
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help="with --recommend: the most combinations to build and score "
                        "(default 256; the rest are reported as not tried)")
    p.add_argument("--space", action="append", default=[], metavar="NAME=V1,V2",
                   help="with --recommend: the values to try for a constexpr (or threads, "
                        "load_path), e.g. --space CLUSTER=1,2 (repeatable)")
    p.add_argument("--orientation", default=None, metavar="A,B,C",
                   help="with --recommend: the kernel computes C = A @ B.T; score every "
                        "configuration as written and transposed (C^T = B @ A^T), e.g. a,b,c")


def parse_define(text: str) -> tuple[str, Any]:
    """`NAME=VALUE` -> (name, value); the value is a Python literal, else a string."""
    import ast

    name, sep, value = text.partition("=")
    if not sep or not name.strip().isidentifier():
        raise UsageError(f"-D {text!r}: expected NAME=VALUE, e.g. -D BM=64")
    try:
        return name.strip(), ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        return name.strip(), value.strip()


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`a=4096x1024` -> ("a", (4096, 1024))."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().replace(",", "x").split("x"))
    except ValueError:
        shape = ()
    if not sep or not name.strip() or not shape or min(shape) <= 0:
        raise UsageError(f"--shape {text!r}: expected NAME=AxB, e.g. a=4096x4096")
    return name.strip(), shape


def load_kernel(spec: str, command: str = "explain") -> tuple[str, Any]:
    """Import FILE.py by path and return (the name it has there, the kernel) for KERNEL, or
    for its only kernel. The name is the module-level variable, which for a kernel made by
    a factory (`gemm_f16 = gemm_kernel(f16)`) differs from the inner function's name."""
    import importlib.util

    from tegula.lang.kernel import Kernel

    path, _, name = spec.rpartition(":") if ":" in spec else (spec, "", "")
    if not os.path.isfile(path):
        raise UsageError(f"{spec!r}: no file {path!r} (expected FILE.py:KERNEL)")
    module_name = f"_tegula_{command}_" + os.path.splitext(os.path.basename(path))[0]
    loader = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader)
    sys.modules[module_name] = module  # dataclasses and pickling look modules up by name
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        loader.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    kernels = {k: v for k, v in vars(module).items() if isinstance(v, Kernel)}
    if not name and len(kernels) == 1:
        return next(iter(kernels.items()))
    if not kernels:
        raise UsageError(f"{path} defines no @tg.kernel at module level ({command} imports "
                         f"the file and looks for module-level kernels; for a kernel made by a "
                         f"factory, assign one at module level, e.g. gemm_f16 = "
                         f"gemm_kernel(f16))")
    if name not in kernels:
        known = ", ".join(sorted(kernels))
        if not name:
            raise UsageError(f"{path} defines several kernels ({known}); name one as "
                             f"{path}:KERNEL")
        raise UsageError(f"{path} has no kernel {name!r} (its @tg.kernel functions: {known})")
    return name, kernels[name]


def _run_explain(args: argparse.Namespace) -> int:
    """`tegula explain FILE.py:KERNEL`: build it and print what the compiler decided."""
    from tegula.build import build
    from tegula.errors import TegulaError
    from tegula.explain import compile_report, explain_build, tile_names, write_svgs

    constexprs = dict(parse_define(d) for d in args.defines)
    shapes = dict(parse_shape(s) for s in args.shapes)
    grid = parse_tile(args.grid) if args.grid else None
    if args.svg_only and not args.svg:
        raise UsageError("--svg-only selects what --svg draws; give --svg DIR too")
    if args.w4a16:
        return _run_w4a16_layout(args)
    if not args.kernel:
        raise UsageError("explain: give FILE.py:KERNEL (e.g. examples/gemm.py:gemm), or "
                         "--w4a16 MxNxK")
    _, kernel = load_kernel(args.kernel, "explain")
    if args.recommend:
        return _run_recommend(args, kernel, constexprs, shapes, grid)
    try:
        result = build(kernel, constexprs, target=args.target)
        compiled = compile_report(result) if args.compile else None
        print(explain_build(result, grid=grid, shapes=shapes, compiled=compiled), end="")
    except TegulaError as err:
        raise UsageError(str(err)) from None
    if args.svg:
        only = [n.strip().lstrip("%") for n in args.svg_only.split(",")] \
            if args.svg_only else None
        unknown = sorted(set(only or ()) - set(tile_names(result)))
        if unknown:
            raise UsageError(f"--svg-only: {kernel.name} has no register tile or shared "
                             f"buffer named {', '.join(unknown)} (it has "
                             f"{', '.join(tile_names(result))})")
        written = write_svgs(result, args.svg, only)
        for path in written:
            print(f"wrote {path}")
        if not written:
            print("nothing to draw (pictures are drawn for tiles of rank 1 or 2)")
    return 0


def _run_w4a16_layout(args: argparse.Namespace) -> int:
    """`tegula explain --w4a16 MxNxK`: W4A16's plans on both weight layouts, ranked by the
    cost model (tegula.kernels.prepack_search)."""
    from tegula.kernels.prepack_search import recommend_w4a16_layout
    from tegula.recommend import DEFAULT_BUDGET

    try:
        dims = tuple(int(d) for d in args.w4a16.lower().split("x"))
    except ValueError:
        dims = ()
    if len(dims) != 3 or min(dims) <= 0 or args.top <= 0:
        raise UsageError(f"--w4a16 {args.w4a16!r} --top {args.top}: expected MxNxK, e.g. "
                         f"16x4096x4096, and a positive --top")
    try:
        result = recommend_w4a16_layout(*dims, group_size=args.group, top_k=args.top,
                                        target=args.target,
                                        budget=args.budget or DEFAULT_BUDGET)
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(result)
    return 0 if result.ranked else 1


def _run_recommend(args: argparse.Namespace, kernel: Any, fixed: dict, shapes: dict,
                   grid: Any) -> int:
    """`tegula explain --recommend`: rank the open constexprs' combinations by the cost
    model (tegula.recommend) and print the top ones and why the others lost."""
    from tegula.errors import TegulaError
    from tegula.recommend import DEFAULT_BUDGET, recommend

    if args.top <= 0:
        raise UsageError(f"--top {args.top}: expected a positive number")
    space = {}
    for item in args.space:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise UsageError(f"--space {item!r}: expected NAME=V1,V2, e.g. CLUSTER=1,2")
        space[name.strip()] = [parse_define(f"v={v}")[1] for v in values.split(",")]
    orientation = tuple(n.strip() for n in args.orientation.split(",")) \
        if args.orientation else None
    try:
        result = recommend(kernel, shapes=shapes, grid=grid, top_k=args.top,
                           target=args.target, budget=args.budget or DEFAULT_BUDGET,
                           space=space or None, orientation=orientation, **fixed)
    except TegulaError as err:
        raise UsageError(str(err)) from None
    print(result)
    return 0 if result.ranked else 1


# --------------------------------------------------------------------------- tegula compile

def _add_compile_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `tegula compile`."""
    p.add_argument("kernel", metavar="FILE.py:KERNEL",
                   help="a Python file and the @tg.kernel in it, e.g. examples/gemm.py:gemm")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                   help="set a constexpr (or threads=N), e.g. -D BM=64 (repeatable)")
    p.add_argument("--target", default="sm_90a", help="sm_80, sm_89, sm_90a (default sm_90a)")
    p.add_argument("--out", default=".", metavar="DIR",
                   help="where to write KERNEL.cu, KERNEL.cubin and KERNEL.explain.txt "
                        "(KERNEL as named in FILE.py:KERNEL)")


def _run_compile(args: argparse.Namespace) -> int:
    """`tegula compile FILE.py:KERNEL`: ahead of time, no GPU needed. Argument types come
    from the annotations; tensors are assumed contiguous, 16-byte aligned, with sizes
    divisible by 16 and offsets that fit in 32 bits (the facts a launch would check)."""
    from tegula.build import build
    from tegula.errors import TegulaError
    from tegula.explain import explain_build
    from tegula.runtime.compiler import compile_cuda_report

    constexprs = dict(parse_define(d) for d in args.defines)
    name, kernel = load_kernel(args.kernel, "compile")
    try:
        result = build(kernel, constexprs, target=args.target)
        source = result.cuda_source()
        cubin, report = compile_cuda_report(source, result.thread_kernel.name,
                                            result.target.sm)
        explanation = explain_build(result, compiled=report)
    except TegulaError as err:
        raise UsageError(str(err)) from None
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, name)  # the file's name for it: factory variants differ
    _write(stem + ".cu", source)
    with open(stem + ".cubin", "wb") as f:
        f.write(cubin)
    _write(stem + ".explain.txt", explanation)
    for suffix in (".cu", ".cubin", ".explain.txt"):
        print(f"wrote {stem}{suffix}")
    if report is not None:
        print(report)
    return 0


# --------------------------------------------------------------------------- tegula bench

def _add_bench_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `tegula bench` (the rest go to the suite)."""
    p.add_argument("suite", help="layout, gemm, norm, softmax or copy")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="options of the suite (see --help)")


def _run_bench(args: argparse.Namespace) -> int:
    """`tegula bench SUITE ...`: the same as `python -m tegula.bench SUITE ...`."""
    from tegula.bench.__main__ import main as bench_main

    return bench_main([args.suite, *args.rest]) or 0


# --------------------------------------------------------------------------- tegula doctor

def _add_doctor_arguments(p: argparse.ArgumentParser) -> None:
    """`tegula doctor` takes no arguments."""


def _run_doctor(args: argparse.Namespace) -> int:
    """Print what is installed and which of emulate / compile / launch works here; the
    status is 0 when the emulator works (the rest may legitimately be missing)."""
    from tegula.doctor import diagnose, report, verdicts

    found = diagnose()
    print(report(found), end="")
    return 0 if verdicts(found)[0][1] else 1


# --------------------------------------------------------------------------- tegula agent

def _add_agent_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `tegula agent` (its own sub-grammar lives in tegula.agent.cli)."""
    from tegula.agent.cli import add_arguments

    add_arguments(p)


def _run_agent(args: argparse.Namespace) -> int:
    """`tegula agent ...`: the loop, `evaluate` or `tasks` (tegula.agent.cli)."""
    from tegula.agent.cli import run

    return run(args)


# --------------------------------------------------------------------------- main

COMMANDS: list[Command] = [
    Command("layout", "print and draw a CuTe layout", _add_layout_arguments, _run_layout),
    Command("demo", "print and draw a few layouts (CuTe, MMA fragments, swizzle, F2), then "
            "explain and emulate the README's GEMM", _add_demo_arguments, _run_demo),
    Command("explain", "compile a kernel and print its layouts, instructions, bank "
            "conflicts, resources and predicted time", _add_explain_arguments, _run_explain),
    Command("compile", "compile a kernel ahead of time (no GPU): write its .cu, .cubin and "
            "explanation", _add_compile_arguments, _run_compile),
    Command("bench", "run a benchmark suite (on a GPU for kernels)", _add_bench_arguments,
            _run_bench),
    Command("agent", "write, check and optimize a kernel with a model (tegula.agent); "
            "`tegula agent evaluate TASK CANDIDATE.py` judges a candidate",
            _add_agent_arguments, _run_agent),
    Command("doctor", "show what is installed and which of emulate / compile / launch works "
            "here, with the fix for each that does not", _add_doctor_arguments, _run_doctor),
]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subparser per entry of COMMANDS."""
    parser = argparse.ArgumentParser(
        prog="tegula", description="tegula: a tile-level GPU kernel language and compiler")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(p)
        p.set_defaults(run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tegula` script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (UsageError, LayoutError) as err:
        print(f"tegula: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # an --svg / --out path that cannot be written
        print(f"tegula: error: {err.strerror or err}: {err.filename or ''}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
