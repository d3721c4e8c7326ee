"""On an H100: the one-block-per-tile GEMM's decode tiles — matmul's deep-ring wgmma
candidates, and thread-block clusters (`gemm_kernel`'s CLUSTER_M x CLUSTER_N, the a / b
boxes multicast; tests/kernels/test_gemm_decode_clusters.py emulates them) — through
matmul's launch path, against a float64 torch reference: decode shapes and ragged ones
whose tile counts are no multiple of the cluster, one partial k step, a fused bias + GELU,
f16 and bf16, outputs NaN-poisoned, every element checked."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.dtypes import bf16, f16

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_matmul_epilogue_gpu import check, operands, poisoned  # noqa: E402

CONFIGS = {  # matmul's decode candidates on sm_90a (the first four), then clusters
    "64x32-s16": dict(BM=64, BN=32, BK=64, STAGES=16),
    "64x32x128-s6": dict(BM=64, BN=32, BK=128, STAGES=6),
    "64x64-s8": dict(BM=64, BN=64, BK=64, STAGES=8),
    "128x32-s8-t256": dict(BM=128, BN=32, BK=64, STAGES=8, threads=256),
    "64x32-s8-n2": dict(BM=64, BN=32, BK=64, STAGES=8, CLUSTER_N=2),
    "64x64-s4-m2n2": dict(BM=64, BN=64, BK=64, STAGES=4, CLUSTER_M=2, CLUSTER_N=2),
    "128x32-s6-n4-t256": dict(BM=128, BN=32, BK=64, STAGES=6, CLUSTER_N=4, threads=256),
}
#: Decode rows against a weight; ragged N (7 of 8 column tiles of 32); one row; K under
#: one k step; M over one row tile (the M cluster's second block past a's rows).
SHAPES = [(16, 4096, 4096), (64, 1000, 520), (1, 200, 136), (9, 33, 8), (130, 300, 264)]


def launch(dtype, config, a, w, c, activation=None, bias=None):
    from tegula.kernels.api import _gemm_launches

    values = dict(config, kernel="shared")
    threads = values.pop("threads", None)
    epilogue = (activation, None if bias is None else bias.view(1, -1))
    _gemm_launches(dtype, values, threads, a, w, c, epilogue)
    torch.cuda.synchronize()


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_clustered_decode_gemm(m, n, k, config):
    a, w, _ = operands(m, n, k, f16, 7 * m + n + k)
    c = poisoned(m, n, f16)
    launch(f16, CONFIGS[config], a, w, c)
    check(c, a, w, None, None, f16)


@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
def test_clustered_decode_gemm_with_bias_and_gelu(dtype):
    m, n, k = 64, 1000, 520
    a, w, bias = operands(m, n, k, dtype, 11)
    c = poisoned(m, n, dtype)
    launch(dtype, CONFIGS["64x32-s8-n2"], a, w, c, "gelu", bias)
    check(c, a, w, bias, "gelu", dtype)
