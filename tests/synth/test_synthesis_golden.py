"""Synthesis decisions that must hold (golden tests): vector widths, MMA layouts, swizzles
free of bank conflicts (checked three ways: synthesis's own plans, the emulator's count,
and the F2 optimal swizzle), determinism, and the register-only GEMM dataflow."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.arch.catalogue import get_mma
from tegula.build import build, emulate
from tegula.ir.ops import Copy, Gemm, walk_ops
from tegula.ir.printer import format_kernel
from tegula.ir.values import GlobalTile, RegisterTile, SharedTile
from tegula.layout.cute import Layout
from tegula.layout.cute_bridge import linear_from_cute, linear_from_cute_tv
from tegula.layout.optimal_swizzle import optimal_swizzle, swizzle_cost
from tegula.layout.tv import tv_table
from tegula.synth.cost import op_uses
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemm_fixtures import readme_gemm  # noqa: E402

# Power-of-two GEMM tiles (BM, BN, BK) the golden checks run over.
TILES = [(128, 128, 32), (64, 64, 32), (128, 128, 64), (64, 128, 64)]


def make_gemm() -> tg.Kernel:
    """A fresh DESIGN.md GEMM (a new Kernel object, so nothing is cached between builds)."""
    return readme_gemm()


GEMM = make_gemm()


def gemm_build(bm: int, bn: int, bk: int):
    # The mma.sync path: on sm_90a this gemm is a wgmma (tests/synth/test_hopper_decision.py).
    return build(GEMM, {"BM": bm, "BN": bn, "BK": bk}, None, "sm_80")


def ops_of(b, kind) -> list:
    return [op for op in walk_ops(b.traced.body) if isinstance(op, kind)]


def global_to_shared(b) -> list[Copy]:
    return [op for op in ops_of(b, Copy)
            if isinstance(op.src, GlobalTile) and isinstance(op.dst, SharedTile)]


# --------------------------------------------------------------------------- vector widths

@pytest.mark.parametrize("tiles", TILES)
def test_k_major_f16_tiles_go_to_shared_memory_in_16_byte_cp_async(tiles):
    b = gemm_build(*tiles)
    copies = global_to_shared(b)
    assert len(copies) == 2
    for op in copies:
        assert op.choices["instr"] == "cp.async"
        assert op.choices["vector"] * 2 == 16
        assert op.choices["dim"] == 1                       # along K, the contiguous dim
        assert op.choices["dst_shared"].vector == 8         # the shared side keeps 16 B
        (use,) = op_uses(op, b.traced, b.target)
        assert use.instr == "cp.async.cg.shared.global.16"
        assert (use.thread_bytes, use.warp_bytes) == (16, 512)


# --------------------------------------------------------------------------- MMA layouts

@pytest.mark.parametrize("tiles", TILES)
def test_accumulator_gets_the_mma_fragment_layout(tiles):
    """Every warp's 16x8 fragments of C hold exactly the PTX m16n8k16 mapping: value i of
    lane l is (groupID + 8*(i//2), 2*tig + i%2) from the fragment's origin, the origin is
    fragment-aligned and shared by the warp, and the tile is covered once."""
    bm, bn, _ = tiles
    b = gemm_build(*tiles)
    (gemm,) = ops_of(b, Gemm)
    atom = get_mma("mma.m16n8k16.f32.f16.f16.f32")
    assert gemm.choices["plan"].atom == atom
    acc = gemm.c
    table = tv_table(acc.layout)                            # threads x values -> m + BM*n
    assert sorted(table.ravel()) == list(range(bm * bn))    # a bijection onto the tile
    m, n = table % bm, table // bm
    lanes = np.arange(32)
    atom_table = tv_table(atom.c_tv)                        # the catalogue's own entry
    origins = set()
    for w in range(table.shape[0] // 32):
        for g in range(table.shape[1] // 4):                # value group g = one fragment
            fm = m[32 * w:32 * w + 32, 4 * g:4 * g + 4]
            fn = n[32 * w:32 * w + 32, 4 * g:4 * g + 4]
            m0, n0 = int(fm.min()), int(fn.min())
            assert m0 % 16 == 0 and n0 % 8 == 0
            origins.add((m0, n0))
            for i in range(4):
                assert np.array_equal(fm[:, i] - m0, lanes // 4 + 8 * (i // 2))
                assert np.array_equal(fn[:, i] - n0, 2 * (lanes % 4) + i % 2)
                assert np.array_equal((fm[:, i] - m0) + 16 * (fn[:, i] - n0), atom_table[:, i])
    assert len(origins) == (bm // 16) * (bn // 8)           # every fragment once


# --------------------------------------------------------------------------- bank conflicts

@pytest.mark.parametrize("tiles", TILES)
def test_synthesized_plans_are_conflict_free(tiles):
    b = gemm_build(*tiles)
    (gemm,) = ops_of(b, Gemm)
    for role in ("a", "b"):
        plan = gemm.choices[f"{role}_shared"]
        assert plan.instr == "ldmatrix" and plan.ldmatrix_num == 4
        assert plan.conflicts == 0
    for op in global_to_shared(b):
        assert op.choices["dst_shared"].conflicts == 0


def test_emulator_counts_no_ldmatrix_conflicts():
    """Run the 128x128x32 GEMM in the emulator and read its bank-conflict report."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((128, 64)).astype(np.float16)
    bt = rng.standard_normal((128, 64)).astype(np.float16)
    c = np.zeros((128, 128), dtype=np.float16)
    report = emulate(GEMM, (1, 1), a, bt, c, BM=128, BN=128, BK=32, target="sm_80")
    ldmatrix = report.kind("LdMatrix")
    assert ldmatrix.count > 0 and ldmatrix.wavefronts > 0
    assert ldmatrix.bank_conflicts == 0
    assert report.kind("CpAsync").bank_conflicts == 0
    expected = a.astype(np.float32) @ bt.astype(np.float32).T
    assert np.abs(c.astype(np.float32) - expected).max() < 0.1


def ldmatrix_rows(rows: int, cols: int) -> Layout:
    """ldmatrix's address pattern over a (rows, cols) f16 tile, cols contiguous, as a TV
    layout: each lane reads one 8-element row (its registers); lanes 0-7 take 8
    consecutive rows (one phase, one 8x8 matrix), lane bits 3-4 the other matrices (m+8,
    k+8), warps 16-row bands; values repeat over the rest of the tile."""
    return Layout(((8, 2, 2, 4), (8, rows // 64, cols // 16)),
                  ((1, 8, 8 * rows, 16), (rows, 64, 16 * rows)))


@pytest.mark.parametrize("tiles", TILES)
def test_synthesized_swizzle_matches_the_f2_optimal_swizzle(tiles):
    """Scored by the F2 bank model (tegula.layout.optimal_swizzle) for the cp.async
    writer and ldmatrix reader, the synthesized (enumerated) swizzle is as good as the
    F2-optimal one: both 16-byte vectors, both conflict-free; an unswizzled layout is not."""
    b = gemm_build(*tiles)
    for op in global_to_shared(b):
        alloc = op.dst.alloc
        rows, cols = shape = tuple(alloc.shape)
        reader = linear_from_cute_tv(ldmatrix_rows(rows, cols), shape)
        writer = linear_from_cute_tv(op.choices["tv"], shape)
        dims, offsets = [("dim0", rows), ("dim1", cols)], [("offset", rows * cols)]
        synthesized = linear_from_cute(alloc.layout, dims, offsets).invert()
        best = swizzle_cost(optimal_swizzle(reader, writer, 2), reader, writer, 2)
        ours = swizzle_cost(synthesized, reader, writer, 2)
        assert ours == best
        assert ours.vec_elems == 8
        assert ours.read_wavefronts == ours.write_wavefronts == ours.ideal_wavefronts
        plain = linear_from_cute(Layout(shape, (cols, 1)), dims, offsets).invert()
        assert swizzle_cost(plain, reader, writer, 2).read_wavefronts > ours.ideal_wavefronts


# --------------------------------------------------------------------------- determinism

def decisions(b) -> tuple:
    """Everything synthesis decided, as text."""
    reasons = tuple(b.synthesis.reasons[t.id] for t in b.traced.register_tiles
                    if t.id in b.synthesis.reasons)
    return format_kernel(b.traced), reasons, b.thread_kernel.shared_bytes


@pytest.mark.parametrize("tiles", TILES[:2])
def test_synthesis_is_deterministic(tiles):
    bm, bn, bk = tiles
    first = build(make_gemm(), {"BM": bm, "BN": bn, "BK": bk})
    second = build(make_gemm(), {"BM": bm, "BN": bn, "BK": bk})
    assert first is not second
    assert decisions(first) == decisions(second)


# --------------------------------------------------------------------------- register dataflow

@tg.kernel(threads=128)
def gemm_in_registers(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                      BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    for k in tg.range(ga.shape[2]):
        ra = tg.load(ga[:, :, k])
        rb = tg.load(gb[:, :, k])
        tg.gemm(acc, ra, rb)
    tg.copy(acc, c.tile((BM, BN), (m, n)))


def same_function(x: Layout, y: Layout) -> bool:
    return np.array_equal(tv_table(x), tv_table(y))


def test_register_operands_anchor_on_the_mma_layouts():
    """Operands copied from global straight into registers get the MMA's A/B layouts (no
    conversion), the loads read them in those layouts, and the result is right."""
    b = build(gemm_in_registers)
    (gemm,) = ops_of(b, Gemm)
    plan = gemm.choices["plan"]
    assert isinstance(gemm.a, RegisterTile) and isinstance(gemm.b, RegisterTile)
    assert same_function(gemm.a.layout, plan.a_tv) and same_function(gemm.b.layout, plan.b_tv)
    assert same_function(gemm.c.layout, plan.c_tv)
    assert b.synthesis.conversions == []
    assert "operand of mma.m16n8k16" in b.synthesis.reasons[gemm.a.id]
    loads = [op for op in ops_of(b, Copy) if isinstance(op.dst, RegisterTile)]
    assert {id(op.dst) for op in loads} == {id(gemm.a), id(gemm.b)}
    for op in loads:
        assert op.choices["instr"] == "ld.global"
        assert op.choices["vector"] == 2          # the fragment's pairs of consecutive k
    rng = np.random.default_rng(2)
    a = rng.standard_normal((70, 96)).astype(np.float16)
    bt = rng.standard_normal((50, 96)).astype(np.float16)
    c = np.zeros((70, 50), dtype=np.float32)
    emulate(gemm_in_registers, (2, 1), a, bt, c)
    expected = a.astype(np.float32) @ bt.astype(np.float32).T
    assert np.abs(c - expected).max() < 1e-2
