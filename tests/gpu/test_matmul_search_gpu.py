"""`tk.matmul` at a shape where the search (`api_matmul.searched_persistent`) takes 128×128
persistent tiles over 128×256 (512×4096×4096: 64 wide tiles for 132 SMs): each of the
search's configurations launched into NaN-poisoned outputs and checked element by element
against a float64 reference, then the entry point itself (which tunes among them)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.dtypes import f16

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_matmul_epilogue_gpu import check, operands, poisoned  # noqa: E402
from test_matmul_persistent_gpu import launch  # noqa: E402

M, N, K = 512, 4096, 4096


def test_each_searched_configuration_is_right():
    from tegula.kernels.api_matmul import searched_persistent
    found = searched_persistent(M, N, K)
    assert [c["BN"] for c in found] == [128, 128]
    a, w, _ = operands(M, N, K, f16, 11)
    for config in found:
        c = poisoned(M, N, f16)
        launch(f16, {k: v for k, v in config.items() if k != "kernel"}, a, w, c)
        check(c, a, w, None, None, f16)


def test_matmul_at_the_searched_shape():
    import tegula.kernels as tk
    a, w, _ = operands(M, N, K, f16, 12)
    for _ in range(2):                       # the first call tunes, the second replays
        c = tk.matmul(a, w.T)
        torch.cuda.synchronize()
        check(c, a, w, None, None, f16)
