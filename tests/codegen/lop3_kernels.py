"""Kernels whose source chains two bitwise ops with constants (the emitter's lop3,
`codegen/lop3.py`), shared by tests/codegen/test_lop3.py and tests/gpu/test_lop3_gpu.py."""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula.dtypes import i32

#: (inner op, its constant, outer op, its constant): the W4A16 mask and magic number, a
#: negative constant, xor, and an op with the constant on the left.
CHAINS = [("and", 0x000F000F, "or", 0x64006400), ("or", -8, "and", 0x7FFF00FF),
          ("xor", 0x5A5A5A5A, "and", 0x00FF00FF), ("and", 0x0F0F0F0F, "xor", -1)]
_NUMPY = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}


def chain_kernel(inner: str, b: int, outer: str, c: int, left: bool = False) -> tg.Kernel:
    """out = (x inner b) outer c on (BM, 4) i32 tiles (`left`: the constants on the
    left of both ops); BM below the 64 threads' worth of rows is a partial tile."""
    ops = {"and": lambda p, q: p & q, "or": lambda p, q: p | q, "xor": lambda p, q: p ^ q}

    @tg.kernel(threads=64)
    def bitwise_chain(x: tg.Tensor[i32], out: tg.Tensor[i32], BM: tg.constexpr = 64):
        a = tg.load(x.tile((BM, 4), (tg.block_id(0), 0)))
        t = ops[inner](b, a) if left else ops[inner](a, b)
        tg.copy(ops[outer](c, t) if left else ops[outer](t, c),
                out.tile((BM, 4), (tg.block_id(0), 0)))

    return bitwise_chain


def chain_reference(x: np.ndarray, inner: str, b: int, outer: str, c: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return _NUMPY[outer](_NUMPY[inner](x, np.int32(np.uint32(b & 0xFFFFFFFF).view(
            np.int32))), np.int32(np.uint32(c & 0xFFFFFFFF).view(np.int32)))


def random_words(rng, rows: int) -> np.ndarray:
    return rng.integers(-2**31, 2**31, (rows, 4), dtype=np.int64).astype(np.int32)
