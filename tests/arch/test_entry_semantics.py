"""What the conversion, 16-bit arithmetic and atomic-add entries compute (`convert` /
`execute`, issue 9 §1: one entry per instruction, read by the emitter *and* the emulator):
against torch's CPU conversions and arithmetic as an independent reference, on random
values over each type's range plus ties, subnormals, ±0, ±inf and NaN; and the emulator
computes through them (change an entry and the emulator's results change)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.arch.convert import (CONVERT_INSTRUCTIONS, ConvertInstr, HalfArithInstr,
                                 half_arithmetic, rounding_to)
from tegula.arch.memory import RED_ADD, RedAddInstr
from tegula.dtypes import bf16, f8e4m3, f8e5m2, f16, f32
from tegula.emulate import round_to
from tegula.errors import TegulaError

torch = pytest.importorskip("torch")
TORCH = {f16: torch.float16, bf16: torch.bfloat16, f8e4m3: torch.float8_e4m3fn,
         f8e5m2: torch.float8_e5m2, f32: torch.float32}
MAX = {f16: 65504.0, bf16: 3.3895314e38, f8e4m3: 448.0, f8e5m2: 57344.0}


def hard_f32(rng, n: int, top: float) -> np.ndarray:
    """n float32 values: random magnitudes from far below to past `top` (log-uniform),
    both signs, halfway points between neighbours of f16 (ties for every shorter type),
    and the edges."""
    with np.errstate(over="ignore"):
        x = (rng.choice([-1.0, 1.0], n) * np.exp2(rng.uniform(-30, np.log2(top) + 2, n))
             ).astype(np.float32)
    grid = rng.standard_normal(n // 4).astype(np.float16).astype(np.float64)
    spacing = np.abs(np.spacing(grid.astype(np.float16))).astype(np.float64)
    x[: n // 4] = (grid + spacing / 2).astype(np.float32)  # exact ties in f32
    edges = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 6e-8, 448.0,
                      464.0, 480.0, 57344.0, 61440.0, 65504.0, 65520.0], np.float32)
    x[-len(edges):] = edges
    return x


def torch_round(x: np.ndarray, dt) -> np.ndarray:
    return torch.from_numpy(x).to(TORCH[dt]).float().numpy()


@pytest.mark.parametrize("dt", [f16, bf16, f8e4m3, f8e5m2], ids=str)
def test_rounding_entries_match_torch(dt):
    x = hard_f32(np.random.default_rng(len(dt.name)), 20000, MAX[dt])
    got = rounding_to(dt).convert(x).astype(np.float32)
    ref = torch_round(x, dt)
    # torch's e5m2 keeps infinities and overflows to inf; the satfinite entry saturates.
    beyond = np.abs(x) > MAX[dt]
    if dt in (f8e4m3, f8e5m2):
        ref = np.where(beyond & ~np.isnan(x), np.copysign(MAX[dt], x), ref)
    np.testing.assert_array_equal(got, ref)
    number = ~np.isnan(ref)  # (torch's NaNs are canonical; the entries keep the sign)
    assert np.array_equal(np.signbit(got)[number], np.signbit(ref)[number])  # -0 stays -0


def test_widening_conversions_are_exact():
    every_f16 = np.arange(65536, dtype=np.uint16).view(np.float16)
    got = next(i for i in CONVERT_INSTRUCTIONS if i.name == "cvt.f32.f16").convert(every_f16)
    np.testing.assert_array_equal(got, every_f16.astype(np.float32))
    assert got.dtype == np.float32
    for ptx, dt in (("cvt.rn.f16x2.e4m3x2", f8e4m3), ("cvt.rn.f16x2.e5m2x2", f8e5m2)):
        entry = next(i for i in CONVERT_INSTRUCTIONS if i.name == ptx)
        values = round_to(np.linspace(-MAX[dt], MAX[dt], 5001, dtype=np.float32), dt)
        np.testing.assert_array_equal(entry.convert(values).astype(np.float32), values)


@pytest.mark.parametrize("dt", [f16, bf16], ids=str)
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_half_arithmetic_matches_torch(dt, op):
    rng = np.random.default_rng(7)
    a, b = (round_to(hard_f32(rng, 4000, 256.0), dt) for _ in range(2))
    fn = {"add": torch.add, "sub": torch.sub, "mul": torch.mul}[op]
    ref = fn(*(torch.from_numpy(np.asarray(v, np.float32)).to(TORCH[dt]) for v in (a, b)))
    for pair in (False, True):
        entry = half_arithmetic(op, dt, pair)
        assert isinstance(entry, HalfArithInstr) and entry.to == dt
        np.testing.assert_array_equal(entry.execute(a, b).astype(np.float32),
                                      ref.float().numpy())


@pytest.mark.parametrize("name", sorted(RED_ADD))
def test_atomic_add_entries_match_torch(name):
    entry = RED_ADD[name]
    assert isinstance(entry, RedAddInstr) and entry.dtype.name == name
    rng = np.random.default_rng(11)
    if name == "i32":
        old = rng.integers(-2**31, 2**31, 5000, dtype=np.int64).astype(np.int32)
        v = rng.integers(-2**31, 2**31, 5000, dtype=np.int64).astype(np.int32)
        ref = (torch.from_numpy(old) + torch.from_numpy(v)).numpy()  # wraps around
    else:
        old, v = (round_to(hard_f32(rng, 5000, 1e4), entry.dtype) for _ in range(2))
        # Subnormal operands and sums (f32's below 2^-126; f16's below 2^-14).
        tiny = 1e-38 if name in ("f32", "bf16") else 3e-5
        old[:500], v[:500] = (round_to(rng.standard_normal(500) * tiny, entry.dtype)
                              for _ in range(2))
        operands = [torch.from_numpy(np.asarray(x, np.float32)).to(TORCH[entry.dtype])
                    for x in (old, v)]
        if name == "f32":  # red.global.add.f32 flushes subnormal inputs and results
            operands = [flush(x) for x in operands]
        ref = (operands[0] + operands[1]).to(TORCH[entry.dtype])
        ref = (flush(ref) if name == "f32" else ref).float().numpy()
    got = entry.execute(old, v)
    np.testing.assert_array_equal(np.asarray(got, ref.dtype), ref)
    number = ~np.isnan(ref)
    assert np.array_equal(np.signbit(np.asarray(got, ref.dtype))[number], np.signbit(ref)[number])


def flush(t):
    """A torch f32 tensor with subnormals replaced by zeros of their sign."""
    subnormal = (t.abs() < torch.finfo(torch.float32).tiny) & (t != 0)
    return torch.where(subnormal, torch.copysign(torch.zeros_like(t), t), t)


def test_f32_atomic_add_flushes_subnormals_as_the_h100_does():
    """Measured on the H100 (session 10 round 1, red.global.add.f32): a subnormal addend
    leaves a normal value as it was, two subnormals give a zero of their sign."""
    entry = RED_ADD["f32"]
    got = entry.execute(np.float32([1.5095104e-38, -9.215631e-39, 3e-39]),
                        np.float32([9.49258e-40, -6.512791e-39, -3e-39]))
    np.testing.assert_array_equal(got, np.float32([1.5095104e-38, -0.0, 0.0]))
    assert list(np.signbit(got)) == [False, True, False]
    assert not RED_ADD["f16"].flushes_subnormals and not RED_ADD["bf16"].flushes_subnormals


def test_rounding_to_a_type_without_an_entry_is_refused():
    with pytest.raises(TegulaError, match="no conversion from f32 to i8"):
        rounding_to(tg.i8)


# ------------------------------------------------------------ the emulator reads them

@tg.kernel
def _half_ops(x: tg.Tensor[bf16], y: tg.Tensor[bf16], s: tg.Tensor[bf16],
              acc: tg.Tensor[bf16]):
    a = tg.load(x.tile((4, 32), (0, 0)))
    b = tg.load(y.tile((4, 32), (0, 0)))
    tg.copy(a + b, s.tile((4, 32), (0, 0)))
    tg.atomic_add(a, acc.tile((4, 32), (0, 0)))


def test_emulator_computes_through_the_entries(monkeypatch):
    rng = np.random.default_rng(5)
    x, y = (round_to(rng.standard_normal((4, 32)).astype(np.float32), bf16) for _ in range(2))
    acc0 = round_to(rng.standard_normal((4, 32)).astype(np.float32), bf16)

    def run():
        s, acc = np.full((4, 32), 99.0, np.float32), acc0.copy()
        tg.emulate(_half_ops, (1,), x, y, s, acc)
        return s, acc

    s, acc = run()
    np.testing.assert_array_equal(s, half_arithmetic("add", bf16).execute(x, y))
    np.testing.assert_array_equal(acc, RED_ADD["bf16"].execute(acc0, x))
    # Change the entries: the emulator's sums, atomics and roundings follow them.
    monkeypatch.setattr(HalfArithInstr, "execute", lambda self, a, b: np.full(
        np.broadcast(a, b).shape, 3.0, np.float32))
    monkeypatch.setattr(RedAddInstr, "execute", lambda self, old, v: np.full(
        np.shape(old), -5.0, np.float32))
    s, acc = run()
    assert (s == 3.0).all() and (acc == -5.0).all()
    monkeypatch.setattr(ConvertInstr, "convert", lambda self, v: np.full(
        np.shape(v), 0.5, np.float32))
    assert (round_to(np.float32([1.0, 7.0]), bf16) == 0.5).all()


def test_duplicate_atomic_adds_apply_one_after_another():
    """Several values for one element in one instruction add in order, each rounded:
    bf16's 256 + 1 + 1 ... stays 256 (each 1 is half an ulp, a tie to even)."""
    from tegula.emulate.memory import GlobalTensor
    t = GlobalTensor("t", bf16, np.float32([256.0, 0.0, 1.0]))
    offs = np.array([0, 0, 0, 1, 2, 0, 1])
    vals = np.float32([1.0, 1.0, 1.0, 0.25, 2.0, 1.0, 0.5])
    t.atomic_add(offs, vals)
    expect = np.float32([256.0, 0.0, 1.0])
    for o, v in zip(offs, vals):
        expect[o] = RED_ADD["bf16"].execute(expect[o], v)
    np.testing.assert_array_equal(t.load(np.arange(3)), expect)
    assert expect[0] == 256.0 and expect[1] == 0.75
