"""`prefetch.tensormap` in the GEMM kernels on sm_90a (`lower/hopper.py: finish_async`):
thread 0 prefetches every TMA descriptor of the kernel at its start, before the mbarrier
inits, so the producer's first TMA copy does not wait for the descriptor's fetch. The
thread IR issues one prefetch per tensor map from thread 0 in the kernel's setup; the SASS
holds one UTMACCTL.PF per map ahead of the first UTMALDG (persistent, staged, decode
kernels); a kernel with no TMA has none; the emulated kernels stay right (a hint, no
memory effect). At the block's exit thread 0 waits for its TMA stores only until they
have read shared memory (`wait_group.read 0`; their global writes complete with the
kernel), and the emulator, which lands them at the block's end, finds the results right."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tegula.build import build
from tegula.dtypes import f16
from tegula.kernels.gemm import (gemm_emulated, gemm_kernel, persistent_gemm_kernel,
                                 staged_gemm_kernel)
from tegula.lower.async_ir import MBarrierInit, PrefetchTensorMap, TmaLoad
from tegula.lower.thread_ir import TID, If, walk

sys.path.insert(0, os.path.dirname(__file__))
from test_gemm import check_gemm  # noqa: E402

#: (kernel, config): the persistent kernel in 2-block clusters, one block per tile with
#: TMA stores, and a decode tile (TMA loads, register stores).
KERNELS = {
    "persistent": (persistent_gemm_kernel, dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=8,
                                                CLUSTER=2, threads=256)),
    "staged": (staged_gemm_kernel, dict(BM=128, BN=256, BK=64, STAGES=4, threads=256)),
    "decode": (gemm_kernel, dict(BM=64, BN=32, BK=128, STAGES=6)),
}


def _built(name: str, target: str = "sm_90a"):
    factory, config = KERNELS[name]
    return build(factory(f16), config, None, target)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_thread_zero_prefetches_every_tensor_map_before_the_barrier_inits(name):
    tk = _built(name).thread_kernel
    maps = {p.name for p in tk.params if type(p).__name__ == "TensorMapParam"}
    assert maps and maps == {s.tensor_map for s in walk(tk.body) if isinstance(s, TmaLoad)} \
        | ({"c_tmap"} if name != "decode" else set())
    # (coordinate Lets of `tid` may come first: no statement of the setup before it)
    first = next(s for s in tk.body if isinstance(s, If))
    assert first.cond == TID.eq(0)
    prefetched = first.then[:len(maps)]  # thread 0's branch of the inits, first
    assert all(isinstance(s, PrefetchTensorMap) for s in prefetched)
    assert [s.tensor_map for s in prefetched] == sorted(maps, key=[
        p.name for p in tk.params].index)
    order = [type(s) for s in walk(tk.body) if isinstance(s, (PrefetchTensorMap, MBarrierInit))]
    assert order.index(MBarrierInit) == len(maps)  # every prefetch before the first init


def test_no_tma_no_prefetch():
    tk = _built("decode", "sm_80").thread_kernel
    assert not any(isinstance(s, PrefetchTensorMap) for s in walk(tk.body))


@pytest.mark.parametrize("name", ["persistent", "decode"])  # (staged: the same setup path)
def test_sass_prefetches_each_descriptor_before_the_first_tma_load(name):
    from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble
    if not available_compilers():
        pytest.skip("neither NVRTC nor nvcc found")
    built = _built(name)
    sass = disassemble(compile_cuda(built.cuda_source(), built.thread_kernel.name, "sm_90a"))
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    lines = [line for line in sass.splitlines() if "UTMACCTL.PF" in line or "UTMALDG" in line]
    maps = sum(type(p).__name__ == "TensorMapParam" for p in built.thread_kernel.params)
    assert [("PF" in line) for line in lines[:maps]] == [True] * maps
    assert sum("UTMACCTL.PF" in line for line in lines) == maps


@pytest.mark.parametrize("persistent", [0, 3])
def test_emulated_kernels_with_the_prefetch_are_right(persistent):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((97, 72)).astype(np.float16)
    b = rng.standard_normal((130, 72)).astype(np.float16)
    tiles = dict(BM=64, BN=64, BK=32, STAGES=2) if persistent else dict(BM=64, BN=32, BK=16,
                                                                         STAGES=2)
    c = gemm_emulated(a, b, persistent=persistent, staged=not persistent, **tiles)
    check_gemm(c, a, b, f16)


@pytest.mark.parametrize("name", ["persistent", "staged"])
def test_the_block_exits_once_its_stores_have_read_shared_memory(name):
    source = _built(name).cuda_source()
    tail = source[source.rindex("cp.async.bulk.commit_group;"):]
    assert "cp.async.bulk.wait_group.read 0;" in tail
    assert "cp.async.bulk.wait_group 0;" not in tail
