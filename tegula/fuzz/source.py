"""A fuzz program as the source text of a `@tg.kernel` (what a failure prints) and the
kernel object made by executing that text."""
from __future__ import annotations

import linecache

from tegula.fuzz.program import (GEMM_ACCUMULATOR, Alias, Assign, Binary, Cast, Extent, Full,
                                 Branch, Gemm, InPlace,
                                 Indices, Load, Loop, Num, Program, Reduce, Stash, Store, Unary,
                                 Cumsum,
                                 Unstash, Where, check)

KERNEL_NAME = "fuzz_kernel"
_OPERATOR = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%",
             "pow": "**", "and": "&",
             "or": "|", "xor": "^", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
             "eq": "==", "ne": "!="}
_FUNCTION = {"max": "tg.maximum", "min": "tg.minimum"}
_DTYPE = {"bool": "tg.bool_"}


def _dtype(name: str) -> str:
    return _DTYPE.get(name, name)


def _operand(x) -> str:
    """An operand's text; negative numbers in parentheses (`-2.0 ** x` is `-(2.0 ** x)`)."""
    if isinstance(x, Extent):
        return x.text()
    if not isinstance(x, Num):
        return x
    text = x.text()
    return f"({text})" if text.startswith("-") else text


def _shape(shape: tuple[bool, bool]) -> str:
    return f"({'BM' if shape[0] else '1'}, {'BN' if shape[1] else '1'})"


def _fill(fill: Num | None) -> str:
    return "" if fill is None else f", fill={fill.text()}"


class _Writer:
    def __init__(self, program: Program):
        self.program = program
        self.lines: list[str] = []
        self.indent = 1
        self.shapes: dict[str, tuple[bool, bool]] = {}
        self.buffers = 0
        self.loop_start = 0  # where a pipeline's staged buffers go (before its loop)
        self.scratch: set[str] = set()  # scratch tiles declared so far (`Stash`)

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def fresh_buffer(self) -> str:
        self.buffers += 1
        return f"s{self.buffers}"

    def shape_of(self, x) -> tuple[bool, bool]:
        return self.shapes.get(x, (True, True)) if isinstance(x, str) else (False, False)


def kernel_source(program: Program) -> str:
    """The kernel's source: imports, the decorated function, and a comment saying how to
    launch it (grid and tensor extents)."""
    w = _Writer(program)
    types = check(program)
    w.shapes = {name: t.shape for name, t in types.items()}
    used = used_tensors(program.body)
    tensors = [t for t in program.tensors if t.name in used]
    params = [f"{t.name}: tg.Tensor[{t.dtype}]" for t in tensors]
    params += [f"BM: tg.constexpr = {program.BM}", f"BN: tg.constexpr = {program.BN}"]
    header = [
        "import tegula as tg",
        "from tegula import f32, f16, bf16, f8e4m3, f8e5m2, i32, i8, u8",
        "",
        f"# {program.label}".rstrip(),
        f"# grid {program.launch_grid}"
        + (f" over tiles {program.grid}" if program.persistent else "") + "; " + ", ".join(
            f"{t.name}: {t.dtype}{list(program.extents(t))}" for t in tensors),
        *_build_comment(program),
        f"@tg.kernel(threads={program.threads})",
        f"def {KERNEL_NAME}(" + ", ".join(params) + "):",
    ]
    if program.cluster > 1:
        w.emit(f"tg.cluster({program.cluster})")
    if program.persistent:  # the blocks walk the tiles in a tile loop (`Program.persistent`)
        gm, gn = program.grid
        w.emit(f"for t in tg.range(tg.block_id(0), {gm * gn}, tg.num_programs(0)):")
        w.indent += 1
        w.emit(f"m, n = t // {gn}, t % {gn}")
    else:
        w.emit("m, n = tg.block_id(0), tg.block_id(1)")
    for s in program.body:
        _statement(w, s, types)
    return "\n".join(header + w.lines) + "\n"


def _build_comment(program: Program) -> list[str]:
    """A comment line naming the sm_90a build options the program launches with (the
    runner passes them at the launch: in the decorator sm_80 would refuse them)."""
    options = [f"{name}={value!r}" for name, value in (("warp_specialize",
                                                          program.warp_specialize),
                                                         ("consumers", program.consumers))
               if value is not None]
    return [f"# sm_90a launch options: {', '.join(options)}"] if options else []


def used_tensors(body) -> set[str]:
    used = set()
    for s in body:
        if isinstance(s, Loop):
            used.add(s.tensor)
            used |= used_tensors(s.body)
        elif isinstance(s, (Load, Store)):
            used.add(s.tensor)
        elif isinstance(s, Binary):
            used |= {x.tensor for x in (s.a, s.b) if isinstance(x, Extent)}
        elif isinstance(s, Gemm):
            used |= {s.a, s.b}
    return used


def _view(program: Program, s: Load) -> str:
    if s.loop is not None:
        return f"g{s.loop}[:, :, i{s.loop}]"
    if s.route == "transposed":
        return f"{s.tensor}.tile((BN, BM), (n, m))"
    return f"{s.tensor}.tile((BM, BN), (m, n))"


def _load(w: _Writer, s: Load, dtype: str, loop: Loop | None) -> None:
    view, fill, dt = _view(w.program, s), _fill(s.fill), _dtype(dtype)
    if s.route == "load":
        w.emit(f"{s.out} = tg.load({view}{fill})")
    elif s.route == "copy":
        w.emit(f"{s.out} = tg.register((BM, BN), {dt})")
        w.emit(f"tg.copy({view}, {s.out}{fill})")
    elif s.route in ("shared", "shared2"):
        buf = w.fresh_buffer()
        if loop is not None and loop.stages > 1:
            # A pipeline's buffers have a stage per iteration in flight, made before the loop.
            w.lines.insert(w.loop_start, "    " * (w.indent - 1) +
                           f"{buf} = tg.shared((BM, BN), {dt}, stages={loop.stages})")
            target = f"{buf}[i{loop.id}]"
        else:
            w.emit(f"{buf} = tg.shared((BM, BN), {dt})")
            target = buf
        w.emit(f"tg.copy({view}, {target}{fill})")
        if s.route == "shared2":
            second = w.fresh_buffer()
            w.emit(f"{second} = tg.shared((BM, BN), {dt})")
            w.emit(f"tg.copy({target}, {second})")
            target = second
        w.emit(f"{s.out} = tg.load({target})")
    elif s.route == "via_register":
        buf = w.fresh_buffer()
        w.emit(f"{s.out} = tg.load({view}{fill})")
        w.emit(f"{buf} = tg.shared((BM, BN), {dt})")
        w.emit(f"tg.copy({s.out}, {buf})")
        w.emit(f"{s.out} = tg.load({buf})")
    elif s.route == "transposed":
        buf = w.fresh_buffer()
        w.emit(f"{buf} = tg.shared((BN, BM), {dt})")
        w.emit(f"tg.copy({view}, {buf}{fill})")
        w.emit(f"{s.out} = tg.load({buf}.T)")
    else:
        raise ValueError(f"unknown load route {s.route!r}")


def _store(w: _Writer, s: Store, dtype: str) -> None:
    shape = _shape(w.shape_of(s.x))
    view = f"{s.tensor}.tile({shape}, (m, n))"
    if s.route == "copy":
        w.emit(f"tg.copy({s.x}, {view})")
        return
    buf = w.fresh_buffer()
    w.emit(f"{buf} = tg.shared({shape}, {_dtype(dtype)})")
    w.emit(f"tg.copy({s.x}, {buf})")
    if s.route == "shared":
        w.emit(f"tg.copy({buf}, {view})")
    else:
        w.emit(f"tg.copy(tg.load({buf}), {view})")


def _gemm(w: _Writer, s: Gemm) -> None:
    """One K tile (stages 0), or the README's GEMM loop: `tg.range` over the K tiles
    (stages 1) or `tg.pipeline` with staged shared buffers (stages ≥ 2). A transposed
    operand (`Gemm.ta` / `tb`) is tiled (bk, rows) into a (bk, rows) buffer read through
    its `.T` ("smem"), or tiled (rows, bk) through the tensor's `.T` view ("gmem")."""
    dt = _dtype(w.program.tensor(s.a).dtype)
    operands = []
    sides = ((s.a, "BM", "m", s.ta), (s.b, "BN", "n", s.tb))
    if s.stages > 0:
        index = f"{s.a}_k"  # names unique to this gemm (tensor names are)
        for tensor, rows, coord, trans in sides:
            if trans == "smem":
                w.emit(f"{tensor}_t = {tensor}.tile(({s.bk}, {rows}), (None, {coord}))")
            else:
                source = f"{tensor}.T" if trans == "gmem" else tensor
                w.emit(f"{tensor}_t = {source}.tile(({rows}, {s.bk}), ({coord}, None))")
        buffers = []
        if s.route == "shared":
            staged = "" if s.stages == 1 else f", stages={s.stages}"
            for tensor, rows, _, trans in sides:
                buffers.append(f"{tensor}_s")
                w.emit(f"{tensor}_s = tg.shared({_gemm_buffer_shape(rows, s.bk, trans)}, "
                       f"{dt}{staged})")
        if s.scratch:
            acc_dt = _dtype(GEMM_ACCUMULATOR[w.program.tensor(s.a).dtype])
            w.emit(f"{s.acc}_x = tg.shared((BM, BN), {acc_dt})")
        loop = "tg.range" if s.stages == 1 else "tg.pipeline"
        extra = "" if s.stages == 1 else f", stages={s.stages}"
        if s.repeat > 1:  # the whole K loop again, into the same accumulator
            w.emit(f"for {s.a}_r in tg.range({s.repeat}):")
            w.indent += 1
        w.emit(f"for {index} in {loop}({s.a}_t.shape[2]{extra}):")
        w.indent += 1
        if s.roles:  # the copies are the producer's block
            w.emit(f"with tg.producer(regs={s.roles[0]!r}):")
            w.indent += 1
        for (tensor, _, _, trans), buf in zip(sides, buffers or (None, None)):
            view = f"{tensor}_t[:, :, {index}]"
            if buf is None:
                operands.append(f"tg.load({view})")
                continue
            target = buf if s.stages == 1 else f"{buf}[{index}]"
            w.emit(f"tg.copy({view}, {target})")
            operands.append(target + (".T" if trans == "smem" else ""))
        if s.roles:  # the rest is the consumer's
            w.indent -= 1
            w.emit(f"with tg.consumer(regs={s.roles[1]!r}, schedule={s.roles[2]!r}):")
            w.indent += 1
        if s.scratch:  # each K tile's product through the scratch tile, transposed
            w.emit(f"{s.acc}_p = tg.zeros((BM, BN), {acc_dt})")
            w.emit(f"tg.gemm({s.acc}_p, {operands[0]}, {operands[1]})")
            w.emit(f"tg.copy({s.acc}_p, {s.acc}_x)")
            w.emit(f"{s.acc} += tg.load({s.acc}_x.T)")
        else:
            w.emit(f"tg.gemm({s.acc}, {operands[0]}, {operands[1]})")
        w.indent -= (2 if s.roles else 1) + (1 if s.repeat > 1 else 0)
        return
    for tensor, rows, coord, trans in sides:
        if trans == "smem":
            view = f"{tensor}.tile(({s.bk}, {rows}), (0, {coord}))"
        else:
            source = f"{tensor}.T" if trans == "gmem" else tensor
            view = f"{source}.tile(({rows}, {s.bk}), ({coord}, 0))"
        if s.route == "register":
            operands.append(f"tg.load({view})")
            continue
        buf = w.fresh_buffer()
        w.emit(f"{buf} = tg.shared({_gemm_buffer_shape(rows, s.bk, trans)}, {dt})")
        w.emit(f"tg.copy({view}, {buf})")
        operands.append(buf + (".T" if trans == "smem" else ""))
    w.emit(f"tg.gemm({s.acc}, {operands[0]}, {operands[1]})")


def _gemm_buffer_shape(rows: str, bk: int, trans: str) -> str:
    """A gemm operand's shared buffer: (rows, bk) K-major, (bk, rows) for an operand
    multiplied through the buffer's `.T` view."""
    return f"({bk}, {rows})" if trans == "smem" else f"({rows}, {bk})"


def _statement(w: _Writer, s, types: dict, loop: Loop | None = None) -> None:  # noqa: C901
    if isinstance(s, Load):
        _load(w, s, w.program.tensor(s.tensor).dtype, loop)
    elif isinstance(s, Full):
        w.emit(f"{s.out} = tg.full({_shape(s.shape)}, {s.value.text()}, {_dtype(s.dtype)})")
    elif isinstance(s, Indices):
        offset = ("" if not s.block_offset else
                  ", m * BM" if s.axis == 0 else ", n * BN")
        w.emit(f"{s.out} = tg.indices({_shape(s.shape)}, {s.axis}{offset})")
    elif isinstance(s, Unary):
        if s.op == "neg":
            w.emit(f"{s.out} = -{s.x}")
        elif s.op == "not":
            w.emit(f"{s.out} = ~{s.x}")
        else:
            w.emit(f"{s.out} = tg.{s.op}({s.x})")
    elif isinstance(s, Binary):
        a, b = _operand(s.a), _operand(s.b)
        if s.op in _FUNCTION:
            w.emit(f"{s.out} = {_FUNCTION[s.op]}({a}, {b})")
        else:
            w.emit(f"{s.out} = {a} {_OPERATOR[s.op]} {b}")
    elif isinstance(s, Where):
        w.emit(f"{s.out} = tg.where({s.cond}, {_operand(s.a)}, {_operand(s.b)})")
    elif isinstance(s, Cast) and s.bits:
        w.emit(f"{s.out} = tg.bitcast({s.x}, {_dtype(s.dtype)})")
    elif isinstance(s, Cast):
        w.emit(f"{s.out} = {s.x}.to({_dtype(s.dtype)})")
    elif isinstance(s, Reduce):
        w.emit(f"{s.out} = tg.{s.kind}({s.x}, {s.axis})")
    elif isinstance(s, Cumsum):
        w.emit(f"{s.out} = tg.cumsum({s.x}, {s.axis}{', reverse=True' if s.reverse else ''})")
    elif isinstance(s, InPlace):
        w.emit(f"{s.target} {_OPERATOR[s.op]}= {_operand(s.x)}")
    elif isinstance(s, Assign):
        w.emit(f"{s.target}.assign({_operand(s.x)})")
    elif isinstance(s, Alias):
        w.emit(f"{s.target} = {s.src}")
    elif isinstance(s, Loop):
        coord = "(m, None)" if s.axis == 1 else "(None, n)"
        w.emit(f"g{s.id} = {s.tensor}.tile((BM, BN), {coord})")
        w.loop_start = len(w.lines)
        loop_fn = "tg.range" if s.stages == 1 else "tg.pipeline"
        extra = "" if s.stages == 1 else f", stages={s.stages}"
        w.emit(f"for i{s.id} in {loop_fn}(g{s.id}.shape[2]{extra}):")
        w.indent += 1
        for b in s.body:
            _statement(w, b, types, s)
        if not s.body:
            w.emit("pass")
        w.indent -= 1
    elif isinstance(s, Store):
        _store(w, s, w.program.tensor(s.tensor).dtype)
    elif isinstance(s, Gemm):
        _gemm(w, s)
    elif isinstance(s, Stash):
        if s.buffer not in w.scratch:  # its first stash, outside loops (`check`)
            w.scratch.add(s.buffer)
            w.emit(f"{s.buffer} = tg.shared((BM, BN), {_dtype(types[s.x].dtype)})")
        w.emit(f"tg.copy({s.x}, {s.buffer})")
    elif isinstance(s, Unstash):
        w.emit(f"{s.out} = tg.load({s.buffer}{'.T' if s.transposed else ''})")
    elif isinstance(s, Branch):
        w.emit(f"with tg.if_({'mn'[s.axis]} {_OPERATOR[s.op]} {s.bound}):")
        w.indent += 1
        for b in s.body:
            _statement(w, b, types, loop)
        w.indent -= 1
    else:
        raise ValueError(f"unknown statement {s!r}")


_COUNTER = [0]


def make_kernel(source: str):
    """Execute kernel source text and return its kernel. The text is registered with
    linecache under a unique file name, so tegula's errors quote the offending line."""
    _COUNTER[0] += 1
    filename = f"<tegula.fuzz kernel {_COUNTER[0]}>"
    lines = source.splitlines(keepends=True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    namespace: dict = {"__name__": f"tegula_fuzz_{_COUNTER[0]}"}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 — our own generated text
    return namespace[KERNEL_NAME], filename


def forget_kernel(filename: str) -> None:
    """Drop a kernel's source from linecache (long runs make tens of thousands)."""
    linecache.cache.pop(filename, None)


__all__ = ["kernel_source", "make_kernel", "forget_kernel", "used_tensors", "KERNEL_NAME"]
