"""A layout change of a 4-bit register tile that needs a shared-memory round trip is refused
at the user's line (shared memory has no 4-bit store), where it failed inside the emulator;
converting the tile to a byte-wide type first works."""
import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.dtypes import u4
from tegula.errors import SynthesisError


def _kernel(widen: bool):
    @tg.kernel(threads=32)
    def rearranged(w: tg.Tensor[u4], y: tg.Tensor[f32]):
        t = tg.load(w.tile((8, 32), (0, 0)))
        r = tg.rearrange(t.to(f16) if widen else t)
        tg.copy(r.to(f32), y.tile((8, 32), (0, 0)))
    return rearranged


def _packed(values: np.ndarray) -> np.ndarray:
    """u4 storage: element 2j in the low nibble of byte j, 2j+1 in the high one."""
    return (values[:, 0::2] | (values[:, 1::2] << 4)).astype(np.uint8)


def test_a_4_bit_tile_through_shared_memory_is_a_clear_error_at_its_line():
    w = _packed(np.random.default_rng(0).integers(0, 16, (8, 32)))
    with pytest.raises(SynthesisError, match=r"4-bit elements.*\.to\(u8\)") as err:
        tg.emulate(_kernel(False), (1,), w, np.zeros((8, 32), np.float32))
    assert "test_subbyte_conversions.py" in str(err.value)


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_the_same_change_after_widening_is_right(target):
    values = np.random.default_rng(1).integers(0, 16, (8, 32))
    y = np.full((8, 32), np.nan, np.float32)
    tg.emulate(_kernel(True), (1,), _packed(values), y, target=target)
    np.testing.assert_array_equal(y, values.astype(np.float32))
