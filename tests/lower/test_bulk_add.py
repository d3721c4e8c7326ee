"""`tg.atomic_add` of a register tile into an f32 tensor on sm_90: staged in shared memory
and added by TMA reduce-adds (`cp.reduce.async.bulk.tensor ... .add`, the catalogue's
`tma.reduce.add.{rank}d`; `synth/copies.py: plan_bulk_adds`), against numpy in the
emulator: edges that cut boxes, several blocks and iterations adding into the same
elements, non-zero starting values; the rounds a small staging buffer takes; the
emitted PTX; and the cases that keep one `red.global.add` per element, each with its
reason. (The kernels here also run on the GPU: tests/gpu/test_bulk_add_gpu.py.)"""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.build import build
from tegula.ir.ops import AtomicAdd, walk_ops
from tegula.lower.async_ir import TmaStore


@tg.kernel(threads=128)
def tile_adds(x: tg.Tensor[f32, 2], out: tg.Tensor[f32, 4], BM: tg.constexpr = 64,
              BN: tg.constexpr = 64, REPEAT: tg.constexpr = 2):
    """Block (m, n, r) adds its x tile REPEAT times into out[1, 0]: every element of it
    gets grid_z * REPEAT adds."""
    m, n = tg.block_id(0), tg.block_id(1)
    t = tg.load(x.tile((BM, BN), (m, n)))
    for _ in tg.range(REPEAT):
        tg.atomic_add(t, out[1, 0].tile((BM, BN), (m, n)))


@tg.kernel(threads=128)
def product_adds(a: tg.Tensor[f16, 2], b: tg.Tensor[f16, 2], out: tg.Tensor[f32, 3],
                 BM: tg.constexpr = 64, BN: tg.constexpr = 128, K: tg.constexpr = 256):
    """Block (m, r) adds a[m-block] @ b.T (a wgmma accumulator, dQ += dS K's shape) into
    out[1]; the (BM, K) and (BN, K) operand buffers leave room for two staging boxes."""
    m = tg.block_id(0)
    sa, sb = tg.shared((BM, K), f16), tg.shared((BN, K), f16)
    tg.copy(a.tile((BM, K), (m, 0)), sa)
    tg.copy(b.tile((BN, K), (0, 0)), sb)
    acc = tg.zeros((BM, BN), f32)
    tg.gemm(acc, sa, sb)
    tg.atomic_add(acc, out[1].tile((BM, BN), (m, 0)))


@tg.kernel(threads=128)
def pipelined_adds(a: tg.Tensor[f16, 2], b: tg.Tensor[f16, 2], out: tg.Tensor[f32, 3],
                   BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 64):
    """Each K block's a_k @ b_k.T added into out[1] from inside a TMA pipeline (the
    consumer's, warp-specialized): the staging is rewritten every iteration."""
    m = tg.block_id(0)
    ga, gb = a.tile((BM, BK), (m, None)), b.tile((BN, BK), (0, None))
    sa, sb = tg.shared((BM, BK), f16, stages=2), tg.shared((BN, BK), f16, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=2):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        acc = tg.zeros((BM, BN), f32)
        tg.gemm(acc, sa[k], sb[k])
        tg.atomic_add(acc, out[1].tile((BM, BN), (m, 0)))


#: `pipelined_adds` forced onto the bulk path (its staging costs a block per SM) with a
#: producer warpgroup.
PIPELINED = dict(atomic_path="bulk", warp_specialize=True)


def pipelined_case(seed: int):
    rng = np.random.default_rng(seed)
    a = rng.integers(-2, 3, (100, 192)).astype(np.float16)
    b = rng.integers(-2, 3, (64, 192)).astype(np.float16)
    start = small_integers(rng, (2, 100, 64))
    want = start.copy()
    want[1] += 2 * (a.astype(np.float32) @ b.astype(np.float32).T)
    return a, b, start, want


@tg.kernel(threads=128)
def read_and_add(x: tg.Tensor[f32, 2], out: tg.Tensor[f32, 2], BM: tg.constexpr = 64):
    t = tg.load(out.tile((BM, 32), (tg.block_id(0), 0)))
    tg.atomic_add(t + tg.load(x.tile((BM, 32), (tg.block_id(0), 0))),
                  out.tile((BM, 32), (tg.block_id(0), 0)))


@tg.kernel(threads=128)
def half_adds(x: tg.Tensor[f16, 2], out: tg.Tensor[f16, 2], BM: tg.constexpr = 64):
    tg.atomic_add(tg.load(x.tile((BM, 64), (tg.block_id(0), 0))),
                  out.tile((BM, 64), (tg.block_id(0), 0)))


def bulk_plan(built):
    ops = [op for op in walk_ops(built.traced.body) if isinstance(op, AtomicAdd)]
    assert len(ops) == 1
    return ops[0].choices.get("bulk_add"), ops[0].choices.get("bulk_add_skipped")


def small_integers(rng, shape) -> np.ndarray:
    """Non-zero small integers: every order of their f32 sums is exact."""
    v = rng.integers(-8, 9, shape).astype(np.float32)
    v[v == 0] = 5
    return v


def tile_adds_case(seed: int, M: int = 100, N: int = 72, blocks_z: int = 3, REPEAT: int = 2):
    """(x, out, want) for `tile_adds` on grid (cdiv(M, 64), cdiv(N, 64), blocks_z):
    out's other slices hold NaN (nothing may land there), out[1, 0] non-zero values."""
    rng = np.random.default_rng(seed)
    x = small_integers(rng, (M, N))
    out = np.full((2, 3, M, N), np.nan, np.float32)
    out[1, 0] = small_integers(rng, (M, N))
    want = out.copy()
    want[1, 0] += x * (blocks_z * REPEAT)
    return x, out, want, (tg.cdiv(M, 64), tg.cdiv(N, 64), blocks_z)


def test_bulk_add_on_ragged_edges_with_many_adders():
    """Boxes cut by both edges (100 x 72 in 64 x 32 boxes), three blocks and two
    iterations adding into each element, onto non-zero values: exact (small integers),
    other slices untouched; every add a TMA reduce-add, none a red."""
    x, out, want, grid = tile_adds_case(1)
    plan, skipped = bulk_plan(build(tile_adds, {}, None, "sm_90a"))
    assert skipped is None and plan.reduce == "add" and plan.dims == (3, 2, 1, 0)
    assert (plan.boxes, plan.slots, plan.box) == (2, 2, (32, 64, 1, 1))
    report = tg.emulate(tile_adds, grid, x, out, target="sm_90a", check_coverage=False)
    assert np.array_equal(out, want, equal_nan=True)
    assert report.kind("TmaStore").count == 2 * 2 * 2 * 3 * 2  # boxes x blocks x repeats
    assert report.kind("GlobalAtomicAdd").count == 0


def test_bulk_add_of_fractions_matches_numpy_and_the_red_path():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 128)).astype(np.float32)
    start = rng.standard_normal((2, 3, 64, 128)).astype(np.float32)
    results = {}
    for path in ("bulk", "red"):
        out = start.copy()
        tg.emulate(tile_adds, (1, 2, 2), x, out, target="sm_90a", check_coverage=False,
                   atomic_path=path)
        results[path] = out
    want = start.astype(np.float64)
    want[1, 0] += 4 * x.astype(np.float64)
    np.testing.assert_allclose(results["bulk"], want, rtol=1e-6, atol=1e-6)
    # The emulator adds in the same order on both paths, with the same f32 add.
    assert np.array_equal(results["bulk"], results["red"])


def test_accumulator_adds_in_rounds_through_one_staging_box():
    """A 64x128 wgmma accumulator is four 64x32 boxes; the operand buffers (96 KB) leave
    room for two staging boxes at two blocks per SM, so the add takes two rounds (the
    second waiting until the first round's reduces have read the boxes)."""
    rng = np.random.default_rng(3)
    a = rng.integers(-2, 3, (100, 256)).astype(np.float16)
    b = rng.integers(-2, 3, (128, 256)).astype(np.float16)
    out = small_integers(rng, (2, 100, 128))
    start = out.copy()
    built = build(product_adds, {}, None, "sm_90a")
    plan, _ = bulk_plan(built)
    assert (plan.boxes, plan.slots) == (4, 2) and "2 rounds" in plan.describe()
    report = tg.emulate(product_adds, (2, 1, 2), a, b, out, target="sm_90a",
                        check_coverage=False)
    want = start.copy()
    want[1] += 2 * (a.astype(np.float32) @ b.astype(np.float32).T)
    assert np.array_equal(out, want)
    assert report.kind("TmaStore").count == 4 * 2 * 2


@pytest.mark.parametrize("order", ["listed", "random:3"])
def test_bulk_add_inside_a_warp_specialized_pipeline(order):
    """The consumer stages and adds every iteration (waiting for the last one's reduces
    to have read the staging buffer), two blocks adding into each element; by default
    the add stays red here (the staging would cost a block per SM)."""
    a, b, out, want = pipelined_case(4)
    assert bulk_plan(build(pipelined_adds, {}, None, "sm_90a"))[0] is None
    plan, _ = bulk_plan(build(pipelined_adds, dict(PIPELINED), None, "sm_90a"))
    assert plan.boxes == plan.slots == 2
    tg.emulate(pipelined_adds, (2, 1, 2), a, b, out, target="sm_90a", check_coverage=False,
               role_order=order, **PIPELINED)
    assert np.array_equal(out, want)


def test_emitted_cuda_issues_fenced_bulk_groups():
    src = build(tile_adds, {}, None, "sm_90a").cuda_source()
    reduce = ("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group "
              "[%0, {%1, %2, %3, %4}], [%5];")
    assert src.count(reduce) == 2 and "red.global" not in src
    fence = src.index("fence.proxy.async.shared::cta;")
    assert src.index("cp.async.bulk.wait_group.read 0;") < fence < src.index(reduce)
    assert src.index(reduce) < src.index("cp.async.bulk.commit_group;") \
        < src.rindex("cp.async.bulk.wait_group.read 0;")  # before the block exits
    assert "const __grid_constant__ tg_tensor_map out_tmap" in src


@pytest.mark.parametrize("kernel,target,options,reason", [
    (tile_adds, "sm_80", {}, "needs sm_90"),
    (tile_adds, "sm_90a", {"atomic_path": "red"}, None),
    (read_and_add, "sm_90a", {}, "out is also accessed at line"),
    (half_adds, "sm_90a", {}, "issued for f32 tensors, not f16"),
])
def test_element_wise_red_where_a_bulk_add_does_not_apply(kernel, target, options, reason):
    built = build(kernel, options, None, target)
    plan, skipped = bulk_plan(built)
    assert plan is None
    if reason is None:  # the build option: not even considered
        assert skipped is None
    else:
        assert reason in skipped
        assert "one red.global.add per element: " in built.explain()
    assert not any(isinstance(s, TmaStore) for s in _statements(built.thread_kernel.body))
    assert "red.global.add" in built.cuda_source()


def test_atomic_path_option_is_checked():
    with pytest.raises(tg.TegulaError, match="atomic_path='tma' must be one of"):
        build(tile_adds, {"atomic_path": "tma"}, None, "sm_90a")


def _statements(stmts):
    for s in stmts:
        yield s
        for field in ("body", "then", "orelse", "else_"):
            inner = getattr(s, field, None)
            if isinstance(inner, list):
                yield from _statements(inner)
