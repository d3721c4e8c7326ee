"""Row softmax written in tegula, emulated on the CPU and checked against numpy.

`softmax` below is the whole kernel: each block owns BM rows of length ≤ BN, reads them
once (elements past the row's end load as -inf, so they add exp(-inf) = 0 to the sum),
subtracts the row max, exponentiates and scales by one reciprocal of the row sum. The
library's version (`tegula/kernels/softmax.py`) is the same with `exp2` of pre-scaled
differences, plus a looped kernel for rows of any length; `main` checks both.

    python examples/softmax.py
    tegula explain examples/softmax.py:softmax -D BN=512
"""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula import f32
from tegula.kernels.common import random_input
from tegula.kernels.softmax import SOFTMAX_DTYPES, softmax_emulated


@tg.kernel(threads=128)
def softmax(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 512):
    m = tg.block_id(0)
    rows = tg.load(x.tile((BM, BN), (m, 0)), fill=-float("inf"))
    e = tg.exp(rows - tg.max(rows, 1))          # (BM, BN) - (BM, 1): broadcast per row
    tg.copy(e * (1.0 / tg.sum(e, 1)), y.tile((BM, BN), (m, 0)))


def _reference(x: np.ndarray) -> np.ndarray:
    xf = x.astype(np.float64)
    e = np.exp(xf - xf.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main(m: int = 37, n: int = 300) -> None:
    rng = np.random.default_rng(0)
    x = random_input(rng, (m, n), f32, 3.0)
    x[0, 5] = -np.inf                           # a masked logit: probability exactly 0
    y = np.full_like(x, np.nan)                 # poison: every element must be written
    tg.emulate(softmax, (tg.cdiv(m, 4),), x, y, BN=max(128, 1 << (n - 1).bit_length()))
    ref = _reference(x)
    assert y[0, 5] == 0 and np.all(np.abs(y - ref) <= 1e-7 + 2.0 ** -20 * ref)
    print(f"softmax kernel above: ok, max abs error {np.abs(y - ref).max():.2e}")
    for dtype in SOFTMAX_DTYPES:
        x = random_input(rng, (m, n), dtype, 3.0)
        y = softmax_emulated(x, dtype).astype(np.float64)
        ref = _reference(x)
        err = np.abs(y - ref)
        # Two ulps of the output type: one for the f32 arithmetic, one for the rounding
        # (plus 1e-7 absolute for the tiniest probabilities, whose exp loses f32 bits).
        rtol = 2 * max(2.0 ** -dtype.mantissa_bits, 2.0 ** -21)
        assert np.all(err <= 1e-7 + rtol * ref), f"{dtype}: max error {err.max()}"
        print(f"{str(dtype):5s} library softmax ok, max abs error {err.max():.2e}")


if __name__ == "__main__":
    main()
