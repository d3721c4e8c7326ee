"""`tg.atomic_add` by TMA reduce-adds on the GPU (`cp.reduce.async.bulk.tensor ... .add`,
sm_90): the kernels of tests/lower/test_bulk_add.py against numpy and the emulator, bit for
bit where every order of the sums is exact (small integers), within f32 rounding where it
is not. The slices the kernel must not touch start as NaN and must stay NaN; the slice it
adds into starts with non-zero values; several blocks (and iterations) add into every
element; the tiles are cut by the tensor's edges."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.build import build

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lower"))
from test_bulk_add import (PIPELINED, bulk_plan, pipelined_adds,  # noqa: E402
                           pipelined_case, product_adds, small_integers, tile_adds,
                           tile_adds_case)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU of sm_90")]


def _uses_bulk_adds(kernel, *tensors, **options) -> None:
    """The build a launch with these tensors compiles takes the bulk path (a fallback to
    red would make the test pass without testing the entry)."""
    from tegula.build import _launch_facts, split_arguments
    named, _, _ = split_arguments(kernel, tensors, {})
    facts, _ = _launch_facts(kernel, named)
    plan, skipped = bulk_plan(build(kernel, options, facts, "sm_90a"))
    assert plan is not None, skipped


@pytest.mark.parametrize("M,N,blocks_z,repeat", [(100, 72, 3, 2), (64, 64, 1, 1),
                                                 (300, 200, 4, 3)])
def test_bulk_add_sums_exactly_like_numpy_and_the_emulator(M, N, blocks_z, repeat):
    x, start, want, grid = tile_adds_case(M * N + blocks_z, M, N, blocks_z, repeat)
    out, tx = torch.from_numpy(start.copy()).cuda(), torch.from_numpy(x).cuda()
    _uses_bulk_adds(tile_adds, tx, out, REPEAT=repeat)
    tile_adds[grid](tx, out, REPEAT=repeat)
    torch.cuda.synchronize()
    got = out.cpu().numpy()
    assert np.array_equal(got.view(np.uint32)[~np.isnan(want)],
                          want.view(np.uint32)[~np.isnan(want)])
    assert np.isnan(got[np.isnan(want)]).all()          # the other slices: untouched
    emulated = start.copy()
    tg.emulate(tile_adds, grid, x, emulated, target="sm_90a", check_coverage=False,
               REPEAT=repeat)
    assert np.array_equal(emulated.view(np.uint32), got.view(np.uint32))


def test_bulk_add_of_fractions_within_rounding():
    """Random f32 values from 16 blocks per element: the order of the adds differs from
    run to run, so within f32 rounding of the float64 sum (and the red path's)."""
    rng = np.random.default_rng(7)
    M, N, blocks_z = 256, 192, 16
    x = rng.standard_normal((M, N)).astype(np.float32)
    start = rng.standard_normal((2, 3, M, N)).astype(np.float32)
    want = start.astype(np.float64)
    want[1, 0] += blocks_z * 2 * x.astype(np.float64)
    grid = (tg.cdiv(M, 64), tg.cdiv(N, 64), blocks_z)
    got = {}
    for path in ("bulk", "red"):
        out, tx = torch.from_numpy(start.copy()).cuda(), torch.from_numpy(x).cuda()
        if path == "bulk":
            _uses_bulk_adds(tile_adds, tx, out)
        tile_adds[grid](tx, out, atomic_path=path)
        torch.cuda.synchronize()
        got[path] = out.cpu().numpy()
        np.testing.assert_allclose(got[path], want, rtol=2e-6, atol=2e-5)
    assert np.array_equal(got["bulk"][0], start[0])     # slice 0 never added into


def test_accumulator_bulk_add_in_rounds():
    """A wgmma accumulator added in two rounds through the staging buffer (the round-two
    writes wait for round one's reduces to have read it), two blocks per element."""
    rng = np.random.default_rng(8)
    a = rng.integers(-2, 3, (100, 256)).astype(np.float16)
    b = rng.integers(-2, 3, (128, 256)).astype(np.float16)
    start = small_integers(rng, (2, 100, 128))
    out, ta, tb = (torch.from_numpy(v.copy()).cuda() for v in (start, a, b))
    _uses_bulk_adds(product_adds, ta, tb, out)
    product_adds[(2, 1, 2)](ta, tb, out)
    torch.cuda.synchronize()
    want = start.copy()
    want[1] += 2 * (a.astype(np.float32) @ b.astype(np.float32).T)
    assert np.array_equal(out.cpu().numpy(), want)


def test_bulk_add_inside_a_warp_specialized_pipeline():
    a, b, start, want = pipelined_case(9)
    out, ta, tb = (torch.from_numpy(v.copy()).cuda() for v in (start, a, b))
    _uses_bulk_adds(pipelined_adds, ta, tb, out, **PIPELINED)
    pipelined_adds[(2, 1, 2)](ta, tb, out, **PIPELINED)
    torch.cuda.synchronize()
    assert np.array_equal(out.cpu().numpy(), want)


def test_subnormal_adds_match_the_emulator():
    """What the f32 bulk add does with subnormal operands and results (the entry says:
    kept, unlike red.add.f32; session 11 round 1 measured it) must be what the GPU does."""
    M, N = 64, 64
    tiny = np.finfo(np.float32).tiny
    x = np.zeros((M, N), np.float32)
    x[:, :16] = tiny / 4                 # subnormal addend onto 0
    x[:, 16:32] = tiny * 3               # normal addend onto a subnormal start
    x[:, 32:48] = -tiny / 2              # subnormal addend onto a normal start
    x[:, 48:] = tiny / 8                 # subnormal addend onto a subnormal start
    start = np.full((2, 3, M, N), np.nan, np.float32)
    start[1, 0] = 0.0
    start[1, 0][:, 16:32] = tiny / 2
    start[1, 0][:, 32:48] = tiny * 1.5
    start[1, 0][:, 48:] = tiny / 16
    out, tx = torch.from_numpy(start.copy()).cuda(), torch.from_numpy(x).cuda()
    _uses_bulk_adds(tile_adds, tx, out, REPEAT=1)
    tile_adds[(1, 1, 1)](tx, out, REPEAT=1)
    torch.cuda.synchronize()
    got = out.cpu().numpy()[1, 0]
    emulated = start.copy()
    tg.emulate(tile_adds, (1, 1, 1), x, emulated, target="sm_90a", check_coverage=False,
               REPEAT=1)
    cols = {name: slice(16 * i, 16 * i + 16) for i, name in
            enumerate(("sub+0", "normal+sub", "sub+normal", "sub+sub"))}
    report = {name: (got[0, c][0], emulated[1, 0][0, c][0]) for name, c in cols.items()}
    print("subnormal adds (gpu, emulator):", report)
    assert np.array_equal(got.view(np.uint32), emulated[1, 0].view(np.uint32)), report
