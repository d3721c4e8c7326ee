"""Mamba's selective scan written in tegula, emulated on the CPU and checked against the
reference loop.

    h[b, d, :] ← exp(delta[b,d,t] · A[d, :]) · h[b, d, :] + delta[b,d,t] · B[b, :, t] · u[b,d,t]
    y[b, d, t] = C[b, :, t] · h[b, d, :] + D[d] · u[b,d,t]

A recurrence is a scan: h_t = a_t·h_{t-1} + b_t composes the maps h → a·h + b, and
composition is associative, so `tg.scan` over the pairs (a, b) with
`(a1, b1), (a2, b2) → (a1·a2, a2·b1 + b2)` gives, at every step t, h_t. The kernel walks
the sequence in chunks of BL steps; for each state n (a Python loop, unrolled) it scans the
chunk starting from the state the last chunk ended with (`initial=`), and the scan hands
back the state this chunk ends with (the carry), which `h[n]` carries to the next chunk.
The sum over states stays in each thread's registers. The library's version of this kernel
(`tegula/kernels/scan.py`, `SPLIT=False`) adds z (silu gate), delta_bias, softplus and
f16/bf16 inputs; its default (`tegula/kernels/scan_split.py`) instead splits each channel's
states over threads that walk the steps in order (no shuffles; faster on an H100). `main`
checks this kernel and the library's default.

    python examples/selective_scan.py
    tegula explain examples/selective_scan.py:selective_scan
"""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula import f32
from tegula.kernels.scan import selective_scan_emulated, selective_scan_reference


@tg.kernel(threads=128)
def selective_scan(u: tg.Tensor[f32, 3], delta: tg.Tensor[f32, 3], A: tg.Tensor[f32],
                   B: tg.Tensor[f32, 3], C: tg.Tensor[f32, 3], D: tg.Tensor[f32],
                   y: tg.Tensor[f32, 3], N: tg.constexpr = 16, BD: tg.constexpr = 8,
                   BL: tg.constexpr = 32):
    b, block = tg.block_id(0), tg.block_id(1)
    a = [tg.load(A.tile((BD, 1), (block, n))) for n in range(N)]          # (BD, 1) each
    skip = tg.load(D.transpose(1, 0).tile((BD, 1), (block, 0)))
    h = [tg.zeros((BD, 1), f32) for _ in range(N)]        # the states, carried over chunks
    one = tg.full((BD, 1), 1.0, f32)
    for k in tg.range(tg.cdiv(u.shape[2], BL)):
        ut = tg.load(u[b].tile((BD, BL), (block, k)))                       # (BD, BL)
        dt = tg.load(delta[b].tile((BD, BL), (block, k)))
        yt = ut * skip
        for n in range(N):
            bn = tg.load(B[b].tile((1, BL), (n, k)))                        # (1, BL)
            cn = tg.load(C[b].tile((1, BL), (n, k)))
            (_, hn), (_, h[n]) = tg.scan((tg.exp(dt * a[n]), dt * bn * ut), 1,
                                         lambda p, q: (p[0] * q[0], q[0] * p[1] + q[1]),
                                         initial=(one, h[n]))
            yt = yt + hn * cn
        tg.copy(yt, y[b].tile((BD, BL), (block, k)))


def main(batch: int = 2, dim: int = 12, length: int = 45, dstate: int = 16) -> None:
    rng = np.random.default_rng(0)
    u = rng.standard_normal((batch, dim, length)).astype(np.float32)
    delta = rng.uniform(0.01, 0.3, (batch, dim, length)).astype(np.float32)
    A = (-np.exp(rng.standard_normal((dim, dstate))) * 0.5).astype(np.float32)
    B, C = (rng.standard_normal((batch, dstate, length)).astype(np.float32) for _ in range(2))
    D = rng.standard_normal(dim).astype(np.float32)
    ref = selective_scan_reference(u, delta, A, B, C, D)
    y = np.full_like(u, np.nan)                 # poison: every element must be written
    tg.emulate(selective_scan, (batch, tg.cdiv(dim, 8)), u, delta, A, B, C, D[None, :], y,
               N=dstate)
    err = np.abs(y - ref).max()
    assert err <= 1e-5 * np.abs(ref).max(), err
    print(f"selective_scan kernel above: ok, max abs error {err:.2e}")
    z = rng.standard_normal((batch, dim, length)).astype(np.float32)
    bias = rng.uniform(0.0, 0.5, dim).astype(np.float32)
    out = selective_scan_emulated(u, delta, A, B, C, D, z, bias, delta_softplus=True)
    ref = selective_scan_reference(u, delta, A, B, C, D, z, bias, delta_softplus=True)
    err = np.abs(out - ref).max()
    assert err <= 1e-5 * np.abs(ref).max(), err
    print(f"library selective_scan (D, z, delta_bias, softplus): ok, max abs error {err:.2e}")


if __name__ == "__main__":
    main()
