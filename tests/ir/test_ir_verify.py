"""The tile IR verifier accepts traced kernels and rejects broken IR, naming the op's line."""
from __future__ import annotations

import pytest

import tegula as tg
from tegula import f16, f32
from tegula.errors import TegulaError
from tegula.ir.ops import Copy, Elementwise, ForLoop, Gemm, IfThen
from tegula.ir.scalar import LoopIndex
from tegula.ir.values import RegisterTile, SharedTile
from tegula.ir.verify import verify


@tg.kernel(threads=128)
def gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
         BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=2)
    sb = tg.shared((BN, BK), f16, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=2):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])
        with tg.if_(k > 0):
            acc *= 1.0
    tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


def fresh():
    t = gemm.trace_fresh()
    verify(t)  # the unbroken kernel is valid
    return t


def rejects(t, *words: str) -> None:
    with pytest.raises(TegulaError) as info:
        verify(t)
    text = str(info.value)
    for w in words:
        assert w in text, (w, text)
    assert __file__ in text  # the offending op's source line


def test_unregistered_register_tile():
    t = fresh()
    t.register_tiles.pop(0)
    rejects(t, "register_tiles", "Fill")


def test_read_before_write():
    t = fresh()
    t.body.pop(0)  # the Fill of the accumulator
    rejects(t, "read before any op writes it", "Gemm")


def test_loop_index_outside_its_loop():
    t = fresh()
    loop = t.body[1]
    t.body.insert(2, loop.body[0])  # a copy naming the loop index, now after the loop
    rejects(t, "loop index", "outside its loop")


def test_shapes_and_scopes_of_ops():
    t = fresh()
    loop = t.body[1]
    copy_a = loop.body[0]
    loop.body[0] = Copy(src=copy_a.src, dst=loop.body[1].dst, loc=copy_a.loc)
    verify(t)  # same shape (64x32 both) is fine ...
    loop.body[0] = Copy(src=copy_a.src, dst=copy_a.src, loc=copy_a.loc)
    rejects(t, "global to global")

    t = fresh()
    mma = t.body[1].body[2]
    t.body[1].body[2] = Gemm(c=mma.c, a=mma.a, b=t.body[1].body[0].src, loc=mma.loc)
    rejects(t, "shared memory or registers")


def test_bad_elementwise_and_shared_views():
    t = fresh()
    cast = t.body[2]
    cast.op = "frobnicate"
    rejects(t, "unknown element-wise op")

    t = fresh()
    cast = t.body[2]
    t.body[2] = Elementwise(op="add", inputs=[cast.inputs[0]], out=cast.out, loc=cast.loc)
    rejects(t, "takes 2 operands")

    t = fresh()
    copy_a = t.body[1].body[0]
    dst: SharedTile = copy_a.dst
    copy_a.dst = SharedTile(dtype=dst.dtype, shape=dst.shape, name="bad", loc=None,
                            alloc=dst.alloc, stage=dst.stage, permutation=(0, 0))
    rejects(t, "not a permutation")


def test_conditions_and_loops_are_checked():
    t = fresh()
    branch: IfThen = t.body[1].body[3]
    branch.cond = True
    rejects(t, "not a Condition")

    t = fresh()
    loop: ForLoop = t.body[1]
    loop.step = 0
    rejects(t, "nonzero")

    t = fresh()
    t.body[1].var = LoopIndex("other")
    rejects(t, "outside its loop")


def test_duplicate_registration():
    t = fresh()
    t.register_tiles.append(t.register_tiles[0])
    with pytest.raises(TegulaError, match="registered twice"):
        verify(t)


def test_a_register_tile_of_symbolic_shape_is_rejected():
    t = fresh()
    acc: RegisterTile = t.register_tiles[0]
    acc.shape = (acc.shape[0], t.body[1].stop)
    rejects(t, "static positive shape")
