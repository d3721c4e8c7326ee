"""Layout conversions: the F2 planner's choice, lowered and run in the emulator."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.build import build, emulate
from tegula.ir.ops import Rearrange, walk_ops
from tegula.layout.cute import Layout

# A 16x16 tile over 64 threads (2 warps), 4 values each. Tile index = m + 16 n.
ROW_VECTORS = Layout(((4, 16), 4), ((64, 1), 16))        # thread t: row t//4, 4 cols
ROW_VECTORS_REVERSED = Layout(((4, 16), (2, 2)), ((64, 1), (32, 16)))  # same threads, registers reordered
LANES_SWAPPED = Layout(((16, 4), 4), ((1, 64), 16))      # thread t: row t%16, columns 4*(t//16)+v
COLUMNS = Layout(((16, 4), 4), ((16, 4), 1))             # thread t: column t%16, rows 4*(t//16)+v


def _kernel(src_layout, dst_layout, dtype):
    @tg.kernel(threads=64)
    def convert(x: tg.Tensor[dtype], y: tg.Tensor[dtype]):
        a = tg.register((16, 16), dtype, layout=src_layout)
        tg.copy(x.tile((16, 16), (0, 0)), a)
        b = tg.register((16, 16), dtype, layout=dst_layout)
        tg.fill(b, 1)
        tg.copy(b * tg.rearrange(a), y.tile((16, 16), (0, 0)))
    return convert


@pytest.mark.parametrize("src,dst,kind", [
    (ROW_VECTORS, ROW_VECTORS_REVERSED, "registers"),
    (ROW_VECTORS, LANES_SWAPPED, None),
    (ROW_VECTORS, COLUMNS, None),
    (COLUMNS, ROW_VECTORS, None),
])
@pytest.mark.parametrize("dtype", [f32, f16])
def test_rearrange_moves_every_element_to_its_new_owner(src, dst, kind, dtype):
    kernel = _kernel(src, dst, dtype)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((16, 16)).astype(np.float32 if dtype is f32 else np.float16)
    y = np.full_like(x, np.nan)
    emulate(kernel, (1,), x, y)
    assert np.array_equal(y, x)
    conversions = [op for op in walk_ops(build(kernel).traced.body) if isinstance(op, Rearrange)]
    assert len(conversions) == 1
    choice = conversions[0].choices["conversion"]
    if kind is not None:
        assert choice.kind == kind


def test_conversions_within_a_warp_become_shuffles_not_shared_memory():
    # Threads of one warp trade elements: lane l's row moves to lane l ^ 4 (same warp).
    swapped = Layout(((4, 2, 2, 4), 4), ((64, 4, 8, 1), 16))
    base = Layout(((4, 2, 2, 4), 4), ((64, 8, 4, 1), 16))
    kernel = _kernel(base, swapped, f32)
    x = np.random.default_rng(3).standard_normal((16, 16)).astype(np.float32)
    y = np.full_like(x, np.nan)
    report = emulate(kernel, (1,), x, y)
    assert np.array_equal(y, x)
    choice = next(op for op in walk_ops(build(kernel).traced.body)
                  if isinstance(op, Rearrange)).choices["conversion"]
    assert choice.kind == "shuffle"
    assert "Shuffle" in str(report)
