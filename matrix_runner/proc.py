"""The one subprocess seam (as in nox): every command matrix-run runs goes through here.

Commands are argument lists (never a shell), run with an allow-listed environment plus explicit
extras, their output going to a log file whose tail is kept for error messages.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

#: Variables passed from matrix-run's environment to the commands it runs; everything else is dropped.
ENV_ALLOW = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM", "TMPDIR", "TZ", "SHELL",
             "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "CC", "CXX",
             "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY",
             "NO_PROXY", "http_proxy", "https_proxy", "no_proxy", "XDG_CACHE_HOME")
ENV_ALLOW_PREFIXES = ("LC_", "UV_", "NVIDIA_", "NCCL_", "TORCH_", "TRITON_", "CUBLAS_", "CUDNN_",
                      "NVSHMEM_", "PYTORCH_", "OMP_", "MKL_", "OPENBLAS_", "PIP_")


def clean_env(extra: dict | None = None) -> dict:
    """The allow-listed subset of ``os.environ`` updated with ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k in ENV_ALLOW or k.startswith(ENV_ALLOW_PREFIXES)}
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


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
    elapsed seconds and the log's last lines."""
    t0 = time.monotonic()
    if log is not None:
        Path(log).parent.mkdir(parents=True, exist_ok=True)
        out = open(log, "ab")
        out.write(("$ " + " ".join(argv) + "\n").encode())
        out.flush()
    else:
        out = subprocess.DEVNULL
    try:
        p = subprocess.Popen(argv, cwd=cwd, env=clean_env(env_extra), stdout=out, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True)
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
    """Run ``argv`` and capture its output as text (for short queries like probes and nvidia-smi)."""
    return subprocess.run(argv, env=clean_env(env_extra), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=cwd)


def spawn(argv: list[str], *, env_extra: dict | None = None, log: Path, cwd: Path | str | None = None) -> subprocess.Popen:
    """Start ``argv`` in its own process group (so it can be stopped with everything it started),
    output appended to ``log``. The caller polls and stops it with :func:`kill_group`."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab")
    try:
        return subprocess.Popen(argv, cwd=cwd, env=clean_env(env_extra), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    finally:
        out.close()


def kill_group(p: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``grace`` seconds."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=grace)
    except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
