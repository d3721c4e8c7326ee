"""matmul's sm_90a tile configurations (`api_matmul.STREAM_64`, `STREAM_128`,
`SMALL_SQUARES`, `wave_fitted`: deep TMA rings, 88- to 224-wide tiles, 128-wide k-steps,
two consumer warpgroups) in the emulator against numpy, every element, each at a shape of
the row class it is chosen for with N and K no multiple of the tile (the last k-step
partial; one shape with fewer k-steps than stages) — K a multiple of 8, so rows stay
16-byte aligned and the operands take TMA, as at the bench's shapes — outputs poisoned
first. The GPU runs
the same configurations through matmul's launch path in
tests/gpu/test_matmul_candidates_gpu.py."""
from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

from tegula.dtypes import f16
from tegula.kernels.api_matmul import (SMALL_SQUARES, STREAM_64, STREAM_128, gemm_candidates,
                                       wave_fitted)
from tegula.kernels.common import random_input
from tegula.kernels.gemm import gemm_emulated

sys.path.insert(0, os.path.dirname(__file__))
from test_gemm import check_gemm  # noqa: E402

#: (configurations, the (M, N, K) they run at): rows of their class, ragged N and K.
CASES = [(STREAM_64, (50, 100, 328)), (STREAM_128, (100, 150, 200)),
         (SMALL_SQUARES, (140, 90, 136))]
#: The wave-fitted decode tiles matmul offers at N = 11008 / 14336 on an H100 (88, 112,
#: 168 and 224 wide; two consumer warpgroups at BM = 128), at ragged shapes of their rows.
FITTED = [wave_fitted(rows, n, bm, bk, 132) for rows, n, bm, bk in
          [(64, 11008, 64, 128), (64, 14336, 64, 64), (128, 11008, 128, 64),
           (128, 11008, 64, 64), (128, 14336, 64, 64), (128, 11008, 128, 128),
           (128, 14336, 64, 128), (128, 14336, 128, 64)]]
CASES += [([FITTED[0]], (40, 300, 392)), ([FITTED[1]], (64, 200, 200)),
          ([FITTED[2]], (100, 300, 200)), ([FITTED[3]], (127, 400, 136)),
          ([FITTED[4]], (70, 500, 136)), ([FITTED[5]], (128, 100, 264)),
          ([FITTED[6]], (90, 300, 392)), ([FITTED[7]], (128, 230, 136))]
PARAMS = [pytest.param(config, shape, id=",".join(f"{k}={v}" for k, v in config.items()))
          for configs, shape in CASES for config in configs]


@pytest.mark.parametrize("config,shape", PARAMS)
def test_sm90a_candidate_matches_numpy_at_a_ragged_shape(config, shape):
    m, n, k = shape
    rng = np.random.default_rng(m + n + k + config["STAGES"])
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    tiles = dict(config)
    staged = tiles.pop("kernel", "shared") == "staged"  # one block a tile, TMA stores
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a cluster that multicasts nothing warns
        c = gemm_emulated(a, b, f16, target="sm_90a", staged=staged, **tiles)
    check_gemm(c, a, b, f16)


def test_fewer_k_steps_than_stages():
    """K = 72: two k-steps of 64 (one partial) into a 12-stage ring."""
    rng = np.random.default_rng(3)
    a, b = random_input(rng, (70, 72), f16), random_input(rng, (100, 72), f16)
    check_gemm(gemm_emulated(a, b, f16, target="sm_90a", **STREAM_128[0]), a, b, f16)


def test_decode_tiles_fitted_to_n_fill_whole_waves():
    """sm_90a decode shapes at N = 11008 / 14336 (one bucket, 16384): matmul also times
    tiles cut to the true N (`wave_fitted`), each one wave of at least 95% of an H100's
    132 SMs, its ring within shared memory; the tuner keys them by N (`fitted_n`)."""
    from tegula.kernels.api_matmul import fitted_n
    for rows, n in [(64, 11008), (64, 14336), (128, 11008), (128, 14336)]:
        found = gemm_candidates(rows, 16384, 4096, hopper=True, n_exact=n)
        fitted = [c for c in found if c["BN"] not in (32, 64, 128, 256)]
        assert fitted, (rows, n)
        for c in fitted:
            blocks = -(-rows // c["BM"]) * -(-n // c["BN"])
            assert 0.95 * 132 <= blocks <= 132, c
            assert c["STAGES"] * (c["BM"] + c["BN"]) * c["BK"] * 2 <= 232448 - 1024, c
    assert fitted_n(100, 11008, True) == 11008 and fitted_n(100, 11008, False) is None
    # Many rows: N itself only where the persistent tile narrows for it (`persistent_width`).
    assert fitted_n(16, 11008, True) is None and fitted_n(4096, 14336, True) is None
