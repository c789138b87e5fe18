"""The one subprocess seam (as in nox): every command matrix-run runs goes through here.

Commands are argument lists (never a shell), run with an allow-listed environment plus explicit
extras, their output going to a log file whose tail is kept for error messages.

Every command is started in its own process group (``start_new_session``) and registered while it
runs, so that an interrupted matrix-run can stop all of them, with everything they started
(:func:`terminate_all` from a signal handler, :func:`kill_all` before exiting). Once stopping,
no new command is started (:class:`Stopped`).
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import Interrupted

#: Variables passed from matrix-run's environment to the commands it runs; everything else is dropped.
ENV_ALLOW = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TMPDIR", "TZ", "SHELL",
             "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CC", "CXX",
             "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY",
             "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "XDG_CACHE_HOME",
             "MATRIX_RUN_BURST_TRACE")  # the worker's burst trace (a diagnostic: worker.py)
ENV_ALLOW_PREFIXES = ("LC_", "UV_", "NVIDIA_", "NCCL_", "TORCH_", "TRITON_", "CUBLAS_", "CUDNN_",
                      "NVSHMEM_", "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_")


def clean_env(extra: dict | None = None) -> dict:
    """The allow-listed subset of ``os.environ`` updated with ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)}
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


# -- the registry of running commands ---------------------------------------------------------
_live: list[subprocess.Popen] = []
_lock = threading.RLock()  # re-entrant: a signal handler may run while the main thread holds it
_stopping = threading.Event()


class Stopped(Interrupted):
    """matrix-run is stopping (interrupted): the command was not started, or was stopped."""


def stopping() -> bool:
    return _stopping.is_set()


def _start(argv: list[str], **kw) -> subprocess.Popen:
    if not isinstance(argv, (list, tuple)) or not all(isinstance(a, (str, os.PathLike)) for a in argv):
        raise TypeError("commands are argument lists of str (never a shell string)")
    with _lock:
        if _stopping.is_set():
            raise Stopped(f"interrupted: {Path(str(argv[0])).name} was not started")
        p = subprocess.Popen([str(a) for a in argv], start_new_session=True, **kw)
        _live[:] = [q for q in _live if q.returncode is None]
        _live.append(p)
    if _stopping.is_set():  # a signal arrived between Popen and registering it
        kill_group(p, grace=1.0)
        raise Stopped(f"interrupted: {Path(str(argv[0])).name} was stopped")
    return p


def live() -> list[subprocess.Popen]:
    """Registered commands that have not been reaped yet."""
    with _lock:
        return [p for p in _live if p.returncode is None]


def terminate_all() -> int:
    """Mark matrix-run as stopping and SIGTERM every running command's process group. Does not
    wait (safe in a signal handler): :func:`signal_all`. Returns how many groups were signalled."""
    return signal_all(signal.SIGTERM)


def signal_all(sig: int) -> int:
    """Mark matrix-run as stopping and send ``sig`` to every registered command's process group,
    without polling, waiting or taking a lock: safe in a signal handler, also one that interrupts
    itself or code holding :data:`_lock` or a ``Popen``'s wait lock (a second SIGINT -- GNU
    ``timeout`` signals the child and then its group -- arrived while the first handler's
    ``Popen.poll`` held that lock, and ``Popen.wait`` in the second blocked on it for good). A
    command whose ``returncode`` is still None has not been reaped, so its id is not reused yet.
    Returns how many groups were signalled."""
    _stopping.set()
    n = 0
    for p in list(_live):  # a copy, no lock: a handler runs between bytecodes; _live changes by single ops
        if p.returncode is None:
            try:
                os.killpg(p.pid, sig)
                n += 1
            except (ProcessLookupError, PermissionError):
                pass
    return n


def kill_all(grace: float = 3.0) -> None:
    """Stop every running command: SIGTERM, then SIGKILL what is left after ``grace`` seconds."""
    terminate_all()
    deadline = time.monotonic() + grace
    for p in live():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        kill_group(p, grace=0.0)


def reset() -> None:
    """Allow commands again (after an interrupted run, for callers that go on in this process)."""
    _stopping.clear()


# -- running commands ---------------------------------------------------------------------------
@dataclass
class Result:
    returncode: int
    timed_out: bool
    seconds: float
    tail: str
    log: Path | None


def tail_of(path: Path | None, lines: int = 25) -> str:
    if path is None or not Path(path).exists():
        return ""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - 16384))
        data = f.read().decode("utf-8", "replace")
    return "\n".join(data.splitlines()[-lines:])


def run_logged(argv: list[str], *, cwd: Path | str | None = None, env_extra: dict | None = None,
               log: Path | None = None, timeout: float | None = None) -> Result:
    """Run ``argv`` to completion, stdout+stderr appended to ``log``. Never raises on failure:
    returns the exit code, whether it timed out (then the whole process group is killed), the
    elapsed seconds and the log's last lines. Raises :class:`Stopped` when matrix-run is stopping."""
    t0 = time.monotonic()
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab")
        out.write(("$ " + " ".join(map(str, argv)) + "\n").encode())
        out.flush()
    else:
        out = subprocess.DEVNULL
    try:
        p = _start(argv, cwd=cwd, env=clean_env(env_extra), stdout=out, stderr=subprocess.STDOUT,
                   stdin=subprocess.DEVNULL)
        timed_out = False
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(p)
        except BaseException:
            kill_group(p)
            raise
    finally:
        if log is not None:
            out.close()
    return Result(p.returncode if not timed_out else -9, timed_out, time.monotonic() - t0, tail_of(log), log)


def capture(argv: list[str], *, env_extra: dict | None = None, timeout: float = 60.0,
            cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` and capture its output as text (for short queries like probes and nvidia-smi).

    Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds (the process group is killed)."""
    p = _start(argv, cwd=cwd, env=clean_env(env_extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
               stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        p.communicate()
        raise
    except BaseException:
        kill_group(p)
        raise
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def spawn(argv: list[str], *, env_extra: dict | None = None, log: Path, cwd: Path | str | None = None,
          piped: bool = False) -> subprocess.Popen:
    """Start ``argv`` in its own process group (so it can be stopped with everything it started),
    output appended to ``log``. The caller polls and stops it with :func:`kill_group`. ``piped``:
    stdin and stdout are unbuffered binary pipes (a worker's command and reply channels; the caller
    frames lines itself) and only stderr goes to ``log``."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab")
    try:
        if piped:
            return _start(argv, cwd=cwd, env=clean_env(env_extra), stdout=subprocess.PIPE, stderr=out,
                          stdin=subprocess.PIPE, bufsize=0)
        return _start(argv, cwd=cwd, env=clean_env(env_extra), stdout=out, stderr=subprocess.STDOUT,
                      stdin=subprocess.DEVNULL)
    finally:
        out.close()


def kill_group(p: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM the process group, SIGKILL it after ``grace`` seconds; then SIGKILL whatever the
    group leader left behind (its children share its process group)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
    try:  # grandchildren still in the group (the leader was just reaped, so its id is not reused yet)
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
