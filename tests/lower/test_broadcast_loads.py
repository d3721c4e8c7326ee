"""A register tile loaded from global memory in a broadcast layout — a (BM, 1) scale
column or a (1, BN) bias row in an accumulator's layout, where each thread holds the same
element in several registers — is loaded once per distinct element (`lower/copy.py`), the
other registers copied from the first; the values are right in the emulator against numpy
(ragged edges, NaN included) on sm_90a and sm_80."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.build import build
from tegula.dtypes import bf16, f16
from tegula.kernels.common import poisoned, random_input
from tegula.kernels.fp8 import fp8_blockwise_gemm_kernel
from tegula.layout.tv import distinct_values
from tegula.lower.thread_ir import GlobalLoad, walk


def _loads_of(kernel, constexprs, target, tensor):
    body = build(kernel, constexprs, None, target).thread_kernel.body
    return [s for s in walk(body) if isinstance(s, GlobalLoad) and s.tensor == tensor]


def test_blockwise_fp8_loads_each_scale_once_per_thread():
    """128x128 accumulator on two warpgroups: each thread owns 2 rows (one a scale_a
    value each) and one scale_b value, where it loaded 64 of each before."""
    kernel = fp8_blockwise_gemm_kernel(bf16)
    config = dict(BM=128, BN=128, STAGES=4, threads=256)
    assert len(_loads_of(kernel, config, "sm_90a", "scale_a")) == 2
    assert len(_loads_of(kernel, config, "sm_90a", "scale_b")) == 1


@tg.kernel(threads=128)
def scaled(a: tg.Tensor[f16], b: tg.Tensor[f16], rows: tg.Tensor[f32], cols: tg.Tensor[f32],
           c: tg.Tensor[f32], BM: tg.constexpr = 64, BN: tg.constexpr = 64,
           BK: tg.constexpr = 32):
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    for k in tg.range(ga.shape[2]):
        tg.gemm(acc, tg.load(ga[:, :, k]), tg.load(gb[:, :, k]))
    r = tg.load(rows.tile((BM, 1), (m, 0)), fill=1.0)       # one per row
    s = tg.load(cols.tile((1, BN), (0, n)), fill=1.0)       # one per column
    tg.copy(acc * r + s, c.tile((BM, BN), (m, n)))


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_broadcast_tiles_are_right_and_loaded_once_per_element(target):
    m, n, k = 100, 90, 40
    rng = np.random.default_rng(4)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    rows = rng.standard_normal((m, 1)).astype(np.float32)
    cols = rng.standard_normal((1, n)).astype(np.float32)
    rows[7, 0], cols[0, 11] = np.nan, np.inf
    c = poisoned((m, n), f32)
    tg.emulate(scaled, (tg.cdiv(m, 64), tg.cdiv(n, 64)), a, b, rows, cols, c, target=target)
    ref = (a.astype(np.float64) @ b.astype(np.float64).T) * rows + cols
    with np.errstate(invalid="ignore"):
        close = np.isclose(c, ref, rtol=1e-5, atol=1e-4) | (np.isnan(c) & np.isnan(ref))
    assert close.all(), np.argwhere(~close)[:3]
    assert np.isnan(c[7]).all() and np.isinf(c[np.arange(m) != 7, 11]).all()
    # as many loaded elements per thread as distinct elements it holds
    for name in ("rows", "cols"):
        loads = _loads_of(scaled, {}, target, name)
        load = next(op for op in build(scaled, {}, None, target).traced.body
                    if getattr(getattr(op, "src", None), "arg", None) is not None
                    and op.src.arg.name == name)
        distinct = len(distinct_values(load.dst.layout))
        assert len(loads) * load.choices["vector"] == distinct < load.dst.layout[1].size


def test_explain_counts_the_loads_issued():
    """The cost model (and so `tegula explain`) counts a broadcast tile's loads once per
    distinct element too: 2 scale_a values and 1 scale_b value a thread, 8 warps."""
    text = tg.explain(fp8_blockwise_gemm_kernel(bf16), target="sm_90a", BM=128, BN=128,
                      STAGES=4, threads=256)
    lines = text.splitlines()
    counts = {}
    for i, line in enumerate(lines):
        for name in ("scale_a", "scale_b"):
            if f"copy %{name}" in line:
                counts[name] = int(lines[i + 2].split()[5])   # the "instrs" column
    assert counts == {"scale_a": 16, "scale_b": 8}
