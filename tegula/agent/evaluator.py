"""The evaluator: is a candidate `ModelNew` correct (and, on a GPU, how fast)?

`evaluate(task, candidate_path)` returns a `Verdict`; `ok` only for a correct candidate.
The protocol, in order (each step's failure is the verdict's `stage` and `reason`):

1. **static** — `tegula.agent.static_check` reads the source: no torch compute outside
   kernels, no try/except, streams, threads, timers, files, reflection, monkeypatching,
   no import of the task's reference.
2. **load** — the checked text (a copy: the file cannot change after the check) is
   imported in a separate process (`tegula.agent.sandbox`, forked from a fork server) with
   CPU-time and memory limits, and `ModelNew(*get_init_inputs())` is built under the same
   seed as the reference `Model` (so parameters match).
3. **trials** — `trials` seeded trials (the base seed is random unless given: a candidate
   cannot know the inputs), cycling through the task's input distributions. Each trial's
   inputs are fresh; the reference gets its own clones in this process, the candidate
   reads them from `.npy` files; which of the two runs first alternates by trial. The
   reference output must not be degenerate (zero, constant, NaN); the candidate's must
   match it element by element within the task's tolerance (`tegula.agent.checks`), with
   exactly its shape, dtype and device; the candidate's inputs must be unchanged after
   the call (re-read from files and compared with this process's pristine copies).
4. **timing** (GPU only) — fresh inputs per timed call, L2 emptied, device synchronized,
   median; the reference timed the same way in this process, the two alternating in two
   rounds; every timed output checked again; a time under the roofline bound (inputs read
   once at peak bandwidth, flops at peak rate) is rejected as impossible.

On a machine without a GPU the candidate's kernels run in the emulator at the task's
"small" size and there is no timing.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tegula.agent.checks import compare, degenerate_reason, worst_text
from tegula.agent.static_check import check_source, format_findings
from tegula.agent.tasks import Task

@dataclass
class EvalOptions:
    """How hard to look. `size` None: "small" without a GPU, "real" with one."""

    trials: int = 3
    timing_trials: int = 5
    size: str | None = None
    seed: int | None = None
    gpu: bool | None = None
    cpu_seconds: int = 300
    memory_bytes: int = 4 << 30
    wall_seconds: float = 180.0
    explain: bool = False
    keep_dir: str | None = None   # keep the job's files there (for audit) instead of deleting
    #: Tests of the runtime defenses only: skip the static check so that cheats it would
    #: reject reach the candidate process (where they must still fail).
    static_check: bool = True


@dataclass
class Verdict:
    """The evaluator's answer: `ok` only for a correct candidate; `reason` says why not."""

    ok: bool
    stage: str
    reason: str
    max_error: float = 0.0
    worst: list = field(default_factory=list)
    trials: list = field(default_factory=list)
    timing: dict | None = None
    profile: str = ""
    predicted_seconds: float | None = None
    notes: list = field(default_factory=list)

    def summary(self) -> str:
        """The verdict as a few lines for a terminal or a prompt."""
        head = "PASS" if self.ok else f"FAIL ({self.stage})"
        lines = [f"{head}: {self.reason}"]
        if self.worst:
            lines.append("worst elements:\n" + worst_text(self.worst))
        if self.timing:
            t = self.timing
            lines.append(f"time: candidate {t['candidate_us']:.1f} us, reference "
                         f"{t['reference_us']:.1f} us, speedup {t['speedup']:.2f}x "
                         f"(roofline bound {t['roofline_us']:.2f} us)")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return asdict(self)


class _Failure(Exception):
    """A verdict-ending failure inside the protocol."""

    def __init__(self, stage: str, reason: str, **extra: Any) -> None:
        super().__init__(reason)
        self.stage, self.reason, self.extra = stage, reason, extra


def evaluate(task: Task, candidate_path: str, options: EvalOptions | None = None) -> Verdict:
    """Judge the candidate file against the task (see the module docstring)."""
    options = options or EvalOptions()
    with open(candidate_path, encoding="utf-8") as f:
        source = f.read()
    return evaluate_source(task, source, options)


def evaluate_source(task: Task, source: str, options: EvalOptions | None = None) -> Verdict:
    """Judge a candidate given as source text."""
    options = options or EvalOptions()
    task_modules = tuple({task.name, *(
        [os.path.splitext(os.path.basename(task.path))[0]] if task.path else [])})
    findings = check_source(source, task_modules) if options.static_check else []
    if findings:
        return Verdict(False, "static", f"the static check rejects the candidate:\n"
                                        f"{format_findings(findings)}")
    session = _Session(task, source, options)
    try:
        return session.run()
    except _Failure as failure:
        return Verdict(False, failure.stage, failure.reason, notes=session.notes,
                       trials=session.trials, **failure.extra)
    finally:
        session.close()


class _Session:
    """One evaluation: the job directory, the candidate process and the reference."""

    def __init__(self, task: Task, source: str, options: EvalOptions) -> None:
        import torch

        self.task, self.options, self.torch = task, options, torch
        self.gpu = torch.cuda.is_available() if options.gpu is None else options.gpu
        self.size = options.size or ("real" if self.gpu else "small")
        self.device = "cuda" if self.gpu else "cpu"
        self.base_seed = options.seed if options.seed is not None else secrets.randbits(31)
        self.init_seed = (self.base_seed * 7919 + 17) % (1 << 31)
        self.notes: list[str] = []
        self.trials: list[dict] = []
        self.job = tempfile.mkdtemp(prefix="tegula-eval-")
        self.candidate_path = os.path.join(self.job, "candidate.py")
        with open(self.candidate_path, "w", encoding="utf-8") as f:
            f.write(source)
        self.conn, self.pid = None, 0
        if not self.gpu:
            self.notes.append(f"no GPU: kernels ran in the emulator at the {self.size!r} size; "
                              f"no timing")

    # ----------------------------------------------------------------- the protocol
    def run(self) -> Verdict:
        self.reference = _task_call("building Model", self.task.model, self.size,
                                    self.init_seed)
        if self.gpu and hasattr(self.reference, "cuda"):
            self.reference = self.reference.cuda()
        self._start_candidate()
        worst_error = 0.0
        for k in range(self.options.trials):
            worst_error = max(worst_error, self._trial(k))
        verdict = Verdict(True, "passed", f"{self.options.trials} trials on "
                                          f"{', '.join(self._distributions())} inputs match "
                                          f"the reference (max normalized error "
                                          f"{worst_error:.3g} of 1)", max_error=worst_error,
                          trials=self.trials, notes=self.notes)
        if self.gpu and self.options.timing_trials > 0:
            verdict.timing = self._timing()
        if self.options.explain:
            reply = self._ask({"cmd": "explain", "inputs": self._real_shapes()}, "explain")
            verdict.profile = reply.get("text", "")
            verdict.predicted_seconds = reply.get("predicted_seconds")
        return verdict

    def _real_shapes(self) -> list[dict]:
        """The inputs at the "real" size as shapes and dtypes (for the explain summary)."""
        return [{"shape": list(shape), "dtype": dtype} if shape is not None else {"json": dtype}
                for shape, dtype in self.task.input_specs("real")]

    def _distributions(self) -> list[str]:
        dists = self.task.distributions
        return [dists[k % len(dists)] for k in range(min(self.options.trials, len(dists)))]

    def _trial(self, k: int) -> float:
        """One correctness trial; returns its max normalized error."""
        distribution = self.task.distributions[k % len(self.task.distributions)]
        inputs = _task_call("get_inputs", self.task.make_inputs, self.size,
                            self.base_seed + 1000 * (k + 1), distribution)
        described = self._write_values(inputs, f"trial{k}_in")
        out_prefix = os.path.join(self.job, f"trial{k}_")
        reference_first = k % 2 == 0
        if reference_first:
            expected = self._reference(inputs)
        reply = self._ask({"cmd": "run", "inputs": described, "out_prefix": out_prefix},
                          f"trial {k}")
        if not reference_first:
            expected = self._reference(inputs)
        record = {"trial": k, "distribution": distribution, "reference_first": reference_first}
        self.trials.append(record)
        if not reply.get("ok"):
            raise _Failure("run", f"trial {k} ({distribution} inputs): {reply.get('error')}")
        self._check_inputs_unchanged(inputs, out_prefix, k)
        devices = reply.get("devices", [])
        error = self._check_outputs(expected, out_prefix + "out", devices,
                                    f"trial {k} ({distribution} inputs)")
        record["max_error"] = error
        return error

    def _reference(self, inputs: list) -> list[np.ndarray]:
        """The reference's outputs on clones of the inputs, as numpy; degenerate ones fail
        the task, not the candidate."""
        torch = self.torch
        clones = [x.clone().to(self.device) if isinstance(x, torch.Tensor) else x
                  for x in inputs]
        with torch.no_grad():
            out = _task_call("reference forward", self.reference, *clones)
        outs = out if isinstance(out, (tuple, list)) else [out]
        arrays = [_to_numpy(t) for t in outs]
        for j, array in enumerate(arrays):
            why = degenerate_reason(array)
            if why:
                raise _Failure("task", f"degenerate reference (output {j}): {why}; a task "
                                       f"must produce outputs that tell right from wrong")
        return arrays

    def _check_outputs(self, expected: list, prefix: str, devices: list, what: str) -> float:
        if len(devices) != len(expected):
            raise _Failure("check", f"{what}: the candidate returned {len(devices)} outputs, "
                                    f"the reference {len(expected)}")
        worst = 0.0
        for j, want in enumerate(expected):
            if not devices[j].startswith(self.device):
                raise _Failure("check", f"{what}: output {j} is on {devices[j]}, the "
                                        f"reference's on {self.device}")
            got = _read_npy(f"{prefix}{j}.npy")
            atol, rtol = self.task.tolerance_for(str(want.dtype))
            result = compare(got, want, atol, rtol, f"output {j}")
            if not result.ok:
                raise _Failure("check", f"{what}: {result.reason}", worst=result.worst,
                               max_error=result.max_error)
            worst = max(worst, result.max_error)
        return worst

    def _check_inputs_unchanged(self, inputs: list, prefix: str, k: int) -> None:
        for j, x in enumerate(inputs):
            if not isinstance(x, self.torch.Tensor):
                continue
            after = _read_npy(f"{prefix}in_after{j}.npy")
            if not np.array_equal(after, _to_numpy(x), equal_nan=True):
                raise _Failure("check", f"trial {k}: the candidate modified input {j} (inputs "
                                        f"must be unchanged after forward)")

    # ----------------------------------------------------------------- timing (GPU)
    def _timing(self) -> dict:
        from tegula.agent.timing import median, roofline_seconds, time_trials

        torch = self.torch
        ref_times, cand_times = [], []
        n = self.options.timing_trials + 1
        for round_ in range(2):
            sets = [self.task.make_inputs(self.size, self.base_seed + 7 * 10**6 + 1000 *
                                          (round_ * n + i),
                                          self.task.distributions[i % len(self.task.distributions)])
                    for i in range(n)]
            order = ("reference", "candidate") if round_ == 0 else ("candidate", "reference")
            for who in order:
                if who == "reference":
                    gpu_sets = [[x.clone().cuda() if isinstance(x, torch.Tensor) else x
                                 for x in s] for s in sets]
                    with torch.no_grad():
                        times, _ = time_trials(lambda inputs: self.reference(*inputs),
                                               gpu_sets, torch)
                    ref_times += times
                else:
                    cand_times += self._time_candidate(sets, round_)
        cand, ref = median(cand_times), median(ref_times)
        device_name = torch.cuda.get_device_name()
        input_bytes = sum(x.numel() * x.element_size() for x in sets[1]
                          if isinstance(x, torch.Tensor))
        bound = roofline_seconds(input_bytes, self.task.flops(self.size), device_name)
        timing = {"candidate_us": cand * 1e6, "reference_us": ref * 1e6, "speedup": ref / cand,
                  "roofline_us": bound * 1e6, "device": device_name,
                  "candidate_times_us": [t * 1e6 for t in cand_times],
                  "reference_times_us": [t * 1e6 for t in ref_times]}
        if cand < bound:
            raise _Failure("timing", f"measured {cand * 1e6:.2f} us, below the roofline bound "
                                     f"{bound * 1e6:.2f} us for {input_bytes} input bytes on "
                                     f"{device_name}: the timing cannot be real", timing=timing)
        return timing

    def _time_candidate(self, sets: list, round_: int) -> list[float]:
        described = [self._write_values(s, f"time{round_}_{i}_in") for i, s in enumerate(sets)]
        prefix = os.path.join(self.job, f"time{round_}_")
        reply = self._ask({"cmd": "time", "input_sets": described, "out_prefix": prefix},
                          "timing")
        if not reply.get("ok"):
            raise _Failure("timing", f"timing: {reply.get('error')}")
        times = [float(t) for t in reply.get("times", [])]
        if len(times) != len(sets) - 1 or not all(t > 0 for t in times):
            raise _Failure("timing", f"timing: the harness returned {reply.get('times')!r}")
        for i, inputs in enumerate(sets[1:]):
            expected = self._reference(inputs)
            self._check_outputs(expected, f"{prefix}{i}_out", [self.device] * len(expected),
                                f"timed call {i} of round {round_}")
        return times

    # ----------------------------------------------------------------- the candidate process
    def _start_candidate(self) -> None:
        """Fork the candidate's process and load the candidate in it."""
        from multiprocessing.connection import Connection

        from tegula.agent.forkserver import ForkServer

        socket_path = os.path.join(self.job, "sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(socket_path)
        listener.listen(1)
        listener.settimeout(self.options.wall_seconds)
        try:
            self.pid = ForkServer.shared().fork(self.job, socket_path, self.options.cpu_seconds,
                                                self.options.memory_bytes, self.gpu)
            peer, _ = listener.accept()
        except (OSError, RuntimeError) as err:
            raise _Failure("load", f"could not start the candidate process: {err}") from None
        finally:
            listener.close()
        peer.setblocking(True)
        self.conn = Connection(peer.detach())
        init = self._write_values(_task_call("get_init_inputs", self.task.init_inputs,
                                             self.size, self.init_seed), "init")
        reply = self._ask({"cmd": "load", "candidate": self.candidate_path, "init": init,
                           "init_seed": self.init_seed}, "load")
        if not reply.get("ok"):
            raise _Failure("load", f"the candidate failed to load: {reply.get('error')}")

    def _ask(self, message: dict, what: str) -> dict:
        """Send a command and wait for the JSON reply (bounded by the wall-clock limit)."""
        try:
            self.conn.send_bytes(json.dumps(message).encode())
            if not self.conn.poll(self.options.wall_seconds):
                self._kill()
                raise _Failure("run", f"{what}: the candidate did not answer within "
                                      f"{self.options.wall_seconds:.0f} s (time limit)")
            reply = json.loads(self.conn.recv_bytes(1 << 24).decode())
        except (EOFError, OSError, ValueError, UnicodeDecodeError):
            raise _Failure("run", f"{what}: the candidate process died "
                                  f"({self._exit_status()}){self._log_tail()}") from None
        if not isinstance(reply, dict):
            raise _Failure("run", f"{what}: malformed reply from the candidate process")
        return reply

    def _exit_status(self) -> str:
        """The dead child's exit status, as the fork server recorded it."""
        path = os.path.join(self.job, "exit.json")
        for _ in range(50):
            if os.path.exists(path):
                break
            time.sleep(0.02)
        try:
            with open(path, encoding="ascii") as f:
                code = json.load(f)["code"]
        except (OSError, ValueError, KeyError):
            return "exit status unknown"
        names = {-signal.SIGKILL: "killed", -signal.SIGXCPU: "CPU time limit",
                 -signal.SIGSEGV: "segmentation fault", -signal.SIGABRT: "aborted"}
        return f"exit status {code}" + (f": {names[code]}" if code in names else "")

    def _kill(self) -> None:
        """Kill the candidate's process (the one this session forked)."""
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.pid = 0

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self.job, "candidate.log"), encoding="utf-8",
                      errors="replace") as f:
                tail = f.read()[-1500:].strip()
        except OSError:
            return ""
        return f"\n{tail}" if tail else ""

    def _write_values(self, values: list, stem: str) -> list:
        """Describe values for the child: tensors as .npy files, the rest as JSON."""
        torch, described = self.torch, []
        for j, value in enumerate(values):
            if isinstance(value, torch.Tensor):
                path = os.path.join(self.job, f"{stem}{j}.npy")
                np.save(path, _to_numpy(value), allow_pickle=False)
                described.append({"npy": path, "dtype": str(value.dtype).removeprefix("torch.")})
            else:
                try:
                    json.dumps(value)
                except TypeError:
                    raise _Failure("task", f"input {j} of type {type(value).__name__} cannot "
                                           f"be passed to the candidate process") from None
                described.append({"json": value})
        return described

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send_bytes(json.dumps({"cmd": "exit"}).encode())
            except OSError:
                pass
            self.conn.close()
            self.conn = None
        if self.pid:  # give it a moment to leave by itself, then make sure
            for _ in range(25):
                if os.path.exists(os.path.join(self.job, "exit.json")):
                    break
                time.sleep(0.02)
            else:
                self._kill()
        if self.options.keep_dir:
            shutil.copytree(self.job, self.options.keep_dir, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("sock"))
        shutil.rmtree(self.job, ignore_errors=True)


def _task_call(what: str, fn: Any, *args: Any) -> Any:
    """Run the task's own code; its failure is the task's (stage "task"), not a crash."""
    try:
        return fn(*args)
    except _Failure:
        raise
    except Exception as err:  # the task file's error, whatever it is, names the task
        raise _Failure("task", f"the task's {what} failed: {type(err).__name__}: "
                               f"{err}") from None


def _to_numpy(value: Any) -> np.ndarray:
    """A tensor as a numpy array (bf16 has no numpy type: tasks with bf16 tensors are
    refused with a clear error until the channel carries their bits)."""
    import torch

    tensor = value.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        raise _Failure("task", "bf16 tensors are not supported by the evaluator yet (numpy "
                               "has no bf16); use f16 or f32 in the task")
    return tensor.numpy()


def _read_npy(path: str) -> np.ndarray:
    """An array the candidate wrote (never unpickled); a missing file is a failure."""
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise _Failure("check", f"cannot read the candidate's output {os.path.basename(path)}: "
                                f"{err}") from None


__all__ = ["evaluate", "evaluate_source", "EvalOptions", "Verdict"]
