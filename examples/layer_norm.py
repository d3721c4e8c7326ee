"""LayerNorm written in tegula, emulated on the CPU and checked against numpy.

    y[i, :] = (x[i, :] - mean(x[i, :])) / sqrt(var(x[i, :]) + eps) * w + b

Each block owns BM whole rows (BN ≥ N). Elements past the row's end load as 0, which is
harmless for the mean but not for the variance (0 - mean is not 0), so the centred values
are masked with the column index before they are squared. The variance is taken of the
centred values (two passes over registers), which stays accurate when |mean| ≫ std.

    python examples/layer_norm.py
    tegula explain examples/layer_norm.py:layer_norm -D N=300 -D BN=512
"""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula import f32


@tg.kernel(threads=128)
def layer_norm(x: tg.Tensor[f32], w: tg.Tensor[f32], b: tg.Tensor[f32], y: tg.Tensor[f32],
               N: tg.constexpr, EPS: tg.constexpr = 1e-5,
               BM: tg.constexpr = 4, BN: tg.constexpr = 512):
    m = tg.block_id(0)
    rows = tg.load(x.tile((BM, BN), (m, 0)))                 # (BM, BN), zeros past N
    mean = tg.sum(rows, 1) * (1.0 / N)                       # (BM, 1)
    inside = tg.indices((BM, BN), 1) < N                     # column index < N
    centred = tg.where(inside, rows - mean, 0.0)
    rstd = tg.rsqrt(tg.sum(centred * centred, 1) * (1.0 / N) + EPS)
    weight = tg.load(w.tile((1, BN), (0, 0)))                # broadcast over the rows
    bias = tg.load(b.tile((1, BN), (0, 0)))
    tg.copy(centred * rstd * weight + bias, y.tile((BM, BN), (m, 0)))


def layer_norm_emulated(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-5,
                        BM: int = 4) -> np.ndarray:
    """Run the kernel in the emulator on an (M, N) float32 array."""
    m, n = x.shape
    bn = max(128, 1 << (n - 1).bit_length())                 # the row, rounded up
    y = np.full_like(x, np.nan)                              # poison: every element is written
    tg.emulate(layer_norm, (tg.cdiv(m, BM),), x, w[None, :], b[None, :], y,
               N=n, EPS=eps, BM=BM, BN=bn)
    return y


def main(m: int = 37, n: int = 300) -> None:
    rng = np.random.default_rng(0)
    # A large mean next to a unit spread: where E[x²] - mean² would lose every digit.
    x = (rng.standard_normal((m, n)) + 1000.0).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    y = layer_norm_emulated(x, w, b)
    xd = x.astype(np.float64)
    centred = xd - xd.mean(axis=1, keepdims=True)
    ref = centred / np.sqrt((centred ** 2).mean(axis=1, keepdims=True) + 1e-5) * w + b
    err = np.abs(y - ref)
    # The f32 mean of values near 1000 is off by a few ulps of 1000 (6e-5 each: the
    # reduction adds ~16 terms in sequence, then a butterfly), which shifts every centred
    # value alike: |w| * 1e-3 per output (std is 1), plus f32 rounding of the result.
    bound = 1e-3 * np.abs(w) + 1e-5 * np.abs(ref) + 1e-6
    assert np.all(err <= bound), f"max error {err.max():.3g}"
    print(f"layer_norm {m}x{n} ok, max abs error {err.max():.2e}")


if __name__ == "__main__":
    main()
