"""The launch grid as a build fact on the GPU (session 14): `kernel[grid](...)` passes its
grid's block count to the build (`grid_blocks`), so the README GEMM's default tile, one
role at a full grid (two blocks an SM), gets a producer warpgroup on a grid of at most one
block an SM, and stays in one role on a grid of two. Both launches write into outputs
poisoned with NaN, checked element by element against torch; the shapes do not divide the
tiles."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from gemm import gemm  # noqa: E402

pytestmark = pytest.mark.gpu


def _roles(build) -> list[bool]:
    from tegula.ir.ops import ForLoop, walk_ops
    return ["roles" in op.choices for op in walk_ops(build.traced.body)
            if isinstance(op, ForLoop) and ("roles" in op.choices or "roles_skipped" in op.choices)]


@pytest.mark.parametrize("mn,producer", [((500, 1000), True), ((2000, 4000), False)])
def test_a_launch_builds_for_its_grid(mn, producer):
    import torch

    import tegula as tg
    from tegula.build import build
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU for sm_90a")
    m, n = mn
    k = 1000
    torch.manual_seed(m)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    grid = (tg.cdiv(m, 128), tg.cdiv(n, 128))  # 32 blocks (one an SM) or 512 (four)
    gemm[grid](a, b, c, target="sm_90a")
    torch.cuda.synchronize()
    ref = a.double() @ b.double().T
    assert not torch.isnan(c).any()
    assert ((c.double() - ref).abs() <= 2e-3 * ref.abs() + 3e-2).all()
    blocks = grid[0] * grid[1]
    launched = [bld for bld in gemm.__dict__["_builds"].values()
                if bld.target.name == "sm_90a" and bld.constexprs.get("grid_blocks") == blocks]
    if producer:
        assert launched and all(_roles(bld) == [True] for bld in launched)
    else:  # the full grid's build: one role, no grid recorded
        assert not launched
        full = build(gemm, {}, None, "sm_90a")
        assert _roles(full) == [False]
