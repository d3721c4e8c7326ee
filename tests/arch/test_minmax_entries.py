"""The NaN-propagating max/min entries (`arch.minmax`): one entry holds the PTX the emitter
prints, what the emulator computes and the cost, and nothing else holds a second copy."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.arch.catalogue import catalogue, get_instruction
from tegula.arch.minmax import MINMAX_INSTRUCTIONS, NanMinMaxInstr, nan_minmax
from tegula.codegen.ptx import prelude
from tegula.dtypes import f32
from tegula.errors import TegulaError


def _nan_inf_operands(rng, shape=(37, 19)):
    a = rng.standard_normal(shape).astype(np.float32) * 8
    b = rng.standard_normal(shape).astype(np.float32) * 8
    a[rng.random(shape) < 0.15] = np.nan
    b[rng.random(shape) < 0.15] = np.nan
    a[rng.random(shape) < 0.05] = np.inf
    b[rng.random(shape) < 0.05] = -np.inf
    b[0, :] = -0.0
    return a, b


@pytest.mark.parametrize("op", ["max", "min"])
def test_execute_is_torch_maximum_minimum(op):
    torch = pytest.importorskip("torch")  # only this test needs it; the rest run without torch
    a, b = _nan_inf_operands(np.random.default_rng(7))
    got = nan_minmax(op).execute(a, b)
    want = (torch.maximum if op == "max" else torch.minimum)(torch.from_numpy(a),
                                                             torch.from_numpy(b)).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)  # NaN where either operand is NaN
    assert np.isnan(got).sum() == (np.isnan(a) | np.isnan(b)).sum()


def test_entries_are_in_the_catalogue_with_their_cost():
    for instr in MINMAX_INSTRUCTIONS:
        assert get_instruction(instr.name) is instr and instr.pure and instr.pipe == "alu"
        assert instr.timing(None) == (1.0, 4.0) and instr.min_cc == 80
        assert instr in catalogue("sm_80") and instr in catalogue("sm_90a")
    with pytest.raises(TegulaError, match="no NaN-propagating f32 'abs'"):
        nan_minmax("abs")


def test_helpers_print_the_entries():
    source = prelude({"tg_max_nan", "tg_min_nan"})
    for op in ("max", "min"):
        assert nan_minmax(op).format_asm(d="r", a="a", b="b") in source
    assert source.count("asm(") == 2 and "fmaxf" not in source


@tg.kernel(threads=64)
def _elementwise(x: tg.Tensor[f32], y: tg.Tensor[f32], hi: tg.Tensor[f32],
                 lo: tg.Tensor[f32], rmax: tg.Tensor[f32]):
    t = tg.load(x.tile((8, 24), (0, 0)))
    u = tg.load(y.tile((8, 24), (0, 0)))
    tg.copy(tg.maximum(t, u), hi.tile((8, 24), (0, 0)))
    tg.copy(tg.minimum(t, u), lo.tile((8, 24), (0, 0)))
    tg.copy(tg.max(t, 1), rmax.tile((8, 1), (0, 0)))


def _emulate(a, b):
    outs = [np.full((8, 24), 1234.5, np.float32) for _ in range(2)] + [
        np.full((8, 1), 1234.5, np.float32)]
    tg.emulate(_elementwise, (1,), a, b, *outs)
    return outs


def test_emulator_computes_through_the_entry(monkeypatch):
    a, b = _nan_inf_operands(np.random.default_rng(3), (8, 24))
    hi, lo, rmax = _emulate(a, b)
    np.testing.assert_array_equal(hi, nan_minmax("max").execute(a, b))
    np.testing.assert_array_equal(lo, nan_minmax("min").execute(a, b))
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(rmax, a.max(1, keepdims=True))
    # The emulator has no max/min of its own: change the entry and its results change.
    monkeypatch.setattr(NanMinMaxInstr, "execute", lambda self, x, y: np.full(
        np.broadcast(x, y).shape, 7.0 if self.op == "max" else -7.0, np.float32))
    hi, lo, rmax = _emulate(a, b)
    assert (hi == 7.0).all() and (lo == -7.0).all() and (rmax == 7.0).all()
