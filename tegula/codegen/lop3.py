"""Two chained bitwise ops with constants, printed as one `lop3.b32` (`arch.logic`).

A kernel source's `(x & m) | c` is two tile ops, so thread IR has two Assigns per
register: `t = x & m`, then `y = t | c`. Printed as C, ptxas fuses them into one LOP3 but
moves one constant into a fresh register before every use; printed as the catalogue's
lop3 with both constants immediate it keeps the constant in one register (the W4A16
dequantization: 43 fewer SASS in a 530-SASS k-step). The emitter notes, along a
straight-line run of Assigns, which 32-bit integer registers hold `x op literal`
(`note`), and prints an Assign of `register op literal` on one of them as the fused
`tg_lop3` of x (`fused`) — while nothing has written x's registers since, so x still
holds the value the first op read. The first Assign is printed as well (the C compiler
drops it where nothing else reads it).
"""
from __future__ import annotations

from tegula.arch.logic import BITWISE, lut_of
from tegula.lower.thread_ir import Assign, Binary, Const, Literal, RegRead, Value


def _word_int(dtype) -> bool:
    return not dtype.is_float and dtype.bits == 32 and dtype.name != "bool"


def _split(v: Value) -> tuple[str, Value, int] | None:
    """(op, operand, constant) of `operand op constant` on 32-bit integers, else None."""
    if not (isinstance(v, Binary) and v.op in BITWISE and _word_int(v.dtype)):
        return None
    for x, y in ((v.x, v.y), (v.y, v.x)):   # and / or / xor commute
        if isinstance(y, Literal) and not isinstance(x, Literal) and _word_int(x.dtype):
            return v.op, x, int(y.value) & 0xFFFFFFFF
    return None


def _key(s_or_read) -> tuple | None:
    r = s_or_read.dst if isinstance(s_or_read, Assign) else s_or_read.reg
    return (id(r.array), r.index.value) if isinstance(r.index, Const) else None


def _reads(v: Value, array) -> bool:
    if isinstance(v, RegRead):
        return v.reg.array is array
    return any(_reads(getattr(v, f), array) for f in ("x", "y", "cond", "if_true",
                                                      "if_false") if hasattr(v, f))


def note(known: dict, s: Assign) -> None:
    """Update `known` (register key -> (op, x, constant)) past Assign `s`: forget what
    `s` overwrites (its register, and every entry whose x reads its array), then
    remember `s` itself if it is `x op constant`."""
    for key in [k for k, (_, x, _) in known.items() if _reads(x, s.dst.array)]:
        del known[key]
    key = _key(s)
    known.pop(key, None)
    split = _split(s.value)
    if (key is not None and split is not None and _word_int(s.dst.array.dtype)
            and not _reads(split[1], s.dst.array)):   # x would be gone at the second op
        known[key] = split


def fused(known: dict, s: Assign) -> tuple[Value, int, int, int] | None:
    """(x, lut, b, c) where Assign `s` is `(x op1 b) op2 c` through a register in
    `known`, else None."""
    outer = _split(s.value)
    if outer is None or not isinstance(outer[1], RegRead) or not _word_int(s.dst.array.dtype):
        return None
    inner = known.get(_key(outer[1]))
    if inner is None:
        return None
    return inner[1], lut_of(inner[0], outer[0]), inner[2], outer[2]
