"""One small launch of a library kernel, checked, for running under compute-sanitizer.

    compute-sanitizer --tool memcheck python tests/gpu/sanitize.py gemm
    compute-sanitizer --tool racecheck python tests/gpu/sanitize.py softmax

Each case uses shapes that do not divide the tiles, so the predicated boundary paths run
(the sanitizer sees every out-of-bounds or racy access there). Exits non-zero when the
result is wrong; the sanitizer's "ERROR SUMMARY" line says whether the accesses were clean.
`tests/gpu/test_sanitize.py` runs this under both tools.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

import tegula as tg
from tegula.dtypes import f32
from tegula.kernels.softmax import softmax_config, softmax_kernel


def run_gemm(target: str | None = None, warp_specialize: bool | None = None) -> None:
    """The DESIGN GEMM (examples/gemm.py), 3-stage pipeline, ragged M, N, K: on an H100 the
    default target is sm_90a (TMA + mbarrier ring + wgmma; `warp_specialize=True`: a
    producer warpgroup and a consumer role, `False` one role; at this 64x64 tile the cost
    model's default is one role);
    `target="sm_90"` is the Ampere path (cp.async + ldmatrix + mma.sync) built for Hopper."""
    path = Path(__file__).resolve().parents[2] / "examples" / "gemm.py"
    spec = importlib.util.spec_from_file_location("tegula_example_gemm_sanitize", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    m, n, k = 150, 70, 104
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half()
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    module.gemm[(tg.cdiv(m, 64), tg.cdiv(n, 64))](a, b, c, BM=64, BN=64, BK=32, STAGES=3,
                                                  target=target,
                                                  warp_specialize=warp_specialize)
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=2e-3, atol=2e-3)


def run_warp_specialized() -> None:
    """The producer/consumer sample (codegen/samples.py): a TMA producer warpgroup and a
    wgmma consumer warpgroup meeting at full/empty mbarrier rings, ragged M, N, K."""
    from tegula.codegen.samples import warp_specialized_gemm
    from tegula.runtime import compile_kernel
    m, n, k = 97, 130, 200
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half()
    c = torch.full((m, n), float("nan"), device="cuda")
    compile_kernel(warp_specialized_gemm(64, 2), "sm_90a")[(tg.cdiv(n, 64), tg.cdiv(m, 64))](
        a, b, c)
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a.float() @ b.float().T, rtol=1e-3, atol=1e-3)


def run_persistent_gemm(warp_specialize: bool | None = None, cluster: int = 1,
                        consumers: str | None = None) -> None:
    """examples/persistent_gemm.py on sm_90a: 3 blocks walking 12 ragged tiles, the TMA
    ring running across each block's tiles (5 K iterations on 3 stages, so every tile
    starts at another stage) and the TMA-store epilogue (c's rows are 464 bytes, a
    multiple of 16), warp-specialized by default or in one role; with `cluster=2`, 2-CTA
    clusters multicasting b's boxes (4 blocks: 3 row tiles, so one block's last tile lies
    past M and still takes part); with `consumers="pingpong"`, two consumer warpgroups
    taking turns over each block's tiles (5 blocks: 3 or 2 tiles each, odd and even)."""
    path = Path(__file__).resolve().parents[2] / "examples" / "persistent_gemm.py"
    spec = importlib.util.spec_from_file_location("tegula_example_persistent_sanitize", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    m, n, k = 150, 232, 152
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half()
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    grid = (3,) if cluster == 1 else (2 * cluster,)
    options = {}
    if consumers is not None:
        grid, options = (5,), dict(consumers=consumers, threads=128)
    module.persistent_gemm[grid](a, b, c, BM=64, BN=64, BK=32, STAGES=3, target="sm_90a",
                                 warp_specialize=warp_specialize, CLUSTER=cluster, **options)
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=2e-3, atol=2e-3)


def run_softmax() -> None:
    """Row softmax in f32 with a ragged row length (the -inf fill path and the cross-warp
    reduction through shared memory)."""
    shape = (10, 1000)
    x = torch.randn(shape, device="cuda") * 3
    y = torch.full(shape, float("nan"), device="cuda")
    grid, constexprs = softmax_config(shape)
    softmax_kernel(f32)[grid](x, y, **constexprs)
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.softmax(x, dim=1), rtol=1e-5, atol=1e-7)


def run_planted_oob() -> None:
    """A thread-IR kernel that writes far past its tensor: memcheck must report it (this
    proves the harness sees errors at all)."""
    from tegula.dtypes import f32 as f32_
    from tegula.lower.thread_ir import (TID, Const, GlobalStore, Literal, Reg, RegArray,
                                        TensorParam, ThreadKernel, Assign)
    from tegula.runtime import compile_kernel
    r = RegArray("v", f32_, 1)
    kernel = ThreadKernel(
        name="planted_oob", threads=32, params=[TensorParam("y", f32_, 1, writes=True)],
        registers=[r], shared=[],
        body=[Assign(Reg(r, Const(0)), Literal(1.0, f32_)),
              GlobalStore("y", TID + (1 << 28), Reg(r, Const(0)), 1)])
    y = torch.zeros(32, device="cuda")
    compile_kernel(kernel)[1](y)
    torch.cuda.synchronize()


CASES = {"gemm": lambda: run_gemm(warp_specialize=True), "gemm_ampere": lambda: run_gemm("sm_90"),
         "gemm_one_role": lambda: run_gemm(warp_specialize=False),
         "warp_specialized": run_warp_specialized, "softmax": run_softmax,
         "persistent_gemm": run_persistent_gemm,
         "persistent_gemm_one_role": lambda: run_persistent_gemm(warp_specialize=False),
         "persistent_gemm_cluster": lambda: run_persistent_gemm(cluster=2),
         "persistent_gemm_pingpong": lambda: run_persistent_gemm(consumers="pingpong"),
         "planted_oob": run_planted_oob}


def main(argv: list[str]) -> int:
    names = argv or list(CASES)
    for name in names:
        CASES[name]()
        print(f"{name}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
