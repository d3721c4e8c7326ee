"""Packed 4-bit tensors in the cost model: two elements share a byte, so a u4 tile moves
half as many bytes as it has elements (the model used to count a byte per element, which
doubled packed tensors' predicted traffic and picked instructions twice as wide)."""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula.arch.catalogue import get_instruction
from tegula.build import build
from tegula.dtypes import u4
from tegula.recommend import shapes_of
from tegula.synth.cost import estimate, instruction_uses

BM, BN = 64, 96                     # 96 u4 elements per row: 48 bytes


@tg.kernel(threads=128)
def copy_u4(x: tg.Tensor[u4, 2], y: tg.Tensor[u4, 2], BM: tg.constexpr = BM,
            BN: tg.constexpr = BN):
    m = tg.block_id(0)
    s = tg.shared((BM, BN), u4)
    tg.copy(x.tile((BM, BN), (m, 0)), s)
    tg.copy(s, y.tile((BM, BN), (m, 0)))


def test_a_u4_tile_moves_half_a_byte_per_element():
    built = build(copy_u4, {}, None, "sm_90a")
    uses = [c.use for c in instruction_uses(built.traced, built.target)]
    loads = [u for u in uses if u.role == "G2S"]
    stores = [u for u in uses if u.role == "R2G"]
    assert loads and stores
    for u in loads + stores:
        assert u.global_bytes == BM * BN // 2
    for u in loads + stores + [u for u in uses if u.role == "S2R"]:
        assert u.thread_bytes * 2 == u.vector        # a vector of u4 is vector/2 bytes
        assert get_instruction(u.instr).nbytes == u.thread_bytes, u


def test_the_grid_reads_each_packed_byte_once():
    rows = 1000                                      # not a multiple of BM: 16 blocks
    shapes = {"x": (rows, BN), "y": (rows, BN)}
    blocks = -(-rows // BM)
    cost = estimate(build(copy_u4, {}, None, "sm_90a"), (blocks,), shapes)
    assert cost.global_bytes == 2 * BM * BN // 2      # one tile in, one out, per block
    footprint = 2 * rows * BN // 2
    assert cost.dram_bytes == min(blocks * BM * BN, footprint)


def test_recommend_reads_a_packed_arrays_shape_in_elements():
    storage = np.zeros((rows := 200, BN // 2), np.uint8)   # BN u4 elements per row
    shapes, _ = shapes_of(copy_u4, (storage, (rows, BN)), None)
    assert shapes == {"x": (rows, BN), "y": (rows, BN)}
