"""The `lg2.approx.f32` entry (`arch.special`): `tg.log2` prints it, the emulator computes
through it, the cost model charges it to the special-function unit, and nothing holds a
second copy. Its accuracy on the hardware: tests/gpu/test_lg2_entry_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.arch.catalogue import catalogue, get_instruction
from tegula.arch.special import LG2_APPROX, SpecialFunctionInstr, special_function
from tegula.arch.targets import get_target
from tegula.build import build, emulate
from tegula.codegen.ptx import prelude
from tegula.dtypes import f32
from tegula.runtime.compiler import available_compilers, compile_cuda
from tegula.synth.cost import instruction_uses

TILE = (8, 128)


@tg.kernel(threads=128)
def log2_of(x: tg.Tensor[f32], out: tg.Tensor[f32]):
    where = (tg.block_id(0), tg.block_id(1))
    tg.copy(tg.log2(tg.load(x.tile(TILE, where))), out.tile(TILE, where))


def special_inputs() -> np.ndarray:
    """Zeros, subnormals, the smallest normal, infinities, NaN, negatives, 1 and near it."""
    return np.array([0.0, -0.0, 1e-45, 3e-39, 1.1754942e-38, 1.1754944e-38, np.inf, -np.inf,
                     np.nan, -1.0, -1e-40, 1.0, 1.0000001, 0.99999994, 0.5, 2.0, 3.4e38],
                    dtype=np.float32)


def random_inputs(rng, shape) -> np.ndarray:
    """Random positive f32 values over the whole range (random exponent and mantissa
    bits), a third of them in [0.5, 2] where the bound is absolute, the specials first."""
    bits = rng.integers(0, 0x7F800000, size=shape, dtype=np.int64).astype(np.uint32)
    x = bits.view(np.float32).copy()
    near_one = rng.random(shape) < 0.33
    x[near_one] = rng.uniform(0.5, 2.0, size=int(near_one.sum())).astype(np.float32)
    flat = x.reshape(-1)
    flat[:special_inputs().size] = special_inputs()
    return x


def grid_for(shape) -> tuple[int, int]:
    return (-(-shape[0] // TILE[0]), -(-shape[1] // TILE[1]))


def test_entry_is_in_the_catalogue_with_its_cost():
    assert get_instruction("lg2.approx.f32") is LG2_APPROX and special_function("log2") is LG2_APPROX
    assert special_function("exp") is None
    assert LG2_APPROX.pure and LG2_APPROX.pipe == "sfu"
    for target in ("sm_80", "sm_90a"):
        assert LG2_APPROX in catalogue(target)
        # 16 results a clock per SM: a warp instruction holds the unit 2 SM cycles.
        assert 1 / LG2_APPROX.throughput(get_target(target)) == 2.0


def test_emitter_prints_the_entry_not_log2f():
    source = build(log2_of).cuda_source()
    assert "tg_log2(" in source and "log2f(" not in source
    assert LG2_APPROX.format_asm(d="r", a="x") in prelude({"tg_log2"})
    assert "lg2.approx.f32 %0, %1;" in source and ".ftz" not in source.split("tg_log2")[1][:200]
    if available_compilers():
        assert compile_cuda(source, "log2_of", "sm_90a")[:4] == b"\x7fELF"


def test_emulator_at_an_odd_shape_matches_numpy_and_the_specials():
    rng = np.random.default_rng(11)
    shape = (13, 201)                        # divides neither tile dimension
    x = random_inputs(rng, shape)
    out = np.full(shape, 12345.0, np.float32)  # poison: no log2 of an f32 is this
    emulate(log2_of, grid_for(shape), x, out)
    with np.errstate(all="ignore"):
        want = np.log2(x.astype(np.float64))
    assert not (out == 12345.0).any()
    assert np.array_equal(np.isnan(out), np.isnan(want))
    finite = np.isfinite(want)
    assert np.array_equal(out[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)])
    assert (np.abs(out[finite] - want[finite]) <= LG2_APPROX.error_bound(x)[finite]).all()
    specials = out.reshape(-1)[:special_inputs().size]
    assert specials[0] == -np.inf and specials[1] == -np.inf and specials[6] == np.inf
    assert np.isnan(specials[8]) and np.isnan(specials[9]) and np.isnan(specials[10])
    assert specials[2] == np.float32(-149.0) and np.isfinite(specials[3])  # subnormals kept


def test_emulator_computes_through_the_entry(monkeypatch):
    x = np.full((8, 128), 4.0, np.float32)
    out = np.zeros((8, 128), np.float32)
    monkeypatch.setattr(SpecialFunctionInstr, "execute",
                        lambda self, v: np.full(np.shape(v), 7.0, np.float32))
    emulate(log2_of, (1, 1), x, out)
    assert (out == 7.0).all()


def test_error_bound_is_absolute_near_one_and_two_ulp_from_rounded_elsewhere():
    x = np.array([1.0, 0.5, 2.0, 4.0, 0.25, 1e-40, 0.0, np.inf, np.nan, -3.0])
    bound = LG2_APPROX.error_bound(x)
    assert (bound[:3] == 2.0 ** -22).all()
    assert bound[3] == 2.5 * np.spacing(np.float32(2.0)) and bound[4] == bound[3]
    assert 0 < bound[5] < 1e-4 and (bound[6:] == 0).all()


def test_cost_model_charges_the_entry_to_the_sfu():
    uses = instruction_uses(build(log2_of).traced, get_target("sm_90a"))
    sfu = [u.use for u in uses if u.use.pipe == "sfu"]
    assert [u.instr for u in sfu] == ["lg2.approx.f32"]
    assert sfu[0].pipe_cycles == 2.0
    # ptxas's subnormal scaling (four ALU instructions) is charged beside the MUFU one.
    extra = [u.use for u in uses if u.use.role == "ALU" and u.use.warp_instructions
             == LG2_APPROX.extra_alu * sfu[0].warp_instructions]
    assert len(extra) == 1


@pytest.mark.parametrize("value", [0.0, -0.0, np.inf, -np.inf, np.nan, -2.0])
def test_execute_at_special_inputs(value):
    got = LG2_APPROX.execute(np.float32(value))
    with np.errstate(all="ignore"):
        want = np.log2(np.float64(value))
    assert (np.isnan(got) and np.isnan(want)) or got == want
