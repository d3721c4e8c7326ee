"""On an H100: every configuration `gemm_candidates` offers the tuner on sm_90a for the
shape buckets of `tegula bench gemm` (decode rows 16 / 64 / 128 against short and long
weights, the small and mid squares, the large shapes and long-K projections), launched as
`matmul` launches it (`_gemm_launches`: split-K pairs, the transposed orientation, the
persistent grid) into a NaN-poisoned output at a ragged shape of the same row class — M,
N and K no multiple of the tiles, K under one k-step for some — every element checked
against a float64 reference (`test_matmul_epilogue_gpu.check`). Whatever the tuner picks,
it is right."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.dtypes import f16

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_matmul_epilogue_gpu import check, operands, poisoned  # noqa: E402

#: (bucket the candidates come from [+ the true N they are fitted to], ragged shape they
#: run at): the ragged shape has the bucket's row class (≤ 16, ≤ 64, ≤ 128 rows, or many)
#: so a decode tile meets the few rows it was chosen for.
CASES = {
    "16": ((16, 4096, 4096), (13, 1000, 520)),
    "16-longk": ((16, 16384, 16384), (9, 300, 1100)),
    "64": ((64, 4096, 4096), (50, 1000, 520)),
    "64-longk": ((64, 16384, 16384), (37, 600, 1352)),
    "128": ((128, 4096, 4096), (100, 1000, 520)),
    "128-longk": ((128, 16384, 16384), (127, 600, 1352)),
    "1024": ((1024, 1024, 1024), (300, 520, 264)),
    "2048": ((2048, 2048, 2048), (700, 1000, 520)),
    "large-longk": ((4096, 4096, 16384), (520, 1000, 1100)),
    # The decode tiles cut to a weight's true N (`wave_fitted`: 88, 112, 168, 224 wide).
    "64-n11008": ((64, 16384, 4096, 11008), (50, 1000, 520)),
    "64-n14336": ((64, 16384, 4096, 14336), (64, 700, 392)),
    "128-n11008": ((128, 16384, 4096, 11008), (100, 1000, 520)),
    "128-n14336": ((128, 16384, 4096, 14336), (127, 900, 264)),
    # Many rows at N = 11008: the persistent tile narrowed to 248 (`persistent_width`).
    "large-n11008": ((4096, 16384, 16384, 11008), (700, 1000, 520)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_candidate_is_right_at_a_ragged_shape(case):
    """The candidates are listed inside the test (the search behind some costs seconds,
    which collection without a GPU should not pay); every one runs, failures named."""
    from tegula.kernels.api_matmul import _gemm_launches, gemm_candidates
    from tegula.runtime.autotune import Config

    bucket, (m, n, k) = CASES[case]
    a, w, _ = operands(m, n, k, f16, m * 7 + n + k)
    failures = []
    m_bucket, n_bucket, k_bucket, *n_exact = bucket
    for config in gemm_candidates(m_bucket, n_bucket, k_bucket, hopper=True,
                                  n_exact=n_exact[0] if n_exact else None):
        c = poisoned(m, n, f16)
        spec = Config.of(config)
        try:
            _gemm_launches(f16, spec.kwargs, spec.threads, a, w, c)
            torch.cuda.synchronize()
            check(c, a, w, None, None, f16)
        except AssertionError as e:
            failures.append(f"{config}: {e}")
    assert not failures, "\n".join(failures)
