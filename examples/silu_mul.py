"""Fused SiLU(x)·y (the gated-MLP activation), emulated on the CPU and checked with numpy.

    python examples/silu_mul.py
"""
from __future__ import annotations

import numpy as np

from tegula.kernels.common import random_input
from tegula.kernels.elementwise import SILU_MUL_DTYPES, silu_mul_emulated


def main() -> None:
    rng = np.random.default_rng(0)
    for dtype in SILU_MUL_DTYPES:
        x, y = random_input(rng, (37, 300), dtype, 4.0), random_input(rng, (37, 300), dtype)
        out = silu_mul_emulated(x, y, dtype).astype(np.float64)
        xf = x.astype(np.float64)
        ref = xf / (1.0 + np.exp(-xf)) * y.astype(np.float64)
        # Within one ulp of the output type (f32: a few ulps of the kernel's arithmetic).
        rtol = max(2.0 ** -dtype.mantissa_bits, 1e-6)
        err = float(np.max(np.abs(out - ref) / (1e-6 / rtol + np.abs(ref))))
        assert err <= rtol, f"{dtype}: relative error {err}"
        print(f"{str(dtype):5s} silu_mul ok, max relative error {err:.2e}")


if __name__ == "__main__":
    main()
