"""Sweep copy-kernel configurations on the GPU against torch's clone (a tuning aid)."""
from __future__ import annotations

import torch
from triton.testing import do_bench

from tegula.dtypes import f16
from tegula.kernels.copy import copy_kernel

kernel = copy_kernel(f16)
for rows, cols in [(8192, 8192), (16384, 16384), (4096, 4096)]:
    x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * 2
    ms = do_bench(lambda: x.clone(), return_mode="median")
    print(f"{rows}x{cols} torch clone {nbytes / ms / 1e9:.2f} TB/s")
    for bm, bn, threads in [(16, 128, 128), (16, 256, 256), (32, 256, 256), (8, 512, 256),
                            (16, 512, 512), (32, 512, 512), (64, 256, 512), (4, 4096, 512),
                            (8, 1024, 128), (32, 128, 128)]:
        grid = (-(-rows // bm), -(-cols // bn))
        run = lambda: kernel[grid](x, y, BM=bm, BN=bn, threads=threads)  # noqa: E731
        run()
        assert torch.equal(x, y)
        ms = do_bench(run, return_mode="median")
        print(f"{rows}x{cols} BM={bm} BN={bn} threads={threads}: {nbytes / ms / 1e9:.2f} TB/s")
