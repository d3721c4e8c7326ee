"""Layout-algebra throughput on the synthesis hot path: `python -m tegula.bench layout`.

Layout synthesis (Algorithm 1 with search, shared-memory unification, swizzle choice)
evaluates thousands of compositions, inverses and offset tables per kernel, so their
cost bounds how wide the instruction search can be. Each case below is one operation
as synthesis performs it, on the layouts a 128x128 f16 GEMM block meets (the
m16n8k16 C fragment, ldmatrix, 128-thread copy TV layouts, 64-wide shared tiles).

Timing: each case runs in batches until a batch takes `--min-time` seconds, the best
of `--repeat` batches is kept (least disturbed by other processes), and reported as
operations per second and microseconds per operation.
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any, Callable

from tegula.bench import format_table, user_results_dir, write_result
from tegula.layout.algebra import (coalesce, composition, left_inverse, logical_divide,
                                   make_layout_tv, max_common_vector, right_inverse,
                                   zipped_divide)
from tegula.layout.cute import Layout
from tegula.layout.swizzle import ComposedLayout, Swizzle
from tegula.layout.symbolic import sym


@dataclass(frozen=True)
class Case:
    """One measured operation: a name, what it stands for in synthesis, and a thunk."""

    name: str
    what: str
    run: Callable[[], Any]


# The accumulator fragment of mma.sync.m16n8k16 (f32 or f16 C): thread t holds rows
# t//4 and t//4 + 8, columns 2*(t%4) and 2*(t%4)+1, as (thread, value) -> m + 16*n.
MMA_C_TV = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))
# ldmatrix.x4 destination fragment over its 32x8 tile (Hexcute CGO Appendix C's q).
LDMATRIX_Q = Layout(((4, 8), (2, 4)), ((64, 1), (32, 8)))


def _cases() -> list[Case]:
    """The operations measured, with their operands built once outside the timing."""
    tile_128 = Layout((128, 128), (1, 128))             # column-major 128x128 C tile
    instr_in_tile = Layout((16, 8), (1, 128))            # one m16n8 C tile inside it
    _, copy_tv = make_layout_tv(Layout((32, 4), (4, 1)), Layout((1, 8)))  # 128 thr x 8
    smem = Layout((128, 32), (32, 1))                    # K-major shared tile of A
    gmem = Layout((128, 32), (4096, 1))                  # its global source, K = 4096
    deep = (((2, 2), (2, 4), (4, 8), 2), ((1, 2), (4, 8), (32, 128), 1024))
    sw = Swizzle(3, 3, 3)
    rows, cols = sym("M"), sym("K", multiple_of=8)
    symbolic_gmem = Layout((rows, cols), (cols, 1))
    by_mode = (Layout(16, 1), Layout(64, 1))
    return [
        Case("composition C-TV∘tile", "mma C fragment placed in a 128x128 tile",
             lambda: composition(instr_in_tile, MMA_C_TV)),
        Case("composition f∘q⁻¹", "copy constraint: tile TV after ldmatrix inverse",
             lambda: composition(copy_tv, right_inverse(LDMATRIX_Q))),
        Case("right_inverse C-TV", "inverting an instruction TV layout",
             lambda: right_inverse(MMA_C_TV)),
        Case("left_inverse 128x128", "inverting a tile layout (shared-memory side)",
             lambda: left_inverse(tile_128)),
        # A fresh Layout each time: coalesce is memoized per instance, and synthesis
        # coalesces layouts it has just built.
        Case("coalesce depth-2 (fresh)", "normalizing a just-composed layout",
             lambda: coalesce(Layout(*deep))),
        Case("logical_divide 128x128/(16,8)", "tiling a C tile by the mma instruction",
             lambda: logical_divide(tile_128, (16, 8))),
        Case("zipped_divide smem/(8,8)", "ldmatrix 8x8 blocks of a shared tile",
             lambda: zipped_divide(smem, (8, 8))),
        Case("make_layout_tv 128x8", "building a coalesced-copy TV layout",
             lambda: make_layout_tv(Layout((32, 4), (4, 1)), Layout((1, 8)))),
        Case("max_common_vector g/s", "vector width of a global->shared copy",
             lambda: max_common_vector(gmem, smem)),
        Case("eval 32 offsets C-TV", "per-index evaluation, one warp's accumulators",
             lambda: [MMA_C_TV(i) for i in range(32)]),
        Case("all_offsets 128x128", "offset table of a fresh 16384-element layout",
             lambda: Layout((128, 128), (1, 128)).all_offsets()),
        Case("all_offsets Sw<3,3,3>", "fresh swizzled 64x64 shared tile (bank analysis)",
             lambda: ComposedLayout(sw, 0, Layout((64, 64), (64, 1))).all_offsets()),
        Case("symbolic composition", "tiling (M,K):(K,1) with K%8==0 by (16,64)",
             lambda: composition(symbolic_gmem, by_mode)),
    ]


def _time_case(case: Case, min_time: float, repeat: int) -> float:
    """Seconds per operation: the best batch of `repeat`, each batch >= min_time long."""
    case.run()  # warm caches (imports, lazily built tables)
    number = 1
    while True:
        start = time.perf_counter()
        for _ in range(number):
            case.run()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            break
        # Grow toward the target with headroom, at most 10x per step.
        wanted = int(number * min_time * 1.2 / max(elapsed, 1e-9))
        number = max(number + 1, min(number * 10, wanted))
    best = elapsed / number
    for _ in range(repeat - 1):
        start = time.perf_counter()
        for _ in range(number):
            case.run()
        best = min(best, (time.perf_counter() - start) / number)
    return best


def run(min_time: float = 0.2, repeat: int = 3) -> list[dict[str, Any]]:
    """Measure every case; one dict per case (name, description, ops/s, us/op)."""
    results = []
    for case in _cases():
        seconds = _time_case(case, min_time, repeat)
        results.append({"name": case.name, "what": case.what,
                        "ops_per_sec": 1.0 / seconds, "us_per_op": seconds * 1e6})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tegula.bench layout",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--min-time", type=float, default=0.2,
                        help="seconds each timed batch must last (default 0.2)")
    parser.add_argument("--repeat", type=int, default=3, help="batches per case (best kept)")
    parser.add_argument("--out", default=None,
                        help="directory for the JSON result (default $TEGULA_RESULTS_DIR, "
                             "else ~/.local/share/tegula/results)")
    parser.add_argument("--no-write", action="store_true", help="print only, write no JSON")
    args = parser.parse_args(argv)
    results = run(args.min_time, args.repeat)
    rows = [(r["name"], r["ops_per_sec"], r["us_per_op"], r["what"]) for r in results]
    print(format_table(("operation", "ops/s", "us/op", "stands for"), rows))
    if not args.no_write:
        path = write_result("layout", {"min_time": args.min_time, "repeat": args.repeat,
                                       "results": results},
                            args.out if args.out is not None else user_results_dir())
        print(f"\nwrote {path}")
    return 0


__all__ = ["Case", "run", "main", "MMA_C_TV", "LDMATRIX_Q"]
