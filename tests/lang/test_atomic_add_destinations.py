"""tg.atomic_add adds into global memory, for the types red.global.add takes.

Session 8: the docstring said a shared destination was allowed, but lowering refused it;
and an i8/u8/f8 destination emulated (wrapping) and only failed when compiled. Both are
now refused where they are written, naming the destination.
"""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32, i32
from tegula.dtypes import bf16, f8e4m3, f16, i4, i8, u8
from tegula.errors import TraceError


@tg.kernel(threads=64)
def into_shared(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    s = tg.shared((16, 16), f32)
    tg.copy(tg.zeros((16, 16), f32), s)
    tg.atomic_add(tg.load(x.tile((16, 16), (0, 0))), s)
    tg.copy(tg.load(s), y.tile((16, 16), (0, 0)))


def test_a_shared_destination_is_refused_at_its_line():
    x = np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32)
    with pytest.raises(TraceError, match=r"tg.atomic_add: the destination %s\d*\[0\]: "
                       r"shared<16x16, f32> is in shared memory; tg.atomic_add adds into "
                       r"global memory only") as info:
        tg.emulate(into_shared, (1,), x, np.zeros_like(x))
    assert "tg.atomic_add(tg.load(x.tile((16, 16), (0, 0))), s)" in info.value.loc.line
    assert "global" in tg.atomic_add.__doc__ and "shared `dst` is refused" in \
        " ".join(tg.atomic_add.__doc__.split())


@pytest.mark.parametrize("dtype", [i8, u8, f8e4m3, i4], ids=str)
def test_a_type_without_an_atomic_add_is_refused_at_its_line(dtype):
    @tg.kernel(threads=64)
    def add_into(x: tg.Tensor[dtype], y: tg.Tensor[dtype]):
        tg.atomic_add(tg.load(x.tile((16, 16), (0, 0))), y.tile((16, 16), (0, 0)))

    with pytest.raises(TraceError, match=rf"no atomic add for {dtype} \(destination %y"
                                         rf"\.\d+: global<16x16, {dtype}>\); red.global.add "
                                         rf"takes f32, i32, f16, bf16") as info:
        add_into.trace()
    assert "tg.atomic_add(" in info.value.loc.line


@tg.kernel(threads=64)
def column_sums(x: tg.Tensor[f32], out: tg.Tensor[f32]):
    # every block adds its 16 rows into the same (1, 32) row of out
    m = tg.block_id(0)
    rows = tg.load(x.tile((16, 32), (m, 0)))
    tg.atomic_add(tg.sum(rows, 0), out.tile((1, 32), (0, 0)))


def test_blocks_adding_into_one_global_tile_sum():
    x = np.random.default_rng(2).standard_normal((45, 30)).astype(np.float32)
    out = np.random.default_rng(3).standard_normal((1, 30)).astype(np.float32)
    want = out.astype(np.float64) + x.astype(np.float64).sum(0, keepdims=True)
    tg.emulate(column_sums, (3,), x, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [f32, i32, f16, bf16], ids=str)
def test_every_type_red_takes_traces(dtype):
    @tg.kernel(threads=64)
    def add_into(x: tg.Tensor[dtype], y: tg.Tensor[dtype]):
        tg.atomic_add(tg.load(x.tile((16, 16), (0, 0))), y.tile((16, 16), (0, 0)))

    assert [type(op).__name__ for op in add_into.trace().body] == ["Copy", "AtomicAdd"]
