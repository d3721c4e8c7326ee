"""Every gemm plan synthesis picks for the library's kernels and the synthesis test kernels,
one line per build, to compare two versions of the search (no GPU).

    PYTHONPATH=. python3 benchmarks/search_picks.py > picks.txt [--fuzz N]

Each line: the build (kernel, constexprs, target), then per gemm in program order its
instruction, warp grid and kind. Issue 11 asks that the joint search over all gemms of a
traced program (`synth/search.py`) reproduce the picks of the greedy per-op planning and
the pairwise chain search it replaced: the two outputs must be identical. `--fuzz N` adds
the first N programs of the fuzzer's seed 1 (its gemms on every target it builds for).
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "synth"))

TARGETS = ("sm_80", "sm_90a")


def _m(name: str):
    return importlib.import_module(name)


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def builds():
    """(label, kernel, constexprs) of every build compared."""
    from tegula.dtypes import bf16, f16
    gemm, at, ab = _m("tegula.kernels.gemm"), _m("tegula.kernels.attention"), \
        _m("tegula.kernels.attention_backward")
    readme = _example("gemm").gemm
    for tiles in (dict(), dict(BM=64, BN=64), dict(BM=128, BN=256, BK=64, threads=256),
                  dict(BM=64, BN=128, BK=16, STAGES=4), dict(BM=32, BN=32, BK=32)):
        yield "readme gemm", readme, tiles
    for act in (None, "gelu"):
        yield f"gemm {act}", gemm.gemm_kernel(f16, act, act is not None), \
            dict(BM=128, BN=256, BK=64, threads=256)
        yield f"registers gemm {act}", gemm.gemm_registers_kernel(f16, act), {}
    yield "persistent gemm", gemm.persistent_gemm_kernel(f16), dict(BM=128, BN=256, BK=64,
                                                                     STAGES=4, threads=256)
    yield "split-k gemm", gemm.gemm_split_k_kernel(bf16), {}
    for d in (64, 128, 256):
        fixed = dict(D=d, QK_SCALE=at.qk_scale(None, d))
        for c in at.attention_candidates(d, True) + at.attention_candidates(d, False):
            yield f"attention fwd D={d}", at.attention_kernel(f16), dict(fixed, **c)
        for c in ab.backward_candidates(d):
            cx = dict(c, D=d, SCALE=1 / math.sqrt(d), CAUSAL=False)
            yield f"bwd dkdv D={d}", ab.attention_backward_dkdv_kernel(f16), cx
            yield f"bwd dq D={d}", ab.attention_backward_dq_kernel(f16), cx
    chain_kernels = _m("chain_kernels")
    for name in ("attention_block", "two_chunk_chain"):
        for tiles in (dict(), dict(BM=128), dict(BN=32)) if name == "attention_block" else (dict(),):
            yield f"chain {name}", getattr(chain_kernels, name), tiles
    epilogue = _m("test_epilogue_reduce")
    for name in dir(epilogue):
        kernel = getattr(epilogue, name)
        if hasattr(kernel, "fn") and hasattr(kernel, "threads"):
            yield f"epilogue {name}", kernel, {}
    fp8 = _m("tegula.kernels.fp8")
    yield "fp8", fp8.fp8_gemm_kernel(bf16), {}
    yield "fp8 blockwise", fp8.fp8_blockwise_gemm_kernel(bf16), dict(BM=64, BN=128, STAGES=4)


def picks(kernel, cx: dict, target: str) -> str:
    from tegula.build import build
    from tegula.errors import TegulaError
    from tegula.ir.ops import Gemm, walk_ops
    try:
        result = build(kernel, dict(cx), None, target)
    except TegulaError as err:
        return "refused: " + str(err).splitlines()[0][:120]
    out = []
    for op in walk_ops(result.traced.body):
        if isinstance(op, Gemm):
            plan = op.choices["plan"]
            grid = getattr(plan, "grid", None)
            out.append(f"{plan.kind}:{plan.atom.name}:{grid.wm}x{grid.wn}")
    return " ".join(out)


def fuzz_lines(count: int):
    from tegula.fuzz import make_program
    from tegula.fuzz.source import forget_kernel, kernel_source, make_kernel
    for index in range(count):
        program = make_program(1, index)
        kernel, filename = make_kernel(kernel_source(program))
        try:
            for target in TARGETS:
                yield f"fuzz 1/{index} {target}: {picks(kernel, {}, target)}"
        finally:
            forget_kernel(filename)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fuzz", type=int, default=0)
    options = parser.parse_args()
    start = time.time()
    for label, kernel, cx in builds():
        config = ",".join(f"{k}={v}" for k, v in cx.items() if k not in ("SCALE", "QK_SCALE"))
        for target in TARGETS:
            print(f"{label} [{config}] {target}: {picks(kernel, cx, target)}", flush=True)
    for line in fuzz_lines(options.fuzz):
        print(line, flush=True)
    print(f"# {time.time() - start:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
