"""Integer `//` and `%` on tiles follow torch.floor_divide / torch.remainder (floor, the
remainder takes the divisor's sign), with tiles, numbers and kernel scalars on either side,
in place, and in masks (`col % 2 == 0`); x // 0 == -1 and x % 0 == x; results wrap to the
type. Float tiles and a literal zero divisor are TraceErrors at the user's line; the CUDA
compiles (its helpers are checked against the emulator on the GPU in tests/gpu)."""
from __future__ import annotations

import re
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import f16, f32, i8, i32
from tegula.runtime.compiler import available_compilers, compile_cuda

sys.path.insert(0, str(Path(__file__).resolve().parent))
from division_kernels import (CASES, CONFIGS, FORMS, division_case, negation_inputs,  # noqa: E402
                              negation_kernel, negation_reference)


@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype,number,s", CASES, ids=str)
def test_floor_division_and_remainder_match_torch(dtype, number, s, config):
    pytest.importorskip("torch")  # the reference is torch's floor_divide / remainder
    shape, threads, BM, BN = config
    rng = np.random.default_rng(zlib.crc32(f"{dtype}{number}{s}{config}".encode()))
    kernel, grid, x, y, out, scalars, constexprs, ref = division_case(
        rng, dtype, number, s, shape, threads, BM, BN)
    tg.emulate(kernel, grid, x, y, out, *scalars, **constexprs)
    rows = out.shape[0] // len(FORMS)
    for i, form in enumerate(FORMS):
        got, want = out[i * rows:(i + 1) * rows], ref[i * rows:(i + 1) * rows]
        bad = np.argwhere(got != want)
        assert bad.size == 0, f"{dtype} {form}: first wrong at {bad[0].tolist()}, " \
                              f"got {got[tuple(bad[0])]}, want {want[tuple(bad[0])]}"


def test_negative_and_zero_divisors_by_hand():
    """The rules written out (independent of torch): floor, divisor's sign, 0 and -1."""
    @tg.kernel(threads=32)
    def divide(x: tg.Tensor[i32, 1], y: tg.Tensor[i32, 1], q: tg.Tensor[i32, 1],
               r: tg.Tensor[i32, 1], t: tg.Tensor[i32, 1]):
        a, b = tg.load(x.tile((8,), (0,))), tg.load(y.tile((8,), (0,)))
        tg.copy(a // b, q.tile((8,), (0,)))
        tg.copy(a % b, r.tile((8,), (0,)))
        tg.copy(a / b, t.tile((8,), (0,)))

    x = np.array([-7, 7, -7, 7, 5, -5, -2**31, -2**31], np.int32)
    y = np.array([2, -2, -2, 2, 0, 0, -1, 1], np.int32)
    q, r, t = np.zeros(8, np.int32), np.zeros(8, np.int32), np.zeros(8, np.int32)
    tg.emulate(divide, (1,), x, y, q, r, t)
    assert q.tolist() == [-4, -4, 3, 3, -1, -1, -2**31, -2**31]
    assert r.tolist() == [1, -1, -1, 1, 5, -5, 0, 0]
    assert t.tolist() == [-3, -3, 3, 3, -1, -1, -2**31, -2**31]  # `/` truncates, as C


def _kernel(dtype, body):
    @tg.kernel(threads=64)
    def k(x: tg.Tensor[dtype], y: tg.Tensor[dtype]):
        body(tg.load(x.tile((8, 8), (0, 0))), y)
    return k


@pytest.mark.parametrize("dtype", (f32, f16), ids=str)
def test_float_floor_division_is_a_clear_error(dtype):
    with pytest.raises(tg.TraceError, match=r"// is defined on integer tiles only.*" + str(dtype)):
        _kernel(dtype, lambda t, y: t // 2).trace()
    only_ints = rf"% is defined on integer tiles only.*{dtype}"
    with pytest.raises(tg.TraceError, match=only_ints) as info:
        _kernel(dtype, lambda t, y: 3 % t).trace()
    assert "3 % t" in info.value.loc.line  # the user's line


def test_a_literal_zero_divisor_is_a_clear_error():
    with pytest.raises(tg.TraceError, match="divisor is the number 0"):
        _kernel(i32, lambda t, y: t % 0).trace()
    _kernel(i32, lambda t, y: 0 % t).trace()  # a zero dividend is fine


@pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler installed")
@pytest.mark.parametrize("dtype,number,s", CASES[1:], ids=str)
def test_division_kernels_compile(dtype, number, s):
    case = division_case(np.random.default_rng(0), dtype, number, s, (5, 7), 32, 4, 8)
    kernel, constexprs = case[0], case[6]
    source = build(kernel, constexprs, target="sm_90a").cuda_source()
    # C's / and % by 0 or of INT_MIN by -1 are undefined: every division goes to a helper
    assert "tg_floordiv(" in source and "tg_mod(" in source and "tg_div(" in source
    values = re.findall(r"^\s*r\d+\[\d+\] = ([^;]*);", source, re.M)
    assert values and not [v for v in values if re.search(r"[/%]", v)]
    assert compile_cuda(source, kernel.name, "sm_90a")[:4] == b"\x7fELF"


@pytest.mark.parametrize("dtype", (i32, i8), ids=str)
def test_negation_and_abs_wrap(dtype):
    """-INT_MIN == INT_MIN (and -(-128) == -128 in i8): the emulator wraps, and the CUDA
    negates through unsigned arithmetic, since C's signed -INT_MIN is undefined."""
    x = negation_inputs(dtype)
    out = np.zeros(24, x.dtype)
    kernel = negation_kernel(dtype)
    tg.emulate(kernel, (1,), x, out)
    assert out.tolist() == negation_reference(x, dtype).tolist()
    assert out[0] == x[0] and out[8] == x[0]  # the type's minimum is its own negation
    source = build(kernel, {}, target="sm_90a").cuda_source()
    values = re.findall(r"^\s*r\d+\[\d+\] = ([^;]*);", source, re.M)
    assert not [v for v in values if re.search(r"(?<![\w)])-\s*\(?r\d", v)], values
    if available_compilers():
        assert compile_cuda(source, kernel.name, "sm_90a")[:4] == b"\x7fELF"
