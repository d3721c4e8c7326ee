"""Global and shared views: tile coordinates map to the right tensor coordinates."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.ir.scalar import cdiv

try:
    from tests.lang.lang_scalar_eval import evaluate, tensor_coord, view_shape
except ImportError:  # pytest's rootdir-relative import mode
    from lang_scalar_eval import evaluate, tensor_coord, view_shape


def capture(body, *, rank: int = 2, **constexprs) -> dict:
    """Trace `body(x, seen)` inside a kernel with one global tensor `x`; return `seen`."""
    seen: dict = {}

    @tg.kernel(threads=32)
    def k(x: tg.Tensor[f32, rank], y: tg.Tensor[f32]):
        body(x, seen)

    k.trace()
    return seen


def check_view(view, env: dict, expected: np.ndarray, tensor: np.ndarray) -> None:
    """Every tile coordinate of `view` addresses the element `expected` has there."""
    shape = view_shape(view.ir, env)
    assert shape == expected.shape
    for index in itertools.product(*(range(s) for s in shape)):
        coord = tensor_coord(view.ir, index, env)
        assert tensor[coord] == expected[index], (index, coord)


def test_tile_with_split_dim_and_k_slice_match_numpy():
    M, K, BM, BK = 40, 24, 8, 4
    A = np.arange(M * K).reshape(M, K)

    def body(x, seen):
        m = tg.block_id(0)
        seen["ga"] = x.tile((BM, BK), (m, None))
        for k in tg.range(seen["ga"].shape[2]):
            seen["k"] = k
            seen["slice"] = seen["ga"][:, :, k]

    seen = capture(body)
    for m, k in [(0, 0), (2, 3), (4, 5)]:
        env = {"block": (m, 0, 0), ("x", 0): M, ("x", 1): K, seen["k"].name: k}
        assert evaluate(seen["ga"].shape[2], env) == cdiv(K, BK) == 6
        full = np.stack([A[m * BM:(m + 1) * BM, j * BK:(j + 1) * BK] for j in range(6)], -1)
        check_view(seen["ga"], env, full, A)
        check_view(seen["slice"], env, A[m * BM:(m + 1) * BM, k * BK:(k + 1) * BK], A)


def test_transposed_and_narrowed_views():
    M, N = 12, 10
    A = np.arange(M * N).reshape(M, N)

    def body(x, seen):
        seen["t"] = x.T.tile((4, 3), (1, 2))           # rows of x.T are columns of x
        seen["narrow"] = x[2:7, ...][:, 3]             # column 3 of rows 2..6
        seen["perm"] = x.tile((4, 5), (None, 1)).transpose(2, 0, 1)

    seen = capture(body)
    env = {"block": (0, 0, 0), ("x", 0): M, ("x", 1): N}
    check_view(seen["t"], env, A.T[4:8, 6:9], A)
    assert seen["t"].shape == (4, 3)
    check_view(seen["narrow"], env, A[2:7, 3], A)
    expected = np.stack([A[i * 4:(i + 1) * 4, 5:10] for i in range(3)], 0)
    check_view(seen["perm"], env, expected, A)


def test_rank_one_and_rank_three_tensors():
    X3 = np.arange(4 * 6 * 8).reshape(4, 6, 8)

    def body3(x, seen):
        seen["v"] = x.tile((2, 3, 4), (1, None, tg.block_id(1)))
        seen["s"] = seen["v"][..., 1]

    seen = capture(body3, rank=3)
    env = {"block": (0, 1, 0), ("x", 0): 4, ("x", 1): 6, ("x", 2): 8}
    expected = np.stack([X3[2:4, j * 3:(j + 1) * 3, 4:8] for j in range(2)], -1)
    check_view(seen["v"], env, expected, X3)
    check_view(seen["s"], env, X3[2:4, 3:6, 4:8], X3)

    X1 = np.arange(50)

    def body1(x, seen):
        seen["v"] = x.tile((16,), (None,))
        seen["row"] = x.tile(16, tg.block_id(0))

    seen = capture(body1, rank=1)
    env = {"block": (2, 0, 0), ("x", 0): 50}
    assert view_shape(seen["v"].ir, env) == (16, 4)
    check_view(seen["row"], env, X1[32:48], X1)


def test_shapes_of_tensor_handles_are_symbolic_extents():
    def body(x, seen):
        seen["shape"] = x.shape
        seen["whole"] = x.view()

    seen = capture(body)
    assert [str(s) for s in seen["shape"]] == ["x.shape[0]", "x.shape[1]"]
    assert seen["whole"].ir.name == "x"


def test_shared_stages_and_transposes():
    def body(x, seen):
        s = tg.shared((16, 8), f16, stages=2)
        one = tg.shared((4, 8, 2), f16)
        seen.update(s=s, stage=s[1], t=s[1].T, one=one, p=one.transpose(2, 0, 1))

    seen = capture(body)
    assert seen["stage"].ir.stage == 1 and seen["stage"].shape == (16, 8)
    t = seen["t"].ir
    assert t.shape == (8, 16) and t.permutation == (1, 0) and t.alloc is seen["s"].alloc
    assert seen["one"].ir.stage == 0 and seen["one"].shape == (4, 8, 2)
    p = seen["p"].ir
    assert p.shape == (2, 4, 8) and p.permutation == (2, 0, 1)
    assert seen["t"].T.ir.permutation == (0, 1)
    assert "x2 stages" in repr(seen["s"])


@pytest.mark.parametrize("index", [(slice(None), 99), (-1,)])
def test_out_of_range_static_indices_are_rejected(index):
    def body(x, seen):
        x.tile((8, 8), (0, 0))[index]

    with pytest.raises(tg.TraceError, match="outside dim"):
        capture(body)
