"""The static check of a candidate's source (Python `ast`), before anything of it runs.

A candidate is a module defining `ModelNew` whose computation runs in tegula kernels. The
check rejects, with the line and a reason:

* imports outside torch (`torch`, `torch.nn`, `torch.nn.functional`), numpy, tegula
  (of `tegula.agent` only `tegula.agent.device`), math, functools, typing, dataclasses —
  by name: threads and processes, timers, files and caches, reflection, the task's module;
* dynamic access that defeats reading the source: `exec`, `eval`, `getattr`, `open`,
  `globals`, dunder attributes, private attributes of modules (`torch._C`);
* `try` statements (a failing kernel must fail; a fallback to the reference hides it);
* streams, CUDA graphs and events, timer calls, torch precision switches, `torch.load`,
  `np.load`, `torch.compile`, `torch.utils` (inline CUDA);
* assignments to attributes of anything but `self` (monkeypatching the evaluator, timers
  or torch), `global`/`nonlocal`, and state kept across calls (writes to `self.x`,
  module-level containers mutated) outside `__init__`;
* torch or numpy compute outside `__init__` and kernel bodies: only allocations
  (`torch.empty*`) and shape/view methods (`x.view`, `x.contiguous`, `x.size`) may be
  called on tensors; a call to an `nn.Module` attribute is a torch op.

Operators on tensors (`x * 2`) cannot be told from integer arithmetic by reading the
source; the evaluator's harness audits every torch op the candidate executes at run time
(`tegula.agent.sandbox`) and rejects compute ops there.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

ALLOWED_IMPORTS = {"torch", "torch.nn", "torch.nn.functional", "numpy", "math", "functools",
                   "typing", "dataclasses", "__future__", "tegula.agent.device"}
REASONS_BY_MODULE = {
    **{m: "threads or processes" for m in ("threading", "_thread", "multiprocessing",
                                           "concurrent", "asyncio", "subprocess", "signal")},
    **{m: "timers" for m in ("time", "timeit")},
    **{m: "files or caches" for m in ("os", "io", "pathlib", "shutil", "tempfile", "pickle",
                                      "glob", "mmap", "shelve", "sqlite3", "json", "socket",
                                      "urllib", "marshal", "copyreg", "linecache")},
    **{m: "reflection" for m in ("sys", "importlib", "inspect", "gc", "ctypes", "builtins",
                                 "types", "weakref", "code", "runpy", "contextlib")},
}
BANNED_NAMES = {"open", "exec", "eval", "compile", "__import__", "getattr", "setattr",
                "delattr", "globals", "locals", "vars", "breakpoint", "input", "memoryview",
                "__builtins__", "__loader__", "__spec__"}
BANNED_TORCH = {  # resolved call/attribute prefixes, with the reason
    "torch.cuda.Event": "timer events", "torch.cuda.synchronize": "synchronization (timing)",
    "torch.cuda.graph": "CUDA graphs", "torch.cuda.CUDAGraph": "CUDA graphs",
    "torch.cuda.set_sync_debug_mode": "timing", "torch.load": "reading files",
    "torch.save": "writing files", "numpy.load": "reading files", "numpy.save": "writing files",
    "numpy.fromfile": "reading files", "numpy.memmap": "reading files",
    "numpy.genfromtxt": "reading files", "numpy.loadtxt": "reading files",
    "torch.compile": "torch.compile", "torch.jit": "TorchScript", "torch.utils": "torch.utils "
    "(inline CUDA, checkpoints)", "torch.ops": "raw torch ops", "torch.library": "raw torch ops",
    "torch.backends": "precision switches", "torch.set_": "global torch settings",
    "torch.use_deterministic": "global torch settings", "torch.hub": "downloads",
    "torch.overrides": "torch function overrides", "torch.autograd": "autograd hooks",
    "torch.multiprocessing": "processes", "torch.distributed": "processes",
}
# torch/numpy names a candidate may use as values (not call): types and dtypes.
ALLOWED_VALUES = {f"torch.{t}" for t in ("float32", "float16", "bfloat16", "float64", "int32",
                                         "int64", "int8", "uint8", "bool", "float", "half",
                                         "Tensor", "Size", "dtype", "device", "nn.Module",
                                         "nn.Parameter")} | {
    f"numpy.{t}" for t in ("float32", "float16", "float64", "int32", "int64", "int8", "uint8",
                           "bool_", "ndarray", "dtype")}
FILE_METHODS = {"tofile", "fromfile", "dump", "dumps", "write_text", "write_bytes",
                "read_text", "read_bytes"}
ALLOWED_TORCH_CALLS = {"torch.empty", "torch.empty_like", "torch.empty_strided", "torch.Size",
                       "torch.no_grad", "torch.device", "numpy.empty", "torch.nn.Parameter"}
ALLOWED_METHODS = {"size", "dim", "numel", "stride", "contiguous", "view", "reshape",
                   "flatten", "unsqueeze", "squeeze", "permute", "transpose", "t",
                   "is_contiguous", "data_ptr", "element_size", "new_empty", "append",
                   "extend", "items", "keys", "values", "get", "format", "join", "ndimension"}
MUTATING_METHODS = {"append", "extend", "insert", "update", "setdefault", "add", "pop",
                    "clear", "remove", "discard", "popitem", "__setitem__"}
ALLOWED_BUILTINS = {"len", "range", "int", "float", "bool", "str", "tuple", "list", "dict",
                    "set", "min", "max", "abs", "isinstance", "zip", "enumerate", "sum", "all",
                    "any", "divmod", "round", "sorted", "reversed", "print", "super",
                    "ValueError", "TypeError", "RuntimeError", "NotImplementedError",
                    "frozenset", "map", "slice"}


@dataclass(frozen=True)
class Finding:
    """One rejected construct: where, which rule, why."""

    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message} [{self.rule}]"


def check_source(source: str, task_modules: tuple[str, ...] = ()) -> list[Finding]:
    """Every finding in a candidate's source (empty: the source passes the check).
    `task_modules` are module names the task's reference could be imported as."""
    try:
        tree = ast.parse(source)
    except SyntaxError as err:
        return [Finding(err.lineno or 0, "syntax", f"syntax error: {err.msg}")]
    checker = _Checker(set(task_modules))
    checker.parents = {child: node for node in ast.walk(tree)
                       for child in ast.iter_child_nodes(node)}
    checker.collect_definitions(tree)
    checker.visit(tree)
    if not checker.has_model_new:
        checker.add(1, "interface", "the candidate defines no class ModelNew with a forward "
                                    "method")
    return sorted(checker.findings, key=lambda f: f.line)


class _Checker(ast.NodeVisitor):
    """Walks the module keeping which function it is in (restricted or not)."""

    def __init__(self, task_modules: set[str]) -> None:
        self.task_modules = task_modules
        self.findings: list[Finding] = []
        self.aliases: dict[str, str] = {}      # local name -> module path it stands for
        self.module_names: set[str] = set()    # names bound at module level
        self.local_defs: set[str] = set()      # functions and classes of the module
        self.methods: set[str] = set()         # method names of the module's classes
        self.restricted = True                 # compute rules apply (not __init__, kernels)
        self.in_kernel = False
        self.in_function = False
        self.has_model_new = False
        self.parents: dict = {}

    def add(self, line: int, rule: str, message: str) -> None:
        self.findings.append(Finding(line, rule, message))

    # ----------------------------------------------------------------- definitions
    def collect_definitions(self, tree: ast.Module) -> None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.local_defs.add(node.name)
            if isinstance(node, ast.ClassDef):
                self.methods |= {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                if node.name == "ModelNew" and "forward" in {
                        n.name for n in node.body if isinstance(n, ast.FunctionDef)}:
                    self.has_model_new = True
        for node in tree.body:
            for target in getattr(node, "targets", []) + [getattr(node, "target", None)]:
                if isinstance(target, ast.Name):
                    self.module_names.add(target.id)

    # ----------------------------------------------------------------- imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node.lineno, alias.name)
            local = alias.asname or alias.name.split(".")[0]
            self.aliases[local] = alias.name if alias.asname else alias.name.split(".")[0]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add(node.lineno, "import", "relative imports are not allowed (the task's "
                                            "module may sit beside the candidate)")
            return
        for alias in node.names:
            full = f"{node.module}.{alias.name}"
            # `from torch import nn` imports a module; `from math import sqrt` a name.
            self._check_module(node.lineno, node.module, full)
            self.aliases[alias.asname or alias.name] = full

    def _check_module(self, line: int, module: str, imported: str | None = None) -> None:
        root = module.split(".")[0]
        if module in self.task_modules or root in self.task_modules:
            self.add(line, "reference", f"imports {module}, the task's reference")
        elif root in REASONS_BY_MODULE:
            self.add(line, "import", f"imports {module}: {REASONS_BY_MODULE[root]} are not "
                                     f"allowed in a candidate")
        elif module.startswith("tegula.agent") and module != "tegula.agent.device":
            self.add(line, "import", f"imports {module}: the evaluator is off limits (of "
                                     f"tegula.agent only tegula.agent.device may be imported)")
        elif root == "tegula" or module in ALLOWED_IMPORTS or (
                imported is not None and imported in ALLOWED_IMPORTS):
            return
        else:
            self.add(line, "import", f"imports {module}: a candidate may import torch, "
                                     f"torch.nn(.functional), numpy, tegula, math, functools, "
                                     f"typing and dataclasses only")

    # ----------------------------------------------------------------- functions
    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        kernel = any(self._is_kernel_decorator(d) for d in node.decorator_list)
        for d in node.decorator_list:
            self.visit(d)
        saved = (self.restricted, self.in_kernel, self.in_function)
        self.in_kernel = self.in_kernel or kernel
        self.restricted = node.name != "__init__" or self.in_kernel
        self.in_function = True
        for child in node.body:
            self.visit(child)
        self.visit(node.args)
        self.restricted, self.in_kernel, self.in_function = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def _is_kernel_decorator(self, node: ast.expr) -> bool:
        target = node.func if isinstance(node, ast.Call) else node
        return (self.resolve(target) or "") in ("tegula.kernel", "tegula.lang.kernel")

    def visit_Lambda(self, node: ast.Lambda) -> None:
        saved = self.restricted
        self.restricted = True  # a lambda made in __init__ runs later, as forward would
        self.generic_visit(node)
        self.restricted = saved

    def visit_Try(self, node: ast.Try) -> None:
        self.add(node.lineno, "try", "try/except is not allowed: a failing kernel must fail "
                                     "(a fallback to the reference would hide it)")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Global(self, node: ast.Global) -> None:
        self.add(node.lineno, "state", "global/nonlocal keeps state across calls (replayed "
                                       "outputs)")

    visit_Nonlocal = visit_Global

    # ----------------------------------------------------------------- names and attributes
    def visit_Name(self, node: ast.Name) -> None:
        if node.id in BANNED_NAMES:
            self.add(node.lineno, "dynamic", f"uses {node.id}: dynamic code and file access "
                                             f"are not allowed in a candidate")
        self._check_value_use(node)

    def _check_value_use(self, node: ast.expr) -> None:
        """A torch/numpy function or module used as a value (kept in a list, bound to a
        name, passed along) could later be called where no rule sees it: only types and
        dtypes may be used that way; functions may only be called."""
        resolved = self.resolve(node)
        if resolved is None or resolved.split(".")[0] not in ("torch", "numpy"):
            return
        parent = self.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # part of a longer chain: the whole chain is judged
        if isinstance(parent, ast.Call) and parent.func is node:
            return  # a call: judged by the call rules
        if isinstance(parent, (ast.Import, ast.ImportFrom, ast.alias)):
            return
        if resolved not in ALLOWED_VALUES:
            self.add(node.lineno, "value", f"uses {resolved} as a value: torch and numpy "
                                           f"functions may only be called (where allowed), "
                                           f"not stored or passed around")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name, line = node.attr, node.lineno
        is_self = isinstance(node.value, ast.Name) and node.value.id == "self"
        dunder = name.startswith("__") and name.endswith("__")
        if dunder and name != "__init__":
            self.add(line, "dynamic", f"uses the attribute {name}: introspection is not allowed")
        elif name.startswith("_") and not dunder and not is_self:
            self.add(line, "dynamic", f"uses the private attribute .{name}")
        if name in FILE_METHODS:
            self.add(line, "banned", f"uses .{name}: writing or reading files is not allowed")
        if "stream" in name.lower():
            self.add(line, "stream", f"uses .{name}: streams are not allowed (work on another "
                                     f"stream escapes the timing)")
        self._check_value_use(node)
        resolved = self.resolve(node)
        if resolved:
            for prefix, why in BANNED_TORCH.items():
                if resolved.startswith(prefix):
                    self.add(line, "banned", f"uses {resolved}: {why} not allowed in a "
                                             f"candidate")
                    break
            if resolved.split(".")[0] in ("time", "timeit") or "perf_counter" in resolved:
                self.add(line, "timer", f"uses {resolved}: timers are not allowed")
        self.generic_visit(node)

    def resolve(self, node: ast.expr) -> str | None:
        """`F.relu` -> "torch.nn.functional.relu" when the chain starts at an import."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        return None

    # ----------------------------------------------------------------- assignments (state)
    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target)
        self.generic_visit(node)

    def _check_target(self, target: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._check_target(element)
            return
        line = getattr(target, "lineno", 0)
        if isinstance(target, ast.Attribute) and target.attr in ("forward", "__call__"):
            self.add(line, "patch", f"assigns {ast.unparse(target)}: forward must be the "
                                    f"method ModelNew defines")
            return
        if isinstance(target, ast.Attribute):
            base = target.value
            if not (isinstance(base, ast.Name) and base.id == "self"):
                self.add(line, "patch", f"assigns to an attribute of {ast.unparse(base)} "
                                        f"(monkeypatching is not allowed)")
            elif self.restricted and not self.in_kernel and self.in_function:
                self.add(line, "state", f"assigns self.{target.attr} outside __init__: state "
                                        f"kept across calls (replayed outputs)")
        elif isinstance(target, ast.Subscript) and self.in_function and not self.in_kernel:
            root = target.value
            while isinstance(root, (ast.Subscript, ast.Attribute)):
                root = root.value
            if isinstance(root, ast.Name) and (root.id in self.module_names or
                                               root.id == "self" or root.id in self.aliases):
                self.add(line, "state", f"writes into {ast.unparse(target.value)}: state kept "
                                        f"across calls (replayed outputs)")

    # ----------------------------------------------------------------- calls
    def visit_Call(self, node: ast.Call) -> None:
        for keyword in node.keywords:
            if keyword.arg and "stream" in keyword.arg.lower():
                self.add(node.lineno, "stream", f"passes {keyword.arg}=: streams are not "
                                                f"allowed (work on another stream escapes the "
                                                f"timing)")
        if self.restricted:
            self._check_compute_call(node)
        self.generic_visit(node)

    def _check_compute_call(self, node: ast.Call) -> None:
        func, line = node.func, node.lineno
        resolved = self.resolve(func)
        if resolved is not None:
            root = resolved.split(".")[0]
            if root in ("torch", "numpy") and resolved not in ALLOWED_TORCH_CALLS:
                where = "a kernel body" if self.in_kernel else "forward"
                self.add(line, "compute", f"calls {resolved} in {where}: the computation must "
                                          f"run in tegula kernels (torch/numpy may only "
                                          f"allocate outputs)")
            return
        if self.in_kernel or isinstance(func, (ast.Subscript, ast.Call, ast.Lambda)):
            return  # tile methods inside kernels; kernel[grid](...) launches
        if isinstance(func, ast.Name):
            if not (func.id in ALLOWED_BUILTINS or func.id in self.local_defs):
                self.add(line, "compute", f"calls {func.id}(): only tegula launches, the "
                                          f"module's own functions and a few builtins may be "
                                          f"called outside kernels")
            return
        if isinstance(func, ast.Attribute):
            self._check_method_call(func, line)

    def _check_method_call(self, func: ast.Attribute, line: int) -> None:
        receiver, method = func.value, func.attr
        is_self = isinstance(receiver, ast.Name) and receiver.id == "self"
        if is_self:
            if method not in self.methods:
                self.add(line, "compute", f"calls self.{method}(...): a torch module or "
                                          f"function attribute is a torch op")
            return
        root = receiver
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        state_owner = isinstance(root, ast.Name) and (root.id == "self" or
                                                      root.id in self.module_names)
        if method in MUTATING_METHODS and state_owner:
            self.add(line, "state", f"calls {ast.unparse(func)}(...): state kept across calls "
                                    f"(replayed outputs)")
        elif method not in ALLOWED_METHODS:
            self.add(line, "compute", f"calls .{method}(...) outside a kernel: only shape and "
                                      f"view methods (view, reshape, contiguous, size, ...) may "
                                      f"be called on tensors; the computation must run in "
                                      f"tegula kernels")


def format_findings(findings: list[Finding]) -> str:
    """Findings as lines, for a verdict or a repair prompt."""
    return "\n".join(str(f) for f in findings)


__all__ = ["Finding", "check_source", "format_findings", "ALLOWED_IMPORTS"]
