"""The CUDA of the persistent-kernel scalars (and of sliced views) compiles with NVRTC for sm_80 and sm_90a — the
emulator tests in tests/lang/test_persistent_scalars.py prove the same thread IR right — and
prints what the emulator computes: the user's scalar `//` and `%` through the floor helpers
(C's `/` truncates: -7 / 2 == -3 where the emulator and Python give -4), the grid size from
`gridDim`, the SM count from `%nsmid`, scalar loads through the tensor's strides."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.build import build
from tegula.runtime.compiler import available_compilers, compile_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lang"))
from test_persistent_scalars import (gather_rows, grid_sizes, grid_stride_rows,  # noqa: E402
                                     persistent_pipeline, scalar_ops, segments, visit)

from test_sliced_views import copy_col_slice, copy_row_slice, gemm_first_k  # noqa: E402

KERNELS = [grid_stride_rows, grid_sizes, visit, persistent_pipeline, scalar_ops, segments,
           gather_rows, copy_row_slice, copy_col_slice, gemm_first_k]


@pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler (NVRTC or nvcc)")
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_persistent_scalar_kernels_compile(kernel, target):
    source = build(kernel, {}, target=target).cuda_source()
    assert compile_cuda(source, kernel.name, target)[:4] == b"\x7fELF"


def test_user_scalar_division_has_floor_semantics_in_cuda():
    source = build(scalar_ops, {}).cuda_source()
    assert "tg_floordiv(a, b)" in source and "tg_mod(a, b)" in source
    assert "__device__ __forceinline__ int tg_floordiv" in source  # the helper is defined
    assert "tg_mod(a, (-3))" in source


def test_grid_size_sm_count_and_scalar_loads_are_read_at_run_time():
    source = build(grid_sizes, {}).cuda_source()
    for text in ("(int)gridDim.x", "(int)gridDim.y", "(int)gridDim.z", "%%nsmid"):
        assert text in source
    loads = build(gather_rows, {}).cuda_source()
    assert "((int)index[(1) * index_stride0 + (i0) * index_stride1])" in loads


def test_division_of_known_non_negative_scalars_stays_c_division():
    """cdiv(K, BK) of a tensor extent by a positive constant: floor and C's truncation
    agree, so the README GEMM's loop bounds keep plain `/` (no helper call)."""
    import importlib.util
    path = Path(__file__).resolve().parents[2] / "examples" / "gemm.py"
    spec = importlib.util.spec_from_file_location("gemm_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    source = build(module.gemm, {}, target="sm_80").cuda_source()
    assert "(a_shape1 + 31) / 32" in source
    assert "tg_floordiv" not in source and "tg_mod" not in source
