"""The scan layout (`synth/scan.py: scan_plan`) against its contract, read off the layout's
table for many shapes: every element held; each thread's registers `r·k … r·k + k-1` are
`k` consecutive elements of one row along the axis; the `n` threads of a row are
consecutive thread indices in axis order (so lanes, then warps); threads take the other
dims first; replicas only where the extents leave threads over. The carry layout (a
scan's initial and carry) puts each row's element where the row's runs are."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.layout.tv import tv_coords
from tegula.synth.scan import carry_layout, scan_plan

CASES = [((4, 64), 1, 128), ((4, 64), 0, 128), ((1, 1024), 1, 128), ((9, 100), 1, 128),
         ((2, 5), 1, 128), ((64, 96), 1, 128), ((1, 2048), 1, 256), ((16, 8, 32), 2, 128),
         ((16, 8, 32), 0, 128), ((3, 11, 20), 1, 64), ((37,), 0, 64), ((7, 33), 1, 96)]


@pytest.mark.parametrize("shape,axis,threads", CASES)
def test_scan_plan_contract(shape, axis, threads):
    plan = scan_plan(shape, axis, threads)
    assert plan.n & (plan.n - 1) == 0 and plan.n * plan.k == shape[axis]
    assert plan.layout[0].size == threads
    coords = tv_coords(plan.layout, shape)                    # (threads, values, dims)
    held = {tuple(c) for c in coords.reshape(-1, len(shape))}
    assert len(held) == int(np.prod(shape))                   # every element, none outside
    others = [d for d in range(len(shape)) if d != axis]
    for r in range(plan.rows):
        run = coords[:, r * plan.k:(r + 1) * plan.k]          # (threads, k, dims)
        # one row per run, consecutive along the axis
        assert np.all(run[:, :, others] == run[:, :1, others])
        assert np.all(np.diff(run[:, :, axis], axis=1) == 1)
        starts = run[:, 0, axis]
        # thread t's run starts at (t mod n)·k: a row's threads are consecutive, in order
        np.testing.assert_array_equal(starts, (np.arange(threads) % plan.n) * plan.k)


def test_threads_go_to_the_rows_first():
    """A (16, 8, 32) tile on 128 threads: one row per thread, each scanning all its 32
    steps in registers (no shuffle); the selective scan's (8 channels, 256 steps) chunk:
    one channel per 16 lanes, 16 steps each."""
    plan = scan_plan((16, 8, 32), 2, 128)
    assert (plan.n, plan.k, plan.rows) == (1, 32, 1)
    assert "whole rows of 32 element(s) in registers" in plan.describe()
    chunk = scan_plan((8, 256), 1, 128)
    assert (chunk.n, chunk.k, chunk.rows) == (16, 16, 1)
    wide = scan_plan((1, 2048), 1, 256)
    assert (wide.n, wide.k) == (256, 8) and "8 warps of 32 lanes" in wide.describe()


@pytest.mark.parametrize("shape,axis,threads", CASES)
def test_carry_layout_sits_with_the_rows_runs(shape, axis, threads):
    """Register r of every thread of the carry is the element of the row its run r scans
    (whatever its position along the axis): the carry needs no data movement to fold in."""
    plan = scan_plan(shape, axis, threads)
    collapsed = tuple(1 if d == axis else e for d, e in enumerate(shape))
    layout = carry_layout(shape, axis, threads)
    assert layout[0].size == threads and layout[1].size == plan.rows
    carry = tv_coords(layout, collapsed)                      # (threads, rows, dims)
    runs = tv_coords(plan.layout, shape)
    others = [d for d in range(len(shape)) if d != axis]
    assert np.all(carry[:, :, axis] == 0)
    for r in range(plan.rows):
        np.testing.assert_array_equal(carry[:, r][:, others], runs[:, r * plan.k][:, others])
