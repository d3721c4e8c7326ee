"""Two chained bitwise ops with constants print as one lop3 (`codegen/lop3.py`,
`arch/logic.py`): the entry computes what the two ops compute, the emitter fuses only
while the first op's operand is unchanged, and the W4A16 fragment kernel's dequantization
uses it. tests/gpu/test_lop3_gpu.py holds the GPU to the emulator bit for bit."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.arch.logic import LOP3, lut_of
from tegula.build import build

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lop3_kernels import CHAINS, chain_kernel, chain_reference, random_words  # noqa: E402


@pytest.mark.parametrize("inner", ["and", "or", "xor"])
@pytest.mark.parametrize("outer", ["and", "or", "xor"])
def test_the_entry_computes_the_two_ops(inner, outer):
    rng = np.random.default_rng(len(inner) * 7 + len(outer))
    a = rng.integers(0, 2**32, 10_000, dtype=np.uint64).astype(np.uint32)
    b, c = (int(v) for v in rng.integers(0, 2**32, 2, dtype=np.uint64))
    ops = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}
    want = ops[outer](ops[inner](a, np.uint32(b)), np.uint32(c))
    assert np.array_equal(LOP3.execute(a, b, c, lut_of(inner, outer)), want)


def _body(kernel, **cx) -> str:
    return build(kernel, cx, None, "sm_90a").cuda_source().split('extern "C"')[1]


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("chain", CHAINS, ids=str)
def test_chains_print_as_one_lop3_and_emulate_exactly(chain, left):
    inner, b, outer, c = chain
    kernel = chain_kernel(inner, b, outer, c, left)
    lut = lut_of(inner, outer)
    assert f"tg_lop3<{lut:#x}u, {b & 0xFFFFFFFF:#x}u, {c & 0xFFFFFFFF:#x}u>" in _body(kernel)
    rng = np.random.default_rng(5)
    x = random_words(rng, 150)                       # 150 rows: a partial last tile
    out = np.full_like(x, 7)
    tg.emulate(kernel, (3,), x, out)
    assert np.array_equal(out, chain_reference(x, inner, b, outer, c))


def test_no_lop3_through_an_overwritten_operand():
    """Thread IR `t = a & m; a = ...; y = t | c` must not print y as lop3(new a): a
    write to a's array between the two Assigns forgets the fact, as does the first
    Assign reading its own array (`t = t & m`); without the write it fuses."""
    from tegula.codegen import lop3
    from tegula.dtypes import i32
    from tegula.lower.thread_ir import Assign, Binary, Const, Literal, Reg, RegArray, RegRead
    a, t, y = (RegArray(name, i32, 2) for name in ("a", "t", "y"))
    read = lambda array, i=0: RegRead(Reg(array, Const(i)))  # noqa: E731
    mask = Assign(Reg(t, Const(0)), Binary("and", read(a), Literal(15.0, i32), i32))
    use = Assign(Reg(y, Const(0)), Binary("or", read(t), Literal(16.0, i32), i32))
    write_a = Assign(Reg(a, Const(1)), Literal(3.0, i32))   # another element, same array
    known: dict = {}
    lop3.note(known, mask)
    assert lop3.fused(known, use) == (read(a), lut_of("and", "or"), 15, 16)
    lop3.note(known, write_a)
    assert lop3.fused(known, use) is None
    known.clear()
    lop3.note(known, Assign(Reg(t, Const(0)), Binary("and", read(t), Literal(15.0, i32), i32)))
    assert lop3.fused(known, use) is None


def test_fragment_dequantization_uses_lop3():
    from tegula.dtypes import f16
    from tegula.kernels.quant_fragment import w4a16_fragment_kernel
    body = _body(w4a16_fragment_kernel(f16, True), G=128, BT=16, STAGES=3, KS=2)
    assert "tg_lop3<0xeau, 0xf000fu, 0x64006400u>" in body
