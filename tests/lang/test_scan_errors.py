"""Misuses of `tg.scan` / `tg.cumsum` are TraceErrors at the user's line naming the op and
what is wrong: combine's arity, shape and type of its result, non-element-wise ops or
outside tiles inside combine, bad axes and element types. (Associativity cannot be
checked.) Also: the traced op itself (one Scan, combine recorded privately, no stray
tiles registered with the kernel)."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.errors import TraceError
from tegula.ir.ops import Scan, walk_ops


def scan_kernel(body, dtype=f32):
    """A kernel loading a (4, 8) tile `t` (and `u`) and calling `body(t, u)`."""
    @tg.kernel(threads=32)
    def k(x: tg.Tensor[dtype], y: tg.Tensor[dtype]):
        t = tg.load(x.tile((4, 8), (0, 0)))
        u = tg.load(y.tile((4, 8), (0, 0)))
        tg.copy(body(t, u), y.tile((4, 8), (0, 0)))
    return k


def trace_error(body, dtype=f32) -> TraceError:
    with pytest.raises(TraceError) as info:
        scan_kernel(body, dtype).trace()
    return info.value


def line_of(fn) -> int:
    """The source line of a one-line lambda body (where the error must point)."""
    return inspect.getsourcelines(fn)[1]


def assert_error(body, *fragments, dtype=f32):
    err = trace_error(body, dtype)
    for fragment in fragments:
        assert fragment in str(err), str(err)
    assert err.loc is not None and err.loc.lineno == line_of(body), (err.loc, line_of(body))
    return err


def test_tuple_returned_for_one_tile():
    body = lambda t, u: tg.scan(t, 1, lambda a, b: (a + b, a))  # noqa: E731
    assert_error(body, "tg.scan", "must return one tile", "tuple of 2")


def test_wrong_arity_for_a_tuple_scan():
    body = lambda t, u: tg.scan((t, u), 1, lambda p, q: p[0] + q[0])[0]  # noqa: E731
    assert_error(body, "tg.scan", "a tuple of 2 tiles", "RegisterValue")
    body = lambda t, u: tg.scan((t, u), 1, lambda p, q: (p[0],))[0]  # noqa: E731
    assert_error(body, "tuple of 2 tiles", "got 1 values")


def test_result_of_another_type():
    body = lambda t, u: tg.scan(t, 1, lambda a, b: (a + b).to(f32))  # noqa: E731
    assert_error(body, "combine's result is f32, but the scanned tile is f16", dtype=f16)
    body = lambda t, u: tg.scan(t, 1, lambda a, b: a < b)  # noqa: E731
    assert_error(body, "combine's result is bool")


def test_result_that_is_not_a_tile_or_not_computed_inside():
    body = lambda t, u: tg.scan(t, 1, lambda a, b: 1.0)  # noqa: E731
    assert_error(body, "must be a register tile computed from the operands", "float")
    body = lambda t, u: tg.scan(t, 1, lambda a, b: u)  # noqa: E731
    assert_error(body, "which combine did not compute from its operands")


def test_outside_tiles_and_non_elementwise_ops_in_combine():
    body = lambda t, u: tg.scan(t, 1, lambda a, b: a + b + u)  # noqa: E731
    assert_error(body, "combine may only compute from its two operands", "from outside")
    body = lambda t, u: tg.scan(t, 1, lambda a, b: a + tg.sum(b, 1))  # noqa: E731
    assert_error(body, "element-wise operations", "reduce")


def test_error_inside_combine_names_the_scan():
    body = lambda t, u: tg.scan(t, 1, lambda a, b: tg.maximum(a, "x"))  # noqa: E731
    err = trace_error(body)
    assert "tg.scan: in combine:" in str(err) and "tg.maximum" in str(err)


@pytest.mark.parametrize("body,fragment", [
    (lambda t, u: tg.scan(t, 2, tg.maximum), "axis 2 is out of range"),
    (lambda t, u: tg.scan(t, 1.0, tg.maximum), "axis must be an integer"),
    (lambda t, u: tg.scan(t, 1, "add"), "combine must be a function"),
    (lambda t, u: tg.scan(t, 1, tg.maximum, reverse=1), "reverse must be True or False"),
    (lambda t, u: tg.scan((t, tg.sum(u, 1)), 1, lambda p, q: p)[0], "must have one shape"),
    (lambda t, u: tg.cumsum(t < u, 1), "tg.cumsum: cannot sum"),
    (lambda t, u: tg.scan(t < u, 1, lambda a, b: a), "cannot scan"),
    (lambda t, u: tg.scan((), 1, lambda a, b: a), "at least one tile"),
])
def test_bad_arguments(body, fragment):
    err = trace_error(body)
    assert fragment in str(err), str(err)
    assert err.loc is not None


@tg.kernel(threads=32)
def two_scans(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    t = tg.load(x.tile((4, 8), (0, 0)))
    a, b = tg.scan((t, t * 2.0), 1, lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]))
    tg.copy(a + b, y.tile((4, 8), (0, 0)))


def test_traced_scan_op():
    traced = two_scans.trace()
    scans = [op for op in walk_ops(traced.body) if isinstance(op, Scan)]
    assert len(scans) == 1
    scan = scans[0]
    assert scan.axis == 1 and not scan.reverse and len(scan.xs) == len(scan.outs) == 2
    assert [e.op for e in scan.combine.ops] == ["mul", "mul", "add"]
    registered = {t.id for t in traced.register_tiles}
    inner = {e.out.id for e in scan.combine.ops} | \
        {t.id for t in scan.combine.lhs + scan.combine.rhs}
    assert not registered & inner      # combine's tiles never become kernel tiles
    assert all(o.id in registered for o in scan.outs)


def test_scan_of_f16_tiles_with_f16_combine_runs():
    """A scan in the tile's own type (no widening outside cumsum): max of f16."""
    k = scan_kernel(lambda t, u: tg.scan(t, 1, tg.maximum), f16)
    x = np.random.default_rng(1).uniform(-1, 1, (4, 8)).astype(np.float16)
    y = np.zeros((4, 8), np.float16)
    tg.emulate(k, (1,), x, y)
    np.testing.assert_array_equal(y, np.maximum.accumulate(x, axis=1))


# -- initial= (a scan continued from a carried state) ---------------------------------------
def test_initial_of_the_wrong_shape_or_type():
    body = lambda t, u: tg.scan(t, 1, lambda a, b: a + b, initial=t)[0]  # noqa: E731
    assert_error(body, "tg.scan", "initial must be a f32 tile of shape (4, 1)", "got %r0: register<4x8, f32>")
    body = lambda t, u: tg.scan(t, 0, lambda a, b: a + b, initial=tg.zeros((1, 8), f16))[0]  # noqa: E731,E501
    assert_error(body, "initial must be a f32 tile of shape (1, 8)", "f16")


def test_initial_must_match_the_scanned_tuple():
    one = lambda: tg.zeros((4, 1), f32)  # noqa: E731
    body = lambda t, u: tg.scan((t, u), 1, lambda p, q: (p[0], q[1]), initial=one())[0][0]  # noqa: E731,E501
    assert_error(body, "initial must be a tuple of 2 tiles, like the scanned x")
    body = lambda t, u: tg.scan((t, u), 1, lambda p, q: (p[0], q[1]), initial=(one(),))[0][0]  # noqa: E731,E501
    assert_error(body, "initial has 1 tiles, but 2 are scanned")
    body = lambda t, u: tg.scan(t, 1, lambda a, b: a + b, initial=0.0)[0]  # noqa: E731
    assert_error(body, "tg.scan", "initial must be a register tile, got float")


def test_with_initial_the_result_is_the_scan_and_the_carry():
    def body(t, u):
        out, carry = tg.scan(t, 1, lambda a, b: a + b, initial=tg.zeros((4, 1), f32))
        assert tuple(out.shape) == (4, 8) and tuple(carry.shape) == (4, 1)
        return out + carry
    (op,) = [o for o in walk_ops(scan_kernel(body).trace().body) if isinstance(o, Scan)]
    assert len(op.initials) == len(op.carries) == 1
    assert tuple(op.carries[0].shape) == (4, 1)
