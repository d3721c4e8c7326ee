"""Extents a kernel assumes equal (tegula/ir/extents.py): constant coordinates.

A tile read at constant coordinates reads known elements; an extent assumption is broken
only where a load would mask one of them in one tensor and not in the other. Symbolic
coordinates (block ids, loop indices) keep the whole-extent rule.
"""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.errors import LaunchError
from tegula.ir.extents import Assumption

RNG = np.random.default_rng(91)


def _random(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@tg.kernel(threads=64)
def transposed_plus_next_block(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    s = tg.shared((16, 16), f32)
    tg.copy(x.tile((16, 16), (0, 0)), s)
    v = tg.load(s.T) + tg.load(x.tile((16, 16), (1, 0)))
    tg.copy(v, y.tile((16, 16), (0, 0)))


@pytest.mark.parametrize("x_shape", [(32, 16), (32, 20), (40, 24), (33, 17)])
def test_a_transposed_block_plus_the_next_block_is_accepted_and_right(x_shape):
    # session 8's repro: the sum reads x's rows 0..15 (through s.T) and its columns 0..15
    # at the same tile coordinates, so tegula assumed x square and refused (32, 16)
    x = _random(*x_shape)
    y = np.full((16, 16), np.nan, np.float32)
    tg.emulate(transposed_plus_next_block, (1,), x, y)
    assert np.array_equal(y, x[:16, :16].T + x[16:32, :16])


@pytest.mark.parametrize("x_shape", [(32, 12), (12, 16), (16, 12)])
def test_a_constant_block_that_straddles_an_extent_is_still_refused(x_shape):
    # x's dim 0 and dim 1 are read at coordinates 0..15 together; one of them ends inside
    # that range, so a zero would stand in for a missing element of the other
    x, y = _random(*x_shape), np.zeros((16, 16), np.float32)
    with pytest.raises(LaunchError, match=r"tg.add combines element by element x's dim 0 "
                       r"\(extent \d+\) with x's dim 1 \(extent \d+\) at coordinates 0..15 "
                       r"\(inside one, past the other\), which must be equal") as info:
        tg.emulate(transposed_plus_next_block, (1,), x, y)
    assert "tg.load(s.T) + tg.load(x.tile" in info.value.loc.line


@tg.kernel(threads=32)
def add_second_block(x: tg.Tensor[f32, 1], y: tg.Tensor[f32, 1], out: tg.Tensor[f32, 1]):
    v = tg.load(x.tile((16,), (1,))) + tg.load(y.tile((16,), (1,)))
    tg.copy(v, out.tile((16,), (0,)))


@pytest.mark.parametrize("nx,ny,refused", [
    (32, 40, False),  # 16..31 inside both
    (20, 40, True),   # 20..31 inside y only
    (40, 25, True),
    (10, 12, False),  # 16..31 past both: both read the fill
    (40, 32, False),
])
def test_constant_tiles_of_two_tensors(nx, ny, refused):
    x, y = _random(nx), _random(ny)
    out = np.full(16, np.nan, np.float32)
    if refused:
        with pytest.raises(LaunchError, match=r"x's dim 0 .* y's dim 0 .* at coordinates "
                                              r"16..31"):
            tg.emulate(add_second_block, (1,), x, y, out)
        return
    tg.emulate(add_second_block, (1,), x, y, out)
    padded = [np.pad(t, (0, 64 - t.size))[16:32] for t in (x, y)]
    assert np.array_equal(out, padded[0] + padded[1])


@tg.kernel(threads=32)
def add_block_of_program(x: tg.Tensor[f32, 1], y: tg.Tensor[f32, 1], out: tg.Tensor[f32, 1]):
    m = tg.block_id(0)
    v = tg.load(x.tile((16,), (m,))) + tg.load(y.tile((16,), (m,)))
    tg.copy(v, out.tile((16,), (m,)))


def test_block_coordinates_keep_the_whole_extent_rule():
    # which elements a block id reads depends on the grid: the extents must be equal
    x, y, out = _random(32), _random(40), np.zeros(32, np.float32)
    with pytest.raises(LaunchError, match=r"x's dim 0 \(extent 32\) with y's dim 0 "
                                          r"\(extent 40\), which must be equal"):
        tg.emulate(add_block_of_program, (2,), x, y, out)


@tg.kernel(threads=64)
def gemm_first_blocks(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
    acc = tg.zeros((16, 16), f32)
    tg.gemm(acc, tg.load(a.tile((16, 16), (0, 0))), tg.load(b.tile((16, 16), (0, 0))))
    tg.copy(acc, c.tile((16, 16), (0, 0)))


@pytest.mark.parametrize("ka,kb,refused", [(16, 24, False), (20, 32, False), (12, 24, True)])
def test_a_gemm_of_constant_tiles_contracts_only_what_it_reads(ka, kb, refused):
    a, b = _random(16, ka, dtype=np.float16), _random(16, kb, dtype=np.float16)
    c = np.full((16, 16), np.nan, np.float32)
    if refused:
        with pytest.raises(LaunchError, match=r"tg.gemm contracts a's dim 1 \(extent 12\) "
                                              r"with b's dim 1 \(extent 24\) at coordinates"):
            tg.emulate(gemm_first_blocks, (1,), a, b, c)
        return
    tg.emulate(gemm_first_blocks, (1,), a, b, c)
    want = a[:, :16].astype(np.float32) @ b[:, :16].T.astype(np.float32)
    np.testing.assert_allclose(c, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("span,extents,broken", [
    ((0, 4, 4), (12, 20), True),    # reads 0, 4, 8, 12: 12 inside the second only
    ((0, 4, 4), (14, 20), False),   # 0, 4, 8, 12 lie inside both
    ((1, 4, 4), (13, 20), True),    # 1, 5, 9, 13: 13 inside the second only
    ((2, 8, 3), (19, 24), False),   # 2, 10, 18
    ((2, 8, 3), (18, 24), True),
    ((30, 1, 5), (20, 30), False),  # past both
    ((29, 1, 5), (20, 30), True),
    (None, (20, 30), True),
    (None, (30, 30), False),
])
def test_broken_by_checks_each_coordinate_read(span, extents, broken):
    assumption = Assumption("tg.add", None, ("x", 0), ("y", 0), span)
    assert assumption.broken_by(*extents) is broken
    assert assumption.broken_by(*reversed(extents)) is broken


@tg.kernel(threads=64)
def one_buffer_for_two_tensors(x: tg.Tensor[f32], y: tg.Tensor[f32], z: tg.Tensor[f32],
                               out: tg.Tensor[f32]):
    m = tg.block_id(0)
    s = tg.shared((16, 16), f32)
    tg.copy(x.tile((16, 16), (m, 0)), s)
    tg.copy(tg.load(s), out.tile((16, 16), (m, 0)))
    tg.copy(y.tile((16, 16), (m, 0)), s)     # the buffer now holds y: x's rows are gone
    tg.copy(tg.load(s) * 2.0, out.tile((16, 16), (m, 1)))
    tg.copy(tg.load(s) + tg.load(z.tile((16, 16), (m, 0))), out.tile((16, 16), (m, 2)))


def test_one_inputs_sources_are_alternatives_not_combined():
    # `load(s) * 2.0` reads y alone: it was refused as combining x's rows with y's
    x, y, z = _random(32, 16), _random(40, 16), _random(40, 16)
    out = np.full((32, 48), np.nan, np.float32)
    tg.emulate(one_buffer_for_two_tensors, (2,), x, y, z, out)
    assert np.array_equal(out, np.concatenate([x, y[:32] * 2, y[:32] + z[:32]], axis=1))


def test_two_inputs_read_together_are_still_checked():
    x, y, z = _random(32, 16), _random(32, 16), _random(40, 16)
    with pytest.raises(LaunchError, match=r"tg.add combines element by element y's dim 0 "
                                          r"\(extent 32\) with z's dim 0 \(extent 40\)"):
        tg.emulate(one_buffer_for_two_tensors, (2,), x, y, z, np.zeros((32, 48), np.float32))


@tg.kernel(threads=64)
def rewritten_in_a_loop(x: tg.Tensor[f32], y: tg.Tensor[f32], z: tg.Tensor[f32],
                        out: tg.Tensor[f32]):
    m = tg.block_id(0)
    s = tg.shared((16, 16), f32)
    tg.copy(x.tile((16, 16), (m, 0)), s)
    for i in tg.range(2):
        tg.copy(tg.load(s) + tg.load(z.tile((16, 16), (m, 0))), out.tile((16, 16), (m, i)))
        tg.copy(y.tile((16, 16), (m, 0)), s)  # what the next trip's sum reads


@tg.kernel(threads=64)
def rewritten_in_a_branch(x: tg.Tensor[f32], y: tg.Tensor[f32], z: tg.Tensor[f32],
                          out: tg.Tensor[f32]):
    m = tg.block_id(0)
    s = tg.shared((16, 16), f32)
    tg.copy(x.tile((16, 16), (m, 0)), s)
    with tg.if_(m > 0):
        tg.copy(y.tile((16, 16), (m, 0)), s)
    tg.copy(tg.load(s) + tg.load(z.tile((16, 16), (m, 0))), out.tile((16, 16), (m, 0)))


@pytest.mark.parametrize("kernel", [rewritten_in_a_loop, rewritten_in_a_branch])
def test_a_write_a_later_trip_or_path_reads_is_still_checked(kernel):
    # a whole-buffer write replaces the buffer's sources, but the loop's first trip reads
    # x and its second y (the branch: x in block 0, y in block 1): both meet z
    x, y, z = _random(32, 16), _random(40, 16), _random(32, 16)
    out = np.full((32, 32 if kernel is rewritten_in_a_loop else 16), np.nan, np.float32)
    with pytest.raises(LaunchError, match=r"tg.add combines element by element y's dim 0 "
                                          r"\(extent 40\) with z's dim 0 \(extent 32\)"):
        tg.emulate(kernel, (2,), x, y, z, out)
    tg.emulate(kernel, (2,), x, y[:32], z, out)
    first = x + z
    if kernel is rewritten_in_a_loop:
        assert np.array_equal(out, np.concatenate([first, y[:32] + z], axis=1))
    else:
        assert np.array_equal(out[:16], first[:16])
        assert np.array_equal(out[16:], (y[:32] + z)[16:])


@tg.kernel(threads=64)
def cumsum_plus(x: tg.Tensor[f32], y: tg.Tensor[f32], out: tg.Tensor[f32]):
    m = tg.block_id(0)
    s = tg.cumsum(tg.load(x.tile((16, 32), (m, 0))), 1)
    tg.copy(s + tg.load(y.tile((16, 32), (m, 0))), out.tile((16, 32), (m, 0)))


@tg.kernel(threads=64)
def affine_pairs(a: tg.Tensor[f32], b: tg.Tensor[f32], out: tg.Tensor[f32]):
    m = tg.block_id(0)
    pa, pb = tg.scan((tg.load(a.tile((16, 32), (m, 0))), tg.load(b.tile((16, 32), (m, 0)))),
                     1, lambda l, r: (l[0] * r[0], l[1] * r[0] + r[1]))
    tg.copy(pb, out.tile((16, 32), (m, 0)))


def test_a_scans_result_keeps_where_it_was_loaded_from():
    # cumsum(x) + y reads x's and y's rows together: a scan had no provenance, so y's
    # missing rows silently read as zeros
    x, y = _random(40, 32), _random(32, 32)
    with pytest.raises(LaunchError, match=r"tg.add combines element by element x's dim 0 "
                                          r"\(extent 40\) with y's dim 0 \(extent 32\)"):
        tg.emulate(cumsum_plus, (3,), x, y, np.zeros((40, 32), np.float32))
    out = np.full((32, 32), np.nan, np.float32)
    tg.emulate(cumsum_plus, (2,), x[:32], y, out)
    np.testing.assert_allclose(out, np.cumsum(x[:32], 1) + y, rtol=1e-5, atol=1e-5)


def test_tiles_scanned_together_must_agree():
    a, b = _random(32, 32), _random(32, 30)
    with pytest.raises(LaunchError, match=r"tg.scan combines element by element a's dim 1 "
                                          r"\(extent 32\) with b's dim 1 \(extent 30\)"):
        tg.emulate(affine_pairs, (2,), a, b, np.zeros((32, 32), np.float32))


@tg.kernel(threads=64)
def permuted_plus(x: tg.Tensor[f32], y: tg.Tensor[f32], out: tg.Tensor[f32]):
    m = tg.block_id(0)
    t = tg.permute(tg.load(x.tile((32, 16), (0, m))), (1, 0))   # x read by columns
    tg.copy(t + tg.load(y.tile((16, 32), (m, 0))), out.tile((16, 32), (m, 0)))


@tg.kernel(threads=64)
def row_plus(x: tg.Tensor[f32], y: tg.Tensor[f32], out: tg.Tensor[f32]):
    m = tg.block_id(0)
    r = tg.reshape(tg.load(x.tile((1, 32), (0, 0))), (32,))    # a size-1 dim dropped...
    r = tg.reshape(r, (1, 32))                                    # ...and put back
    tg.copy(r + tg.load(y.tile((16, 32), (m, 0))), out.tile((16, 32), (m, 0)))


def test_permutes_and_size_one_reshapes_keep_where_tiles_were_loaded_from():
    # both were ops without provenance: the sums below read x and y together unchecked
    with pytest.raises(LaunchError, match=r"x's dim 1 \(extent 40\) with y's dim 0 "
                                          r"\(extent 32\)"):
        tg.emulate(permuted_plus, (2,), _random(32, 40), _random(32, 32),
                   np.zeros((32, 32), np.float32))
    with pytest.raises(LaunchError, match=r"x's dim 1 \(extent 30\) with y's dim 1 "
                                          r"\(extent 32\)"):
        tg.emulate(row_plus, (2,), _random(1, 30), _random(32, 32),
                   np.zeros((32, 32), np.float32))
    x, y = _random(32, 32), _random(32, 32)
    out = np.full((32, 32), np.nan, np.float32)
    tg.emulate(permuted_plus, (2,), x, y, out)
    assert np.array_equal(out, x.T + y)
    tg.emulate(row_plus, (2,), x[:1], y, out)
    assert np.array_equal(out, x[:1] + y)
