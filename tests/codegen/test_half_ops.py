"""16-bit float element ops in their own type (`codegen/expr.py`: `_half`, `_half_pair`):
+ - * of two f16 (bf16) values print as one `add/sub/mul.rn.f16` (two neighbours as one
`.f16x2` op), a narrow integer converts to f16/bf16 by its magic number, and register
copies copy bits. Why the results cannot change: one correctly rounded 16-bit operation
equals the emulator's f32 operation rounded once (checked here against exact arithmetic)
and the magic-number conversion is exact for every value (checked here for all of them);
tests/gpu/test_half_ops_gpu.py holds the GPU to the emulator bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import bf16, f16, f32, i4, i8, u4, u8
from tegula.build import build
from tegula.codegen.expr import _HALF_MAGIC
from tegula.runtime.compiler import available_compilers, compile_cuda_report


def _bf16_round(x: np.ndarray) -> np.ndarray:
    """float64 -> the nearest bf16 value (ties to even; subnormals; inf past the largest
    finite value), as float64."""
    _, exp = np.frexp(x)                             # |x| = m * 2^exp, 0.5 <= m < 1
    quantum = np.ldexp(1.0, np.maximum(exp - 8, -133))   # 8 significant bits
    with np.errstate(invalid="ignore"):
        rounded = np.round(x / quantum) * quantum        # np.round: ties to even
    return np.where(np.abs(rounded) >= 2.0 ** 128, np.copysign(np.inf, x), rounded)


def _as_float64(bits: np.ndarray, dtype: str) -> np.ndarray:
    """16-bit patterns (uint32 holding 0..65535) -> their f16 / bf16 values as float64."""
    if dtype == "f16":
        return bits.astype(np.uint16).view(np.float16).astype(np.float64)
    return (bits << 16).astype(np.uint32).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_one_16_bit_op_equals_the_f32_op_rounded_once(op, dtype):
    """Double rounding is innocuous here (24 >= 2p + 2): for random pairs of 16-bit
    values (every exponent, subnormals included), exact result rounded once == f32
    result rounded again — what lets the emitter use add/sub/mul.rn.f16/bf16."""
    rng = np.random.default_rng(3)
    bits = rng.integers(0, 1 << 16, (2, 200_000), dtype=np.uint32)
    with np.errstate(invalid="ignore"):          # NaN bit patterns
        x, y = (_as_float64(b, dtype) for b in bits)
    keep = np.isfinite(x) & np.isfinite(y)   # (NaN and inf propagate alike either way)
    x, y = x[keep], y[keep]
    fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op]
    exact = fn(x, y)                            # exact in float64 for 16-bit operands
    with np.errstate(over="ignore", under="ignore"):
        via_f32 = fn(x.astype(np.float32), y.astype(np.float32)).astype(np.float64)
        if dtype == "f16":
            once, twice = exact.astype(np.float16), via_f32.astype(np.float16)
        else:
            once, twice = _bf16_round(exact), _bf16_round(via_f32)
    assert np.array_equal(once, twice, equal_nan=True)


@pytest.mark.parametrize("src,dst", sorted(_HALF_MAGIC), ids=str)
def test_magic_number_conversion_is_exact_for_every_value(src, dst):
    """bits(magic + v) - magic == v for every value of the narrow type (the emitter's
    conversion), computed in the 16-bit type's own rounding (exact, so any rounding)."""
    magic = _HALF_MAGIC[(src, dst)]
    lo, hi = {"u4": (0, 15), "i4": (-8, 7), "u8": (0, 255), "i8": (-128, 127)}[dst]
    v = np.arange(lo, hi + 1)
    got = (_as_float64(np.array(magic + v, np.uint32), src)
           - _as_float64(np.array([magic], np.uint32), src))
    assert np.array_equal(got, v)


@tg.kernel(threads=128)
def half_arith(x: tg.Tensor[f16], y: tg.Tensor[f16], q: tg.Tensor[u4], out: tg.Tensor[f16]):
    a = tg.load(x.tile((128, 8), (0, 0)))
    b = tg.load(y.tile((128, 8), (0, 0)))
    w = tg.load(q.tile((128, 8), (0, 0)))
    tg.copy((w.to(f16) - b) * a + a, out.tile((128, 8), (0, 0)))


def _source(kernel, target="sm_90a", **cx) -> str:
    return build(kernel, cx, None, target).cuda_source()


def test_f16_arithmetic_prints_16_bit_ops_in_pairs():
    body = _source(half_arith).split('extern "C"')[1]
    for helper in ("tg_f16x2_sub(", "tg_f16x2_mul(", "tg_f16x2_add("):
        assert helper in body
    assert "tg_f16_to_f32(" not in body and "tg_f32_to_f16(" not in body
    assert "8388608.0f" not in body          # no f32 magic-number conversion
    assert "0x64006400u" in body             # both halves' magic number at once


@tg.kernel(threads=64)
def mixed_types(x: tg.Tensor[f16], y: tg.Tensor[f32], out: tg.Tensor[f16]):
    a = tg.load(x.tile((64, 4), (0, 0)))
    b = tg.load(y.tile((64, 4), (0, 0)))
    tg.copy((a.to(f32) * b).to(f16) + a, out.tile((64, 4), (0, 0)))


def test_mixed_type_ops_keep_the_f32_route():
    body = _source(mixed_types).split('extern "C"')[1]
    assert "tg_f16_to_f32(" in body           # the f32 product
    assert "tg_f16x2_add(" in body or "tg_f16_add(" in body


@pytest.mark.skipif(not available_compilers(), reason="needs NVRTC or nvcc")
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("narrow", [u4, i4, u8, i8], ids=str)
def test_half_helpers_compile(dtype, narrow, target):
    """Every helper (f16 and bf16, one and two at a time, the sm_80 fallback of bf16)
    and every magic conversion compiles."""
    @tg.kernel(threads=64)
    def kernel(x: tg.Tensor[dtype], q: tg.Tensor[narrow], out: tg.Tensor[dtype]):
        a = tg.load(x.tile((64, 2), (0, 0)))
        w = tg.load(q.tile((64, 2), (0, 0)))
        tg.copy((w.to(dtype) - a) * a + a, out.tile((64, 2), (0, 0)))

    result = build(kernel, {}, None, target)
    compile_cuda_report(result.cuda_source(), result.thread_kernel.name, result.target.sm)


@tg.kernel(threads=64)
def shifts(x: tg.Tensor[tg.i32], out: tg.Tensor[tg.i32]):
    a = tg.load(x.tile((64, 2), (0, 0)))
    tg.copy(a // 256 + a % 16 + a // 3, out.tile((64, 2), (0, 0)))


def test_floor_division_by_a_power_of_two_is_a_shift_and_a_mask():
    """x // 2^k is x >> k and x % 2^k is x & (2^k - 1) for every int (two's complement
    floor semantics; tests/emulate/division_kernels.py has negative cases, held to the
    GPU by tests/gpu/test_floor_division_gpu.py); other divisors keep the helpers."""
    body = _source(shifts).split('extern "C"')[1]
    assert " >> 8)" in body and " & 15)" in body and "tg_floordiv(" in body
