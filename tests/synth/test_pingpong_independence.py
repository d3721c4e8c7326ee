"""Ping-pong consumers split the iterations of the loop around a pipeline between two
warpgroups, each with registers of its own: only right where the iterations are
independent. Session 10: a K pipeline inside a `tg.range` that *accumulates* into one
`acc` across it (the README GEMM repeated `reps` times) was split by default, each
warpgroup summing every other repetition into its own accumulator: half the sum, no
error. A tile carried across the loop, or a store to the same elements in every
iteration, now keeps one consumer role (and `consumers="pingpong"` is refused)."""
import numpy as np
import pytest

import tegula as tg
from tegula.errors import SynthesisError
from tegula import f16, f32


@tg.kernel(threads=128, warp_specialize=True)
def repeated_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32], reps: int,
                  BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32,
                  STAGES: tg.constexpr = 3):
    m, n = tg.block_id(0), tg.block_id(1)
    ga, gb = a.tile((BM, BK), (m, None)), b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for r in tg.range(reps):                      # acc carried across the outer loop
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc, c.tile((BM, BN), (m, n)))


@tg.kernel(threads=128, warp_specialize=True)
def restored_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32], reps: int,
                  BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32,
                  STAGES: tg.constexpr = 3):
    m, n = tg.block_id(0), tg.block_id(1)
    ga, gb = a.tile((BM, BK), (m, None)), b.tile((BN, BK), (n, None))
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for r in tg.range(reps):
        acc = tg.zeros((BM, BN), f32)             # made in the loop: not carried
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc * (r + 1), c.tile((BM, BN), (m, n)))   # the same tile every time


def _operands(m=64, n=64, k=96):
    rng = np.random.default_rng(10)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    return a, b, a.astype(np.float64) @ b.astype(np.float64).T


@pytest.mark.parametrize("reps", [2, 3])
@pytest.mark.parametrize("order", ["listed", "reversed"])
def test_a_tile_carried_across_the_loop_sums_every_repetition(reps, order):
    a, b, ab = _operands()
    c = np.full(ab.shape, np.nan, np.float32)
    tg.emulate(repeated_gemm, (1, 1), a, b, c, reps, role_order=order)
    ref = reps * ab
    assert np.all(np.abs(c - ref) <= 1e-5 * reps * (np.abs(a).astype(np.float64)
                                                     @ np.abs(b).T.astype(np.float64)))


def _consumers(kernel) -> str:
    line = next(x for x in str(tg.explain(kernel)).splitlines() if "consumers:" in x)
    return line.split("consumers:")[1]


def test_explain_says_why_the_carried_tile_keeps_one_consumer():
    said = _consumers(repeated_gemm)
    assert said.startswith(" cooperative (not pingpong: %r0: register<64x64, f32> is "
                           "written in the tile loop"), said


def test_a_store_to_the_same_tile_every_iteration_keeps_one_consumer():
    said = _consumers(restored_gemm)
    assert said.startswith(" cooperative (not pingpong: the store to %c"), said
    a, b, ab = _operands()
    c = np.full(ab.shape, np.nan, np.float32)
    tg.emulate(restored_gemm, (1, 1), a, b, c, 3)
    assert np.all(np.abs(c - 3 * ab) <= 1e-4 * (np.abs(a).astype(np.float64)
                                                @ np.abs(b).T.astype(np.float64)))


@pytest.mark.parametrize("kernel", [repeated_gemm, restored_gemm])
def test_asking_for_pingpong_there_is_refused_with_the_reason(kernel):
    a, b, ab = _operands()
    c = np.full(ab.shape, np.nan, np.float32)
    with pytest.raises(SynthesisError, match="consumers='pingpong': .*(tile loop|iteration)"):
        tg.emulate(kernel, (1, 1), a, b, c, 2, consumers="pingpong")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel,reps", [(repeated_gemm, 3), (restored_gemm, 3)])
def test_the_repeated_gemms_on_the_gpu(kernel, reps):
    import torch
    a, b, ab = _operands(130, 70, 96)
    c = torch.full(ab.shape, float("nan"), device="cuda")
    kernel[(tg.cdiv(130, 64), tg.cdiv(70, 64))](torch.from_numpy(a).cuda(),
                                                 torch.from_numpy(b).cuda(), c, reps)
    torch.cuda.synchronize()
    bound = 1e-5 * reps * (np.abs(a).astype(np.float64) @ np.abs(b).T.astype(np.float64))
    assert np.all(np.abs(c.cpu().numpy() - reps * ab) <= bound)
