"""Scalar loads from read-only tensors are read once per block of statements
(`lower/scalar_loads.py`), not once per use: a paged copy used to read its page-table entry
again for every cp.async vector."""
import sys
from pathlib import Path

import numpy as np

import tegula as tg
from tegula import f32, i32
from tegula.build import build
from tegula.lower.scalar_loads import bind_scalar_loads
from tegula.lower.thread_ir import (BinOp, Const, CpAsyncWait, For, If, Let, LoadScalar, Select,
                                    Var, walk)

sys.path.insert(0, str(Path(__file__).parent))
from test_pipeline_gathers import gather_rows  # noqa: E402

TABLE_ENTRY = LoadScalar("t", (Var("j"),), i32)


def loads_in(node, tensor: str) -> int:
    """How many times `tensor` is read in the printed thread IR."""
    return str(node).count(f"LoadScalar(tensor='{tensor}'")


def test_a_gathered_copy_reads_its_table_entry_once_per_iteration():
    kernel = build(gather_rows, dict(BM=8, BN=16, STAGES=3), None, "sm_80").thread_kernel
    loop = next(s for s in walk(kernel.body) if isinstance(s, For) and not s.unroll)
    # One read of table[i0 + 2] in the loop: the Let the prefetch's copies share, first
    # in the body, before the wait for this iteration's stage (`lower/pipeline.py`:
    # `table_loads_first`), guarded by the prefetched iteration existing.
    assert loads_in(loop.body, "table") == 1
    lets = [s for s in walk(loop.body) if isinstance(s, Let) and "table" in str(s.value)]
    assert len(lets) == 1 and lets[0] is loop.body[0] and isinstance(lets[0].value, Select)
    assert any(isinstance(s, CpAsyncWait) for s in loop.body[1:])


def test_loads_of_a_tensor_the_kernel_writes_stay_where_they_are():
    body = [Let(Var("a"), BinOp("+", TABLE_ENTRY, Const(1))),
            Let(Var("b"), BinOp("+", TABLE_ENTRY, Const(2)))]
    assert bind_scalar_loads(body, read_only=set()) == body


def test_one_read_serves_the_statements_after_it():
    body = [Let(Var("a"), BinOp("+", TABLE_ENTRY, Const(1))),
            Let(Var("b"), BinOp("*", TABLE_ENTRY, Const(2)))]
    out = bind_scalar_loads(body, read_only={"t"})
    assert isinstance(out[0], Let) and out[0].value == TABLE_ENTRY
    assert loads_in(out[1:], "t") == 0
    assert out[1].value == BinOp("+", out[0].var, Const(1))


def test_a_select_branch_is_not_read_ahead():
    # j < n ? t[j] : 0 reads t[j] only when j < n: it must not move in front.
    guarded = Select(BinOp("<", Var("j"), Var("n")), TABLE_ENTRY, Const(0))
    body = [Let(Var("a"), guarded)]
    assert bind_scalar_loads(body, read_only={"t"}) == body


def test_a_read_inside_a_branch_is_not_used_after_it():
    inner = [Let(Var("a"), BinOp("+", TABLE_ENTRY, Const(1)))]
    body = [If(BinOp("<", Var("j"), Var("n")), inner), Let(Var("b"), TABLE_ENTRY)]
    out = bind_scalar_loads(body, read_only={"t"})
    branch, after = out[0], out[1:]
    assert loads_in(branch.then, "t") == 1          # bound inside the branch
    assert loads_in(after, "t") == 1                # and read again after it
    assert isinstance(after[0], Let) and after[0].value == TABLE_ENTRY


def test_gathered_pipeline_still_matches_numpy_on_both_targets():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8 * 6, 16)).astype(np.float32)
    table = np.array([4, 0, 5, 5], np.int32)
    for target in ("sm_80", "sm_90a"):
        y = np.full((8, 16), np.nan, np.float32)
        tg.emulate(gather_rows, (1,), x, table, y, BM=8, BN=16, STAGES=2, target=target)
        np.testing.assert_allclose(y, sum(x[r * 8:(r + 1) * 8] for r in table), rtol=1e-6)
