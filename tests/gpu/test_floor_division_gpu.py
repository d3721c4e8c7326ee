"""On the GPU: integer // and % (tiles, numbers and kernel scalars on either side, in place,
masks; negative, zero and -1 divisors, the types' extremes), integer / and unary - and
abs of the types' minimum give the emulator's bits, and the emulator's results equal
torch's floor_divide / remainder / trunc division (tests/emulate)."""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

import tegula as tg  # noqa: E402
from tegula.dtypes import i8, i32  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "emulate"))
from division_kernels import (CASES, CONFIGS, division_case, negation_inputs,  # noqa: E402
                              negation_kernel, negation_reference)
from gpu_helpers import assert_matches_emulator, poison, to_device  # noqa: E402


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype,number,s", CASES, ids=str)
def test_floor_division_matches_the_emulator(dtype, number, s, config):
    shape, threads, BM, BN = config
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{number}{s}{config}".encode()))
    kernel, grid, x, y, out, scalars, constexprs, ref = division_case(
        rng, dtype, number, s, shape, threads, BM, BN)
    out_dev = poison(to_device(out, dtype))
    kernel[grid](to_device(x, dtype), to_device(y, dtype), out_dev, *scalars, **constexprs)
    torch.cuda.synchronize()
    tg.emulate(kernel, grid, x, y, out, *scalars, **constexprs)
    assert np.array_equal(out, ref)
    assert_matches_emulator(out, out_dev, dtype, what=f"{dtype} // and %")


@pytest.mark.parametrize("dtype", (i32, i8), ids=str)
def test_negation_and_abs_wrap_on_the_gpu(dtype):
    x = negation_inputs(dtype)
    out = np.zeros(24, x.dtype)
    out_dev = poison(to_device(out, dtype))
    negation_kernel(dtype)[(1,)](to_device(x, dtype), out_dev)
    torch.cuda.synchronize()
    tg.emulate(negation_kernel(dtype), (1,), x, out)
    assert np.array_equal(out, negation_reference(x, dtype))
    assert_matches_emulator(out, out_dev, dtype, what=f"{dtype} -x, abs(x), -x < 0")
