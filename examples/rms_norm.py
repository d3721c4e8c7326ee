"""RMSNorm, emulated on the CPU and checked against numpy.

    python examples/rms_norm.py
"""
from __future__ import annotations

import numpy as np

from tegula.kernels.common import random_input
from tegula.kernels.norm import RMS_NORM_DTYPES, rms_norm_emulated


def main() -> None:
    rng = np.random.default_rng(0)
    eps = 1e-5
    for dtype in RMS_NORM_DTYPES:
        x, w = random_input(rng, (37, 300), dtype, 3.0), random_input(rng, (300,), dtype)
        y = rms_norm_emulated(x, w, eps, dtype).astype(np.float64)
        xf = x.astype(np.float64)
        ref = xf / np.sqrt((xf * xf).mean(axis=1, keepdims=True) + eps) * w.astype(np.float64)
        err = np.abs(y - ref)
        # Two ulps of the output type: one for the f32 arithmetic, one for the rounding.
        rtol = 2 * max(2.0 ** -dtype.mantissa_bits, 2.0 ** -21)
        assert np.all(err <= 1e-6 + rtol * np.abs(ref)), f"{dtype}: max error {err.max()}"
        print(f"{str(dtype):5s} rms_norm ok, max abs error {err.max():.2e}")


if __name__ == "__main__":
    main()
