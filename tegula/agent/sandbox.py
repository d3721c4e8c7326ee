"""The candidate's side of the evaluator: a separate process that runs `ModelNew`.

The evaluator (`tegula.agent.evaluator`) forks this process from a fork server that has
torch and tegula imported (so a candidate costs a fork, not a 3-second interpreter start)
and talks to it over a pipe in JSON only — never pickle, which would let the candidate run
code in the evaluator. Tensors travel as `.npy` files in a directory the evaluator made:
it writes each trial's inputs just before asking for that trial, and reads the outputs
back with `allow_pickle=False`. The reference's outputs never exist in this process, nor
on disk: the evaluator computes them itself.

Limits: CPU seconds (`RLIMIT_CPU`) and, on a machine without a GPU, address space
(`RLIMIT_AS`, the interpreter's own size plus the budget: CUDA reserves huge address
ranges, so on a GPU the evaluator's wall-clock timeout is the bound). The candidate's
prints go to a log file in the job directory.

Each call of `forward` runs under `TorchAudit`, a torch dispatch mode that lets through
only allocation, view and copy ops: a candidate computing with torch (`x * 2`, a hidden
`F.relu`, the reference's module) is caught even where the static check cannot see it.
After the call the harness checks here what it can (outputs are tensors on the inputs'
device, do not alias an input, no thread was left running); the evaluator re-checks the
inputs from files and the outputs against its own reference.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import threading
import traceback
from typing import Any

import numpy as np

# Torch ops a candidate's forward may execute outside its kernels: allocation, views,
# copies (contiguous()), and detach. Anything else computes.
ALLOWED_ATEN = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                "view", "_unsafe_view", "reshape", "alias", "detach", "t", "transpose",
                "permute", "unsqueeze", "squeeze", "as_strided", "clone", "copy_",
                "contiguous", "expand", "slice", "select", "flatten", "lift_fresh",
                "_reshape_alias", "unflatten", "split", "unbind", "numpy_T", "view_as"}


def op_name(func: Any) -> str:
    """`aten.view.default` -> "view"."""
    name = getattr(func, "__name__", str(func))
    return name.split(".")[0]


def make_audit():
    """A torch dispatch mode recording every op outside ALLOWED_ATEN (built lazily: the
    module must import without torch for the parent's type checks)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class TorchAudit(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.violations: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = op_name(func)
            if name not in ALLOWED_ATEN and str(func) not in self.violations:
                self.violations.append(str(func))
            return func(*args, **(kwargs or {}))

    return TorchAudit()


# --------------------------------------------------------------------------- entry point

def serve(conn: Any, job_dir: str, cpu_seconds: int, memory_bytes: int,
          use_gpu: bool) -> None:
    """The child's main loop: set limits, then answer the evaluator's commands."""
    log = os.open(os.path.join(job_dir, "candidate.log"), os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    _set_limits(cpu_seconds, memory_bytes if not use_gpu else 0)
    guarded = _snapshot_guarded()
    _forbid_threads()
    state: dict = {"gpu": use_gpu}
    while True:
        try:
            message = json.loads(conn.recv_bytes().decode())
        except (EOFError, OSError):
            return
        command = message.get("cmd")
        if command == "exit":
            return
        try:
            reply = HANDLERS[command](state, message)
        except BaseException as err:  # the candidate's failure, whatever it is, is reported
            reply = {"ok": False, "error": _describe(err)}
        patched = [name for name, (owner, attr, value) in guarded.items()
                   if getattr(owner, attr, None) is not value]
        if patched:
            reply = {"ok": False, "error": f"the candidate patched {', '.join(patched)} "
                                           f"(timers, synchronization or the harness)"}
        conn.send_bytes(json.dumps(reply).encode())


def _snapshot_guarded() -> dict:
    """The callables a candidate could patch to fake a time or a result: timers, device
    synchronization, this harness's own checks, numpy's file writer."""
    import time

    import torch

    from tegula.agent import timing

    owners = {"time": time, "torch.cuda": torch.cuda, "numpy": np, "timing": timing,
              "sandbox": sys.modules[__name__], "threading.Thread": threading.Thread}
    names = {"time": ("perf_counter", "perf_counter_ns", "time", "time_ns", "monotonic"),
             "torch.cuda": ("synchronize", "Event"), "numpy": ("save", "load"),
             "timing": ("time_trials", "_CLOCK", "_SYNC"),
             "sandbox": ("_check_output", "_save_all", "make_audit", "_overlaps"),
             "threading.Thread": ("start",)}
    return {f"{owner}.{attr}": (owners[owner], attr, getattr(owners[owner], attr))
            for owner, attrs in names.items() for attr in attrs}


def _forbid_threads() -> None:
    """Threads escape the torch audit (dispatch modes are per thread) and can finish work
    after forward returns: starting one is an error in the candidate's process.

    One kind is let through: the emulator runs the warp roles of a warp-specialized kernel
    (the sm_90a GEMM's producer and consumer) as coroutines on threads of its own
    (`tegula/emulate/roles.py`): one baton, the starting thread blocked while a role runs,
    every role joined before the kernel's `Roles` statement ends — no work outlives the
    call. Such a thread runs under a dispatch mode refusing every torch op (a role runs
    numpy on thread IR, never torch), so it cannot compute past the audit either."""
    import _thread

    from tegula.emulate.roles import RoleTask

    def refuse(*args, **kwargs):
        raise RuntimeError("the candidate started a thread: threads are not allowed")

    def start(original):
        def start_thread(function, *args, **kwargs):
            thread = getattr(function, "__self__", None)
            target = getattr(thread, "_target", None)
            if not isinstance(thread, threading.Thread) or \
                    getattr(target, "__func__", None) is not RoleTask._main:
                refuse()
            return original(_without_torch(function), *args, **kwargs)
        return start_thread

    _thread.start_new_thread = refuse
    threading._start_new_thread = start(threading._start_new_thread)  # Thread.start's
    if hasattr(threading, "_start_joinable_thread"):  # Python 3.13+
        threading._start_joinable_thread = start(threading._start_joinable_thread)


def _without_torch(function):
    """`function` run under a torch dispatch mode that refuses every op (an emulator role
    thread has no torch work to do; a role thread that tries is the candidate's error)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class NoTorch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            raise RuntimeError(f"the candidate ran torch op {func} in an emulator role "
                               f"thread: threads are not allowed")

    def run(*args, **kwargs):
        with NoTorch():
            return function(*args, **kwargs)
    return run


def _set_limits(cpu_seconds: int, memory_bytes: int) -> None:
    """CPU time for the whole process; address space on top of what is mapped now."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
    if memory_bytes:
        with open("/proc/self/status", encoding="ascii") as f:
            size = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))
        limit = size + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _describe(err: BaseException) -> str:
    """An exception as its message first, then the candidate's own frames (the library's
    frames say nothing the model can act on; tegula errors already name the line)."""
    if isinstance(err, MemoryError):
        return "MemoryError: the candidate ran out of its memory limit"
    message = f"{type(err).__name__}: {err}".strip()
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if f.filename.endswith("candidate.py")]
    where = "".join(f"\n  candidate.py line {f.lineno}, in {f.name}: {(f.line or '').strip()}"
                    for f in frames[-4:])
    return (message[:2500] + where)[:3000]


# --------------------------------------------------------------------------- commands

def _load(state: dict, message: dict) -> dict:
    """Import the candidate and build ModelNew(*init_inputs) under the init seed."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("tegula_candidate", message["candidate"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "ModelNew"):
        return {"ok": False, "error": "the candidate defines no ModelNew"}
    init = [_load_value(v) for v in message["init"]]
    torch.manual_seed(message["init_seed"])
    model = module.ModelNew(*init)
    if state["gpu"] and hasattr(model, "cuda"):
        model = model.cuda()
    state["model"] = model
    state["threads"] = threading.active_count()
    return {"ok": True}


def _run(state: dict, message: dict) -> dict:
    """One trial: inputs from files, forward under the audit, outputs to files."""
    import torch

    inputs = [_load_value(v, state["gpu"]) for v in message["inputs"]]
    audit = make_audit()
    with torch.no_grad(), audit:
        output = state["model"](*inputs)
    if state["gpu"]:
        torch.cuda.synchronize()
    problem = _check_output(output, inputs, state)
    if audit.violations:
        problem = (f"forward executed torch compute ops outside tegula kernels: "
                   f"{', '.join(audit.violations[:6])}")
    outputs = output if isinstance(output, (tuple, list)) else [output]
    names = []
    if problem is None:
        names = _save_all(outputs, message["out_prefix"] + "out")
    _save_all(inputs, message["out_prefix"] + "in_after")
    return {"ok": problem is None, "error": problem, "outputs": names,
            "devices": [str(t.device) for t in outputs if isinstance(t, torch.Tensor)]}


def _check_output(output: Any, inputs: list, state: dict) -> str | None:
    """What is wrong with forward's result before values are compared, or None."""
    import torch

    outputs = output if isinstance(output, (tuple, list)) else [output]
    if not outputs or not all(isinstance(t, torch.Tensor) for t in outputs):
        return f"forward returned {type(output).__name__}, not a tensor (or tuple of tensors)"
    if threading.active_count() > state["threads"]:
        return "forward left a thread running (work finishing after the call returns)"
    for t in outputs:
        for x in inputs:
            if isinstance(x, torch.Tensor) and _overlaps(t, x):
                return "an output shares memory with an input (a view of the input)"
    return None


def _overlaps(a: Any, b: Any) -> bool:
    """True when two tensors' storages overlap."""
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes() and sa.nbytes() and sb.nbytes()


def _time(state: dict, message: dict) -> dict:
    """Time forward on each input set (GPU only; fresh inputs per trial, L2 emptied, the
    device synchronized), saving each timed output for the evaluator to check."""
    import torch

    from tegula.agent.timing import time_trials

    sets = [[_load_value(v, True) for v in inputs] for inputs in message["input_sets"]]
    violations: list[str] = []

    def audited_call(inputs: list) -> Any:
        audit = make_audit()
        with torch.no_grad(), audit:
            out = state["model"](*inputs)
        violations.extend(audit.violations)
        return out

    times, outputs = time_trials(audited_call, sets, torch)
    if violations:
        return {"ok": False, "error": "forward executed torch compute ops while timed: "
                                      + ", ".join(sorted(set(violations))[:6])}
    names = [_save_all(out if isinstance(out, (tuple, list)) else [out],
                       f"{message['out_prefix']}{k}_out") for k, out in enumerate(outputs)]
    return {"ok": True, "times": times, "outputs": names}


def _explain(state: dict, message: dict) -> dict:
    """`tegula explain` of the kernels one forward call launches at the given input
    shapes (the GPU size: launches are recorded, not run, so no data is needed)."""
    import torch

    from tegula.agent import device
    from tegula.agent.profile import explain_launches

    inputs = [torch.empty(v["shape"], dtype=getattr(torch, v["dtype"])) if "shape" in v
              else v["json"] for v in message["inputs"]]
    device.LAUNCHES.clear()
    device.DRY_RUN = True
    try:
        with torch.no_grad():
            state["model"](*inputs)
    finally:
        device.DRY_RUN = False
    text, seconds = explain_launches(device.LAUNCHES, message.get("max_chars", 6000))
    return {"ok": True, "text": text, "predicted_seconds": seconds}


HANDLERS = {"load": _load, "run": _run, "time": _time, "explain": _explain}


# --------------------------------------------------------------------------- values

def _load_value(value: dict, gpu: bool = False) -> Any:
    """A value the evaluator described: {"npy": path, "dtype": ...} or {"json": x}."""
    import torch

    if "json" in value:
        return value["json"]
    array = np.load(value["npy"], allow_pickle=False)
    tensor = torch.from_numpy(array)
    if value.get("dtype") == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor.cuda() if gpu else tensor


def _save_all(values: list, prefix: str) -> list:
    """Tensors to `prefix{k}.npy` (bf16 as its int16 bits); descriptions of the files."""
    import torch

    names = []
    for k, value in enumerate(values):
        if not isinstance(value, torch.Tensor):
            names.append({"json": None})
            continue
        tensor = value.detach().cpu()
        dtype = str(tensor.dtype).removeprefix("torch.")
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.int16)
        path = f"{prefix}{k}.npy"
        np.save(path, tensor.contiguous().numpy(), allow_pickle=False)
        names.append({"npy": path, "dtype": dtype})
    return names


__all__ = ["serve", "ALLOWED_ATEN", "make_audit"]
