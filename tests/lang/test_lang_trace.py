"""Tracing kernels into tile IR: the DESIGN.md GEMM, loops, branches, elementwise ops."""
from __future__ import annotations

import tegula as tg
from tegula import f16, f32, i32
from tegula.dtypes import bool_
from tegula.ir.ops import Copy, Elementwise, Fill, ForLoop, Gemm, IfThen, Reduce, walk_ops
from tegula.ir.printer import format_kernel
from tegula.ir.scalar import Condition, LoopIndex, ScalarArg, TensorExtent
from tegula.ir.values import GlobalTile, RegisterTile, SharedTile


def line_of(marker: str) -> int:
    """The line of this file holding `marker` (so tests survive edits above them)."""
    with open(__file__) as f:
        for n, line in enumerate(f, 1):
            if marker in line and "line_of(" not in line:
                return n
    raise AssertionError(marker)


@tg.kernel(threads=128)
def gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
         BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
         STAGES: tg.constexpr = 3):
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))            # (BM, BK, K/BK) view
    gb = b.tile((BN, BK), (n, None))            # b is N×K
    acc = tg.zeros((BM, BN), f32)               # @acc
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):  # @loop
        tg.copy(ga[:, :, k], sa[k])             # @copy-a
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])              # @gemm
    tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))  # @store


def test_design_gemm_traces_into_the_expected_ops():
    t = gemm.trace()
    assert t.name == "gemm" and t.threads == 128
    assert [a.name for a in t.args] == ["a", "b", "c"] and t.scalar_args == []
    assert t.constexprs == {"BM": 128, "BN": 128, "BK": 32, "STAGES": 3}
    fill, loop, cast, store = t.body
    assert isinstance(fill, Fill) and fill.value == 0.0
    assert isinstance(loop, ForLoop) and loop.stages == 3 and loop.step == 1
    assert isinstance(loop.var, LoopIndex) and loop.start == 0
    assert str(loop.stop) == "((a.shape[1] + 31) // 32)"
    copy_a, copy_b, mma = loop.body
    assert isinstance(copy_a.src, GlobalTile) and isinstance(copy_a.dst, SharedTile)
    assert copy_a.dst.alloc is t.shared_allocs[0] and copy_a.dst.stage is loop.var
    assert isinstance(mma, Gemm) and mma.c is fill.dst
    assert mma.a.alloc is t.shared_allocs[0] and mma.b.alloc is t.shared_allocs[1]
    assert isinstance(cast, Elementwise) and cast.op == "cast" and cast.out.dtype == f16
    assert isinstance(store, Copy) and store.src is cast.out
    assert [s.stages for s in t.shared_allocs] == [3, 3]
    assert [r.shape for r in t.register_tiles] == [(128, 128), (128, 128)]


def test_ops_carry_the_users_source_lines():
    t = gemm.trace()
    fill, loop, cast, store = t.body
    assert fill.loc.filename == __file__ and fill.loc.lineno == line_of("# @acc")
    assert loop.loc.lineno == line_of("# @loop")
    assert loop.body[0].loc.lineno == line_of("# @copy-a")
    assert loop.body[2].loc.lineno == line_of("# @gemm")
    assert "tg.gemm(acc, sa[k], sb[k])" in loop.body[2].loc.line
    assert store.loc.lineno == cast.loc.lineno == line_of("# @store")
    assert t.register_tiles[0].loc.lineno == line_of("# @acc")


def test_traces_are_cached_per_constexpr_values():
    assert gemm.trace() is gemm.trace(BM=128)
    small = gemm.trace(BM=64, STAGES=2)
    assert small is not gemm.trace()
    assert small.shared_allocs[0].shape == (64, 32) and small.shared_allocs[0].stages == 2
    assert gemm.trace_fresh() is not gemm.trace()
    assert gemm.constexpr_names == ["BM", "BN", "BK", "STAGES"]


def test_the_gemm_prints():
    text = format_kernel(gemm.trace())
    assert text.startswith("kernel gemm(a: tensor<f16, rank 2>")
    assert "for i0 in pipeline(0, ((a.shape[1] + 31) // 32), 1, stages=3):" in text
    assert "gemm %r0, %s0[i0], %s1[i0]" in text
    assert f"# line {line_of('# @gemm')}" in text


@tg.kernel(threads=256)
def softmaxish(x: tg.Tensor[f32], y: tg.Tensor[f16], n: int, BM: tg.constexpr = 64,
               BN: tg.constexpr = 32):
    m = tg.block_id(0)
    row_max = tg.full((BM, 1), float("-inf"), f32)
    total = tg.zeros((BM, 1), f32)
    for j in tg.range(n):
        xt = tg.load(x.tile((BM, BN), (m, j)))
        z = xt * tg.sigmoid(xt) + 1.0
        row_max.assign(tg.maximum(row_max, tg.max(z, 1)))
        total += tg.sum(tg.exp(z - row_max), axis=1)
        with tg.if_((j < 3) & (m > 0)):
            total -= 2.0
        with tg.else_():
            total *= 0.5
    w = tg.where(total > 0, 1.0 / total, 0.0)
    tg.copy(w.to(f16), y.tile((BM, 1), (m, 0)))


def test_loops_branches_and_in_place_updates():
    t = softmaxish.trace()
    assert t.scalar_args == ["n"]
    loop = next(op for op in t.body if isinstance(op, ForLoop))
    assert isinstance(loop.stop, ScalarArg) and loop.stages == 1
    branch = next(op for op in loop.body if isinstance(op, IfThen))
    assert isinstance(branch.cond, Condition) and branch.cond.op == "and"
    (sub,), (mul,) = branch.then, branch.otherwise
    total = t.body[1].dst
    assert sub.out is total and sub.op == "sub" and sub.scalars == {1: 2.0}
    assert mul.out is total and mul.inputs == [total]
    # row_max.assign(...) is a register-to-register copy into the carried tile
    row_max = t.body[0].dst
    assert any(isinstance(op, Copy) and op.dst is row_max for op in loop.body)
    reduces = [op for op in loop.body if isinstance(op, Reduce)]
    assert [(r.kind, r.axis, r.out.shape) for r in reduces] == [("max", 1, (64, 1)),
                                                                ("sum", 1, (64, 1))]


def test_elementwise_scalars_broadcast_and_types():
    t = softmaxish.trace()
    ops = [op for op in walk_ops(t.body) if isinstance(op, Elementwise)]
    by_op = {}
    for op in ops:
        by_op.setdefault(op.op, op)  # the first of each kind
    assert by_op["sub"].out.shape == (64, 32)  # (64, 32) - (64, 1) broadcasts
    assert by_op["gt"].out.dtype == bool_
    where = by_op["where"]
    assert len(where.inputs) == 2 and where.scalars == {2: 0.0}
    div = by_op["div"]
    assert div.scalars == {0: 1.0} and div.inputs == [by_op["gt"].inputs[0]]


def test_nested_loops_and_loop_index_names():
    @tg.kernel(threads=64)
    def nested(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        acc = tg.zeros((16, 16), f32)
        for i in tg.range(0, x.shape[0], 16):
            for j in tg.range(4):
                with tg.if_(tg.eq(j, i)):
                    acc += tg.load(x.tile((16, 16), (i, j)))
        tg.copy(acc, y.tile((16, 16), (0, 0)))

    t = nested.trace()
    outer = t.body[1]
    inner = outer.body[0]
    assert outer.var.name == "i0" and inner.var.name == "i1" and outer.step == 16
    assert isinstance(outer.stop, TensorExtent)
    branch = inner.body[0]
    assert branch.cond.op == "==" and branch.cond.rhs is outer.var
    assert [type(op).__name__ for op in branch.then] == ["Copy", "Elementwise"]


def test_python_control_flow_unrolls():
    @tg.kernel
    def unrolled(x: tg.Tensor[f32], y: tg.Tensor[f32], N: tg.constexpr = 3):
        acc = tg.zeros((8, 8), f32)
        for i in range(N):
            if i % 2 == 0:
                acc += tg.load(x.tile((8, 8), (0, i)))
        tg.copy(acc, y.tile((8, 8), (0, 0)))

    t = unrolled.trace()
    assert sum(isinstance(op, Copy) for op in t.body) == 3  # 2 loads + 1 store
    assert t.threads == 128
    assert len(unrolled.trace(N=5).body) == 1 + 3 * 2 + 1


def test_register_operands_cast_reduce_rearrange_atomic():
    @tg.kernel(threads=128)
    def misc(a: tg.Tensor[tg.i8], b: tg.Tensor[tg.i8], c: tg.Tensor[i32],
             out: tg.Tensor[f32, 1]):
        ra = tg.load(a.tile((64, 32), (tg.block_id(0), 0)))
        rb = tg.load(b.tile((64, 32), (0, 0)))
        acc = tg.zeros((64, 64), i32)
        tg.gemm(acc, ra, rb)
        tg.atomic_add(acc, c.tile((64, 64), (0, 0)))
        f = tg.rearrange(acc.to(f32))
        s = tg.sum(abs(f), 0) - tg.min(f, axis=-2)
        r = tg.register((1, 64), f32)
        tg.fill(r, 2)
        r.assign(tg.sqrt(s) * r)
        tg.copy(tg.reduce(r, 1, "max"), tg.register((1, 1), f32))

    t = misc.trace()
    kinds = [type(op).__name__ for op in t.body]
    assert kinds == ["Copy", "Copy", "Fill", "Gemm", "AtomicAdd", "Elementwise", "Rearrange",
                     "Elementwise", "Reduce", "Reduce", "Elementwise", "Fill", "Elementwise",
                     "Elementwise", "Copy", "Reduce", "Copy"]
    gemm_op = t.body[3]
    assert gemm_op.a.dtype == tg.i8 and isinstance(gemm_op.a, RegisterTile)
    fill = t.body[11]
    assert fill.value == 2.0 and isinstance(fill.dst, RegisterTile)
    assert t.body[5].op == "cast" and t.body[7].op == "abs"
    assert t.body[9].axis == 0  # axis=-2 normalized


def test_constexpr_override_reaches_the_body_and_repr():
    assert repr(gemm) == "<tegula kernel gemm threads=128>"
    t = gemm.trace(BK=64)
    loop = t.body[1]
    assert str(loop.stop) == "((a.shape[1] + 63) // 64)"
