"""Shared-memory planning counts 4-bit elements as half a byte (synth/shared.py).

Session 8 noted that the planner rounded a u4/i4 element up to one byte. Addresses stayed
right (codegen and the emulator both address element `o` at byte `o >> 1`), but every
width and bank count was off by two: packed buffers got 8-byte vectors where 16 bytes
fit, 8-byte cp.async, wavefront counts of twice the bytes, and a swizzle of 8-byte
chunks chosen against conflicts that were not there. The GPU test launches the same
kernels and compares bytes.
"""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, i4, u4, u8
from tegula.build import build
from tegula.ir.ops import Copy, walk_ops
from tegula.layout.swizzle import ComposedLayout
from tegula.synth.shared import SharedAccess, candidate_layouts, plan_access

BM, BN = 32, 64


def _through_shared(dtype, threads):
    @tg.kernel(threads=threads)
    def through_shared(x: tg.Tensor[dtype], y: tg.Tensor[dtype], z: tg.Tensor[f16]):
        m, n = tg.block_id(0), tg.block_id(1)
        s = tg.shared((BM, BN), dtype)
        tg.copy(x.tile((BM, BN), (m, n)), s)
        v = tg.load(s)
        tg.copy(v, y.tile((BM, BN), (m, n)))
        tg.copy(v.to(f16), z.tile((BM, BN), (m, n)))
    return through_shared


def _shared_plans(kernel, target):
    traced = build(kernel, {}, target=target).traced
    return [(op.choices.get("instr"), plan) for op in walk_ops(traced.body)
            if isinstance(op, Copy) for key in ("src_shared", "dst_shared")
            if (plan := op.choices.get(key)) is not None]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", [u4, i4], ids=str)
def test_packed_shared_accesses_move_16_bytes_without_conflicts(dtype, target):
    plans = _shared_plans(_through_shared(dtype, 64), target)
    assert plans
    for instr, plan in plans:
        assert plan.vector == 32, plan          # 32 nibbles: one 16-byte access
        assert plan.wavefronts == plan.ideal_wavefronts == plan.instructions * 4, plan
    assert plans[0][0] == "cp.async"            # 16-byte cp.async, not staged or 8-byte
    traced = build(_through_shared(dtype, 64), {}, target=target).traced
    assert not isinstance(traced.shared_allocs[0].layout, ComposedLayout)  # no swizzle


def test_a_packed_access_costs_what_the_same_bytes_cost_as_u8():
    # 4-bit offsets 2o and 2o+1 are byte o: an access of 2w nibbles is an access of w bytes
    rng = np.random.default_rng(3)
    for trial in range(20):
        width = int(rng.choice([1, 2, 4, 8, 16]))
        starts = rng.choice(4096 // width, size=(64, 1), replace=False) * width
        bytes_ = starts + np.arange(width)                     # 64 threads x width bytes
        nibbles = (2 * bytes_[:, :, None] + np.arange(2)).reshape(64, 2 * width)
        as_u8 = plan_access(SharedAccess(bytes_[..., None], False, 8), bytes_)
        as_u4 = plan_access(SharedAccess(nibbles[..., None], False, 4), nibbles)
        assert as_u4.vector == 2 * as_u8.vector, (trial, width)
        assert (as_u4.instructions, as_u4.wavefronts, as_u4.ideal_wavefronts) == \
            (as_u8.instructions, as_u8.wavefronts, as_u8.ideal_wavefronts), (trial, width)


@pytest.mark.parametrize("dtype,chunk", [(u4, 5), (u8, 4), (f16, 3)], ids=str)
def test_swizzle_candidates_permute_16_byte_chunks(dtype, chunk):
    swizzles = [c.outer for c in candidate_layouts((64, 128), dtype.bits)
                if isinstance(c, ComposedLayout)]
    assert swizzles and {s.base for s in swizzles} == {chunk}


@pytest.mark.parametrize("threads", [64, 128])
@pytest.mark.parametrize("shape", [(32, 64), (45, 96), (7, 130)])
@pytest.mark.parametrize("dtype", [u4, i4], ids=str)
def test_packed_tiles_through_shared_match_numpy(dtype, shape, threads):
    rng = np.random.default_rng(11)
    rows, cols = shape
    x = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)   # two nibbles a byte
    y = np.full_like(x, 0xA5)
    z = np.full(shape, np.nan, np.float16)
    grid = (-(-rows // BM), -(-cols // BN))
    tg.emulate(_through_shared(dtype, threads), grid, x, y, z)
    assert np.array_equal(y, x)
    nibbles = np.stack([x & 15, x >> 4], axis=-1).reshape(shape).astype(np.int16)
    if dtype == i4:
        nibbles = np.where(nibbles > 7, nibbles - 16, nibbles)
    assert np.array_equal(z, nibbles.astype(np.float16))


@pytest.mark.gpu
@pytest.mark.parametrize("threads", [64, 128])
@pytest.mark.parametrize("shape", [(32, 64), (45, 96), (7, 130)])
@pytest.mark.parametrize("dtype", [u4, i4], ids=str)
def test_packed_tiles_through_shared_on_the_gpu(dtype, shape, threads):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(12)
    rows, cols = shape
    x = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    y_emu, z_emu = np.full_like(x, 0xA5), np.full(shape, np.nan, np.float16)
    grid = (-(-rows // BM), -(-cols // BN))
    kernel = _through_shared(dtype, threads)
    tg.emulate(kernel, grid, x, y_emu, z_emu)
    xd = torch.from_numpy(x).cuda()
    y = torch.full_like(xd, 0xA5)
    z = torch.full(shape, float("nan"), dtype=torch.float16, device="cuda")
    kernel[grid](xd, y, z)
    torch.cuda.synchronize()
    assert np.array_equal(y.cpu().numpy(), x)
    assert np.array_equal(z.cpu().numpy(), z_emu)
