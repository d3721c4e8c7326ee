"""Lowering: address arithmetic, barriers and pipelines (ldmatrix row holders: tests/arch/test_ldmatrix_holders.py)."""
from __future__ import annotations

import numpy as np

from tegula import f16
from tegula.build import build
from tegula.kernels.gemm import gemm_kernel
from tegula.layout.cute import Layout
from tegula.layout.tv import coalesced_tv, tv_coords
from tegula.lower.addressing import ThreadCoords, split_index
from tegula.lower.lower import substitute
from tegula.lower.thread_ir import (Barrier, CpAsync, CpAsyncCommit, CpAsyncWait, For,
                                    GlobalLoad, If, LdMatrix, Var, walk)


def _eval(expr, tid: np.ndarray, env: dict | None = None) -> np.ndarray:
    """Evaluate an index expression for every thread (a tiny reference interpreter)."""
    from tegula.emulate.exprs import compile_expr
    scope = {"tid": tid}
    scope.update(env or {})
    return np.broadcast_to(np.asarray(compile_expr(expr)(scope)), tid.shape)


def test_thread_coords_match_the_layout_for_every_thread_and_register():
    tv = coalesced_tv((32, 40), 1, 4, 64)
    coords = ThreadCoords()
    table = tv_coords(tv, (32, 40))
    tid = np.arange(64)
    env = {}
    for v in range(tv[1].size):
        exprs = coords.coords(tv, (32, 40), v)
        for let in coords.prologue:
            env[let.var.name] = _eval(let.value, tid, env)
        got = np.stack([_eval(e, tid, env) for e in exprs], axis=-1)
        assert np.array_equal(got, table[:, v])


def test_split_index_is_colexicographic():
    assert split_index(7 + 5 * 3, (5, 4)) == [7 % 5, (7 + 15) // 5]


def _design_gemm():
    """The DESIGN.md GEMM (the library's pipelined f16 kernel) with 64x64x32 tiles, built
    for sm_80 below: the cp.async pipeline (sm_90a's TMA ring: test_hopper_lowering.py)."""
    return gemm_kernel(f16)


def test_pipelined_loop_issues_stages_minus_one_groups_ahead():
    kernel = build(_design_gemm(), dict(BM=64, BN=64, BK=32), None, "sm_80").thread_kernel
    top = kernel.body
    loop = next(s for s in top if isinstance(s, For))
    prologue = top[:top.index(loop)]
    assert sum(isinstance(s, CpAsyncCommit) for s in prologue) == 2  # STAGES - 1
    body = loop.body
    assert isinstance(body[0], CpAsyncWait) and body[0].pending == 1
    assert isinstance(body[1], Barrier)
    # The copies issued inside the loop run STAGES-1 iterations ahead, only for iterations
    # that exist (a branch on `i0 + 2 < stop`), each iteration committing one group.
    fetch = next(s for s in body if isinstance(s, If))
    assert "i0 + 2" in str(fetch.cond)
    issued = [s for s in walk(fetch.then) if isinstance(s, CpAsync)]
    assert issued and all("i0" in str(s.index) for s in issued)
    assert sum(isinstance(s, CpAsyncCommit) for s in body) == 1
    assert any(isinstance(s, LdMatrix) for s in walk(body))


def test_copies_of_f16_tiles_are_16_byte_vectors():
    kernel = build(_design_gemm(), dict(BM=64, BN=64, BK=32), None, "sm_80").thread_kernel
    copies = [s for s in walk(kernel.body) if isinstance(s, CpAsync)]
    assert copies and all(s.count == 8 for s in copies)


def test_substitute_replaces_variables_and_folds_constants():
    k = Var("k")
    load = GlobalLoad(dst=None, tensor="a", index=k * 32 + 5, count=1)
    shifted = substitute([load], {"k": k + 2})[0]
    assert str(shifted.index) == str((k + 2) * 32 + 5)
    fixed = substitute([load], {"k": Var("k") * 0 + 3})[0]
    assert str(fixed.index) == "101"


def test_layouts_without_carry_get_let_bound_bases():
    tv = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))
    coords = ThreadCoords()
    coords.coords(tv, (16, 8), 3)
    assert len(coords.prologue) == 2  # one Let per tile dim


def _flat_copy_kernel():
    import tegula as tg

    @tg.kernel(threads=64)
    def flat_copy(x: tg.Tensor[f16], y: tg.Tensor[f16], BN: tg.constexpr = 1024):
        n = tg.block_id(0)
        tg.copy(tg.load(x.tile((1, BN), (0, n))), y.tile((1, BN), (0, n)))
    return flat_copy


def test_vectors_straddling_an_odd_edge_are_split_element_by_element():
    """A row whose length is no multiple of 8 still moves in 16-byte vectors; only the
    vector that crosses the end is split into predicated elements."""
    import numpy as np

    from tegula.build import emulate
    from tegula.lower.thread_ir import If

    kernel = _flat_copy_kernel()
    for length in (1000, 1003, 2049, 7):
        x = np.random.default_rng(length).standard_normal((1, length)).astype(np.float16)
        y = np.full_like(x, np.nan)
        emulate(kernel, (-(-length // 1024),), x, y)
        assert np.array_equal(x, y)
    facts_kernel = build(kernel, {}, _odd_facts()).thread_kernel
    loads = [s for s in walk(facts_kernel.body) if isinstance(s, GlobalLoad)]
    assert {s.count for s in loads} == {8, 1}        # vector body, element tail
    assert any(isinstance(s, If) for s in walk(facts_kernel.body))


def _odd_facts():
    from tegula.synth.facts import TensorFacts
    odd = TensorFacts(rank=2, contiguous_dim=1, extent_divisors=(1, 1), stride_divisors=(16, 1),
                      align_bytes=16)
    return {"x": odd, "y": odd}


def test_numbers_before_tiles_are_lowered_in_operand_order():
    """`1.0 / t` and `2.0 - t`: the number is the first operand, the tile the second."""
    import tegula as tg
    from tegula import f32

    @tg.kernel(threads=32)
    def number_first(x: tg.Tensor[f32], y: tg.Tensor[f32], z: tg.Tensor[f32]):
        t = tg.load(x.tile((8, 32), (0, 0)))
        tg.copy(1.0 / t, y.tile((8, 32), (0, 0)))
        tg.copy(2.0 - t, z.tile((8, 32), (0, 0)))

    x = np.random.default_rng(3).uniform(0.5, 4.0, (8, 32)).astype(np.float32)
    y, z = np.full_like(x, np.nan), np.full_like(x, np.nan)
    tg.emulate(number_first, (1,), x, y, z)
    assert np.array_equal(y, np.float32(1) / x)
    assert np.array_equal(z, np.float32(2) - x)
