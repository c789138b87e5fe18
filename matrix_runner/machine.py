"""Machine metadata recorded with every run: host, CPU, GPU, driver, CUDA, torch."""
from __future__ import annotations

import os
import platform
import socket
import sys

from .proc import capture


def nvidia_smi() -> dict | None:
    """GPU name, driver, memory and compute capability of GPU 0 from nvidia-smi; None without one."""
    try:
        cp = capture(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap,clocks.max.sm",
                      "--format=csv,noheader,nounits", "-i", "0"], timeout=20)
    except (OSError, Exception):  # noqa: BLE001 - no nvidia-smi: no NVIDIA GPU here
        return None
    if cp.returncode != 0 or not cp.stdout.strip():
        return None
    f = [x.strip() for x in cp.stdout.strip().splitlines()[0].split(",")]
    keys = ["name", "driver", "memory_mib", "compute_cap", "max_sm_clock_mhz"]
    return dict(zip(keys, f))


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def collect(driver_probe: dict | None) -> dict:
    """Metadata of this machine; ``driver_probe`` is the worker probe run with matrix-run's python."""
    t = (driver_probe or {}).get("torch") or {}
    smi = nvidia_smi()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "torch": t.get("version"),
        "cuda": t.get("cuda"),
        "gpu": (t.get("gpu") or {}).get("name") or (smi or {}).get("name"),
        "gpu_capability": (t.get("gpu") or {}).get("capability") or (smi or {}).get("compute_cap"),
        "driver": (smi or {}).get("driver"),
        "nvidia_smi": smi,
    }
