"""A multi-stage shared buffer the kernel pinned to its tile's row-major order, filled and
read inside a `tg.pipeline` loop.

Such a stage became TMA boxes (`synthesize._plan_tma_copies`) planned like a wgmma operand
buffer's: boxes one 16-byte column block wide, landing block after block, dense. A pinned
(8, 256) f16 stage has a 512-byte row pitch, so the 32 boxes of 8x8 scrambled it (a silent
wrong sum, max error ~8). And the plan was made on sm_80 too, where the ring's TMA boxes
and mbarriers cannot compile (the emulator ran them, as wrong). The stage is now one box
of whole rows, and only from sm_90 on; sm_80 keeps cp.async.
"""
import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.layout import Layout


@tg.kernel
def pinned_stage_sum(w: tg.Tensor[f16], y: tg.Tensor[f32], BN: tg.constexpr = 8,
                     BK: tg.constexpr = 256, STAGES: tg.constexpr = 2):
    n = tg.block_id(0)
    gw = w.tile((BN, BK), (n, None))
    sw = tg.shared((BN, BK), f16, stages=STAGES, layout=Layout((BN, BK), (BK, 1)))
    acc = tg.zeros((BN, BK), f32)
    for k in tg.pipeline(gw.shape[2], stages=STAGES):
        tg.copy(gw[:, :, k], sw[k])
        acc = acc + tg.load(sw[k]).to(f32)
    tg.copy(acc, y.tile((BN, BK), (n, 0)))


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("bn,bk,stages,blocks_k", [(8, 256, 2, 2), (4, 64, 3, 5)])
def test_a_pinned_row_major_stage_in_a_pipeline_reads_back_every_element(
        target, bn, bk, stages, blocks_k):
    rng = np.random.default_rng(1101 + bn + bk)
    n = 2 * bn
    w = rng.uniform(0.5, 2.0, (n, bk * blocks_k)).astype(np.float16)
    w *= rng.choice([-1, 1], w.shape).astype(np.float16)
    y = np.zeros((n, bk), np.float32)
    tg.emulate(pinned_stage_sum, (n // bn,), w, y, BN=bn, BK=bk, STAGES=stages,
               target=target)
    want = w.astype(np.float32).reshape(n, blocks_k, bk).sum(axis=1)
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)


def test_the_pinned_stage_is_whole_row_boxes_on_sm_90a_and_cp_async_on_sm_80():
    hopper = tg.explain(pinned_stage_sum, target="sm_90a")
    assert "TMA box 256x8 of w" in hopper and "boxes 8x8" not in hopper
    ampere = tg.explain(pinned_stage_sum, target="sm_80")
    assert "tma" not in ampere.lower() and "cp.async" in ampere
