"""Compiler bugs the fuzzer found and that are not fixed yet, as strict xfails: each one
passes (and so fails here, XPASS) once its owner fixes it; then turn it into a plain test.
"""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32, i32
from tegula.errors import SynthesisError


@tg.kernel(threads=32)
def _transposed_with_argmax(x0: tg.Tensor[i32], x1: tg.Tensor[f16], o0: tg.Tensor[i32],
                            BM: tg.constexpr = 3, BN: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    s1 = tg.shared((BN, BM), i32)
    tg.copy(x0.tile((BN, BM), (n, m)), s1)
    v1 = tg.load(s1.T)
    v4 = tg.argmax(tg.load(x1.tile((BM, BN), (m, n))).to(f32), 0)
    v7 = v4 < v1  # noqa: F841 — unused, but its layout meeting v1's is what fails
    s2 = tg.shared((BM, BN), i32)
    tg.copy(v1, s2)
    tg.copy(s2, o0.tile((BM, BN), (m, n)))


@pytest.mark.xfail(strict=True, raises=SynthesisError, reason=(
    "a (3, 32) tile read through a transposed shared view, compared with a (1, 32) argmax: "
    "synthesis raises the layout algebra's 'composition((3,32):(0,1), (32,3):(1,32)) is not "
    "admissible' as a SynthesisError at the @tg.kernel line, on sm_90a and sm_80 alike "
    "(python -m tegula.fuzz --seed 20261124 --program 110, shrunk); the kernel is valid"))
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_transposed_tile_meeting_an_argmax_compiles_and_is_right(target):
    rng = np.random.default_rng(0)
    M, N = 5, 40
    x0 = rng.integers(-1000, 1000, (N, M)).astype(np.int32)
    x1 = rng.standard_normal((M, N)).astype(np.float16)
    o0 = np.zeros((M, N), np.int32)
    tg.emulate(_transposed_with_argmax, (tg.cdiv(M, 3), tg.cdiv(N, 32)), x0, x1, o0,
               target=target)
    assert np.array_equal(o0, x0.T)
