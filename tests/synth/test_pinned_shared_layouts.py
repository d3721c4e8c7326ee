"""Shared layouts pinned with `tg.shared(..., layout=...)`, end to end.

Shared addressing (lowering's `shared_offset`) and the costing of candidate layouts
(`synth.shared.evaluate_offsets`) both evaluate a buffer layout through one function,
`layout.swizzle.buffer_offset`, which reads each dim's coordinate through its whole mode:
a layout hierarchical within one dim is addressed right (before, both paired each dim with
one stride and a pinned `(8,(4,4)):(4,(1,32))` failed with an IndexError deep in
synthesis). A pinned layout that is not a one-to-one map onto the buffer's elements is
refused at the pinning line (before, it ran off the buffer or raced).
"""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.errors import SynthesisError
from tegula.layout import Layout, Swizzle, make_swizzled_layout
from tegula.layout.swizzle import buffer_offset
from tegula.synth.shared import evaluate_offsets

TARGETS = ["sm_90a", "sm_80"]

# (8, 16) buffers: one mode per dim, some hierarchical within a dim; each one to one.
HIERARCHICAL_8x16 = {
    "columns split (4,4)": Layout((8, (4, 4)), (4, (1, 32))),
    "rows split (2,4)": Layout(((2, 4), 16), ((16, 32), 1)),
    "both split": Layout(((2, 4), (8, 2)), ((8, 32), (1, 16))),
    "column-major rows split": Layout(((4, 2), 16), ((1, 64), 4)),
    "swizzled, columns split": make_swizzled_layout(Swizzle(2, 2, 3),
                                                    Layout((8, (4, 4)), (4, (1, 32)))),
}


@pytest.mark.parametrize("name", list(HIERARCHICAL_8x16))
def test_buffer_offset_is_cute_evaluation(name):
    """On ints and numpy arrays, buffer_offset(L, (m, n)) == L((m, n)), CuTe's own
    evaluation of a natural coordinate (swizzle included)."""
    layout = HIERARCHICAL_8x16[name]
    m, n = np.indices((8, 16)).reshape(2, -1)
    expected = np.array([layout((int(i), int(j))) for i, j in zip(m, n)])
    assert [buffer_offset(layout, [int(i), int(j)]) for i, j in zip(m, n)] == list(expected)
    assert np.array_equal(evaluate_offsets(layout, np.stack([m, n], axis=-1)), expected)
    assert sorted(expected) == list(range(128))  # the cases are one to one


def _copy_kernel(layout, threads=32, layout_t=None):
    """Pinned `layout` for an (8, 16) buffer, `layout_t` (None: synthesized) for a (16, 8)
    buffer written and read through its transposed view."""
    @tg.kernel(threads=threads)
    def pinned_copy(x: tg.Tensor[f32], o: tg.Tensor[f32], BM: tg.constexpr = 8,
                    BN: tg.constexpr = 16):
        m, n = tg.block_id(0), tg.block_id(1)
        s = tg.shared((BM, BN), f32, layout=layout)
        tg.copy(x.tile((BM, BN), (m, n)), s)             # global -> shared
        v = tg.load(s)                                    # shared -> registers
        t = tg.shared((BN, BM), f32, layout=layout_t)
        tg.copy(v * 2.0 + 1.0, t.T)                       # registers -> transposed view
        tg.copy(t.T, o.tile((BM, BN), (m, n)))            # shared -> global
    return pinned_copy


def _transposed(layout):
    """The same layout with its two modes swapped (a (16, 8) buffer's layout)."""
    if hasattr(layout, "outer"):
        return make_swizzled_layout(layout.outer, _transposed(layout.inner), layout.offset)
    return Layout((layout.shape[1], layout.shape[0]), (layout.stride[1], layout.stride[0]))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("threads", [32, 128])
@pytest.mark.parametrize("name", list(HIERARCHICAL_8x16))
def test_hierarchical_pinned_buffers_copy_right(name, threads, target):
    rng = np.random.default_rng(len(name) + threads)
    x = rng.standard_normal((13, 37)).astype(np.float32)   # does not divide (8, 16)
    x[0, 0], x[5, 20] = np.nan, -np.inf
    o = np.full_like(x, 7.5)
    layout = HIERARCHICAL_8x16[name]
    kernel = _copy_kernel(layout, threads, layout_t=_transposed(layout))
    tg.emulate(kernel, (2, 3), x, o, target=target)
    np.testing.assert_array_equal(o, x * 2.0 + 1.0)


def _gemm_kernel(layout_a, layout_b):
    @tg.kernel(threads=128)
    def pinned_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                    BM: tg.constexpr = 64, BN: tg.constexpr = 32, BK: tg.constexpr = 32):
        m, n = tg.block_id(0), tg.block_id(1)
        ga = a.tile((BM, BK), (m, None))
        gb = b.tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), f32)
        sa = tg.shared((BM, BK), f16, stages=2, layout=layout_a)
        sb = tg.shared((BN, BK), f16, stages=2, layout=layout_b)
        for k in tg.pipeline(ga.shape[2], stages=2):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc, c.tile((BM, BN), (m, n)))
    return pinned_gemm


@pytest.mark.parametrize("target", TARGETS)
def test_hierarchical_pinned_gemm_operands_in_a_pipeline(target):
    """Staged operand buffers with K split into 8-element chunks spread apart, read by
    the MMA path (ldmatrix where rows line up) in a two-stage pipeline."""
    layout_a = Layout((64, (8, 4)), (8, (1, 512)))   # chunk j of a row at 512 * j
    layout_b = make_swizzled_layout(Swizzle(2, 3, 3), Layout((32, (8, 4)), (8, (1, 256))))
    rng = np.random.default_rng(9)
    M, N, K = 70, 40, 80                                     # none divides its tile
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((N, K)).astype(np.float16)
    c = np.full((M, N), np.nan, np.float32)
    tg.emulate(_gemm_kernel(layout_a, layout_b), (tg.cdiv(M, 64), tg.cdiv(N, 32)), a, b, c,
               target=target)
    expected = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c, expected, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("layout,message", [
    (Layout((16, 8), (1, 16)), r"one mode per buffer dim with that dim's extent \(8, 16\), "
                                r"but its modes have the extents \(16, 8\)"),
    (Layout(128, 1), r"extents \(128,\)"),
    (Layout((8, 16), (1, 16)), r"reaches the offset 128, outside the buffer's 128 elements"),
    (Layout((8, 16), (17, 1)), r"reaches the offset 1[0-9][0-9], outside"),   # padding
    (Layout((8, 16), (1, 1)), r"maps several coordinates to the offset 1 "),
    (Layout((8, (4, 4)), (4, (1, 16))), r"maps several coordinates"),
    ("(8,16):(16,1)", r"'\(8,16\):\(16,1\)' pinned for shared buffer s0 \(8, 16\) is not a "
                      r"shared-memory layout"),
])
def test_pinned_layouts_that_do_not_map_onto_the_buffer_are_refused(layout, message):
    kernel = _copy_kernel(layout)
    x = np.ones((8, 16), np.float32)
    with pytest.raises(SynthesisError, match=message) as info:
        tg.emulate(kernel, (1, 1), x, np.zeros_like(x))
    assert "s = tg.shared((BM, BN), f32, layout=layout)" in str(info.value)


def _on_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(HIERARCHICAL_8x16))
def test_hierarchical_pinned_buffers_copy_right_on_the_gpu(name):
    """The emitted addressing (the same index expressions the emulator ran) on hardware."""
    torch = _on_gpu()
    layout = HIERARCHICAL_8x16[name]
    x = torch.randn(13, 37, device="cuda")
    out = torch.full_like(x, float("nan"))
    _copy_kernel(layout, 128, layout_t=_transposed(layout))[(2, 3)](x, out)
    torch.cuda.synchronize()
    assert torch.equal(out, x * 2.0 + 1.0)


@pytest.mark.gpu
def test_hierarchical_pinned_gemm_operands_on_the_gpu():
    torch = _on_gpu()
    layout_a = Layout((64, (8, 4)), (8, (1, 512)))
    layout_b = make_swizzled_layout(Swizzle(2, 3, 3), Layout((32, (8, 4)), (8, (1, 256))))
    M, N, K = 70, 40, 80
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(N, K, device="cuda", dtype=torch.float16)
    c = torch.full((M, N), float("nan"), device="cuda")
    _gemm_kernel(layout_a, layout_b)[(tg.cdiv(M, 64), tg.cdiv(N, 32))](a, b, c)
    torch.cuda.synchronize()
    expected = a.double() @ b.double().T
    assert torch.allclose(c.double(), expected, rtol=1e-3, atol=1e-3)
