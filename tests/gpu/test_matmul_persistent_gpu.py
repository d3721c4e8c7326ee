"""The library's persistent GEMM (the default of `tegula.kernels.matmul` on sm_90a for
shapes that fill the GPU) and split-K at decode shapes on the GPU, against a float64 torch
reference: the tuner's configurations and small ones (more tiles than SMs, fewer, every
stage count 2–5), ragged shapes, every fused epilogue, f16 and bf16, outputs NaN-poisoned,
every element checked; then `tk.matmul` with only the persistent kernel to choose, first
call and replays."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.dtypes import bf16, f16

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_matmul_epilogue_gpu import ACTIVATIONS, check, operands, poisoned  # noqa: E402

CONFIGS = {
    "128x256x64-s4": dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=8, threads=256),
    "128x128x64-s4": dict(BM=128, BN=128, BK=64, STAGES=4, GROUP=8, threads=256),
    "64x64x32-s2": dict(BM=64, BN=64, BK=32, STAGES=2, GROUP=3),
    "64x128x64-s5": dict(BM=64, BN=128, BK=64, STAGES=5, GROUP=1),
}
#: Ragged everywhere; one row; K < one k-tile; more tiles than SMs (2000² in 64×64 is
#: 1024 tiles); a whole number of 128×256 tiles.
SHAPES = [(257, 129, 72), (1, 300, 64), (70, 50, 24), (2000, 2000, 136), (512, 1024, 256)]


def launch(dtype, config, a, w, c, activation=None, bias=None):
    from tegula.kernels.api import _gemm_launches

    values = dict(config, kernel="persistent")
    threads = values.pop("threads", None)
    epilogue = (activation, None if bias is None else bias.view(1, -1))
    _gemm_launches(dtype, values, threads, a, w, c, epilogue)
    torch.cuda.synchronize()


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_persistent_plain_f16(m, n, k, config):
    a, w, _ = operands(m, n, k, f16, m + 3 * n + k)
    c = poisoned(m, n, f16)
    launch(f16, CONFIGS[config], a, w, c)
    check(c, a, w, None, None, f16)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("m,n,k", SHAPES[:3] + [(1000, 700, 200)])
def test_persistent_with_bias_and_activation(m, n, k, dtype, activation):
    a, w, bias = operands(m, n, k, dtype, 5 * m + n)
    for name in ("128x256x64-s4", "64x64x32-s2"):
        c = poisoned(m, n, dtype)
        launch(dtype, CONFIGS[name], a, w, c, activation, bias)
        check(c, a, w, bias, activation, dtype)


@pytest.mark.parametrize("split", [2, 4, 8])
@pytest.mark.parametrize("tiles", [dict(BM=16, BN=128, BK=64, STAGES=4),
                                   dict(BM=64, BN=128, BK=64, STAGES=4)], ids=["16", "64"])
@pytest.mark.parametrize("m,n,k", [(16, 4096, 4096), (64, 1000, 14336), (100, 520, 1000),
                                   (1, 130, 4100)])
def test_split_k_at_decode_shapes(m, n, k, tiles, split):
    """Split-K with the epilogue in its reduction (summed in split order: deterministic,
    so two runs agree bit for bit)."""
    from tegula.kernels.api import _gemm_launches

    a, w, bias = operands(m, n, k, bf16, m + k + split)
    results = []
    for _ in range(2):
        c = poisoned(m, n, bf16)
        _gemm_launches(bf16, dict(tiles, kernel="shared", SPLIT=split), None, a, w, c,
                       ("silu", bias.view(1, n)))
        torch.cuda.synchronize()
        check(c, a, w, bias, "silu", bf16)
        results.append(c)
    assert torch.equal(results[0].view(torch.int16), results[1].view(torch.int16))


def test_entry_point_with_only_the_persistent_kernel(monkeypatch):
    import tegula.kernels as tk
    import tegula.kernels.api as api
    from tegula.runtime.autotune import Config

    config = (Config.of(dict(CONFIGS["128x256x64-s4"], kernel="persistent", B="view")),)
    monkeypatch.setattr(api, "_configs", lambda family, *bucket: config)
    monkeypatch.setattr(api, "_REPLAYS", {})
    for call in range(3):  # first call, then replays on fresh data
        a, w, bias = operands(1000, 1500, 320, f16, call)
        c = tk.matmul(a, w.T, bias, "gelu")
        torch.cuda.synchronize()
        check(c, a, w, bias, "gelu", f16)
