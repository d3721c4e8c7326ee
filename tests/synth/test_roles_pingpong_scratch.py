"""Ping-pong consumers and shared scratch (issue from the fuzzer, session 14): lowering
exchanges a reduction across warps, a scan or a layout conversion through a shared buffer
both consumer warpgroups would use at once, so synthesis does not take ping-pong for a
tile loop whose epilogue needs one (the default runs one consumer role; asked for, it is
refused at the op's line), and still takes it for a plain epilogue."""
import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.build import build
from tegula.errors import SynthesisError
from tegula.ir.ops import ForLoop, walk_ops


def persistent(reduce_rows: bool):
    @tg.kernel(threads=128)
    def k(ga: tg.Tensor[f16], gb: tg.Tensor[f16], o: tg.Tensor[f32], BM: tg.constexpr = 64,
          BN: tg.constexpr = 64):
        for t in tg.range(tg.block_id(0), 4, tg.num_programs(0)):
            m, n = t // 2, t % 2
            ga_t = ga.tile((BM, 64), (m, None))
            gb_t = gb.tile((BN, 64), (n, None))
            ga_s = tg.shared((BM, 64), f16, stages=3)
            gb_s = tg.shared((BN, 64), f16, stages=3)
            acc = tg.zeros((BM, BN), f32)
            for kk in tg.pipeline(ga_t.shape[2], stages=3):
                tg.copy(ga_t[:, :, kk], ga_s[kk])
                tg.copy(gb_t[:, :, kk], gb_s[kk])
                tg.gemm(acc, ga_s[kk], gb_s[kk])
            if reduce_rows:
                tg.copy(tg.sum(acc, 0), o.tile((1, BN), (m, n)))   # the sum's line
            else:
                tg.copy(acc, o.tile((BM, BN), (m, n)))
    return k


def consumer_groups(result) -> list:
    return [op.choices["roles"].consumer_groups for op in walk_ops(result.traced.body)
            if isinstance(op, ForLoop) and "roles" in op.choices]


def test_a_cross_warp_sum_in_the_epilogue_keeps_one_consumer_role():
    result = build(persistent(True), dict(warp_specialize=True), None, "sm_90a")
    assert consumer_groups(result) == [1]
    (loop,) = [op for op in walk_ops(result.traced.body)
               if isinstance(op, ForLoop) and "roles" in op.choices]
    assert "shared-memory scratch buffer" in loop.choices["roles"].consumers_note


def test_pingpong_asked_for_is_refused_at_the_reductions_line():
    kernel = persistent(True)
    with pytest.raises(SynthesisError, match=r"the sum of .* across warps \(line \d+\) goes "
                                             r"through a shared-memory scratch buffer") as err:
        build(kernel, dict(consumers="pingpong"), None, "sm_90a")
    assert err.value.loc is not None


def test_a_plain_epilogue_still_takes_pingpong():
    assert consumer_groups(build(persistent(False), dict(warp_specialize=True), None,
                                 "sm_90a")) == [2]


def test_the_emulated_default_is_right():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((128, 152)).astype(np.float16)
    b = rng.standard_normal((128, 152)).astype(np.float16)
    o = np.zeros((2, 128), np.float32)
    tg.emulate(persistent(True), (2,), a, b, o, target="sm_90a", warp_specialize=True)
    want = (a.astype(np.float32) @ b.astype(np.float32).T).reshape(2, 64, 128).sum(1)
    np.testing.assert_allclose(o, want, rtol=1e-3, atol=1e-2)
