"""Row softmax, emulated on the CPU and checked against numpy.

    python examples/softmax.py
"""
from __future__ import annotations

import numpy as np

from tegula.kernels.common import random_input
from tegula.kernels.softmax import SOFTMAX_DTYPES, softmax_emulated


def main() -> None:
    rng = np.random.default_rng(0)
    for dtype in SOFTMAX_DTYPES:
        x = random_input(rng, (37, 300), dtype, 3.0)
        y = softmax_emulated(x, dtype).astype(np.float64)
        xf = x.astype(np.float64)
        e = np.exp(xf - xf.max(axis=1, keepdims=True))
        ref = e / e.sum(axis=1, keepdims=True)
        err = np.abs(y - ref)
        # Two ulps of the output type: one for the f32 arithmetic, one for the rounding
        # (plus 1e-7 absolute for the tiniest probabilities, whose exp loses f32 bits).
        rtol = 2 * max(2.0 ** -dtype.mantissa_bits, 2.0 ** -21)
        assert np.all(err <= 1e-7 + rtol * ref), f"{dtype}: max error {err.max()}"
        print(f"{str(dtype):5s} softmax ok, max abs error {err.max():.2e}")


if __name__ == "__main__":
    main()
