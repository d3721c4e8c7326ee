"""Loop-invariant run-time divisions leave the loop (lower/hoist.py).

The persistent GEMM's producer computes its tile's grouped coordinates (several floor
divisions by run-time values) for the TMA boxes of every k-step; nothing varied with k, but
the hoister only split sums, so the whole division chain stayed in the k loop and nvcc did
not hoist it either (tg_floordiv's guarded division is not speculated): ~25 dependent SASS
instructions per division, per stage, in the one thread feeding the tensor cores.
"""
from __future__ import annotations

import re

import numpy as np

from tegula.build import build
from tegula.dtypes import f16
from tegula.kernels.gemm import gemm_emulated, persistent_gemm_kernel
from tegula.kernels.common import random_input
from tegula.lower.hoist import hoist_loop_invariants
from tegula.lower.thread_ir import BinOp, Const, For, If, Let, Var, _bin
from tegula.lower.async_ir import MBarrierWait


def _divisions(node) -> list:
    """Every run-time division BinOp inside `node` (statements, lists, expressions)."""
    found = []
    if isinstance(node, list):
        for x in node:
            found += _divisions(x)
    elif isinstance(node, BinOp):
        if node.op in ("//", "%", "floordiv", "mod") and not isinstance(node.rhs, Const):
            found.append(node)
        found += _divisions(node.lhs) + _divisions(node.rhs)
    elif hasattr(node, "__dataclass_fields__"):
        for name in node.__dataclass_fields__:
            found += _divisions(getattr(node, name))
    return found


def test_a_wholly_invariant_division_leaves_the_inner_loop():
    tile, k, grid, tiles = Var("tile"), Var("k"), Var("grid"), Var("tiles")
    coord = _bin("floordiv", tile * grid, tiles) * Const(128)   # no term varies with k
    inner = For(k, Const(0), Var("steps"), 1,
                [MBarrierWait("full", k % Const(4), coord),
                 If(_bin("mod", tile, tiles).lt(Const(3)), [MBarrierWait("e", k, Const(0))])])
    body = hoist_loop_invariants([For(tile, Const(0), Var("n"), 1, [inner])])
    outer = body[-1]
    k_loop = next(s for s in outer.body if isinstance(s, For))
    assert _divisions(k_loop.body) == []
    lets = [s for s in outer.body if isinstance(s, Let)]
    assert any(_divisions(s.value) for s in lets)       # computed once per tile instead
    # A division reading the k index stays where it is.
    varying = For(k, Const(0), Var("steps"), 1,
                  [MBarrierWait("full", Const(0), _bin("floordiv", k, tiles))])
    kept = hoist_loop_invariants([varying])
    assert len(_divisions(kept[-1].body)) == 1
    # So does C's truncating `/` by a run-time value: before a loop that may run zero
    # times it could divide by a zero the loop never saw (the floor helpers take 0).
    unguarded = For(tile, Const(0), Var("n"), 1, [For(k, Const(0), Var("steps"), 1,
                    [MBarrierWait("full", Const(0), _bin("//", grid, tiles))])])
    inner_body = hoist_loop_invariants([unguarded])[-1].body[-1].body
    assert len(_divisions(inner_body)) == 1


def _producer_k_loop(source: str) -> str:
    """The innermost `for` of the producer role in the CUDA source."""
    producer = source[source.index("role producer"):]
    start = producer.index("for (int i1")
    return producer[start:producer.index("\n        }\n", start)]


def test_persistent_gemm_producer_divides_nothing_per_k_step():
    for cluster in (1, 2):
        kernel = persistent_gemm_kernel(f16)
        result = build(kernel, dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=8, CLUSTER=cluster,
                                    threads=256), None, "sm_90a")
        loop = _producer_k_loop(result.cuda_source())
        assert "cp.async.bulk.tensor" in loop
        assert not re.search(r"tg_floordiv|tg_mod|/ \(|/ tg_grid", loop), loop[:2000]


def test_hoisted_persistent_gemm_still_right_at_ragged_shapes():
    rng = np.random.default_rng(7)
    m, n, k = 83, 150, 72                                # no dim divides its tile
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    bound = 2.0 ** -10 * np.abs(ref) + k * 2.0 ** -23 * (np.abs(a) @ np.abs(b).T)
    c = gemm_emulated(a, b, persistent=5, BM=64, BN=32, BK=16, STAGES=3, GROUP=3)
    assert np.all(np.abs(c.astype(np.float64) - ref) <= bound)
