"""`tegula bench gemm` names what Triton's autotuners picked per shape (issue 10 compares
tegula's tiles with Triton's where Triton comes close)."""
from types import SimpleNamespace

from tegula.bench.gemm import triton_picks


def test_the_picks_are_listed_per_kernel_and_shape():
    def config(bm, bn, bk, stages, warps):
        return SimpleNamespace(kwargs=dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8),
                               num_stages=stages, num_warps=warps)
    kernels = SimpleNamespace(
        _matmul_kernel=SimpleNamespace(cache={(16, 4096, 4096, "x"): config(16, 128, 128, 4, 4)}),
        _matmul_tma_persistent_kernel=SimpleNamespace(cache={
            (4096, 14336, 4096, True): config(128, 256, 64, 4, 8)}))
    assert triton_picks(kernels) == [
        "Triton picked at 16x4096x4096: 16x128x128, 4 stages, 4 warps",
        "Triton TMA picked at 4096x14336x4096: 128x256x64, 4 stages, 8 warps"]
    assert triton_picks(SimpleNamespace()) == []
