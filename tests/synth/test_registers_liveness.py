"""The register estimate's copy coalescing, element-wise chains and index expressions
(`synth/registers.py` steps 7-9), on hand-made thread IR and library kernels whose ptxas
counts were measured (nvcc 13.0, sm_90a: `benchmarks/register_table.py`)."""
from __future__ import annotations

import pytest

from tegula.build import build
from tegula.dtypes import f16, f32
from tegula.lower.thread_ir import (Assign, Binary, Const, For, GlobalLoad, GlobalStore,
                                    Literal, Reg, RegArray, RegRead, ThreadKernel, Unary, Var)
from tegula.synth.registers import estimate_registers


def _kernel(body, *arrays, threads: int = 32):
    return ThreadKernel("k", threads, [], list(arrays), [], body)


def _read(array, j):
    return RegRead(Reg(array, Const(j)))


def test_replicated_row_values_hold_one_register():
    # A row maximum carried across a loop, held (as the lowering writes a row vector of a
    # wgmma tile) in 16 elements that are copies of one: one register, not 16.
    m, new, x = RegArray("m", f32, 16), RegArray("new", f32, 16), RegArray("x", f32, 16)
    loop = For(Var("i"), Const(0), Var("n"), 1, [
        GlobalLoad(Reg(x, Const(0)), "x", Var("i"), 16),
        Assign(Reg(new, Const(0)), Binary("max", _read(m, 0), _read(x, 0), f32)),
        *[Assign(Reg(new, Const(j)), _read(new, 0)) for j in range(1, 16)],
        *[Assign(Reg(m, Const(j)), _read(new, j)) for j in range(16)]])
    body = [*[Assign(Reg(m, Const(j)), Literal(float("-inf"), f32)) for j in range(16)],
            loop, GlobalStore("y", Const(0), Reg(m, Const(0)), 16)]
    found = estimate_registers(_kernel(body, m, new, x))
    assert found.live_words == 16 + 1            # x and the one maximum


def test_a_copy_whose_source_changes_keeps_its_own_register():
    # prev = part, then part is loaded again while prev is still read: two tiles.
    prev, part, acc = RegArray("prev", f32, 16), RegArray("part", f32, 16), \
        RegArray("acc", f32, 16)
    body = [GlobalLoad(Reg(part, Const(0)), "x", Const(0), 16),
            *[Assign(Reg(prev, Const(j)), _read(part, j)) for j in range(16)],
            GlobalLoad(Reg(part, Const(0)), "x", Const(16), 16),
            *[Assign(Reg(acc, Const(j)), Binary("add", _read(prev, j), _read(part, j), f32))
              for j in range(16)],
            GlobalStore("y", Const(0), Reg(acc, Const(0)), 16)]
    assert estimate_registers(_kernel(body, prev, part, acc)).live_words >= 32


def _epilogue(size: int):
    """acc loaded, then gelu-like: h = 0.5 * acc, e = exp(acc * c), y = h * (1 + e),
    each op over the whole tile, as the lowering writes them."""
    names = ("acc", "h", "t", "e", "u", "y")
    acc, h, t, e, u, y = (RegArray(n, f32, size) for n in names)
    ops = [(h, lambda j: Binary("mul", Literal(0.5, f32), _read(acc, j), f32)),
           (t, lambda j: Binary("mul", _read(acc, j), Literal(0.7, f32), f32)),
           (e, lambda j: Unary("exp", _read(t, j), f32)),
           (u, lambda j: Binary("add", Literal(1.0, f32), _read(e, j), f32)),
           (y, lambda j: Binary("mul", _read(h, j), _read(u, j), f32))]
    body = [GlobalLoad(Reg(acc, Const(0)), "x", Const(0), 4)]
    for dst, value in ops:
        body += [Assign(Reg(dst, Const(j)), value(j)) for j in range(size)]
    body.append(GlobalStore("y", Const(0), Reg(y, Const(0)), 4))
    return acc, h, t, e, u, y, body


def test_element_wise_chain_over_the_launch_limit_is_interleaved():
    # 128 elements a thread on 256 threads (255 allowed): in tile-op order h and t (or
    # h and e ...) are whole tiles beside acc (~384 words); element by element ptxas
    # holds acc and a few values.
    *arrays, body = _epilogue(128)
    found = estimate_registers(_kernel(body, *arrays, threads=256))
    assert found.live_words <= 128 + 8


def test_element_wise_chain_under_the_launch_limit_keeps_the_tile_order():
    # 16 elements: the tile-op order fits, and ptxas keeps it (silu(a) * b on sm_80 holds
    # a, b and sigmoid(a) as tiles: 63 registers).
    *arrays, body = _epilogue(16)
    found = estimate_registers(_kernel(body, *arrays, threads=128))
    assert found.live_words >= 32


@pytest.mark.parametrize("constexprs, ptxas", [
    (dict(D=64, BM=64, BN=64), 94),
    (dict(D=128, BM=64, BN=64), 126),
])
def test_attention_forward_near_ptxas(constexprs, ptxas):
    # One role on sm_90a (ptxas 13 measured): the estimate was 203 / 235 (+116% / +87%)
    # before copies shared their source's register and index tiles were folded.
    from tegula.kernels.attention import attention_kernel, qk_scale
    c = dict(constexprs, QK_SCALE=qk_scale(None, constexprs["D"]))
    tk = build(attention_kernel(f16), c, target="sm_90a").thread_kernel
    assert abs(estimate_registers(tk).registers / ptxas - 1) <= 0.15
