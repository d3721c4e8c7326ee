"""The torch entry points' argument checks and configuration lists (no GPU needed).

Every check on type, rank, dtype and shape runs before the device check, so CPU tensors
exercise them all; a well-formed CPU tensor then fails on its device.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tegula.kernels as tk  # noqa: E402
from tegula.kernels.api import (_copy_shape, copy_candidates, gemm_candidates,  # noqa: E402
                                row_candidates)

F16 = torch.float16


def test_entry_points_are_exported():
    assert all(callable(f) for f in (tk.matmul, tk.rms_norm, tk.softmax, tk.copy))
    from tegula.kernels.copy import copy_kernel  # the submodule stays importable
    assert callable(copy_kernel)


def test_matmul_names_each_mistake():
    a, b = torch.randn(8, 16, dtype=F16), torch.randn(16, 4, dtype=F16)
    with pytest.raises(ValueError, match="cuda|CUDA"):
        tk.matmul(a, b)
    with pytest.raises(TypeError, match="a has dtype torch.float32"):
        tk.matmul(a.float(), b)
    with pytest.raises(TypeError, match="share one dtype"):
        tk.matmul(a, b.bfloat16())
    with pytest.raises(ValueError, match="inner dimensions"):
        tk.matmul(a, torch.randn(15, 4, dtype=F16))
    with pytest.raises(ValueError, match="2-D"):
        tk.matmul(a[0], b)
    with pytest.raises(TypeError, match="torch.Tensor"):
        tk.matmul(a.numpy(), b)


def test_rms_norm_names_each_mistake():
    x, w = torch.randn(4, 64, dtype=F16), torch.randn(64, dtype=F16)
    with pytest.raises(ValueError, match="cuda|CUDA"):
        tk.rms_norm(x, w)
    with pytest.raises(ValueError, match="weight has 63 elements"):
        tk.rms_norm(x, w[:63])
    with pytest.raises(TypeError, match="share one dtype"):
        tk.rms_norm(x, w.float())
    with pytest.raises(TypeError, match="int32"):
        tk.rms_norm(x.int(), w)
    with pytest.raises(ValueError, match="eps"):
        tk.rms_norm(x, w, -1.0)
    with pytest.raises(ValueError, match="1-D"):
        tk.rms_norm(x, w[None, :])
    with pytest.raises(ValueError, match="cuda|CUDA"):  # long rows are fine (looped kernel)
        tk.rms_norm(torch.randn(1, 20000, dtype=F16), torch.randn(20000, dtype=F16))


def test_softmax_and_copy_name_each_mistake():
    x = torch.randn(4, 64, dtype=F16)
    with pytest.raises(ValueError, match="cuda|CUDA"):
        tk.softmax(x)
    with pytest.raises(ValueError, match="last dim"):
        tk.softmax(x, dim=0)
    with pytest.raises(TypeError, match="float64"):
        tk.softmax(x.double())
    with pytest.raises(ValueError, match="cuda|CUDA"):  # long rows are fine (looped kernel)
        tk.softmax(torch.randn(2, 16385, dtype=F16))
    with pytest.raises(ValueError, match="cuda|CUDA"):
        tk.copy(x)
    with pytest.raises(TypeError, match="complex"):
        tk.copy(torch.randn(4, 4, dtype=torch.complex64))


@pytest.mark.parametrize("dims", [(16, 4096, 4096), (128, 4096, 14336), (4096, 4096, 4096),
                                  (8192, 14336, 4096), (1024, 1024, 1024)])
@pytest.mark.parametrize("hopper", [True, False])
def test_gemm_candidates_fit_the_problem(dims, hopper):
    configs = gemm_candidates(*dims, hopper=hopper)
    assert 1 <= len(configs) <= 7
    assert all(c["kernel"] in ("shared", "registers", "persistent", "staged") for c in configs)
    # The TMA kernels (persistent, and one block per tile with its TMA-store epilogue) are
    # Hopper's, for more rows than a decode shape.
    tma = [c for c in configs if c["kernel"] in ("persistent", "staged")]
    assert not tma or (hopper and dims[0] > 64)
    # K is split only for few rows, and only where each split keeps 8 or more k-tiles.
    splits = [c for c in configs if c.get("SPLIT", 1) > 1]
    assert all(dims[2] // c["BK"] // c["SPLIT"] >= 8 for c in splits)
    assert bool(splits) == (dims[0] <= 256)
    # Accumulators per thread stay at or under 128 f32 registers.
    assert all(c["BM"] * c["BN"] // c.get("threads", 128) <= 128 for c in configs)
    if dims[0] <= 64:
        assert all(c["BM"] <= 64 for c in configs)


@pytest.mark.parametrize("n", [1, 100, 128, 1000, 4096, 5120, 8192, 16384])
def test_row_candidates_hold_whole_rows(n):
    configs = row_candidates(n)
    assert 1 <= len(configs) <= 7
    # A power of two, or (rows well short of one) whole 8-element vectors per thread.
    assert all(c["BN"] >= n for c in configs)
    assert all(c["BN"] & (c["BN"] - 1) == 0 or c["BN"] % (8 * (c["threads"] or 128)) == 0
               for c in configs)
    if n == 5120:
        assert {"BM": 1, "BN": 5120, "threads": None} in configs
    assert configs[0]["threads"] is None  # the declared block size comes first
    assert len({tuple(sorted(c.items(), key=str)) for c in configs}) == len(configs)


def test_copy_candidates_and_shapes():
    assert copy_candidates(1, 100) == [{"BM": 16, "BN": 128}]
    assert len(copy_candidates(8192, 8192)) == 8
    assert {"BM": 1, "BN": 4096} in copy_candidates(1, 24581191)  # one long row
    assert _copy_shape(torch.empty(8191, 3001)) == (1, 8191 * 3001)
    assert _copy_shape(torch.empty(1 << 20)) == (256, 4096)
    assert _copy_shape(torch.empty(3, 64)) == (3, 64)
    assert _copy_shape(torch.empty(())) == (1, 1)


# --------------------------------------------------------------------------------------
# On a GPU (`pytest -m gpu`): each entry point against torch on odd shapes, random data,
# outputs poisoned with NaN first.
# --------------------------------------------------------------------------------------

def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _rel(out, ref) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("m,n,k", [(97, 130, 72), (16, 256, 512), (1000, 1030, 520)])
@pytest.mark.parametrize("b_major", ["k", "n"])
def test_matmul_matches_torch(dtype, tol, m, n, k, b_major):
    _cuda()
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype).T if b_major == "k" else \
        torch.randn(k, n, device="cuda", dtype=dtype)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    tk.matmul(a, b, out=out)
    assert _rel(out, a.double() @ b.double()) < tol
    assert _rel(tk.matmul(a, b), a.double() @ b.double()) < tol  # tuned winner reused


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3),
                                       (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("shape", [(37, 300), (3, 5, 4096), (130, 16384)])
def test_row_kernels_match_torch(dtype, tol, shape):
    _cuda()
    x = torch.randn(*shape, device="cuda", dtype=dtype) * 3
    w = torch.rand(shape[-1], device="cuda", dtype=dtype) + 0.5
    out = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    xd = x.double()
    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert _rel(tk.rms_norm(x, w, 1e-5, out=out), ref) < tol
    out.fill_(float("nan"))
    assert _rel(tk.softmax(x, out=out), torch.softmax(xd, -1)) < tol


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("shape", [(8191, 3001), (1 << 20,), (3, 5, 7), ()])
def test_copy_is_exact(dtype, shape):
    _cuda()
    if dtype.is_floating_point:
        x = torch.randn(shape, device="cuda", dtype=dtype)
    else:
        x = torch.randint(-128, 128, shape, device="cuda", dtype=dtype)
    y = tk.copy(x)
    assert y.shape == x.shape and torch.equal(y, x)
    assert torch.equal(tk.copy(x.T if x.dim() == 2 else x), x.T if x.dim() == 2 else x)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3)])
@pytest.mark.parametrize("shape", [(3, 20000), (2, 70001), (33, 3000)])
def test_row_kernels_past_one_tile_match_torch(dtype, tol, shape):
    """Rows longer than a register tile (or odd ones the tuner sends there) run through the
    chunked kernels (online softmax; two-pass RMSNorm)."""
    _cuda()
    x = torch.randn(*shape, device="cuda", dtype=dtype) * 3
    w = torch.rand(shape[-1], device="cuda", dtype=dtype) + 0.5
    out = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
    assert _rel(tk.softmax(x, out=out), torch.softmax(x.double(), -1)) < tol
    assert not torch.isnan(out).any()
    out.fill_(float("nan"))
    xd = x.double()
    ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    assert _rel(tk.rms_norm(x, w, 1e-5, out=out), ref) < tol
    assert not torch.isnan(out).any()


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["contiguous", "row-gaps", "strided-weight"])
def test_replayed_calls_read_their_own_arguments(layout):
    """After its first call for a signature an entry point replays the launch with new data
    pointers: every later call must read its own (fresh) inputs and write a fresh output.
    'row-gaps': rows a view cannot flatten (reshape copies); 'strided-weight': a weight
    that must be made contiguous."""
    _cuda()
    for call in range(3):
        base = torch.randn(4, 12 if layout == "row-gaps" else 6, 640, device="cuda",
                           dtype=torch.float16) * 3
        x = base[:, ::2] if layout == "row-gaps" else base
        w_base = torch.rand(640 * (2 if layout == "strided-weight" else 1), device="cuda",
                            dtype=torch.float16) + 0.5
        w = w_base[::2] if layout == "strided-weight" else w_base
        xd = x.double()
        ref = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
        assert _rel(tk.rms_norm(x, w, 1e-5), ref) < 2e-3, f"rms_norm, call {call}"
        assert _rel(tk.softmax(x), torch.softmax(xd, -1)) < 2e-3, f"softmax, call {call}"
        assert torch.equal(tk.copy(x), x), f"copy, call {call}"
        a = torch.randn(70, 96, device="cuda", dtype=torch.float16)
        b = torch.randn(96, 50, device="cuda", dtype=torch.float16)
        assert _rel(tk.matmul(a, b), a.double() @ b.double()) < 2e-3, f"matmul, call {call}"
        assert _rel(tk.matmul(a, b.T.contiguous().T), a.double() @ b.double()) < 2e-3
    assert tuple(x.shape) == (4, 6, 640)  # the rows reached the kernels as (4, 6, 640) views


@pytest.mark.gpu
def test_split_k_matmul_and_its_replays(monkeypatch):
    """The entry point with only a split-K configuration to choose: the first call tunes
    and runs it (two launches through a workspace), later calls replay both launches
    with a fresh workspace; every call checked on fresh data."""
    _cuda()
    import tegula.kernels.api as api
    from tegula.runtime.autotune import Config

    split = (Config.of(dict(kernel="shared", B="view", BM=64, BN=128, BK=64, STAGES=4,
                            SPLIT=3)),)
    monkeypatch.setattr(api, "_configs", lambda family, *bucket: split)
    monkeypatch.setattr(api, "_REPLAYS", {})
    for call in range(3):
        a = torch.randn(100, 1500, device="cuda", dtype=torch.float16)
        w = torch.randn(300, 1500, device="cuda", dtype=torch.float16)
        c = tk.matmul(a, w.T)
        assert _rel(c, a.double() @ w.double().T) < 2e-3, f"call {call}"
    assert len(api._REPLAYS) == 1


# --------------------------------------------------------------------------------------
# Edge inputs: empty tensors give empty results, bad shapes are named (numpy entry points
# on the CPU; the torch ones on the GPU)
# --------------------------------------------------------------------------------------

def _np_inputs(shape, dtype="float32", seed=0):
    import numpy as np
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype) + 0.5


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0), (2, 0, 4), (3, 0)])
def test_numpy_row_entry_points_on_empty_inputs(shape):
    from tegula.kernels import rms_norm_emulated, silu_mul_emulated, softmax_emulated
    x, y = _np_inputs(shape), _np_inputs(shape, seed=1)
    w = _np_inputs(shape[-1:])
    for looped in (False, True):
        for out in (softmax_emulated(x, looped=looped), rms_norm_emulated(x, w, looped=looped)):
            assert out.shape == shape and out.dtype == x.dtype
    assert silu_mul_emulated(x, y).shape == shape


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0)])
def test_numpy_copies_of_empty_arrays(shape):
    from tegula.kernels import copy_emulated, transpose_emulated
    x = _np_inputs(shape)
    assert copy_emulated(x).shape == shape and transpose_emulated(x).shape == shape[::-1]


@pytest.mark.parametrize("m,n,k", [(0, 8, 16), (4, 0, 16), (0, 0, 0), (4, 8, 0), (33, 17, 0)])
@pytest.mark.parametrize("variant", [dict(), dict(shared=False), dict(split=2)])
def test_numpy_gemm_on_empty_inputs(m, n, k, variant):
    """An empty M or N gives an empty result; an empty K gives zeros (the empty sum)."""
    import numpy as np
    from tegula.kernels import gemm_emulated
    c = gemm_emulated(_np_inputs((m, k), "float16"), _np_inputs((n, k), "float16", 1),
                      **variant)
    assert c.shape == (m, n) and c.dtype == np.float16
    assert np.array_equal(c, np.zeros((m, n), np.float16))


def test_numpy_entry_points_name_each_mistake():
    import numpy as np
    from tegula.kernels import (copy_emulated, gemm_emulated, rms_norm_emulated,
                                silu_mul_emulated, softmax_emulated, transpose_emulated)
    cube, a = _np_inputs((2, 3, 4)), _np_inputs((5, 8), "float16")
    for fn in (copy_emulated, transpose_emulated):
        with pytest.raises(ValueError, match=rf"{fn.__name__}: x must be 2-D, got shape "
                                             r"\(2, 3, 4\)"):
            fn(cube)
    with pytest.raises(ValueError, match=r"gemm_emulated: a must be 2-D, got shape \(2, 3, 4\)"):
        gemm_emulated(cube.astype(np.float16), a)
    with pytest.raises(ValueError, match=r"one K, got a of shape \(5, 8\) and b of shape "
                                         r"\(6, 7\)"):
        gemm_emulated(a, _np_inputs((6, 7), "float16"))
    with pytest.raises(TypeError, match=r"share one dtype \(a: float16 \(5, 8\), b: float32"):
        gemm_emulated(a, _np_inputs((6, 8)))
    with pytest.raises(ValueError, match=r"weight must have shape \(4,\) for x of shape"):
        rms_norm_emulated(cube, _np_inputs((3,)))
    with pytest.raises(ValueError, match="weight must be 1-D"):
        rms_norm_emulated(cube, _np_inputs((1, 4)))
    with pytest.raises(ValueError, match=r"x and y must have one shape"):
        silu_mul_emulated(cube, cube.transpose(0, 2, 1))
    with pytest.raises(TypeError, match="softmax_emulated: x must be a numpy array, got list"):
        softmax_emulated([[1.0, 2.0]])
    with pytest.raises(TypeError, match="copy_emulated: x has no tegula dtype for numpy "
                                        "float64"):
        copy_emulated(np.zeros((2, 2)))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(0, 64), (3, 0), (2, 0, 5)])
def test_torch_entry_points_on_empty_tensors(shape):
    _cuda()
    x = torch.randn(shape, device="cuda", dtype=F16)
    w = torch.randn(shape[-1], device="cuda", dtype=F16)
    for out in (tk.rms_norm(x, w), tk.softmax(x), tk.copy(x)):
        assert out.shape == x.shape and out.dtype == x.dtype
    for m, n, k in [(0, 8, 16), (4, 0, 16), (4, 8, 0)]:
        c = tk.matmul(torch.randn(m, k, device="cuda", dtype=F16),
                      torch.randn(k, n, device="cuda", dtype=F16))
        assert c.shape == (m, n) and torch.equal(c, torch.zeros_like(c))


@pytest.mark.gpu
def test_a_kernel_launched_on_empty_tensors_with_an_empty_grid_does_nothing():
    _cuda()
    import tegula as tg
    from tegula.kernels.copy import copy_kernel
    from tegula.dtypes import f32
    x, y = torch.empty((0, 64), device="cuda"), torch.empty((0, 64), device="cuda")
    for _ in range(2):  # the full path, then the replayed fast path
        copy_kernel(f32)[(tg.cdiv(64, 64), tg.cdiv(0, 32))](x, y)
    torch.cuda.synchronize()
