"""Every way a Python number meets a tile prints a C literal of the operation's exact type,
and the CUDA compiles — for every element type, with each integer type's extreme values.

The first GPU run found `max(r0[0], -2147483648)` rejected by NVRTC: in C, `-2147483648`
is unary minus applied to the *long* 2147483648, so `max(int, long)` is ambiguous (and in
arithmetic it would silently widen to 64 bits). NVRTC runs here without a GPU, so this
class is caught on the CPU: the number-forms kernels of tests/lower/regression_kernels.py
(+ - * with the number on either side, max/min, comparisons, where, fill, full, bitwise,
/ and ** for floats) and the integer reductions, whose identities are the type limits.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tegula.build import build
from tegula.codegen.expr import CodegenError, float_literal, int_literal
from tegula.dtypes import i8, i32, u8
from tegula.runtime.compiler import available_compilers, compile_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from regression_kernels import (ALL_TYPES, INT_TYPES, minmax_kernel,  # noqa: E402
                                number_expressions, numbers_for, numbers_kernel)

needs_compiler = pytest.mark.skipif(not available_compilers(),
                                    reason="no CUDA compiler (NVRTC or nvcc) installed")

#: Each integer type's limits (the values a wrong literal type gets wrong), plus -1.
EXTREMES = {i32: (-2**31, 2**31 - 1, -2**31 + 1, -1), i8: (-128, 127, -1), u8: (0, 255)}


def numbers_of(dtype) -> tuple:
    """The regression numbers of `dtype`, and for integer types its extreme values."""
    values = list(numbers_for(dtype))
    values += [v for v in EXTREMES.get(dtype, ()) if v not in values]
    return tuple(values)


def source_of(dtype, target: str = "sm_90a") -> tuple[str, str]:
    """The kernel's CUDA without comment lines (which quote the numbers as written). One
    element per thread keeps NVRTC fast: the class is in the printing, not in the count."""
    kernel = numbers_kernel(dtype, tuple(number_expressions(dtype)), numbers_of(dtype),
                            (4, 8), 32)
    source = build(kernel, {}, target=target).cuda_source()
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("//"))
    return code, kernel.name


def test_int_literals_are_ints():
    assert int_literal(-2**31) == "(-2147483647 - 1)"
    assert int_literal(2**31 - 1) == "2147483647"
    assert int_literal(-7) == "(-7)"
    assert int_literal(255) == "255"
    with pytest.raises(CodegenError, match="does not fit"):
        int_literal(2**31)
    assert float_literal(-2.5) == "(-2.5f)"  # so `-` before it never prints "--2.5f"


@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
def test_no_integer_literal_is_wider_than_int(dtype):
    """Runs without a compiler: no literal that C would type as long (|v| >= 2^31), and no
    negative literal that is not parenthesized."""
    source, _ = source_of(dtype)
    assert not re.search(r"(?<![\w.])2147483648(?![\w.])", source)
    assert not re.search(r"[-+*/,(?:] *--", source)


@needs_compiler
@pytest.mark.parametrize("dtype", ALL_TYPES, ids=str)
def test_every_form_of_number_compiles(dtype):
    source, name = source_of(dtype)
    assert compile_cuda(source, name, "sm_90a")[:4] == b"\x7fELF"


@needs_compiler
@pytest.mark.parametrize("dtype", INT_TYPES, ids=str)
def test_integer_max_min_reductions_compile(dtype):
    """Reductions start from the type's limits (INT_MIN for an i32 max)."""
    kernel = minmax_kernel(dtype, (8, 32), 64)
    source = build(kernel, {}, target="sm_90a").cuda_source()
    assert compile_cuda(source, kernel.name, "sm_90a")[:4] == b"\x7fELF"
