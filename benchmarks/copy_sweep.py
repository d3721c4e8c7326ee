"""Sweep copy-kernel configurations on the GPU against torch's clone (a tuning aid).

Compares the library kernel (row tiles on grid axis 0) with a variant whose grid walks
column tiles fastest, so consecutively scheduled blocks read neighbouring memory.
"""
from __future__ import annotations

import torch
from triton.testing import do_bench

import tegula as tg
from tegula import f16
from tegula.kernels.copy import copy_kernel


@tg.kernel(threads=128)
def copy_columns_fastest(x: tg.Tensor[f16], y: tg.Tensor[f16],
                         BM: tg.constexpr = 16, BN: tg.constexpr = 128):
    n, m = tg.block_id(0), tg.block_id(1)
    tg.copy(tg.load(x.tile((BM, BN), (m, n))), y.tile((BM, BN), (m, n)))


rows_first = copy_kernel(f16)
for rows, cols in [(8192, 8192), (16384, 16384), (4096, 4096), (16384, 4096)]:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * 2
    ms = do_bench(lambda: x.clone(), return_mode="median")
    print(f"{rows}x{cols} torch clone {nbytes / ms / 1e9:.2f} TB/s")
    for bm, bn, threads in [(16, 128, 128), (8, 512, 256), (32, 256, 256), (4, 4096, 512),
                            (1, 4096, 256), (2, 4096, 512)]:
        for name, kernel, grid in [
                ("rows fastest", rows_first, (-(-rows // bm), -(-cols // bn))),
                ("cols fastest", copy_columns_fastest, (-(-cols // bn), -(-rows // bm)))]:
            run = lambda: kernel[grid](x, y, BM=bm, BN=bn, threads=threads)  # noqa: E731
            y.fill_(float("nan"))
            run()
            assert torch.equal(x, y)
            ms = do_bench(run, return_mode="median")
            print(f"{rows}x{cols} {name} BM={bm} BN={bn} threads={threads}: "
                  f"{nbytes / ms / 1e9:.2f} TB/s")
