"""RMSNorm written in tegula, emulated on the CPU and checked against numpy.

    y[i, :] = x[i, :] / sqrt(mean(x[i, :]²) + eps) * w

`rms_norm` below is the whole kernel: each block owns BM whole rows (BN ≥ N; elements
past the row's end load as 0 and add nothing to the sum of squares), and the weight is
one (1, BN) tile broadcast over the rows. N is a constexpr because the mean divides by it.
The library's version (`tegula/kernels/norm.py`) adds other dtypes and a looped kernel
for rows of any length; `main` checks both.

    python examples/rms_norm.py
    tegula explain examples/rms_norm.py:rms_norm -D N=300 -D BN=512
"""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula import f32
from tegula.kernels.common import random_input
from tegula.kernels.norm import RMS_NORM_DTYPES, rms_norm_emulated


@tg.kernel(threads=128)
def rms_norm(x: tg.Tensor[f32], w: tg.Tensor[f32], y: tg.Tensor[f32], N: tg.constexpr,
             EPS: tg.constexpr = 1e-6, BM: tg.constexpr = 4, BN: tg.constexpr = 512):
    m = tg.block_id(0)
    rows = tg.load(x.tile((BM, BN), (m, 0)))
    scale = tg.rsqrt(tg.sum(rows * rows, 1) * (1.0 / N) + EPS)     # (BM, 1)
    weight = tg.load(w.tile((1, BN), (0, 0)))                      # (1, BN)
    tg.copy(rows * scale * weight, y.tile((BM, BN), (m, 0)))


def _reference(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    xf = x.astype(np.float64)
    return xf / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + eps) * w.astype(np.float64)


def main(m: int = 37, n: int = 300) -> None:
    rng = np.random.default_rng(0)
    eps = 1e-5
    x, w = random_input(rng, (m, n), f32, 3.0), random_input(rng, (n,), f32)
    y = np.full_like(x, np.nan)                 # poison: every element must be written
    tg.emulate(rms_norm, (tg.cdiv(m, 4),), x, w[None, :], y, N=n, EPS=eps,
               BN=max(128, 1 << (n - 1).bit_length()))
    ref = _reference(x, w, eps)
    assert np.all(np.abs(y - ref) <= 1e-6 + 2.0 ** -20 * np.abs(ref))
    print(f"rms_norm kernel above: ok, max abs error {np.abs(y - ref).max():.2e}")
    for dtype in RMS_NORM_DTYPES:
        x, w = random_input(rng, (m, n), dtype, 3.0), random_input(rng, (n,), dtype)
        y = rms_norm_emulated(x, w, eps, dtype).astype(np.float64)
        ref = _reference(x, w, eps)
        err = np.abs(y - ref)
        # Two ulps of the output type: one for the f32 arithmetic, one for the rounding.
        rtol = 2 * max(2.0 ** -dtype.mantissa_bits, 2.0 ** -21)
        assert np.all(err <= 1e-6 + rtol * np.abs(ref)), f"{dtype}: max error {err.max()}"
        print(f"{str(dtype):5s} library rms_norm ok, max abs error {err.max():.2e}")


if __name__ == "__main__":
    main()
