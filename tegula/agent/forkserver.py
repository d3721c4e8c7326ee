"""A fork server for candidate processes: one interpreter with torch and tegula imported
(about 3 s to start) that forks a fresh child per candidate (milliseconds).

The evaluator starts it once (`ForkServer.shared()`) and writes one JSON line per
candidate to its stdin: the job directory, the limits and whether to use the GPU. The
server forks; the child connects to the Unix socket the evaluator listens on in the job
directory and runs `tegula.agent.sandbox.serve` there; the server answers with the child's
pid and, when the child ends, writes its exit status to `exit.json` in the job directory
(negative: killed by that signal). Nothing of the evaluator's memory is in the server or
its children: the server is a separate interpreter that never sees a reference output.
(multiprocessing's own fork server re-imports the caller's `__main__` in every child,
which would run an arbitrary caller script inside the sandbox; this one does not.)
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading

PRELOAD = ("numpy", "torch", "tegula", "tegula.build", "tegula.agent.device",
           "tegula.agent.sandbox", "tegula.agent.timing")


class ForkServer:
    """The evaluator's handle on the server process."""

    _shared: "ForkServer | None" = None
    _lock = threading.Lock()

    def __init__(self) -> None:
        # CUDA does not survive a fork once the driver is initialized: the server must
        # never initialize it (the children do). torch's NVML-based availability check
        # answers torch.cuda.is_available() without initializing the driver.
        env = {**os.environ, "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from tegula.agent.forkserver import main; main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
        atexit.register(self.stop)

    @classmethod
    def shared(cls) -> "ForkServer":
        """The one server of this process (started on first use, restarted if it died)."""
        with cls._lock:
            if cls._shared is None or cls._shared.process.poll() is not None:
                cls._shared = ForkServer()
            return cls._shared

    def fork(self, job_dir: str, socket_path: str, cpu_seconds: int, memory_bytes: int,
             gpu: bool) -> int:
        """Ask for a child; returns its pid."""
        request = {"job": job_dir, "socket": socket_path, "cpu": cpu_seconds,
                   "memory": memory_bytes, "gpu": gpu}
        with self._lock:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the tegula agent fork server exited (see its stderr)")
        return int(json.loads(line)["pid"])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()


# --------------------------------------------------------------------------- server side

def main() -> None:
    """The server's loop: preload, then fork one child per request line."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    _warm_up()
    jobs: dict[int, str] = {}

    def reap(signum: int, frame: object) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = jobs.pop(pid, None)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if job and os.path.isdir(job):
                with open(os.path.join(job, "exit.json"), "w", encoding="ascii") as f:
                    json.dump({"pid": pid, "code": code}, f)

    signal.signal(signal.SIGCHLD, reap)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)  # never returns
        jobs[pid] = request["job"]
        sys.stdout.write(json.dumps({"pid": pid}) + "\n")
        sys.stdout.flush()


def _warm_up() -> None:
    """Do once here what every child would do first: the first torch dispatch mode
    imports torch._dynamo (seconds), and the first emulated kernel the compiler's lazily
    imported stages."""
    import numpy as np
    import torch

    import tegula as tg
    from tegula.agent.sandbox import make_audit

    with make_audit():
        torch.empty(1)

    @tg.kernel(threads=32)
    def warm(x: tg.Tensor[tg.f32], y: tg.Tensor[tg.f32]):
        tg.copy(tg.load(x.tile((4, 8), (0, 0))) + 1.0, y.tile((4, 8), (0, 0)))

    tg.emulate(warm, (1,), np.ones((4, 8), np.float32), np.zeros((4, 8), np.float32))


def _child(request: dict) -> None:
    """In the forked child: leave the server's pipes, connect, serve, exit."""
    code = 0
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        from multiprocessing.connection import Client

        from tegula.agent.sandbox import serve

        conn = Client(request["socket"], family="AF_UNIX")
        serve(conn, request["job"], request["cpu"], request["memory"], request["gpu"])
    except BaseException:  # the sandbox reports candidate errors itself; this is the rest
        code = 3
    finally:
        os._exit(code)


__all__ = ["ForkServer", "main"]
