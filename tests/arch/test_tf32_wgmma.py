"""tf32 wgmma entries (`wgmma.m64n{N}k8.f32.tf32.tf32`): f32 data multiplied as tf32,
checked on the CPU against the PTX ISA's fragment formula and the truncation model
(`truncate_to_tf32`: the low 13 mantissa bits dropped) re-derived here from the bits."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.arch import get_target, mma_accumulators
from tegula.arch.instructions import tv_table
from tegula.arch.wgmma import WGMMA_INSTRUCTIONS, WGMMA_N, get_wgmma, truncate_to_tf32, wgmma_for
from tegula.dtypes import f32
from tegula.errors import TegulaError

TF32 = [i for i in WGMMA_INSTRUCTIONS if i.operand_class == "tf32"]


def _isa_a_tf32(t: int, v: int) -> int:
    """PTX ISA, wgmma .tf32 A fragment (a0..a3): row groupID (+8 for a1, a3) of warp w's
    16 rows, column threadID_in_group (+4 for a2, a3); flat index m + 64 k."""
    w, lane = t // 32, t % 32
    g, tig = lane >> 2, lane % 4
    return (16 * w + g + 8 * (v % 2)) + 64 * (tig + 4 * (v // 2))


def test_one_entry_per_n_with_k8_and_tf32_spelling():
    assert [i.n for i in TF32] == list(WGMMA_N)
    sm80, sm90 = get_target("sm_80"), get_target("sm_90a")
    for i in TF32:
        assert i.name == f"wgmma.m64n{i.n}k8.f32.tf32.tf32"
        assert i.ptx == f"wgmma.mma_async.sync.aligned.m64n{i.n}k8.f32.tf32.tf32"
        assert (i.a_dtype, i.b_dtype, i.acc_dtype, i.k) == (f32, f32, f32, 8)
        assert i.a_regs == 4 and i.acc_regs == i.n // 2
        assert get_wgmma(i.name) is i and wgmma_for(f32, f32, f32, i.n) is i
        assert i.available_on(sm90) and not i.available_on(sm80)
        assert sm90.wgmma_rate(i.operand_class) == sm90.wgmma_rate("f16") // 2


def test_a_register_fragment_is_the_isa_figure():
    table = tv_table(get_wgmma("wgmma.m64n64k8.f32.tf32.tf32").a_tv, 128)
    want = np.array([[_isa_a_tf32(t, v) for v in range(4)] for t in range(128)])
    assert np.array_equal(table, want)
    assert sorted(table.ravel()) == list(range(64 * 8))


def test_asm_has_no_transpose_immediates():
    """tf32 operands are K-major only: no imm-trans-a/b in the PTX, transposing refused."""
    i = get_wgmma("wgmma.m64n32k8.f32.tf32.tf32")
    d = [f"d{j}" for j in range(16)]
    text = i.format_asm(d=d, a="da", b="db", scale_d="s")
    assert "m64n32k8.f32.tf32.tf32 {%0, " in text and "p, 1, 1; }" in text
    assert '"+f"(d0)' in text and '"l"(da), "l"(db)' in text
    with pytest.raises(TegulaError, match="transposed"):
        i.format_asm(d=d, a="da", b="db", scale_d="s", trans_b=1)


def _mantissa_truncated(x: np.ndarray) -> np.ndarray:
    """Re-derived: keep sign, exponent and the top 10 of the 23 mantissa bits."""
    bits = x.astype(np.float32).view(np.uint32)
    return (bits >> 13 << 13).view(np.float32)


def test_truncate_to_tf32_drops_the_low_13_bits_and_keeps_specials():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10_000) * 10.0 ** rng.integers(-40, 38, 10_000)).astype(np.float32)
    x = np.concatenate([x, np.float32([np.inf, -np.inf, 0.0, -0.0, 1e-45, -3e-39,
                                       1 + 2.0 ** -10, 1 + 2.0 ** -11 + 2.0 ** -23])])
    got = truncate_to_tf32(x)
    assert got.dtype == np.float64
    assert np.array_equal(got, _mantissa_truncated(x).astype(np.float64))
    assert truncate_to_tf32(np.float32([1 + 2.0 ** -11 + 2.0 ** -23]))[0] == 1.0  # not nearest
    nan_low_bits = np.array([0x7F800001, 0xFFC00000], dtype=np.uint32).view(np.float32)
    assert np.isnan(truncate_to_tf32(nan_low_bits)).all()  # a NaN does not become Inf


def test_execute_multiplies_the_truncated_operands_exactly():
    i = get_wgmma("wgmma.m64n16k8.f32.tf32.tf32")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 8)).astype(np.float32)
    b = rng.standard_normal((16, 8)).astype(np.float32)
    d = rng.standard_normal((64, 16)).astype(np.float32)
    ta, tb = _mantissa_truncated(a).astype(np.float64), _mantissa_truncated(b).astype(np.float64)
    got = i.execute(d, a, b, scale_d=1)
    assert got.dtype == np.float32
    assert np.array_equal(got, (ta @ tb.T + d).astype(np.float32))
    assert not np.array_equal(got, (a.astype(np.float64) @ b.T + d).astype(np.float32))
    assert np.array_equal(i.execute(None, a, b, scale_d=0), (ta @ tb.T).astype(np.float32))


def test_the_language_multiplies_f32_only_where_a_tf32_wgmma_exists():
    assert mma_accumulators(f32, f32) == (f32,)
    assert mma_accumulators(f32, f32, "sm_90a") == (f32,)
    assert mma_accumulators(f32, f32, "sm_80") == ()
