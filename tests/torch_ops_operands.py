"""Operands of the torch ops' tests (tests/test_torch_ops.py, tests/gpu/
test_torch_ops_graphs.py): random CPU tensors at ragged sizes, in a module of their own so
that a test can import them without importing a test module (which registers its user ops
at import: a second import would register them twice)."""
from __future__ import annotations

import torch


def _random(shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def _w4a16_operands(m, n, k, group, zero_point, seed):
    from tegula.kernels.quant import quantize_w4
    w = _random((n, k), torch.float16, seed, 0.1)
    packed, scales, zeros = quantize_w4(w, group, zero_point)
    return _random((m, k), torch.float16, seed + 1), packed, scales, zeros


def _w4a16_fragment_operands(m, n, k, group, zero_point, seed):
    """`_w4a16_operands` with the weights pre-packed in the fragment order (6-D)."""
    from tegula.kernels.quant_fragment import pack_fragments
    a, packed, scales, zeros = _w4a16_operands(m, n, k, group, zero_point, seed)
    return a, pack_fragments(packed), scales, zeros


def _scan_operands(seed=0, dtype=torch.float32, bc_dtype=None, options=True):
    """Mamba-like operands at a ragged size (3 channels, 37 steps, dstate 4)."""
    batch, dim, length, dstate = 2, 3, 37, 4
    u = _random((batch, dim, length), dtype, seed)
    delta = (torch.rand(batch, dim, length, generator=torch.Generator().manual_seed(seed))
             * 0.5 + 0.05).to(dtype)
    A = -torch.exp(_random((dim, dstate), seed=seed + 1))
    B = _random((batch, dstate, length), bc_dtype or dtype, seed + 2)
    C = _random((batch, dstate, length), bc_dtype or dtype, seed + 3)
    if not options:
        return u, delta, A, B, C
    return (u, delta, A, B, C, _random((dim,), seed=seed + 4),
            _random((batch, dim, length), dtype, seed + 5), _random((dim,), seed=seed + 6) * 0.2,
            True)


def _decode_operands(seed=0, paged=False):
    q = _random((2, 4, 1, 32), torch.float16, seed)
    k = _random((2, 2, 40, 32), torch.float16, seed + 1)
    v = _random((2, 2, 40, 32), torch.float16, seed + 2)
    lens = torch.tensor([40, 17], dtype=torch.int32)
    if not paged:
        return q, k, v, lens
    pages = torch.tensor([[3, 0, 4], [1, 5, 2]], dtype=torch.int32)  # 16-token pages
    pool = torch.zeros(6, 2, 16, 32, dtype=torch.float16)
    vpool = torch.zeros_like(pool)
    for b in range(2):
        for j, page in enumerate(pages[b].tolist()):
            span = slice(16 * j, min(16 * j + 16, 40))
            pool[page, :, :span.stop - span.start] = k[b, :, span]
            vpool[page, :, :span.stop - span.start] = v[b, :, span]
    return q, pool, vpool, lens, pages
