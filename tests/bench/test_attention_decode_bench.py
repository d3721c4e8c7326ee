"""The attention_decode bench's helpers on the CPU (the suite itself needs a GPU): the paged
layout it times holds the same keys as the contiguous cache, its reference is attention,
and it refuses cleanly without torch."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tegula.bench import attention_decode as bench


def test_paged_layout_holds_the_cache():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    k, v = torch.randn(2, 3, 2 * bench.PAGE, 8), torch.randn(2, 3, 2 * bench.PAGE, 8)
    pool_k, pool_v, table = bench.page_cache(torch, k, v)
    assert table.dtype == torch.int32 and sorted(table.flatten().tolist()) == [0, 1, 2, 3]
    for b in range(2):
        for i in range(2):
            keys = slice(i * bench.PAGE, (i + 1) * bench.PAGE)
            assert torch.equal(pool_k[table[b, i]], k[b, :, keys])
            assert torch.equal(pool_v[table[b, i]], v[b, :, keys])


def test_reference_is_grouped_attention():
    torch = pytest.importorskip("torch")
    torch.manual_seed(1)
    q, k, v = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 40, 16), torch.randn(2, 2, 40, 16)
    want = torch.softmax(q @ k.repeat_interleave(2, 1).transpose(2, 3) / 4.0, -1) @ \
        v.repeat_interleave(2, 1)
    assert np.allclose(bench.reference(torch, q, k, v).numpy(), want.numpy(), atol=1e-6)


def test_refuses_cleanly_without_torch():
    script = ("import sys\nsys.modules['torch'] = None\nsys.modules['triton'] = None\n"
              "from tegula.bench.attention_decode import main\nsys.exit(main(['--quick']))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "needs a CUDA GPU" in done.stderr
    assert "Traceback" not in done.stderr
