"""The CUDA side of issue 8's fixes, read from the emitted source and compiled with NVRTC
for sm_80 and sm_90a: the emitter must say what the emulator does.

* a number in `where` is a literal of the values' type (-inf, not `true`);
* max/min (element-wise and every reduction step, warp shuffles included) use the
  NaN-propagating PTX max.NaN/min.NaN, never fmaxf/fminf;
* a replicated global -> shared copy issues cp.async only from the owning thread, and a
  non-zero fill is stored (st.shared) rather than zero-filled.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import tegula as tg
from tegula.build import build
from tegula.codegen import emit_cuda
from tegula.dtypes import f16, f32
from tegula.runtime.compiler import available_compilers, compile_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
from regression_kernels import copy_paths_kernel, minmax_kernel  # noqa: E402

TARGETS = ("sm_80", "sm_90a")
needs_compiler = pytest.mark.skipif(not available_compilers(), reason="no NVRTC or nvcc")


def _source(kernel, target="sm_80", **constexprs) -> str:
    return emit_cuda(build(kernel, constexprs, target=target).thread_kernel, target)


@tg.kernel(threads=64)
def masked(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    t = tg.load(x.tile((8, 16), (0, 0)))
    tg.copy(tg.where(t > 0, t, -float("inf")), y.tile((8, 16), (0, 0)))


def test_where_number_is_a_literal_of_the_value_type():
    src = _source(masked)
    assert "__int_as_float(0xff800000)" in src  # -inf as an f32 literal
    assert not re.search(r"\?[^;:]*:\s*true", src)  # never the bool the condition has


def test_max_and_min_propagate_nan_in_every_reduction_step():
    src = _source(minmax_kernel(f16, (16, 128), 256))
    assert "fmaxf" not in src and "fminf" not in src
    assert "max.NaN.f32" in src and "min.NaN.f32" in src
    # the butterfly shuffles combine through the same helper
    assert "shfl.sync.bfly" in src
    combines = re.findall(r"^\s*r\d+\[\d+\] = .*\bshfl(?:_\d+)?\[0\].*$", src, re.M)
    assert combines and all("tg_max_nan" in c or "tg_min_nan" in c for c in combines)


def test_replicas_do_not_issue_cp_async_and_fills_are_stored():
    src = _source(copy_paths_kernel(f32, (8, 8), 32, -float("inf")))
    lines = src.splitlines()
    asm = [i for i, line in enumerate(lines) if re.search(r"cp\.async\.c[ag]\.shared", line)]
    assert asm
    # every cp.async sits under the owner test (tid / 16 % 2 == 0 for 16 chunks, 32 threads)
    # and copies all 16 bytes (src-size the constant 16, never a zero-filling condition):
    # out-of-bounds vectors take the fill-store branch.
    assert all(lines[i].endswith('"r"(16) : "memory");') for i in asm)
    assert all(lines[i - 2].strip() == "if (tid / 16 % 2 == 0) {" for i in asm)
    assert all(lines[i + 1].strip() == "} else {" and "0xff800000" in lines[i + 2] for i in asm)


def test_integer_arithmetic_wraps_instead_of_overflowing():
    """The emulator wraps i32 + - * (two's complement); C's signed overflow is undefined,
    so the emitter computes them in unsigned arithmetic."""
    from regression_kernels import numbers_kernel
    from tegula.dtypes import i32
    src = _source(numbers_kernel(i32, ("add_right", "sub_left", "mul_right"), (2**31 - 1,)))
    for op in "+-*":
        assert re.search(rf"\(int\)\(\(unsigned\)\([^()]*\) \{op} \(unsigned\)\(", src), op
    assert not re.search(r"r0\[\d\] [-+*] 2147483647", src)


def test_small_tile_gemm_copies_only_from_owners():
    """Issue 8 item 5: 16x32 f16 tiles are 64 cp.async vectors for 128 threads."""
    from tegula.kernels.gemm import gemm_kernel
    src = _source(gemm_kernel(f16), BM=16, BN=64, BK=32, threads=128)
    lines = src.splitlines()
    # a's 16x32 tile has replicas (2 threads per vector), b's 64x32 tile none
    a_copies = [i for i, line in enumerate(lines) if "tile op: copy %a" in line]
    b_copies = [i for i, line in enumerate(lines) if "tile op: copy %b" in line]
    assert len(a_copies) == 3  # two in the pipeline prologue, one in the loop
    assert all(lines[i + 1].strip() == "if (tid / 64 % 2 == 0) {" for i in a_copies)
    assert all(not lines[i + 1].strip().startswith("if (tid") for i in b_copies)


@needs_compiler
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("which", ("masked", "minmax", "copy_paths", "gemm_small",
                                   "numbers_i32", "numbers_bf16", "numbers_f8e4m3",
                                   "shared_to_shared"))
def test_the_regression_kernels_compile(which, target):
    from regression_kernels import number_expressions, numbers_for, numbers_kernel
    from tegula.dtypes import bf16, f8e4m3, i32
    from tegula.kernels.gemm import gemm_kernel
    numbers = {f"numbers_{t}": (numbers_kernel(t, forms, numbers_for(t)[:2]), {})
               for t, forms in ((i32, tuple(number_expressions(i32))),  # INT_MIN literals
                                (bf16, tuple(number_expressions(bf16))),  # -inf, inf
                                # f8 on sm_80 is software conversion: keep it small
                                (f8e4m3, ("where_false", "max_left", "cmp_lt", "full")))}
    from regression_kernels import shared_to_shared_kernel
    numbers["shared_to_shared"] = (shared_to_shared_kernel(f16, (16, 32), 128, True), {})
    kernel, constexprs = {**numbers,
        "masked": (masked, {}), "minmax": (minmax_kernel(f16, (16, 128), 256), {}),
        "copy_paths": (copy_paths_kernel(f32, (8, 8), 32, -float("inf")), {}),
        "gemm_small": (gemm_kernel(f16), dict(BM=16, BN=64, BK=32, threads=128))}[which]
    thread_kernel = build(kernel, constexprs, target=target).thread_kernel
    cubin = compile_cuda(emit_cuda(thread_kernel, target), thread_kernel.name, target)
    assert cubin[:4] == b"\x7fELF"
