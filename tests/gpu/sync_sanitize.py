"""One launch of each barrier-placement kernel (`tests/lower/sync_kernels.py`) on the GPU,
checked against numpy element by element, for running under compute-sanitizer:

    compute-sanitizer --tool racecheck python tests/gpu/sync_sanitize.py consumer
    compute-sanitizer --tool synccheck python tests/gpu/sync_sanitize.py plain
    compute-sanitizer --tool racecheck python tests/gpu/sync_sanitize.py scan
    compute-sanitizer --tool racecheck python tests/gpu/sync_sanitize.py stages

`--missing-barrier` lowers as before the fix of the warp-specialized consumer loop (no
barrier between one iteration's reads of its scratch tile and the next iteration's write),
so racecheck can show that race on hardware. Exits non-zero when a result is wrong."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

import tegula as tg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lower"))
import sync_kernels as K  # noqa: E402


def run_plain() -> None:
    x = K.plain_inputs()
    xt = torch.from_numpy(x).cuda()
    for name, kernel, ref, args in K.PLAIN_CASES:
        y = torch.full((K.T, K.T), float("nan"), device="cuda")
        kernel[(1,)](xt, y, *args)
        torch.cuda.synchronize()
        np.testing.assert_allclose(y.cpu().numpy(), ref(x, *args), rtol=1e-6, atol=1e-6,
                                   err_msg=name)


def run_consumer(m: int = 200, n: int = 130, k: int = 328) -> None:
    a, b = K.consumer_scratch_inputs(m, n, k)
    c = torch.full((m, n), float("nan"), device="cuda")
    K.consumer_scratch[(tg.cdiv(m, 64), tg.cdiv(n, 64))](
        torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda(), c)
    torch.cuda.synchronize()
    np.testing.assert_allclose(c.cpu().numpy(), K.consumer_scratch_ref(a, b),
                               rtol=1e-3, atol=1e-2)


def run_scan(n: int = 3) -> None:
    x = K.scan_chain_inputs(n)
    y = torch.full((2, x.shape[1]), float("nan"), device="cuda")
    K.scan_chain[(2,)](torch.from_numpy(x).cuda(), y, n)
    torch.cuda.synchronize()
    assert np.array_equal(y.cpu().numpy(), K.scan_chain_ref(x, n)), "scan chain"


def run_stages() -> None:
    """The double-buffered loop with one barrier per iteration (STEP 1: the next iteration
    writes the other stage) and the loops that keep two (STEP 2, a write one ahead)."""
    x = K.stage_inputs()
    xt = torch.from_numpy(x).cuda()
    for step, ahead in ((1, 0), (2, 0), (1, 1)):
        y = torch.full((16, 32), float("nan"), device="cuda")
        K.stage_per_iteration[(2,)](xt, y, STEP=step, AHEAD=ahead)
        torch.cuda.synchronize()
        np.testing.assert_allclose(y.cpu().numpy(), K.stage_reference(x, step), rtol=1e-5,
                                   atol=1e-5, err_msg=f"step {step}, ahead {ahead}")


def missing_barrier() -> None:
    """Lower the consumer loop as before the fix (`carried_conflict` never true)."""
    from tegula.lower import lower
    lower.SharedSync.carried_conflict = lambda self, ignore=frozenset(), advance=None: False


CASES = {"plain": run_plain, "consumer": run_consumer, "scan": run_scan, "stages": run_stages}

if __name__ == "__main__":
    if "--missing-barrier" in sys.argv:
        missing_barrier()
    for case in [a for a in sys.argv[1:] if not a.startswith("--")] or list(CASES):
        CASES[case]()
        print(f"{case}: right")
