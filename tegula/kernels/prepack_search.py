"""The pre-packed global layout of a constant operand as a search decision (issue 11).

W4A16's 4-bit weights are constant across calls, so how they are stored in global memory
is the caller's choice, made once: "plain" (row-major packed bytes, `quantize_w4` /
`prepack`) read by the rows, GEMM and swapped kernels, or "fragment" (`pack_fragments`:
the wgmma A fragment's order, one 16-byte load per thread and k-step) read by the
fragment kernel and, at one token, the CUDA-core GEMV kernel (`quant_gemv`). Each layout has its own kernels and configurations, and a split-K
configuration runs two launches (the partial product and its sum), so the decision is
scored as whole launch plans: `tegula.recommend.recommend_plans` ranks every plan of both
layouts by the cost model, one ranking with `w_layout` a coordinate of the decision
vector next to the kernels' constexprs.

    result = recommend_w4a16_layout(16, 14336, 4096, group_size=128)
    print(result)                    # the top plans, why the others lost
    result.best["w_layout"]          # "fragment": pre-pack with pack_fragments

`tegula explain --w4a16 MxNxK [--group G]` prints the same report. The plans are exactly
what `matmul_w4a16` times on each layout (`quant.w4a16_candidates`,
`quant.fragment_candidates`, its splits fitted to a 132-SM H100), launched as
`quant.launch_w4a16` launches them; nothing is built for a GPU and no memory is touched
(the arrays are shape stand-ins).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from tegula.dtypes import DType, f16
from tegula.recommend import Launch, Recommendation, recommend_plans

#: The stored layouts of W4A16's weights: the values of the `w_layout` coordinate.
WEIGHT_LAYOUTS = ("plain", "fragment")


def w4a16_layout_plans(m: int, n: int, k: int, group_size: int = 128, dtype: DType = f16,
                       has_zeros: bool = True) -> dict[str, list]:
    """{layout: [(config, [Launch, ...]), ...]}: every configuration `matmul_w4a16` would
    time on weights stored in that layout, with the launches it makes."""
    from tegula.kernels.quant import (check_w4a16_shapes, fragment_candidates,
                                      launch_w4a16, w4a16_candidates, w4a16_config,
                                      w4a16_operands)
    from tegula.kernels.quant_fragment import fragment_shape

    groups = k // group_size if isinstance(group_size, int) and group_size > 0 else 0
    check_w4a16_shapes("recommend_w4a16_layout", (m, k), n, k, (n, groups),
                       (n, groups) if has_zeros else None, group_size)
    stand_in = lambda shape, kind=np.float16: np.empty(shape, kind)  # noqa: E731
    a, c = stand_in((m, k)), stand_in((m, n))
    scales = stand_in((n, groups))
    zeros = stand_in((n, groups)) if has_zeros else stand_in((1, 1))
    stored = {"plain": (stand_in((n, k // 2), np.uint8), w4a16_candidates(m, group_size)),
              "fragment": (stand_in(fragment_shape(n, k)[:5] + (16,), np.uint8),
                           fragment_candidates(m, n, k, group_size=group_size))}
    plans: dict[str, list] = {}
    for layout in WEIGHT_LAYOUTS:
        packed, candidates = stored[layout]
        for config in candidates:
            tiles = {key: value for key, value in config.items() if key != "threads"}
            kind, grid, constexprs = w4a16_config(m, n, k, group_size, **tiles)
            if "threads" in config:
                constexprs = {**constexprs, "threads": config["threads"]}
            operands = (*w4a16_operands(kind, a, packed, group_size), scales, zeros)
            launches: list[Launch] = []
            launch_w4a16(kind, grid, constexprs, dtype, has_zeros, operands, c,
                         lambda kernel, g, args, cx: launches.append(
                             Launch(kernel, tuple(g), tuple(args), dict(cx))),
                         lambda shape: stand_in(shape, np.float32))
            plans.setdefault(layout, []).append((dict(config), launches))
    return plans


def recommend_w4a16_layout(m: int, n: int, k: int, group_size: int = 128,
                           dtype: DType = f16, has_zeros: bool = True, top_k: int = 5,
                           target: str | None = None, budget: int = 256) -> Recommendation:
    """Rank the plans of both weight layouts for an (M, N, K) W4A16 product by predicted
    time (module docstring); `.best["w_layout"]` is the layout to pre-pack the weights in."""
    plans = w4a16_layout_plans(m, n, k, group_size, dtype, has_zeros)
    return recommend_plans(f"matmul_w4a16 {m}x{n}x{k} (group {group_size})", "w_layout",
                           plans, top_k=top_k, target=target, budget=budget)


__all__ = ["WEIGHT_LAYOUTS", "w4a16_layout_plans", "recommend_w4a16_layout"]
