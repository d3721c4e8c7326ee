"""wgmma descriptors as the emitter writes them: a warp-uniform run-time base shared by a
gemm's k-steps plus one constant per wgmma (`codegen/async_stmts.descriptor_base`), equal
to the whole start address's field for every thread, loop index and buffer placement."""
from __future__ import annotations

import importlib
import random

import pytest

from tegula.build import build
from tegula.codegen.async_stmts import WARP_TID, descriptor_base
from tegula.codegen.cuda import emit_cuda
from tegula.dtypes import f16
from tegula.lower.async_ir import SmemDesc, Wgmma
from tegula.lower.thread_ir import _FOLD, TID, BinOp, Const, Var, walk

attention = importlib.import_module("tegula.kernels.attention")
attention_backward = importlib.import_module("tegula.kernels.attention_backward")


def _value(e, env: dict) -> int:
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        return env[e.name]
    assert isinstance(e, BinOp), e
    lhs, rhs = _value(e.lhs, env), _value(e.rhs, env)
    return _FOLD[e.op](lhs, rhs)


def _variables(e, found: set) -> set:
    if isinstance(e, Var):
        found.add(e.name)
    elif isinstance(e, BinOp):
        _variables(e.lhs, found)
        _variables(e.rhs, found)
    return found


def _start_field(saddr: int) -> int:
    return (saddr >> 4) & 0x3FFF


def _check_descriptors(thread_kernel, bits: int = 16) -> int:
    """Every descriptor of the kernel: the split form's start field equals the whole
    offset's, for every thread, several values of the loop indices and buffer bases."""
    rng = random.Random(0)
    checked = 0
    for st in walk(thread_kernel.body):
        if not isinstance(st, Wgmma):
            continue
        for desc in (st.a, st.b):
            if not isinstance(desc, SmemDesc):
                continue
            split = descriptor_base(desc.offset, bits)
            assert split is not None, f"descriptor {desc.offset} not split"
            base, sixteens = split
            others = _variables(desc.offset, set()) - {"tid"}
            for trial in range(6):
                buffer_saddr = 1024 * rng.randrange(0, 64)
                env = {name: rng.randrange(0, 40) for name in others}
                for tid in range(thread_kernel.threads):
                    env.update(tid=tid, tg_warp_tid=tid - tid % 32)
                    whole = _start_field(buffer_saddr + _value(desc.offset, env) * bits // 8)
                    split_value = _start_field(buffer_saddr + _value(base, env) * bits // 8)
                    assert split_value + sixteens == whole, (desc.offset, env)
            checked += 1
    return checked


@pytest.mark.parametrize("d,causal,extra", [(128, False, dict(BM=128, BN=128, threads=256)),
                                            (64, True, dict(BM=64, BN=64)),
                                            (128, False, dict(BM=128, BN=64, threads=256,
                                                              V_KMAJOR=True, P_SHARED=True))])
def test_attention_forward_descriptors_split_exactly(d, causal, extra):
    kw = dict(D=d, QK_SCALE=attention.qk_scale(None, d), CAUSAL=causal, BM=64, BN=64,
              STAGES=2, V_KMAJOR=False, P_SHARED=False, OVERLAP=False)
    kw.update(extra)
    result = build(attention.attention_kernel(f16), kw, target="sm_90a")
    assert _check_descriptors(result.thread_kernel) >= 2
    source = emit_cuda(result.thread_kernel, "sm_90a")
    assert "tg_warp_tid = __shfl_sync(0xffffffffu, (int)threadIdx.x, 0)" in source


def test_attention_backward_descriptors_split_exactly():
    checked = 0
    launches = attention_backward.backward_launches(f16, 1, 2, 1, 100, 100, 128, 0.1, True,
                                                    BM=64, BN=64)
    for kernel, _grid, _names, constexprs in launches[1:]:  # dK/dV and dQ: all wgmma
        checked += _check_descriptors(build(kernel, constexprs, target="sm_90a").thread_kernel)
    assert checked >= 8


def test_descriptor_base_refuses_what_it_cannot_prove():
    x = Var("x")
    # base a multiple of 8 bytes only: the shifted parts would not add up
    assert descriptor_base(x * 4 + 64, 16) is None
    # a constant that is not a whole number of 16 bytes
    assert descriptor_base(x * 64 + 4, 16) is None
    # a thread-dependent base not through the warp (differs between lanes)
    assert descriptor_base(TID % 2 * 64, 16) is None
    assert descriptor_base(TID * 64, 16) is None
    # tid // 16 differs between a warp's lanes too
    assert descriptor_base(TID // 16 * 64, 16) is None


def test_descriptor_base_splits_sums_and_differences():
    x = Var("x")
    base, sixteens = descriptor_base((x % 2 * 128 + (TID // 128 * 4096 + 24)) - 8, 16)
    assert sixteens == 2  # 16 f16 elements = 32 bytes
    assert base == x % 2 * 128 + BinOp("//", WARP_TID, Const(128)) * 4096
    assert descriptor_base(Const(4096 + 64), 8) == (Const(0), (4096 + 64) // 16)
