"""A descending tg.range on the GPU (it emitted a loop that never ran: outputs left
unwritten), against the emulator, outputs poisoned."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lang"))
from test_range_steps import every_other_down, reverse_rows  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("rows", [1, 2, 7, 300])
def test_descending_range_on_the_gpu(rows):
    import torch
    x = torch.randn(rows, 32, device="cuda")
    y = torch.full_like(x, float("nan"))
    reverse_rows[(1,)](x, y)
    torch.cuda.synchronize()
    assert torch.equal(y, x.flip(0))


@pytest.mark.parametrize("start,stop", [(6, 0), (6, -1), (5, 0)])
def test_constant_negative_step_on_the_gpu(start, stop):
    import torch
    visits = list(range(start, stop, -2))
    x = torch.randn(8, 32, device="cuda")
    y = torch.full((len(visits), 32), float("nan"), device="cuda")
    every_other_down[(1,)](x, y, START=start, STOP=stop)
    torch.cuda.synchronize()
    assert torch.equal(y, x[visits])
