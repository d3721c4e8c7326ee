"""FP8 GEMM (tegula/kernels/fp8.py) in the emulator against a float64 numpy reference:
per-tensor scales (as torch._scaled_mm) and DeepSeek-V3 blockwise scales (1×128 for a,
128×128 for b), ragged M/N/K, sm_90a (TMA + wgmma) and sm_89 (mma.sync), every element;
sm_80 and bad arguments give clear errors."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f8e4m3, f16, f32
from tegula.emulate.values import round_to
from tegula.kernels.fp8 import (fp8_blockwise_gemm_kernel, fp8_config, matmul_fp8_emulated,
                                scale_shapes)

# Unit roundoff of the output types: one rounding of the f32 result.
UNIT = {bf16: 2.0 ** -8, f16: 2.0 ** -11, f32: 2.0 ** -24}


def e4m3(rng, shape, scale=4.0):
    """Random e4m3 values (as float32), spread over the format's range."""
    return round_to(rng.standard_normal(shape).astype(np.float32) * scale, f8e4m3) \
        .astype(np.float32)


def expanded_scales(scale_a, scale_b, m, n, k):
    """Per-element (M, K) and (N, K) scale factors of the blockwise form."""
    sa = np.repeat(scale_a.astype(np.float64), 128, axis=1)[:m, :k]
    sb = np.repeat(np.repeat(scale_b.astype(np.float64), 128, axis=0), 128, axis=1)[:n, :k]
    return sa, sb


def check_close(c, ref, magnitude, k, out_dtype):
    """Every element: f32 accumulation error (k ulps of the sum of |terms|, for the
    partial sums and their scaled additions) plus one rounding to out_dtype."""
    assert c.shape == ref.shape
    assert not np.isnan(c).any(), "NaN left in the output (an element was not written)"
    bound = (k + 8) * 2.0 ** -24 * magnitude + UNIT[out_dtype] * np.abs(ref) + 1e-30
    if out_dtype == f16:
        bound = bound + 2.0 ** -24  # f16 subnormal spacing
    err = np.abs(c.astype(np.float64) - ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert (err <= bound).all(), (f"element {worst}: got {c[worst]}, expected {ref[worst]} "
                                  f"(error {err[worst]:.3g} > bound {bound[worst]:.3g})")


@pytest.mark.parametrize("target", ["sm_90a", "sm_89"])
@pytest.mark.parametrize("out_dtype", [bf16, f16, f32])
@pytest.mark.parametrize("shape,tiles", [((37, 50, 48), dict(BM=64, BN=64, BK=32)),
                                         ((130, 70, 80), dict(BM=64, BN=64, BK=64)),
                                         ((9, 200, 16), dict(BM=64, BN=128, BK=32))])
def test_per_tensor(shape, tiles, out_dtype, target):
    m, n, k = shape
    rng = np.random.default_rng(m * n + k)
    a, b = e4m3(rng, (m, k)), e4m3(rng, (n, k))
    scale_a, scale_b = np.float32(0.37), np.float32(1.9)
    c = matmul_fp8_emulated(a, b, scale_a, scale_b, out_dtype, target=target, STAGES=2,
                            **tiles)
    s = float(scale_a) * float(scale_b)
    ref = (a.astype(np.float64) @ b.astype(np.float64).T) * s
    magnitude = (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T) * s
    check_close(c, ref, magnitude, k, out_dtype)


@pytest.mark.parametrize("target", ["sm_90a", "sm_89"])
@pytest.mark.parametrize("shape,sms", [((130, 200, 80), 3), ((37, 50, 48), 4), ((1, 70, 16), 2)])
def test_per_tensor_persistent(shape, sms, target):
    """The persistent per-tensor kernel: more tiles than blocks, idle blocks, M = 1."""
    m, n, k = shape
    rng = np.random.default_rng(m + 2 * n + k)
    a, b = e4m3(rng, (m, k)), e4m3(rng, (n, k))
    a[3 % m, 5] = np.nan                                       # NaN reaches its row
    c = matmul_fp8_emulated(a, b, 0.37, 1.9, bf16, target=target, persistent=sms, BM=64,
                            BN=32, BK=32, STAGES=2, GROUP=2)
    s = 0.37 * 1.9
    with np.errstate(invalid="ignore"):
        ref = (a.astype(np.float64) @ b.astype(np.float64).T) * s
        magnitude = (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T) * s
    assert np.isnan(c[3 % m]).all()
    keep = np.arange(m) != 3 % m
    if keep.any():
        check_close(c[keep], ref[keep], magnitude[keep], k, bf16)


@pytest.mark.parametrize("shape,sms", [((200, 150, 96), 4), ((70, 90, 48), 2), ((1, 40, 16), 6)])
def test_per_tensor_persistent_in_clusters(shape, sms):
    """The persistent per-tensor kernel in 2-CTA clusters (b's boxes multicast, each stage
    released by both blocks): M and N not multiples of the tile or of the cluster (an odd
    number of row tiles: one block's last tile lies past M), fewer clusters than tile
    pairs, idle clusters at M = 1; every element against the float64 product."""
    m, n, k = shape
    rng = np.random.default_rng(3 * m + n + k)
    a, b = e4m3(rng, (m, k)), e4m3(rng, (n, k))
    c = matmul_fp8_emulated(a, b, 0.37, 1.9, bf16, persistent=sms, BM=64, BN=32, BK=32,
                            STAGES=3, GROUP=2, CLUSTER=2)
    s = 0.37 * 1.9
    ref = (a.astype(np.float64) @ b.astype(np.float64).T) * s
    magnitude = (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T) * s
    check_close(c, ref, magnitude, k, bf16)


def test_large_shape_candidates_include_the_clustered_persistent_kernel():
    """matmul_fp8 times the persistent 128x256 kernel alone and in 2-CTA clusters on
    Hopper for shapes that fill the GPU; the clustered one multicasts b's boxes."""
    from tegula.build import build
    from tegula.kernels.api_matmul import fp8_candidates
    from tegula.kernels.fp8 import fp8_persistent_gemm_kernel
    found = [c for c in fp8_candidates(4096, 4096, 4096, False) if c.get("CLUSTER") == 2]
    assert found and all(c["kernel"] == "persistent" for c in found)
    assert not any(c.get("CLUSTER") for c in fp8_candidates(4096, 4096, 4096, False, False))
    config = {k: v for k, v in found[0].items() if k != "kernel"}
    source = build(fp8_persistent_gemm_kernel(bf16), config, None, "sm_90a").cuda_source()
    assert ".multicast::cluster" in source


@pytest.mark.parametrize("shape,tiles,sms", [
    ((200, 129, 256), dict(BM=128, BN=128, GROUP=2, threads=256), 2),
    ((5, 40, 128), dict(BM=64, BN=64, GROUP=1), 4),                     # idle blocks
    ((200, 150, 384), dict(BM=64, BN=64, GROUP=2, CLUSTER=2), 4),       # b multicast
    ((70, 90, 256), dict(BM=64, BN=128, GROUP=2, CLUSTER=2, role_order="random:7"), 2),
    ((130, 100, 512), dict(BM=64, BN=32, GROUP=2, role_order="random:3"), 3),
    ((9, 64, 128), dict(BM=64, BN=64), 2),                              # one block
    ((250, 100, 256), dict(BM=192, BN=64, GROUP=2, threads=384), 2),    # 3 consumers
    ((70, 400, 208), dict(BM=64, BN=192, GROUP=1), 2),                  # two b scales a tile
    # TWIN=1 (session 14): two K blocks a stage, both products in flight
    ((130, 100, 384), dict(BM=64, BN=64, GROUP=2, TWIN=1), 3),          # odd K blocks
    ((70, 129, 208), dict(BM=64, BN=128, GROUP=1, TWIN=1), 2),          # K = 128 + 80
    ((200, 150, 384), dict(BM=64, BN=64, GROUP=2, CLUSTER=2, TWIN=1), 4),
    ((150, 70, 512), dict(BM=128, BN=64, GROUP=2, threads=256, role_order="random:5",
                          TWIN=1), 2)])
def test_blockwise_persistent(shape, tiles, sms):
    """The persistent warp-specialized blockwise kernel (session 10): more tiles than
    blocks, ragged M and N, 2-CTA clusters (b's boxes multicast, a stage released by each
    warp of both blocks once its wgmmas retired; an odd number of row tiles), random role
    interleavings, three consumer warpgroups (threads=384), two K blocks a stage (TWIN=1:
    an odd K block count, whose last twin lies past K), scales over four decades; every
    element against the float64 reference."""
    m, n, k = shape
    rng = np.random.default_rng(m + 3 * n + k)
    a, b = e4m3(rng, (m, k)), e4m3(rng, (n, k))
    shape_a, shape_b = scale_shapes(m, n, k, True)
    scale_a = (10.0 ** rng.uniform(-2, 2, shape_a)).astype(np.float32)
    scale_b = (10.0 ** rng.uniform(-2, 2, shape_b)).astype(np.float32)
    c = matmul_fp8_emulated(a, b, scale_a, scale_b, f32, block_scales=True, persistent=sms,
                            STAGES=2, **tiles)
    sa, sb = expanded_scales(scale_a, scale_b, m, n, k)
    check_close(c, (a * sa) @ (b * sb).T, np.abs(a * sa) @ np.abs(b * sb).T, k, f32)


def test_large_blockwise_candidates_start_with_the_persistent_kernel():
    """matmul_fp8(block_scales=True) times the persistent blockwise kernel first on Hopper
    for shapes that fill the GPU (192x128 on three consumer warpgroups, then 128x128 on
    two), not on other GPUs or for decode shapes; both build to the warp-specialized TMA
    ring."""
    import tegula as tg
    from tegula.kernels.api_matmul import fp8_candidates
    from tegula.kernels.fp8 import fp8_blockwise_persistent_kernel
    first, second = fp8_candidates(4096, 4096, 4096, True)[:2]
    assert first["kernel"] == second["kernel"] == "persistent"
    assert (first["BM"], first["threads"], second["BM"]) == (192, 384, 128)
    assert not any(c.get("kernel") for c in fp8_candidates(4096, 4096, 4096, True, False))
    assert not any(c.get("kernel") for c in fp8_candidates(64, 4096, 4096, True))
    config = {k: v for k, v in first.items() if k != "kernel"}
    text = tg.explain(fp8_blockwise_persistent_kernel(bf16), **config)
    assert "the ring runs across the enclosing loop" in text and "producer warpgroup" in text


def test_blockwise_persistent_keeps_the_tma_ring_across_tiles():
    """The promotion in the K loop's body no longer sends a persistent kernel back to
    cp.async: the ring runs across the tiles, warp-specialized."""
    import tegula as tg
    from tegula.kernels.fp8 import fp8_blockwise_persistent_kernel
    text = tg.explain(fp8_blockwise_persistent_kernel(bf16), BM=128, BN=128, STAGES=4,
                      threads=256)
    assert "TMA boxes completing full mbarriers" in text
    assert "the ring runs across the enclosing loop" in text
    assert "producer warpgroup" in text


def test_per_tensor_scales_as_arrays_and_f8_bits():
    """(1, 1) scale arrays and raw uint8 bit patterns give the same result."""
    rng = np.random.default_rng(3)
    a, b = e4m3(rng, (20, 32)), e4m3(rng, (24, 32))
    by_value = matmul_fp8_emulated(a, b, 0.5, 2.0, f32, BM=64, BN=64, BK=32, STAGES=2)
    from tegula.emulate.values import to_bits  # the emulator's own e4m3 encoder
    raw_a = to_bits(a, f8e4m3).astype(np.uint8).reshape(a.shape)
    raw_b = to_bits(b, f8e4m3).astype(np.uint8).reshape(b.shape)
    by_bits = matmul_fp8_emulated(raw_a, raw_b, np.full((1, 1), 0.5, np.float32),
                                  np.full((1, 1), 2.0, np.float32), f32, BM=64, BN=64, BK=32,
                                  STAGES=2)
    np.testing.assert_array_equal(by_value, by_bits)


def test_per_tensor_nan_propagates_to_its_row_and_column():
    rng = np.random.default_rng(4)
    a, b = e4m3(rng, (33, 48)), e4m3(rng, (40, 48))
    a[5, 7] = np.nan
    b[11, 3] = np.nan
    c = matmul_fp8_emulated(a, b, 1.0, 1.0, f32, BM=64, BN=64, BK=32, STAGES=2)
    nan = np.isnan(c)
    assert nan[5, :].all() and nan[:, 11].all()
    assert nan.sum() == 40 + 33 - 1
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    keep = ~np.isnan(ref)
    np.testing.assert_allclose(c[keep], ref[keep], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("target", ["sm_90a", "sm_89"])
@pytest.mark.parametrize("out_dtype", [bf16, f32])
@pytest.mark.parametrize("shape,tiles", [((70, 200, 256), dict(BM=64, BN=64)),
                                         ((130, 129, 384), dict(BM=64, BN=128)),
                                         ((5, 40, 128), dict(BM=64, BN=32)),
                                         ((70, 400, 208), dict(BM=64, BN=192)),
                                         ((33, 300, 176), dict(BM=64, BN=96))])
def test_blockwise(shape, tiles, out_dtype, target):
    """Scales spread over four decades, so a scale applied to the wrong rows, columns or
    K block is far outside the bound. BN = 192 and 96 tiles reach two of b's scale blocks,
    split at column 128 or 64 (192), 96, 64 or 32 (96); K = 208 and 176 end in a partial
    scale block; N = 400 and 300 end in a partial tile."""
    m, n, k = shape
    rng = np.random.default_rng(m + n + k)
    a, b = e4m3(rng, (m, k)), e4m3(rng, (n, k))
    shape_a, shape_b = scale_shapes(m, n, k, True)
    scale_a = (10.0 ** rng.uniform(-2, 2, shape_a)).astype(np.float32)
    scale_b = (10.0 ** rng.uniform(-2, 2, shape_b)).astype(np.float32)
    c = matmul_fp8_emulated(a, b, scale_a, scale_b, out_dtype, block_scales=True,
                            target=target, STAGES=2, **tiles)
    sa, sb = expanded_scales(scale_a, scale_b, m, n, k)
    ref = (a * sa) @ (b * sb).T
    magnitude = np.abs(a * sa) @ np.abs(b * sb).T
    check_close(c, ref, magnitude, k, out_dtype)


def test_blockwise_is_not_per_tensor():
    """The scales are really applied per block: scaling one K block of a's scales by 2
    changes exactly the result that block contributes."""
    rng = np.random.default_rng(9)
    m, n, k = 16, 32, 256
    a, b = e4m3(rng, (m, k)), e4m3(rng, (n, k))
    scale_a, scale_b = np.ones((m, 2), np.float32), np.ones((1, 2), np.float32)
    base = matmul_fp8_emulated(a, b, scale_a, scale_b, f32, block_scales=True, BM=64, BN=32,
                               STAGES=2)
    scale_a[:, 1] = 2.0
    doubled = matmul_fp8_emulated(a, b, scale_a, scale_b, f32, block_scales=True, BM=64,
                                  BN=32, STAGES=2)
    second = a[:, 128:].astype(np.float64) @ b[:, 128:].astype(np.float64).T
    np.testing.assert_allclose(doubled - base, second, rtol=1e-5, atol=1e-3)


def test_sm80_refuses_fp8():
    a = np.ones((16, 32), np.float32)
    with pytest.raises(ValueError, match=r"FP8.*sm_89.*sm_80"):
        matmul_fp8_emulated(a, a, 1.0, 1.0, target="sm_80")


@pytest.mark.parametrize("kwargs,k,message", [
    (dict(), 40, r"K = 40 .*multiple of 16"),
    (dict(block_scales=True), 200, r"K = 200 .*multiple of 16"),
])
def test_k_alignment_errors(kwargs, k, message):
    a = np.ones((16, k), np.float32)
    scale = np.ones((16, 1), np.float32) if kwargs else 1.0
    with pytest.raises(ValueError, match=message):
        matmul_fp8_emulated(a, a, scale, scale, **kwargs)


def test_scale_shape_errors():
    a, b = np.ones((16, 256), np.float32), np.ones((200, 256), np.float32)
    with pytest.raises(ValueError, match=r"scale_a has shape \(16, 1\), expected \(16, 2\)"):
        matmul_fp8_emulated(a, b, np.ones((16, 1)), np.ones((2, 2)), block_scales=True)
    with pytest.raises(ValueError, match=r"scale_b has shape \(1, 2\), expected \(2, 2\)"):
        matmul_fp8_emulated(a, b, np.ones((16, 2)), np.ones((1, 2)), block_scales=True)
    with pytest.raises(ValueError, match=r"scale_a has shape \(16, 2\), expected \(1, 1\)"):
        matmul_fp8_emulated(a, b, np.ones((16, 2)), 1.0)


def test_argument_type_errors():
    a = np.ones((16, 32), np.float32)
    with pytest.raises(TypeError, match=r"a must hold e4m3 values as float32"):
        matmul_fp8_emulated(a.astype(np.float16), a, 1.0, 1.0)
    with pytest.raises(TypeError, match=r"out_dtype must be one of"):
        matmul_fp8_emulated(a, a, 1.0, 1.0, out_dtype=f8e4m3)
    with pytest.raises(ValueError, match=r"a is \(M, K\) and b has the same K"):
        matmul_fp8_emulated(a, np.ones((16, 48), np.float32), 1.0, 1.0)
    with pytest.raises(ValueError, match=r"at most two of b's 128-column scale blocks.*BN = 224"):
        fp8_config(64, 64, True, BN=224)      # a tile at column 96 reaches three blocks


def test_blockwise_sm90a_keeps_tma_and_wgmma():
    """A fresh accumulator per K block inside the pipeline still compiles to the TMA ring
    and wgmma on sm_90a (no fallback to cp.async)."""
    import tegula as tg

    text = tg.explain(fp8_blockwise_gemm_kernel(bf16), BM=64, BN=128, STAGES=3)
    assert "TMA boxes into an mbarrier ring of 3" in text
    assert "wgmma.m64n128k32.f32.e4m3.e4m3" in text
