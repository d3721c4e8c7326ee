"""The shared-memory GEMM with small user-chosen tiles (issue 8, item 5: BN=16 or BM=16,
f16 and i8, returned mostly zeros while the register dataflow was right).

Root cause: a global -> shared copy of a tile with fewer cp.async vectors than threads
(16x32 f16 is 64 16-byte vectors for 128 threads) gives the coalesced partition replica
threads, and every replica issued a src-size-0 cp.async that zero-filled what the owner
copied (tests/lower/test_copy_paths.py covers the copy itself). A sweep of BM, BN, BK in
{16, 32, 64} x threads {32, 64, 128, 256} x {f16, bf16, i8}, both dataflows, agrees with
numpy after the fix; this test keeps a spread of it (and the shapes do not divide the
tiles).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import bf16, f16, i8
from tegula.kernels.common import poisoned
from tegula.kernels.gemm import gemm_kernel, gemm_registers_kernel, output_type

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gemm import check_gemm, operands  # noqa: E402

# (BM, BN, BK, threads): the BN=16 / BM=16 tiles, tiles with fewer copy vectors
# than threads, warp grids as large as the tile allows.
SMALL_TILES = [(16, 64, 32, 128), (64, 16, 32, 128), (16, 16, 32, 32), (32, 16, 64, 128),
               (16, 32, 32, 64), (16, 64, 64, 256), (32, 32, 32, 256)]


@pytest.mark.parametrize("tiles", SMALL_TILES, ids=lambda t: "x".join(map(str, t)))
@pytest.mark.parametrize("dtype", (f16, bf16, i8), ids=str)
def test_shared_memory_gemm_with_small_tiles(dtype, tiles):
    bm, bn, bk, threads = tiles
    m, n, k = bm + 7, 2 * bn - 3, 3 * bk
    a, b = operands(sum(tiles), m, n, k, dtype)
    c = poisoned((m, n), output_type(dtype))
    tg.emulate(gemm_kernel(dtype), (tg.cdiv(m, bm), tg.cdiv(n, bn)), a, b, c,
               BM=bm, BN=bn, BK=bk, STAGES=2, threads=threads)
    check_gemm(c, a, b, dtype)


@pytest.mark.parametrize("dtype", (f16, i8), ids=str)
def test_register_gemm_with_the_same_small_tiles(dtype):
    """The register dataflow was right before; it stays right."""
    for bm, bn, bk, threads in SMALL_TILES[:3]:
        m, n, k = bm + 7, 2 * bn - 3, 3 * bk
        a, b = operands(bm * bn, m, n, k, dtype)
        c = poisoned((m, n), output_type(dtype))
        tg.emulate(gemm_registers_kernel(dtype), (tg.cdiv(m, bm), tg.cdiv(n, bn)), a, b, c,
                   BM=bm, BN=bn, BK=bk, threads=threads)
        check_gemm(c, a, b, dtype)
