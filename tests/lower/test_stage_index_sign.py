"""A multi-stage shared buffer indexed by a loop index that may be negative: the stage is
`k mod stages` with floor semantics on the GPU as in the emulator. C's `%` (which lowering
printed before) gave a negative stage — an offset before the buffer — for k < 0 on the GPU
while the emulator wrapped; loops known to count up from >= 0 keep the cheaper `%`."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import f32
from tegula.lower.thread_ir import BinOp, walk


def staged_sum(start: int):
    @tg.kernel(threads=64)
    def kernel(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        s = tg.shared((4, 32), f32, stages=2)
        acc = tg.zeros((4, 32), f32)
        for k in tg.range(start, start + 6):
            tg.copy(x.tile((4, 32), (k - start, 0)), s[k])
            acc += tg.load(s[k]) * (k + 10)
        tg.copy(acc, y.tile((4, 32), (0, 0)))
    return kernel


def _stage_mods(kernel) -> set[str]:
    ops = set()
    for stmt in walk(build(kernel, {}, None, "sm_80").thread_kernel.body):
        for value in vars(stmt).values():
            stack = [value]
            while stack:
                e = stack.pop()
                if isinstance(e, BinOp):
                    if e.op in ("%", "mod") and str(e.rhs) == "2":
                        ops.add(e.op)
                    stack += [e.lhs, e.rhs]
    return ops


def test_a_loop_that_may_be_negative_takes_the_floor_modulo_for_its_stage():
    assert "mod" in _stage_mods(staged_sum(-3))
    assert _stage_mods(staged_sum(0)) == {"%"}


@pytest.mark.parametrize("start", [-3, 0])
def test_negative_stage_indices_are_right_in_the_emulator(start):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((24, 32)).astype(np.float32)
    y = np.full((4, 32), np.nan, np.float32)
    tg.emulate(staged_sum(start), (1,), x, y)
    want = sum(x[4 * i:4 * i + 4] * np.float32(start + i + 10) for i in range(6))
    np.testing.assert_allclose(y, want, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("start", [-3, 0])
def test_negative_stage_indices_agree_with_the_emulator_on_the_gpu(start):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((24, 32)).astype(np.float32)
    y = np.full((4, 32), np.nan, np.float32)
    tg.emulate(staged_sum(start), (1,), x, y)
    gy = torch.full((4, 32), float("nan"), device="cuda")
    staged_sum(start)[(1,)](torch.from_numpy(x).cuda(), gy)
    torch.cuda.synchronize()
    # `acc += s * c` may contract into one FMA on the GPU (one rounding where the emulator
    # rounds twice): a few f32 ulps of the running sum. A wrong stage reads another
    # block of x and is off by whole values.
    np.testing.assert_allclose(gy.cpu().numpy(), y, rtol=0, atol=6 * 2.0 ** -23 * 2000)
