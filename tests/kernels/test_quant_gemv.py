"""The CUDA-core W4A16 kernel for a few tokens on fragment-ordered weights (`quant_gemv`),
emulated against a float64 numpy reference: N and K that divide no tile, groups of 64 and
128 (one to four a step, a warp's blocks spanning two), zero points integer, fractional
or symmetric, f16 and bf16, 1-4 tokens, split K, both targets; its w − zero is exact, so
the bound is the f32 sum's, not a rounded weight's. Then its config's refusals, its
candidates, and that synthesis keeps the layouts the kernel pins (no conversion, the
words one 16-byte load)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import bf16, f16
from tegula.kernels.common import random_input
from tegula.kernels.quant import dequantize_w4, w4a16_config, w4a16_gemm_emulated
from tegula.kernels.quant_gemv import gemv_candidates, w4a16_fragment_gemv_kernel

sys.path.insert(0, os.path.dirname(__file__))
from w4a16_checks import check_w4a16, random_w4  # noqa: E402


CASES = [  # dtype, m, n, k, group, zeros ("int", "frac", None), tiles, target
    (f16, 1, 70, 320, 64, "int", dict(KS=4, KW=2), "sm_90a"),      # 1.25 steps, N ragged
    (f16, 2, 70, 1024, 128, "frac", dict(KS=8, KW=2, SPLIT=3, ASTAGES=3), "sm_90a"),  # a
    # warp's blocks span 2 groups; the activations through a ring
    (f16, 4, 33, 384, 128, None, dict(KS=2, KW=1, AHEAD=1), "sm_90a"),  # acts a step ahead
    (f16, 3, 77, 640, 128, "frac", dict(KS=2, KW=2, ASTAGES=2), "sm_80"),
    (f16, 1, 64, 128, 64, "frac", dict(KS=1, KW=1), "sm_90a"),     # a zero's fine fraction
    (f16, 1, 200, 512, 128, "int", dict(KS=4, KW=4, RW=4, SPLIT=2), "sm_90a"),  # 4 quarters
    (f16, 2, 70, 320, 64, "frac", dict(KS=4, KW=2, RW=2, AHEAD=1), "sm_80"),    # a thread
    (bf16, 2, 66, 192, 64, "frac", dict(KS=1, KW=1), "sm_90a"),
    (bf16, 1, 100, 512, 128, "int", dict(KS=4, KW=4), "sm_80"),
]


@pytest.mark.parametrize("dtype,m,n,k,group,zeros,tiles,target", CASES)
def test_gemv_kernel_matches_numpy(dtype, m, n, k, group, zeros, tiles, target):
    rng = np.random.default_rng(m * 131 + n + k)
    a = random_input(rng, (m, k), dtype)
    w_q, scales, zero_points = random_w4(rng, n, k, group, dtype, zeros is not None,
                                         fractional=zeros == "frac")
    c = w4a16_gemm_emulated(a, w_q, scales, zero_points, group, dtype=dtype, target=target,
                            GEMV=1, **tiles)
    assert c.shape == (m, n) and c.dtype == a.dtype
    check_w4a16(c, a, w_q, scales, zero_points, group, dtype, dequant_rounded=False)


def test_gemv_kernel_nan_and_inf_reach_only_their_outputs():
    m, n, k = 3, 40, 256
    rng = np.random.default_rng(5)
    a = random_input(rng, (m, k), f16)
    w_q, scales, zeros = random_w4(rng, n, k, 128, f16)
    scales[21, 1] = np.nan     # column 21 of c
    a[2, 7] = np.nan           # row 2 of c
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 128, GEMV=1, KS=2, KW=2)
    with np.errstate(invalid="ignore"):
        ref = a.astype(np.float64) @ dequantize_w4(w_q, scales, zeros, 128).T
    assert np.array_equal(np.isnan(c), np.isnan(ref))
    rows, cols = np.arange(m) != 2, np.arange(n) != 21
    check_w4a16(c[rows][:, cols], a[rows], w_q[cols], scales[cols], zeros[cols], 128, f16,
                dequant_rounded=False)


def test_gemv_config_and_its_refusals():
    kind, grid, c = w4a16_config(1, 4096, 4096, 128, GEMV=1, KS=16, KW=4)
    assert kind == "gemv" and grid == (256,)
    assert c == dict(G=128, MT=1, KS=16, KW=4, SPLIT=1, RW=1, threads=128)
    assert w4a16_config(2, 70, 512, 64, GEMV=1, KS=4, SPLIT=2)[1] == (5, 1, 2)
    assert w4a16_config(1, 70, 512, 64, GEMV=1, KS=4, RW=4)[1] == (2,)
    with pytest.raises(ValueError, match=r"RW=3 row quarters a block must be 1, 2 or 4"):
        w4a16_config(1, 64, 256, 64, GEMV=1, RW=3)
    with pytest.raises(ValueError, match=r"groups of whole stored blocks \(group_size ≥ "
                                         r"64, got 32\)"):
        w4a16_config(1, 64, 256, 32, GEMV=1)
    with pytest.raises(ValueError, match=r"KS=8, KW=16"):
        w4a16_config(1, 64, 256, 64, GEMV=1, KS=8, KW=16)
    with pytest.raises(ValueError, match=r"MT=1 tokens are fewer than a's 2 rows"):
        w4a16_config(2, 64, 256, 64, GEMV=1, MT=1)
    with pytest.raises(ValueError, match=r"KW=4 warps need threads=128, got threads=256"):
        w4a16_config(1, 64, 256, 64, GEMV=1, KS=8, KW=4, threads=256)


def test_gemv_candidates_only_where_they_apply():
    """One token only (at 2 the tensor-core kernel was ahead on the H100), groups of 64
    or more, and beside the fragment kernel's configs in the tuner's list."""
    assert gemv_candidates(2, 4096, 4096) == [] and gemv_candidates(1, 4096, 4096,
                                                                    group_size=32) == []
    one = gemv_candidates(1, 4096, 4096)
    assert one and all(c["GEMV"] == 1 and c["KS"] % c["KW"] == 0 for c in one)
    assert any(c.get("ASTAGES") for c in one) and any(not c.get("ASTAGES") for c in one)
    from tegula.kernels.quant import fragment_candidates
    assert all(c in fragment_candidates(1, 4096, 4096) for c in one)
    assert not any(c.get("GEMV") for c in fragment_candidates(2, 4096, 4096))


def test_gemv_layouts_need_no_conversion_and_load_16_bytes():
    """The kernel pins its words', activations' and scales' layouts so that each thread's
    weights of a block arrive in one 16-byte load and nothing is moved between threads in
    the loop (the first version, unpinned, went through shared memory four times a step)."""
    from tegula.build import build
    kernel = w4a16_fragment_gemv_kernel(f16, True)
    config = dict(G=128, MT=1, KS=8, KW=4, threads=128, INTEGER_ZEROS=1)
    assert "layout conversions: none" in tg.explain(kernel, **config)
    source = build(kernel, config, target="sm_90a").cuda_source()
    start = source.index("for (int i0")
    loop = source[start:source.index("\n  }\n", start)]            # the k-loop's body
    assert "global<1x8x32x4, i32>" in loop and "ld.global, 4-element vectors" in loop
    assert "__syncthreads" not in loop and "round trip" not in loop


def test_gemv_activation_ring_reads_shared_memory_with_ldmatrix():
    """ASTAGES: the activations ride a cp.async ring, read with ldmatrix (no predicated
    global load and address per 4 bytes: 5.1 SASS a weight against 6.5 at KS=16, KW=4)."""
    from tegula.build import build
    config = dict(G=128, MT=1, KS=16, KW=4, threads=128, INTEGER_ZEROS=1, ASTAGES=3)
    assert "layout conversions: none" in tg.explain(w4a16_fragment_gemv_kernel(f16, True),
                                                    **config)
    source = build(w4a16_fragment_gemv_kernel(f16, True), config,
                   target="sm_90a").cuda_source()
    assert "cp.async" in source and "ldmatrix" in source
