"""Copy and transpose for every element type, emulated on the CPU and checked exactly.

    python examples/copy_transpose.py

`tegula.kernels.copy` holds the kernels: a register-staged copy, and a transpose that
stages each tile in shared memory and reads it back through a `.T` view, so both global
sides are coalesced (synthesis picks the shared layout and swizzle).
"""
from __future__ import annotations

import numpy as np

from tegula.kernels.common import random_input
from tegula.kernels.copy import COPY_DTYPES, TRANSPOSE_DTYPES, copy_emulated, transpose_emulated


def main() -> None:
    rng = np.random.default_rng(0)
    for dtype in COPY_DTYPES:
        x = random_input(rng, (131, 78), dtype, scale=4.0)
        assert np.array_equal(copy_emulated(x, dtype), x), f"copy {dtype}"
        line = f"{str(dtype):8s} copy ok"
        if dtype in TRANSPOSE_DTYPES:
            assert np.array_equal(transpose_emulated(x, dtype), x.T), f"transpose {dtype}"
            line += ", transpose ok"
        print(line)


if __name__ == "__main__":
    main()
