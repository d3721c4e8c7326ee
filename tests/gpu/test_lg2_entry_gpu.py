"""`tg.log2` on the GPU is the catalogue's `lg2.approx.f32` (`arch.special`): every result
within the entry's documented bound of the exact log2 (2^-22 absolute in [0.5, 2], 2 ulp
elsewhere), zeros, subnormals, infinities, NaN and negatives as torch.log2, and within the
bound of the emulator's value (`pytest -m gpu`; `-s` prints the errors measured)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.arch.special import LG2_APPROX
from tegula.build import emulate

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "arch"))  # the CPU test's kernel
from test_lg2_entry import grid_for, log2_of, random_inputs, special_inputs  # noqa: E402

POISON = 12345.0  # no f32 has a log2 this large


def _on_gpu(x: np.ndarray) -> np.ndarray:
    out = torch.full(x.shape, POISON, device="cuda")
    log2_of[grid_for(x.shape)](torch.from_numpy(x).cuda(), out)
    torch.cuda.synchronize()
    got = out.cpu().numpy()
    assert not (got == POISON).any(), "an element was never written"
    return got


@pytest.mark.parametrize("shape", [(257, 1031), (9, 130)])
def test_lg2_within_its_bound_everywhere(shape):
    x = random_inputs(np.random.default_rng(shape[0]), shape)
    got = _on_gpu(x)
    with np.errstate(all="ignore"):
        exact = np.log2(x.astype(np.float64))
    want_torch = torch.log2(torch.from_numpy(x).cuda()).cpu().numpy()
    # Specials exactly as torch: NaN where torch has NaN, the same infinities.
    assert np.array_equal(np.isnan(got), np.isnan(want_torch))
    inf = np.isinf(want_torch)
    assert np.array_equal(got[inf], want_torch[inf])
    finite = np.isfinite(exact)
    error = np.abs(got[finite].astype(np.float64) - exact[finite])
    bound = LG2_APPROX.error_bound(x)[finite]
    worst = int(np.argmax(error / np.where(bound > 0, bound, 1)))
    near = (x[finite] >= 0.5) & (x[finite] <= 2.0)
    ulps = error[~near] / np.spacing(np.abs(exact[finite][~near]).astype(np.float32))
    print(f"\nlg2.approx.f32 {shape}: max |err| in [0.5, 2] {error[near].max():.3g} "
          f"(bound 2^-22 = {2.0 ** -22:.3g}), max ulp elsewhere {ulps.max():.2f} from the "
          f"exact value (bound 2 from the rounded one); "
          f"equal to the emulator's f32 bits: {np.mean(got == _emulated(x)):.1%}")
    assert (error <= bound).all(), (f"x={x[finite][worst]!r}: got {got[finite][worst]!r}, "
                                    f"exact {exact[finite][worst]!r}, bound {bound[worst]:.3g}")


def _emulated(x: np.ndarray) -> np.ndarray:
    out = np.full(x.shape, POISON, np.float32)
    emulate(log2_of, grid_for(x.shape), x, out)
    return out


def test_subnormal_inputs_are_kept_not_flushed():
    x = np.array([[1e-45, 1e-44, 3e-39, 1.1754942e-38] * 32] * 8, np.float32)
    got = _on_gpu(x)
    exact = np.log2(x.astype(np.float64))
    assert np.isfinite(got).all() and (got <= -126).all()  # log2 of the largest: -126.0
    assert (np.abs(got - exact) <= LG2_APPROX.error_bound(x)).all()


def test_gpu_within_the_bound_of_the_emulator():
    x = random_inputs(np.random.default_rng(5), (40, 300))
    got, emulated = _on_gpu(x), _emulated(x)
    assert np.array_equal(np.isnan(got), np.isnan(emulated))
    finite = np.isfinite(emulated)
    assert np.array_equal(got[~finite & ~np.isnan(got)], emulated[~finite & ~np.isnan(emulated)])
    # The emulator is correctly rounded (half an ulp) and the hardware within the bound.
    slack = LG2_APPROX.error_bound(x)[finite] + np.spacing(np.abs(emulated[finite]))
    assert (np.abs(got[finite].astype(np.float64) - emulated[finite]) <= slack).all()
    assert special_inputs().size < x.size
