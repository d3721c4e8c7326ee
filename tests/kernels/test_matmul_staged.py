"""The one-block-per-tile GEMM with the persistent kernel's TMA-store epilogue
(`kernels.gemm.staged_gemm_kernel`, `matmul`'s `kernel="staged"` candidate for large
shapes on sm_90a) in the emulator against float64 numpy, every element: ragged shapes (M,
N and K no multiple of the tiles, K under one k-step, M = 1), every fused epilogue with
NaN/±inf operands, bf16, sm_90a (TMA + wgmma, a producer warpgroup, TMA stores) and sm_80
(cp.async + mma.sync, register stores); the 128×256 tile matmul times, at a ragged shape."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tegula.build import build
from tegula.dtypes import bf16, f16
from tegula.kernels.gemm import ACTIVATIONS, gemm_emulated, staged_gemm_kernel
from tegula.lower.async_ir import TmaLoad, TmaStore
from tegula.lower.thread_ir import walk

sys.path.insert(0, os.path.dirname(__file__))
from test_gemm import check_gemm  # noqa: E402
from test_matmul_epilogue import check_epilogue, operands  # noqa: E402

#: Small tiles that still take wgmma on sm_90a (64 rows, one warpgroup's instruction).
SMALL = dict(BM=64, BN=32, BK=16, STAGES=2)


def test_sm90a_stores_the_tile_through_tma_and_sm80_through_registers():
    """The one-trip loop around the tile is what puts the epilogue through shared memory
    and TMA stores on sm_90a (the ring runs across an enclosing loop)."""
    def statements(target):
        kernel = build(staged_gemm_kernel(f16, "gelu", True), SMALL, None, target)
        return {type(s) for s in walk(kernel.thread_kernel.body)}
    assert {TmaLoad, TmaStore} <= statements("sm_90a")
    assert not {TmaLoad, TmaStore} & statements("sm_80")


#: (M, N, K): tiles ragged in M, N and K; one k-step shorter than BK; M = 1; one tile.
SHAPES = [(97, 130, 72), (70, 40, 9), (1, 77, 48), (64, 32, 16)]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("m,n,k", SHAPES, ids=lambda v: str(v))
def test_plain_f16_at_ragged_shapes(m, n, k, target):
    rng = np.random.default_rng(m * n + k)
    a, b, _ = operands(rng, m, n, k, f16)
    check_gemm(gemm_emulated(a, b, f16, staged=True, target=target, **SMALL), a, b, f16)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_bias_activation_and_nonfinite_values(activation):
    """A NaN row of a is NaN in every column; ±inf bias columns give the activation's
    value at ±inf; every other element within the epilogue's bound."""
    rng = np.random.default_rng(len(str(activation)))
    a, b, bias = operands(rng, 37, 70, 56, f16, nonfinite=True)
    c = gemm_emulated(a, b, bias=bias, activation=activation, target="sm_90a", staged=True,
                      **SMALL)
    assert np.isnan(c[3, :]).all()
    check_epilogue(c, a, b, bias, activation, f16)


def test_bf16_with_bias_and_silu_on_sm80():
    rng = np.random.default_rng(3)
    a, b, bias = operands(rng, 50, 45, 120, bf16)
    c = gemm_emulated(a, b, bf16, bias=bias, activation="silu", target="sm_80", staged=True,
                      BM=64, BN=32, BK=16, STAGES=4)
    check_epilogue(c, a, b, bias, "silu", bf16)


def test_the_candidate_tile_at_a_ragged_shape(monkeypatch):
    """matmul's staged candidate itself (128×256, 4 stages, two consumer warpgroups): a
    ragged row and column tile, a partial last k-step. (The cost-model search behind the
    persistent candidates is replaced: seconds, not tested here.)"""
    from tegula.kernels import api_matmul
    monkeypatch.setattr(api_matmul, "searched_persistent",
                        lambda m, n, k: list(api_matmul.PERSISTENT))
    config = api_matmul.gemm_candidates(2048, 2048, 2048)[0]
    assert config["kernel"] == "staged"
    tiles = {k: v for k, v in config.items() if k != "kernel"}
    rng = np.random.default_rng(256)
    a, b, _ = operands(rng, 130, 260, 72, f16)
    check_gemm(gemm_emulated(a, b, f16, staged=True, target="sm_90a", **tiles), a, b, f16)
