"""Instruction accounting of the W4A16 fragment kernel's main loop, from its SASS (needs
nvcc/NVRTC and cuobjdump; no GPU): `python benchmarks/w4a16_sass.py [--dtype f16|bf16]
[--config 'KS=4,STAGES=6,...'] ...`. For each config it builds the kernel for sm_90a
(16 tokens, group 128, zero points, cp.async ring unless the config says otherwise),
finds the k-loop (the backward branch whose body holds the HGMMAs), and prints the loop's
SASS per class — dequantization (LOP3/PRMT/SHF/HADD2/HMUL2/HFMA2), tensor core (HGMMA and
the warpgroup fences), loads (LDGSTS/LDS/LDG), uniform datapath (U*: descriptors, loop
counters), address and predicate arithmetic (IMAD/LEA/IADD3/ISETP/LDC ...), the rest —
and each class per weight (a thread's weights of a k-step: 64·KS·WG·64 / (128·WG); two
k-steps a loop with PAIRS=1).
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLASSES = (   # (class, opcode prefixes), the first match wins
    ("dequant", ("LOP3", "PRMT", "SHF", "HADD2", "HMUL2", "HFMA2", "F2FP")),
    ("tensor core", ("HGMMA", "WARPGROUP", "FFMA")),
    ("loads", ("LDGSTS", "LDS", "LDG", "LDGDEPBAR", "DEPBAR")),
    ("sync", ("BAR", "MEMBAR", "FENCE")),
    ("uniform", ("U",)),
    ("address/predicate", ("IMAD", "LEA", "IADD3", "VIADD", "ISETP", "LDC", "MOV", "SEL",
                           "CS2R", "IABS", "BRA")),
)
DEFAULT = dict(G=128, BT=16, STAGES=6, KS=4, warp_specialize=False, load_path="cp.async")


def loop_body(sass: str) -> list[str]:
    """The opcodes (predicates stripped) of the innermost loop whose body holds the
    HGMMAs."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2).strip()))
    best: list[str] = []
    for addr, text in ins:
        m = re.search(r"BRA\s+(?:`?\(?)0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for a, t in ins
                    if int(m.group(1), 16) <= a <= addr]
            # the innermost such loop: a warp-specialized kernel's producer branches back
            # around the consumer's loop too (its region held the prologue and the TMA issue)
            if any(op.startswith("HGMMA") for op in body) and (not best
                                                               or len(body) < len(best)):
                best = body
    return best


def classify(ops: list[str]) -> dict[str, int]:
    counts: dict[str, int] = collections.Counter()
    for op in ops:
        name = next((c for c, prefixes in CLASSES if op.startswith(prefixes)), "other")
        counts[name] += 1
    return counts


def account(dtype_name: str, config: dict) -> tuple[dict, collections.Counter, float]:
    from tegula.build import build
    from tegula.dtypes import bf16, f16
    from tegula.kernels.quant_fragment import w4a16_fragment_kernel
    from tegula.runtime.compiler import compile_cuda, disassemble

    constexprs = dict(DEFAULT, **config)
    partial = bool(constexprs.pop("SPLIT", 1) > 1)
    dtype = {"f16": f16, "bf16": bf16}[dtype_name]
    result = build(w4a16_fragment_kernel(dtype, True, partial), constexprs, target="sm_90a")
    sass = disassemble(compile_cuda(result.cuda_source(), result.thread_kernel.name,
                                    result.target.sm))
    if sass is None:
        raise RuntimeError("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
    ops = loop_body(sass)
    weights = 64 * constexprs["KS"] * 64 // 128      # a thread's weights of a k-step
    weights *= 2 if constexprs.get("PAIRS") else 1    # PAIRS: two k-steps a loop
    return classify(ops), collections.Counter(ops), weights


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="f16", choices=("f16", "bf16"))
    parser.add_argument("--config", action="append", default=None,
                        help="comma-separated NAME=VALUE constexprs over the default "
                             f"{DEFAULT} (repeatable)")
    parser.add_argument("--opcodes", action="store_true", help="also every opcode's count")
    args = parser.parse_args()
    configs = args.config or ["", "INTEGER_ZEROS=1", "INTEGER_ZEROS=1,SCALE_AFTER=1",
                              "INTEGER_ZEROS=1,SCALE_AFTER=1,KS=8,STAGES=4"]
    names = [c for c, _ in CLASSES] + ["other"]
    print(f"{'config':44} {'loop':>5} {'/w':>5}  " + "  ".join(f"{n:>10}" for n in names))
    for text in configs:
        config = {k: int(v) if v.isdigit() else {"True": True, "False": False}.get(v, v)
                  for k, v in (kv.split("=") for kv in text.split(",") if kv)}
        classes, opcodes, weights = account(args.dtype, config)
        total = sum(classes.values())
        print(f"{text or 'session 11 default':44} {total:5d} {total / weights:5.2f}  "
              + "  ".join(f"{classes.get(n, 0) / weights:10.2f}" for n in names), flush=True)
        if args.opcodes:
            print("   " + ", ".join(f"{op} {n}" for op, n in opcodes.most_common()))
    print("per weight: a thread's loop instructions / its weights of one k-step "
          "(64·KS·64/128); SASS of sm_90a, 16 tokens, group 128, zero points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
