"""On the GPU: two chained bitwise ops with constants, printed as one lop3
(`codegen/lop3.py`), give the emulator's bits (and numpy's), into poisoned outputs."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

import tegula as tg  # noqa: E402
from tegula.dtypes import i32  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from gpu_helpers import poison, to_device, values_of  # noqa: E402
from lop3_kernels import CHAINS, chain_kernel, chain_reference, random_words  # noqa: E402


@pytest.mark.parametrize("left", [False, True])
@pytest.mark.parametrize("chain", CHAINS, ids=str)
def test_lop3_chains_match_the_emulator(chain, left):
    kernel = chain_kernel(*chain, left)
    x = random_words(np.random.default_rng(11), 150)   # a partial last tile
    out_dev = poison(to_device(np.zeros_like(x), i32))
    kernel[(3,)](to_device(x, i32), out_dev)
    torch.cuda.synchronize()
    emulated = np.zeros_like(x)
    tg.emulate(kernel, (3,), x, emulated)
    assert np.array_equal(values_of(out_dev, i32), emulated)
    assert np.array_equal(emulated, chain_reference(x, *chain))
