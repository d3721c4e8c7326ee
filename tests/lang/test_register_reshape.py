"""tg.reshape / tg.permute of register tiles (numpy semantics, no data moved): emulated on
both targets against numpy, with layouts that agree (the reshape renames flat indices)
and that do not (a conversion is inserted), odd extents, tiles smaller than the block,
and the errors for misuse."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.errors import TegulaError
from tegula.layout.reshape import reshape_sources, reshaped_tv
from tegula.layout.tv import coalesced_tv, tv_table

TARGETS = ["sm_90a", "sm_80"]


@tg.kernel(threads=128)
def permute_reshape(x: tg.Tensor[f32, 3], y: tg.Tensor[f32], A: tg.constexpr = 4,
                    B: tg.constexpr = 8, C: tg.constexpr = 32):
    t = tg.load(x.tile((A, B, C), (0, 0, 0)))
    u = tg.reshape(tg.permute(t, (1, 0, 2)), (B, A * C))
    tg.copy(u * 2.0 + 1.0, y.tile((B, A * C), (0, 0)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("a,b,c", [(4, 8, 32), (2, 3, 5), (1, 16, 4), (8, 2, 1)])
def test_permute_then_reshape_matches_numpy(a, b, c, target):
    rng = np.random.default_rng(a * 100 + b * 10 + c)
    x = rng.standard_normal((a, b, c)).astype(np.float32)
    x.flat[::7] = np.nan  # NaN travels with its element
    y = np.full((b, a * c), np.nan, np.float32)
    tg.emulate(permute_reshape, (1,), x, y, A=a, B=b, C=c, target=target)
    np.testing.assert_array_equal(y, x.transpose(1, 0, 2).reshape(b, a * c) * 2 + 1)


@tg.kernel(threads=128)
def split_then_sum(x: tg.Tensor[f16], y: tg.Tensor[f32], M: tg.constexpr = 64,
                   N: tg.constexpr = 64, G: tg.constexpr = 16):
    t = tg.load(x.tile((M, N), (0, 0))).to(f32)
    groups = tg.reshape(t, (M, N // G, G))          # split the row into groups
    sums = tg.sum(groups, 2)                         # (M, N // G, 1)
    tg.copy(tg.reshape(sums, (M, N // G)), y.tile((M, N // G), (0, 0)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m,n,g", [(64, 64, 16), (8, 96, 32), (3, 20, 5)])
def test_split_dim_feeds_a_reduction(m, n, g, target):
    rng = np.random.default_rng(m + n + g)
    x = rng.standard_normal((m, n)).astype(np.float16)
    y = np.full((m, n // g), np.nan, np.float32)
    tg.emulate(split_then_sum, (1,), x, y, M=m, N=n, G=g, target=target)
    ref = x.astype(np.float32).reshape(m, n // g, g).sum(axis=2)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_layout_renaming_agrees_with_the_flat_index_table():
    """reshaped_tv (a CuTe composition) and reshape_sources (numpy) say the same: out's
    register v of thread t holds x's element sources[out flat], which x's layout puts in
    the same register; and the inverse gives x's layout back."""
    cases = [((4, 8, 4, 32), (0, 1, 2, 3), (4, 8, 4, 4, 2, 2, 2)),
             ((4, 8, 4, 4, 2, 2, 2), (0, 6, 1, 3, 5, 2, 4), (64, 64)),
             ((1, 1, 4, 8, 4, 32), (0, 1, 2, 3, 4, 5), (1, 1, 4, 8, 4, 4, 2, 2, 2)),
             ((8, 16), (1, 0), (128,)), ((64, 2, 32), (0, 1, 2), (64, 64))]
    for x_shape, perm, out_shape in cases:
        sources = reshape_sources(x_shape, perm, out_shape)
        for dim in range(len(x_shape)):
            tv = coalesced_tv(x_shape, dim, 1, 128)
            out = reshaped_tv(tv, x_shape, perm, out_shape)
            assert out is not None
            assert (sources[tv_table(out)] == tv_table(tv)).all()
            back = reshaped_tv(out, x_shape, perm, out_shape, inverse=True)
            assert (tv_table(back) == tv_table(tv)).all()


def test_reshape_without_common_refinement_has_no_renaming():
    tv = coalesced_tv((2, 3), 1, 1, 32)
    assert reshaped_tv(tv, (2, 3), (0, 1), (3, 2)) is None


@tg.kernel(threads=32)
def no_refinement(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    t = tg.load(x.tile((2, 3), (0, 0)))
    tg.copy(tg.reshape(t, (3, 2)) + 0.0, y.tile((3, 2), (0, 0)))


@pytest.mark.parametrize("target", TARGETS)
def test_reshape_without_common_refinement_still_computes_numpys_answer(target):
    """(2, 3) -> (3, 2) has no layout renaming: the reshape gets a conversion instead."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + 0.5
    y = np.full((3, 2), np.nan, np.float32)
    tg.emulate(no_refinement, (1,), x, y, target=target)
    np.testing.assert_array_equal(y, x.reshape(3, 2))


def _traced_error(body) -> str:
    @tg.kernel(threads=32)
    def bad(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        body(tg.load(x.tile((4, 8), (0, 0))))

    with pytest.raises(TegulaError) as info:
        tg.emulate(bad, (1,), np.zeros((4, 8), np.float32), np.zeros((4, 8), np.float32))
    return str(info.value)


def test_reshape_to_another_size_is_refused_at_the_line():
    text = _traced_error(lambda t: tg.reshape(t, (5, 8)))
    assert "tg.reshape" in text and "32 elements" in text and "40 elements" in text
    assert "test_register_reshape.py" in text


def test_permute_needs_a_permutation():
    for dims in [(0,), (0, 0), (1, 2), (0, 1, 2)]:
        text = _traced_error(lambda t, d=dims: tg.permute(t, d))
        assert "tg.permute" in text and "permutation of 0..1" in text


def test_reshape_of_a_global_view_is_refused():
    @tg.kernel(threads=32)
    def bad(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        tg.copy(tg.reshape(x.tile((4, 8), (0, 0)), (8, 4)), y.tile((8, 4), (0, 0)))

    with pytest.raises(TegulaError, match="register tile.*global or shared view"):
        tg.emulate(bad, (1,), np.zeros((4, 8), np.float32), np.zeros((8, 4), np.float32))


# --------------------------------------------------------------------------------------
# tg.bitcast
# --------------------------------------------------------------------------------------

@tg.kernel(threads=64)
def words_to_halves(x: tg.Tensor[tg.i32], y: tg.Tensor[f16, 3], z: tg.Tensor[f32],
                    M: tg.constexpr = 16, N: tg.constexpr = 8):
    words = tg.load(x.tile((M, N), (0, 0)))
    halves = tg.bitcast(words, f16)                   # (M, N, 2): [..., 0] the low half
    tg.copy(halves * 1.0, y.tile((M, N, 2), (0, 0, 0)))
    tg.copy(tg.bitcast(words ^ 1, f32), z.tile((M, N), (0, 0)))   # same width


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("m,n", [(16, 8), (5, 3), (64, 4)])
def test_bitcast_reads_the_bits_numpy_reads(m, n, target):
    rng = np.random.default_rng(m + n)
    x = rng.integers(-2**31, 2**31, (m, n), dtype=np.int64).astype(np.int32)
    x[0, 0] = 0x7C00FC00 if m > 1 else x[0, 0]        # +inf high half, -inf low half
    y = np.full((m, n, 2), np.nan, np.float16)
    z = np.full((m, n), np.nan, np.float32)
    tg.emulate(words_to_halves, (1,), x, y, z, M=m, N=n, target=target)
    np.testing.assert_array_equal(y.view(np.uint16), np.where(
        np.isnan(y), y.view(np.uint16), x.view(np.uint16).reshape(m, n, 2)))
    assert np.array_equal(np.isnan(y), np.isnan(x.view(np.float16).reshape(m, n, 2)))
    assert np.array_equal(z.view(np.int32), (x ^ 1)) or np.array_equal(
        np.isnan(z), np.isnan((x ^ 1).view(np.float32)))


@tg.kernel(threads=128)
def halves_transposed(x: tg.Tensor[tg.i32], y: tg.Tensor[tg.bf16, 3]):
    halves = tg.bitcast(tg.load(x.tile((32, 16), (0, 0))), tg.bf16)
    tg.copy(tg.permute(halves, (1, 0, 2)) + 0.0, y.tile((16, 32, 2), (0, 0, 0)))


@pytest.mark.parametrize("target", TARGETS)
def test_bitcast_to_bf16_then_permuted(target):
    rng = np.random.default_rng(3)
    x = rng.integers(-2**31, 2**31, (32, 16), dtype=np.int64).astype(np.int32)
    y = np.zeros((16, 32, 2), np.float32)              # bf16 values held in float32
    tg.emulate(halves_transposed, (1,), x, y, target=target)
    bits = x.view(np.uint16).reshape(32, 16, 2).transpose(1, 0, 2).astype(np.uint32) << 16
    want = bits.view(np.float32)
    assert np.array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(y[~np.isnan(y)], want[~np.isnan(want)])


def _bitcast_error(src, dst) -> str:
    @tg.kernel(threads=32)
    def bad(x: tg.Tensor[src], y: tg.Tensor[f32]):
        tg.bitcast(tg.load(x.tile((4, 8), (0, 0))), dst)

    storage = {f16: np.float16, f32: np.float32}[src]
    with pytest.raises(TegulaError) as info:
        tg.emulate(bad, (1,), np.zeros((4, 8), storage), np.zeros((4, 8), np.float32))
    return str(info.value)


@pytest.mark.parametrize("src,dst", [(f16, tg.i32), (f16, tg.u4), (f32, tg.i8)], ids=str)
def test_bitcast_refuses_what_it_cannot_read(src, dst):
    """16 -> 32 bits, 4-bit and 32 -> 8 bits: a clear error at the user's line."""
    text = _bitcast_error(src, dst)
    assert "tg.bitcast" in text and "cannot be read as" in text
    assert "test_register_reshape.py" in text
