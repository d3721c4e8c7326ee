"""A cp.async pipeline whose copies are addressed through a table read in the loop (a paged
KV cache, a gathered row list): the pipeline fetches stages ahead, and it must fetch only
iterations that exist — the table has no entry past the loop's end, so reading one is an
out-of-bounds load (on the GPU, a read of whatever lies there, then a copy from that
address)."""
import numpy as np
import pytest

import tegula as tg
from tegula import f32, i32


@tg.kernel(threads=64)
def gather_rows(x: tg.Tensor[f32], table: tg.Tensor[i32, 1], y: tg.Tensor[f32],
                BM: tg.constexpr, BN: tg.constexpr, STAGES: tg.constexpr):
    acc = tg.zeros((BM, BN), f32)
    buf = tg.shared((BM, BN), f32, stages=STAGES)
    for j in tg.pipeline(0, table.shape[0], stages=STAGES):
        row_block = table[j]                                  # read inside the loop
        tg.copy(x.tile((BM, BN), (row_block, 0)), buf[j])
        acc = acc + tg.load(buf[j])
    tg.copy(acc, y.tile((BM, BN), (0, 0)))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("trips", [1, 2, 5])
def test_pipeline_fetches_no_iteration_past_the_end(target, stages, trips):
    rng = np.random.default_rng(trips * 10 + stages)
    BM, BN, blocks = 8, 16, 7
    x = rng.standard_normal((BM * blocks, BN)).astype(np.float32)
    table = rng.permutation(blocks)[:trips].astype(np.int32)   # exactly `trips` entries
    y = np.full((BM, BN), np.nan, np.float32)
    tg.emulate(gather_rows, (1,), x, table, y, BM=BM, BN=BN, STAGES=stages, target=target)
    want = sum(x[r * BM:(r + 1) * BM] for r in table)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
