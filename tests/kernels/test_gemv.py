"""GEMV (x @ w.T for M ≤ 16 rows of x) in the emulator against a float64 numpy reference:
shapes that divide no tile, tiles smaller than the block, both targets, NaN and infinity,
and the argument checks of the numpy and torch entry points."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f16
from tegula.kernels.common import random_input
from tegula.kernels.gemv import GEMV_DTYPES, gemv_config, gemv_emulated


def check_gemv(y: np.ndarray, x: np.ndarray, w: np.ndarray, dtype) -> None:
    """Every element within the output's rounding (half an ulp, one for slack) plus the
    f32 accumulation's error (K · 2^-24 of Σ|x·w|, generously 2^-16 of it)."""
    x2 = np.atleast_2d(x).astype(np.float64)
    ref = x2 @ w.astype(np.float64).T
    scale = np.abs(x2) @ np.abs(w.astype(np.float64)).T
    y2 = np.asarray(y, np.float64).reshape(ref.shape)
    assert not np.isnan(y2).any(), "unwritten (poisoned) outputs remain"
    bound = 2.0 ** -dtype.mantissa_bits * np.abs(ref) + 2.0 ** -16 * scale
    err = np.abs(y2 - ref)
    worst = np.unravel_index(err.argmax(), err.shape)
    assert np.all(err <= bound), f"max error {err.max():.3g} at {worst}"


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("dtype", GEMV_DTYPES, ids=str)
@pytest.mark.parametrize("m,n,k", [(1, 37, 1000), (2, 9, 33), (5, 70, 300), (16, 20, 130),
                                   (1, 3, 1)])
def test_gemv_matches_numpy(dtype, target, m, n, k):
    rng = np.random.default_rng(m * 1000 + n + k + 7 * GEMV_DTYPES.index(dtype))
    x, w = random_input(rng, (m, k), dtype), random_input(rng, (n, k), dtype)
    check_gemv(gemv_emulated(x, w, dtype, target=target), x, w, dtype)


def test_gemv_of_a_vector_returns_a_vector():
    rng = np.random.default_rng(3)
    x, w = random_input(rng, (77,), f16), random_input(rng, (12, 77), f16)
    y = gemv_emulated(x, w)
    assert y.shape == (12,)
    check_gemv(y, x, w, f16)


@pytest.mark.parametrize("tiles", [dict(BN=1, BK=32), dict(BN=3, BK=64), dict(BN=16, BK=256),
                                   dict(BN=2, BK=64, UNROLL=3), dict(BN=1, BK=256, UNROLL=4),
                                   dict(BN=2, BK=64, PREFETCH=True),
                                   dict(BN=4, BK=32, UNROLL=2, PREFETCH=True)])
def test_gemv_tiles_smaller_than_the_block_and_odd_row_counts(tiles):
    """A 1x32 chunk gives 128 threads 32 elements; BN=3 is not a power of two."""
    rng = np.random.default_rng(11)
    x, w = random_input(rng, (3, 100), f16), random_input(rng, (10, 100), f16)
    check_gemv(gemv_emulated(x, w, **tiles), x, w, f16)


@pytest.mark.parametrize("tiles", [dict(PERSISTENT=True, blocks=3, BN=2, BK=64),
                                   dict(PERSISTENT=True, blocks=4, BN=1, BK=32, UNROLL=2,
                                        PREFETCH=True),
                                   dict(PERSISTENT=True, blocks=64, BN=2, BK=64)])
def test_persistent_gemv_walks_every_row_block(tiles):
    """A grid of fewer blocks than row blocks (11 rows of BN 1-2: 6 or 11 row blocks on 3 or
    4 blocks, uneven), or of more (64: clamped to the row blocks); K=100 is ragged."""
    rng = np.random.default_rng(12)
    x, w = random_input(rng, (1, 100), f16), random_input(rng, (11, 100), f16)
    check_gemv(gemv_emulated(x, w, **tiles), x, w, f16)


def test_gemv_accumulates_in_f32_not_f16():
    """Sums whose partials leave f16's range (and lose its precision) come out right."""
    x = np.full((1, 4000), 16.0, np.float16)
    w = np.full((2, 4000), 8.0, np.float16)
    w[1, 2000:] = -8.0
    w[1, 0] = 7.0          # row 1: partial sums reach 256000 (inf in f16), the total is -16
    y = gemv_emulated(x, w)
    assert np.isinf(y[0, 0]) and y[0, 0] > 0  # 512000 overflows f16 only when stored
    assert y[0, 1] == -16.0


def test_gemv_propagates_nan_and_inf_to_their_outputs_only():
    rng = np.random.default_rng(5)
    x, w = random_input(rng, (2, 200), f16), random_input(rng, (9, 200), f16)
    w[4, 150] = np.nan
    x[1, 7] = np.inf
    y = gemv_emulated(x, w)
    assert np.isnan(y[:, 4]).all()
    keep = np.arange(9) != 4
    check_gemv(y[0, keep], x[:1], w[keep], f16)
    signs = np.sign(w[keep, 7].astype(np.float64))  # +inf * w: ±inf by w's sign
    assert np.array_equal(y[1, keep], signs * np.inf)


def test_gemv_empty_dims():
    assert gemv_emulated(np.ones((2, 5), np.float16), np.ones((0, 5), np.float16)).shape == (2, 0)
    y = gemv_emulated(np.ones((2, 0), np.float16), np.ones((3, 0), np.float16))
    assert np.array_equal(y, np.zeros((2, 3), np.float16))


def test_gemv_config_shrinks_the_chunk_as_rows_grow():
    """Weights per thread per step (BN·BK·UNROLL/threads; M accumulators of BN·BK/threads
    f32 each): 32 for one row (four chunks of 8), 16 for 4 rows, 8 for 16."""
    for m, per_thread in [(1, 32), (4, 16), (16, 8)]:
        _, c = gemv_config(m, 4096, 4096)
        assert c["BN"] * c["BK"] * c["UNROLL"] // 128 == per_thread and c["M"] == m


@pytest.mark.parametrize("x,w,error,match", [
    (np.ones((17, 8), np.float16), np.ones((4, 8), np.float16), ValueError, "17 rows"),
    (np.ones((2, 8), np.float16), np.ones((4, 9), np.float16), ValueError, r"x's last dim \(8\)"),
    (np.ones((2, 8), np.float32), np.ones((4, 8), np.float32), TypeError, "f16 or bf16"),
    (np.ones((2, 8), np.float16), np.ones((4, 8), np.float32), TypeError, "share one dtype"),
    (np.ones((2, 2, 8), np.float16), np.ones((4, 8), np.float16), ValueError, "x must be"),
    (np.ones((2, 8), np.float16), np.ones((4, 8, 1), np.float16), ValueError, "w must be 2-D"),
])
def test_gemv_emulated_bad_arguments(x, w, error, match):
    with pytest.raises(error, match=match):
        gemv_emulated(x, w)


def test_gemv_bf16_through_float32_arrays():
    rng = np.random.default_rng(8)
    x, w = random_input(rng, (4, 300), bf16), random_input(rng, (33, 300), bf16)
    check_gemv(gemv_emulated(x, w, bf16), x, w, bf16)


# ------------------------------------------------------------------ torch argument checks

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("args,error,match", [
    (lambda: (torch.ones(2, 8, dtype=torch.float32), torch.ones(4, 8)), TypeError,
     "x has dtype torch.float32"),
    (lambda: (torch.ones(2, 8, dtype=torch.float16), torch.ones(4, 8, dtype=torch.bfloat16)),
     TypeError, "share one dtype"),
    (lambda: (torch.ones(20, 8, dtype=torch.float16), torch.ones(4, 8, dtype=torch.float16)),
     ValueError, "20 rows"),
    (lambda: (torch.ones(2, 8, dtype=torch.float16), torch.ones(4, 6, dtype=torch.float16)),
     ValueError, "must equal w's"),
    (lambda: (torch.ones(2, 8, dtype=torch.float16), torch.ones(4, 8, dtype=torch.float16)),
     ValueError, "x is on cpu"),
    (lambda: ([1.0], torch.ones(4, 8, dtype=torch.float16)), TypeError, "x must be a torch"),
])
def test_gemv_torch_bad_arguments(args, error, match):
    from tegula.kernels import gemv
    with pytest.raises(error, match=match):
        gemv(*args())
