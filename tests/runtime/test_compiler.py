"""Source → cubin without a GPU: NVRTC in-process, nvcc as the fallback, readable errors,
and `compile_kernel` through the disk cache."""
from __future__ import annotations

import pytest

from tegula.codegen.samples import vector_copy
from tegula.errors import CompileError
from tegula.runtime import DiskCache, available_compilers, compile_cuda, compile_kernel, launcher
from tegula.runtime.compiler import Compiler, default_compiler, nvcc_arch_flag

KINDS = {c.kind: c for c in available_compilers()}
needs_nvrtc = pytest.mark.skipif("nvrtc" not in KINDS, reason="cuda-bindings / NVRTC not "
                                 "importable (pip install cuda-bindings nvidia-cuda-nvrtc)")
needs_any = pytest.mark.skipif(not KINDS, reason="neither NVRTC nor nvcc found")

GOOD = 'extern "C" __global__ void k(float* p) { p[threadIdx.x] = 1.0f; }\n'
BAD = ('extern "C" __global__ void k(float* p) {\n'
       '  float x = 1.0f;\n'
       '  p[threadIdx.x] = undefined_name + x;\n'
       '}\n')


@needs_nvrtc
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_nvrtc_makes_a_cubin_without_a_gpu(target):
    cubin = compile_cuda(GOOD, "k", target, compiler=KINDS["nvrtc"])
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.skipif("nvcc" not in KINDS, reason="nvcc not found")
def test_nvcc_fallback_makes_a_cubin():
    cubin = compile_cuda(GOOD, "k", "sm_90a", compiler=KINDS["nvcc"])
    assert cubin[:4] == b"\x7fELF"


@needs_any
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_compile_error_quotes_the_offending_line(kind):
    with pytest.raises(CompileError) as info:
        compile_cuda(BAD, "k", "sm_90a", compiler=KINDS[kind])
    text = str(info.value)
    assert "undefined_name" in text
    assert ">>     3 |   p[threadIdx.x] = undefined_name + x;" in text


def test_arch_flag_is_the_explicit_gencode_form():
    assert nvcc_arch_flag("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"
    assert nvcc_arch_flag("sm_80") == "-gencode=arch=compute_80,code=sm_80"
    with pytest.raises(ValueError):
        nvcc_arch_flag("compute_90")


def test_forced_compiler_missing(monkeypatch):
    monkeypatch.setenv("TEGULA_COMPILER", "nope")
    with pytest.raises(CompileError, match="TEGULA_COMPILER=nope"):
        default_compiler()


@needs_any
def test_compile_kernel_uses_both_caches(tmp_path):
    launcher._LOADED.clear()
    cache = DiskCache(tmp_path)
    ck = compile_kernel(vector_copy(), target="sm_90a", cache=cache)
    assert ck.cubin[:4] == b"\x7fELF" and (cache.hits, cache.misses) == (0, 1)
    assert compile_kernel(vector_copy(), target="sm_90a", cache=cache) is ck  # in memory
    launcher._LOADED.clear()
    again = compile_kernel(vector_copy(), target="sm_90a", cache=cache)
    assert again is not ck and again.cubin == ck.cubin and cache.hits == 1
    assert "extern \"C\" __global__" in ck.source and ck.key == again.key
    assert isinstance(default_compiler(), Compiler)
