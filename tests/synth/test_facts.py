"""Divisibility facts: their caps per element type, and the 16-byte 4-bit loads they allow.

A 16-byte vector of 4-bit elements is 32 of them, so the facts of a 4-bit tensor track
divisors up to 32; every other type keeps the cap of 16 its widest vector needs (so the
compilation keys of those tensors are what they were)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, u4
from tegula.build import build
from tegula.synth.facts import MAX_VECTOR_BYTES, TensorFacts, divisor_cap


def test_divisor_cap_is_one_vector_for_sub_byte_types_and_16_otherwise():
    assert divisor_cap(4) == 32
    assert [divisor_cap(bits) for bits in (8, 16, 32, 64)] == [16, 16, 16, 16]


def test_four_bit_facts_track_divisors_up_to_32_and_alignment_up_to_16():
    facts = TensorFacts.of((96, 128), (128, 1), 4096, 0.5)
    assert facts.extent_divisors == (32, 32)
    assert facts.stride_divisors == (32, 1)
    assert facts.align_bytes == MAX_VECTOR_BYTES  # 4096 is aligned beyond any access


def test_wider_types_keep_the_cap_of_16_so_their_keys_do_not_change():
    facts = TensorFacts.of((96, 128), (128, 1), 4096, 2)
    assert facts.extent_divisors == (16, 16)
    assert facts.stride_divisors == (16, 1)
    # an extent-1 dim's stride is never stepped along: the cap, per type
    assert TensorFacts.of((1, 64), (7, 1), 0, 0.5).stride_divisors == (32, 1)
    assert TensorFacts.of((1, 64), (7, 1), 0, 2).stride_divisors == (16, 1)


def test_assumed_row_major_facts_follow_the_element_type():
    assert TensorFacts.assume_row_major(2, elem_bits=4).extent_divisors == (32, 32)
    assert TensorFacts.assume_row_major(2).extent_divisors == (16, 16)
    assert TensorFacts.assume_row_major(2, elem_bits=4).align_bytes == 16


@tg.kernel(threads=32)
def _u4_rows(w: tg.Tensor[u4], out: tg.Tensor[f16], BN: tg.constexpr = 32,
             BK: tg.constexpr = 32):
    """out = w as f16, (BN, BK) chunks along K."""
    n = tg.block_id(0)
    gw, go = w.tile((BN, BK), (n, None)), out.tile((BN, BK), (n, None))
    for k in tg.range(gw.shape[2]):
        tg.copy(tg.load(gw[:, :, k]).to(f16), go[:, :, k])


def _u4_facts(n: int, k: int) -> dict:
    return {"w": TensorFacts.of((n, k), (k, 1), 0, 0.5),
            "out": TensorFacts.of((n, k), (k, 1), 0, 2)}


def _load_line(result) -> str:
    return next(line for line in result.cuda_source().splitlines() if "load w:" in line)


def test_a_thread_loads_32_four_bit_weights_with_one_16_byte_access():
    """Before the cap was per type, 4-bit vectors stopped at 16 elements (8 bytes)."""
    result = build(_u4_rows, {}, _u4_facts(64, 64), "sm_90a")
    assert "32 x u4, one 16-byte access" in _load_line(result)
    # the cost model and explain count the access in bytes of 4-bit elements, too
    assert any("ld.global.v4.b32" in line and line.split()[2:4] == ["32", "16"]
               for line in result.explain().splitlines()), result.explain()


def test_a_row_of_16_four_bit_elements_caps_the_vector_at_8_bytes():
    """K = 16: a 16-byte vector would straddle two rows."""
    result = build(_u4_rows, dict(BK=16), _u4_facts(64, 16), "sm_90a")
    assert "16 x u4, one 8-byte access" in _load_line(result)


@pytest.mark.parametrize("k", [64, 96, 30])
def test_wide_four_bit_loads_read_every_element(k):
    """The emulator against numpy (every element), K a multiple of the 32-element
    vector, not a multiple of the tile, and not a multiple of any wide vector."""
    rng = np.random.default_rng(k)
    n = 45
    w_q = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    packed = (w_q[:, 0::2] | (w_q[:, 1::2] << 4)).astype(np.uint8)
    for target in ("sm_90a", "sm_80"):
        out = np.full((n, k), np.nan, np.float16)
        tg.emulate(_u4_rows, (tg.cdiv(n, 32),), packed, out, target=target)
        np.testing.assert_array_equal(out, w_q.astype(np.float16))
