"""tg.gemm's operand types come from the instruction catalogue's MMA entries (issue 9 §1):
every entry's (a, b, c) types trace, and the mixed-signedness i8 x u8 entry — which the
language's old hand-written table refused — computes the right products in the emulator."""
from __future__ import annotations

import os
import sys
import numpy as np
import pytest

import tegula as tg
from tegula.arch import MMA_INSTRUCTIONS, mma_accumulators
from tegula.dtypes import f16, i8, i32, u8
from tegula.kernels.common import poisoned, random_input

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemm_fixtures import readme_gemm  # noqa: E402


def _gemm_kernel(a_t, b_t, c_t):
    return readme_gemm(a_t, c_t, c_t, b_dtype=b_t, BM=32, BN=32, BK=32, STAGES=2)


def test_language_accepts_exactly_the_catalogue_types():
    pairs = {(i.a_dtype, i.b_dtype) for i in MMA_INSTRUCTIONS}
    for a_t, b_t in pairs:
        accs = mma_accumulators(a_t, b_t)
        assert accs and set(accs) == {i.c_dtype for i in MMA_INSTRUCTIONS
                                      if (i.a_dtype, i.b_dtype) == (a_t, b_t)}
        for c_t in accs:
            _gemm_kernel(a_t, b_t, c_t).trace_fresh(128, BM=32, BN=32, BK=32)
    assert mma_accumulators(f16, f16) == (tg.f32, f16)  # the error message's order
    assert mma_accumulators(tg.f32, tg.f32) == (tg.f32,)        # sm_90a's tf32 wgmma only
    assert mma_accumulators(tg.f32, tg.f32, "sm_80") == ()
    _gemm_kernel(tg.f32, tg.f32, tg.f32).trace_fresh(128, BM=32, BN=32, BK=32)
    assert mma_accumulators(f16, i8) == ()


@pytest.mark.parametrize("a_t, b_t", [(i8, u8), (u8, i8)], ids=str)
def test_mixed_signedness_int8_gemm_in_the_emulator(a_t, b_t):
    rng = np.random.default_rng(9)
    m, n, k = 45, 37, 80  # none divides the 32x32x32 tiles
    a, b = random_input(rng, (m, k), a_t), random_input(rng, (n, k), b_t)
    c = poisoned((m, n), i32)
    tg.emulate(_gemm_kernel(a_t, b_t, i32), (tg.cdiv(m, 32), tg.cdiv(n, 32)), a, b, c)
    ref = a.astype(np.int64) @ b.astype(np.int64).T
    np.testing.assert_array_equal(c.astype(np.int64), ref)
