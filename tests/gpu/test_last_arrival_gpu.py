"""`tg.last_arrival` on the GPU (catalogue entries atom.acq_rel.gpu.global.inc.u32 and
bar.red.or.pred): many rows of many split blocks, each storing a partial sum, the last
block of a row adding them in order, into NaN-poisoned outputs; launched repeatedly on the
same counters (they must be back at 0 after every launch), against numpy and bit for bit
against the emulator."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lang"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_helpers import poison  # noqa: E402
from test_last_arrival import split_sum  # noqa: E402


@pytest.mark.parametrize("rows,splits", [(300, 33), (7, 1), (1, 128)])
def test_split_sums_merged_by_the_last_block(rows, splits):
    import tegula as tg
    from tegula.build import launch
    rng = np.random.default_rng(rows + splits)
    x = rng.standard_normal((rows, splits * 64)).astype(np.float32)
    part_em = np.full((rows, splits), np.nan, np.float32)
    out_em = np.full((rows,), np.nan, np.float32)
    emulated = rows * splits <= 300                # (the 300 x 33 grid is slow on the CPU)
    if emulated:
        tg.emulate(split_sum, (splits, rows), x, part_em, out_em, np.zeros(rows, np.int32),
                   BN=64, S=splits)
    xd = torch.from_numpy(x).cuda()
    counters = torch.zeros(rows, dtype=torch.int32, device="cuda")
    expected = x.astype(np.float64).reshape(rows, splits, 64).sum(-1).sum(-1)
    for _ in range(3):                          # the counters wrap back to 0 each launch
        part = poison(torch.empty(rows, splits, device="cuda"))
        out = poison(torch.empty(rows, device="cuda"))
        launch(split_sum, (splits, rows), xd, part, out, counters, BN=64, S=splits)
        torch.cuda.synchronize()
        got = out.cpu().numpy()
        assert not np.isnan(got).any(), f"{int(np.isnan(got).sum())} rows never merged"
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-3)
        assert int(counters.abs().sum()) == 0, "a counter was not wrapped back to 0"
        if emulated:
            np.testing.assert_array_equal(got, out_em)  # the same order of additions


def test_a_counter_not_zeroed_traps_instead_of_leaving_the_output_unwritten():
    """A counter holding count or more makes thread 0 trap: a launch error, not a row that
    silently no block merges. Run in a subprocess: a trap ruins the CUDA context."""
    import subprocess
    code = (
        "import sys, torch; sys.path.insert(0, %r); "
        "from test_last_arrival import split_sum; from tegula.build import launch; "
        "x = torch.randn(2, 4 * 64, device='cuda'); "
        "part = torch.empty(2, 4, device='cuda'); out = torch.empty(2, device='cuda'); "
        "c = torch.tensor([0, 7], dtype=torch.int32, device='cuda'); "
        "launch(split_sum, (4, 2), x, part, out, c, BN=64, S=4); torch.cuda.synchronize()"
        % str(Path(__file__).resolve().parents[1] / "lang"))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0, "the launch with a bad counter did not fail"
    assert "launch failure" in done.stderr.lower() or "error" in done.stderr.lower()
