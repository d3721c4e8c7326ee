"""Scans on the GPU: the emulator tests' scan kernels launched on CUDA tensors with poisoned
outputs and compared with the emulator bit for bit (sums, max and integer combines have no
multiply-add to contract) and with torch.cumsum; then Mamba's selective scan against a
torch transcription of Mamba's `selective_scan_ref` (float64) on many shapes, dtypes and
option sets, outputs NaN-poisoned first, every element checked."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.dtypes import f16, f32, i32

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

import tegula as tg  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "emulate"))
from gpu_helpers import assert_matches_emulator, poison, to_device  # noqa: E402
from scan_kernels import (SHAPES, affine_scan, cumsum_f16, cumsum_tile,  # noqa: E402
                          max_and_first, rand)


def run_both(kernel, grid, inputs: list, outputs: list, dtypes: list, **constexprs):
    """Emulate, then launch on the GPU with poisoned outputs; compare every output."""
    emulated = [o.copy() for o in outputs]
    tg.emulate(kernel, grid, *inputs, *emulated, **constexprs)
    on_gpu = [poison(to_device(o, dt)) for o, dt in zip(outputs, dtypes[len(inputs):])]
    kernel[grid](*[to_device(x, dt) for x, dt in zip(inputs, dtypes)], *on_gpu, **constexprs)
    torch.cuda.synchronize()
    for i, (want, got) in enumerate(zip(emulated, on_gpu)):
        assert_matches_emulator(want, got, dtypes[len(inputs) + i], what=f"output {i}")
    return on_gpu


@pytest.mark.parametrize("M,N,BM,BN,threads", SHAPES + [(20, 4096, 1, 4096, 512)])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_matches_emulator_and_torch(M, N, BM, BN, threads, axis, reverse):
    x = rand(M, N, seed=M + N)
    (y,) = run_both(cumsum_tile, (tg.cdiv(M, BM),), [x], [np.zeros((M, N), np.float32)],
                    [f32, f32], BM=BM, BN=BN, AXIS=axis, REVERSE=reverse, threads=threads)
    if axis == 1 and BN >= N:   # one tile per row: torch.cumsum of the whole row
        xt = torch.from_numpy(x).double().cuda()
        want = torch.cumsum(xt.flip(1), 1).flip(1) if reverse else torch.cumsum(xt, 1)
        scale = torch.cumsum(xt.abs(), 1)
        assert bool(((y.double() - want).abs() <= N * 1.2e-7 * scale).all())


@pytest.mark.parametrize("M,N,BM,BN,threads", [(3, 1000, 2, 1024, 128),
                                                (1, 2048, 1, 2048, 256),
                                                (5, 45, 4, 48, 64), (4, 7, 4, 7, 128),
                                                (2, 8192, 1, 8192, 1024)])
@pytest.mark.parametrize("reverse", [False, True])
def test_affine_tuple_scan_matches_emulator(M, N, BM, BN, threads, reverse):
    rng = np.random.default_rng(M * N)
    a = rng.integers(-5, 6, (M, N)).astype(np.int32)
    a[a == 0] = 3
    b = rng.integers(-1000, 1000, (M, N)).astype(np.int32)
    run_both(affine_scan, (tg.cdiv(M, BM),), [a, b],
             [np.zeros((M, N), np.int32), np.zeros((M, N), np.int32)], [i32] * 4,
             BM=BM, BN=BN, REVERSE=reverse, threads=threads)


@pytest.mark.parametrize("M,N,BM,BN,threads", SHAPES)
@pytest.mark.parametrize("axis", [0, 1])
def test_max_and_first_scans_match_emulator(M, N, BM, BN, threads, axis):
    x = rand(M, N, seed=7)
    x[0, N // 2] = np.nan
    run_both(max_and_first, (tg.cdiv(M, BM),), [x],
             [np.zeros((M, N), np.float32), np.zeros((M, N), np.float32)], [f32] * 3,
             BM=BM, BN=BN, AXIS=axis, threads=threads)


def test_f16_cumsum_matches_emulator():
    x = np.random.default_rng(5).uniform(0.9, 1.1, (1, 4000)).astype(np.float16)
    run_both(cumsum_f16, (1,), [x], [np.zeros((1, 4000), np.float16)], [f16, f16])


# -- the selective scan ---------------------------------------------------------------------
def selective_scan_ref(u, delta, A, B, C, D=None, z=None, delta_bias=None,
                       delta_softplus=False):
    """Mamba's selective_scan_ref (variable B and C, no groups), in float64."""
    F = torch.nn.functional
    u, delta = u.double(), delta.double()
    if delta_bias is not None:
        delta = delta + delta_bias[..., None].double()
    if delta_softplus:
        delta = F.softplus(delta)
    A, B, C = A.double(), B.double(), C.double()
    x = A.new_zeros((u.shape[0], A.shape[0], A.shape[1]))
    delta_a = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    delta_b_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    ys = []
    for i in range(u.shape[2]):
        x = delta_a[:, :, i] * x + delta_b_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", x, C[:, :, i]))
    out = torch.stack(ys, dim=2)
    if D is not None:
        out = out + u * D.double()[:, None]
    if z is not None:
        out = out * F.silu(z.double())
    return out


TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def mamba_inputs(batch, dim, length, dstate, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = TORCH_DTYPES[dtype]
    u = torch.randn(batch, dim, length, device="cuda", generator=g).to(t)
    delta = (torch.rand(batch, dim, length, device="cuda", generator=g) * 0.3 + 0.01).to(t)
    A = -0.5 * torch.exp(torch.randn(dim, dstate, device="cuda", generator=g))
    B = torch.randn(batch, dstate, length, device="cuda", generator=g).to(t)
    C = torch.randn(batch, dstate, length, device="cuda", generator=g).to(t)
    D = torch.randn(dim, device="cuda", generator=g)
    z = torch.randn(batch, dim, length, device="cuda", generator=g).to(t)
    bias = torch.rand(dim, device="cuda", generator=g) * 0.5
    return u, delta, A, B, C, D, z, bias


@pytest.mark.parametrize("batch,dim,length,dstate", [
    (1, 8, 32, 16), (2, 100, 1000, 16), (2, 1536, 2048, 16), (3, 37, 333, 16),
    (1, 64, 4097, 16), (2, 24, 100, 7), (1, 16, 1, 16), (4, 256, 511, 4), (2, 13, 300, 1)])
@pytest.mark.parametrize("dtype", list(TORCH_DTYPES))
@pytest.mark.parametrize("options", ["plain", "all"])
@pytest.mark.parametrize("split", [False, True], ids=["lane", "split"])
def test_selective_scan_matches_mamba_reference(batch, dim, length, dstate, dtype, options,
                                                split):
    """Both kernels (the lane scan and the split-state one) into NaN-poisoned outputs."""
    from tegula.kernels import selective_scan
    u, delta, A, B, C, D, z, bias = mamba_inputs(batch, dim, length, dstate, dtype,
                                                 batch * dim + length)
    extra = dict(D=D, z=z, delta_bias=bias, delta_softplus=True) if options == "all" else {}
    out = torch.full_like(u, float("nan"))
    got = selective_scan(u, delta, A, B, C, out=out, SPLIT=split, **extra)
    torch.cuda.synchronize()
    assert got is out and not torch.isnan(out).any(), "unwritten (poisoned) outputs remain"
    want = selective_scan_ref(u, delta, A, B, C, **extra)
    # f32 math in another order than the float64 loop, then one rounding to the output type.
    ulp = {"f32": 2.0 ** -23, "f16": 2.0 ** -10, "bf16": 2.0 ** -7}[dtype]
    scale = want.abs().amax(dim=2, keepdim=True)
    err = (out.double() - want).abs()
    assert bool((err <= ulp * want.abs() + 1e-5 * scale).all()), f"max error {err.max():.3g}"


def test_selective_scan_tiles_agree():
    """Other chunk and channel tilings, with and without prefetching, several states per
    scan, the states in a run-time loop, the split-state kernel's tiles (threads, chunk,
    stages, states a thread): the same result (within f32 reassociation); outputs poisoned
    first."""
    from tegula.kernels import selective_scan
    u, delta, A, B, C, D, z, bias = mamba_inputs(2, 64, 700, 16, "f32", 1)
    base = selective_scan(u, delta, A, B, C, D, z, bias, True, prefetch=False)
    # the lane-scan kernel's tilings name SPLIT=False: the split-state kernel is the
    # default and refuses tiles that are not its own (BD=4 is not 128 threads of G=8)
    lane = (dict(BL=8), dict(BL=64), dict(BD=4, BL=16), dict(BD=16, BL=32),
            dict(prefetch=True), dict(BD=4, BL=512, prefetch=True),
            dict(BD=16, BL=128), dict(BL=256, GROUP=1, BC_AHEAD=False),
            dict(GROUP=4, BC_AHEAD=True), dict(BL=256, STATE_LOOP=True),
            dict(BL=128, STATE_LOOP=True, prefetch=True),
            dict(STATE_SMEM=True, GROUP=2, BC_AHEAD=False),
            dict(BL=256, STATE_SMEM=True, GROUP=3, BC_AHEAD=False),
            dict(BD=16, BL=128, STATE_SMEM=True, GROUP=2, BC_AHEAD=False, BC_PIPE=True),
            dict(BL=64, STATE_SMEM=True, GROUP=3, BC_AHEAD=False, BC_PIPE=True))
    split = (dict(SPLIT=True), dict(threads=64), dict(BL=32, STAGES=3),
             dict(G=8, BD=16), dict(G=2, BD=64, BL=8), dict(G=1, BD=128, BL=4),
             dict(STAGES=4), dict(threads=64, STAGES=4), dict(G=16, BL=32, STAGES=3),
             dict(G=16, BL=16, STAGES=4, blocks_per_sm=6), dict(FMA_CHAIN=False, STAGES=2),
             dict(SUBS=2), dict(SUBS=2, STAGES=2))
    for tiles in [dict(t, SPLIT=False) for t in lane] + list(split):
        other = selective_scan(u, delta, A, B, C, D, z, bias, True,
                               out=torch.full_like(u, float("nan")), **tiles)
        torch.testing.assert_close(other, base, rtol=1e-5, atol=1e-5)
