"""The one place that asks the machine questions: host, CPU (model, count, the CPUs this process
may use, SMT siblings), memory, GPU (nvidia-smi: name, driver, compute capability, clocks, NUMA
node) -- and the metadata recorded with every run (:func:`collect`).

Everything here reads the OS (``/proc``, ``/sys``, ``sched_getaffinity``) or runs nvidia-smi; no other
module does. Each function answers "unknown" (None, [], a fallback named in its docstring) instead of
raising where the machine cannot say."""
from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path

from .proc import capture


def cpu_count() -> int:
    """Logical CPUs of the machine (``os.cpu_count``; 1 where unknown)."""
    return os.cpu_count() or 1


def allowed_cpus() -> list[int]:
    """CPU ids this process may run on (``sched_getaffinity``), sorted; [] where unknown."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return []


def siblings(cpu: int) -> set[int]:
    """CPUs sharing ``cpu``'s physical core (SMT), from sysfs; ``{cpu}`` where unknown."""
    try:
        txt = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return {cpu}
    return set(_cpu_list(txt)) or {cpu}


def _cpu_list(txt: str) -> list[int]:
    """sysfs' CPU list syntax (``0-3,8,10-11``) as ids."""
    out: list[int] = []
    for part in txt.split(","):
        if "-" in part:
            a, b = part.split("-")
            out.extend(range(int(a), int(b) + 1))
        elif part.strip():
            out.append(int(part))
    return out


#: ``/proc/stat`` (a module attribute, so tests can point it at a file of their own).
PROC_STAT = "/proc/stat"


def cpu_jiffies(cpus) -> tuple[int, int] | None:
    """(steal, total) clock ticks since boot summed over the CPU ids ``cpus`` (``None``: the whole
    machine), from ``/proc/stat``'s ``cpuN user nice system idle iowait irq softirq steal ...``
    lines; ``steal`` is the time a hypervisor ran something else while the CPU had work (a cloud
    VM's noisy neighbours or an exhausted CPU credit). None where unknown (not Linux, or no steal
    column)."""
    want = None if cpus is None else {f"cpu{c}" for c in cpus}
    steal = total = 0
    seen = False
    try:
        with open(PROC_STAT) as f:
            for line in f:
                if not line.startswith("cpu"):
                    break
                name, *vals = line.split()
                if (want is None and name != "cpu") or (want is not None and name not in want):
                    continue
                if len(vals) < 8:
                    return None
                v = [int(x) for x in vals[:8]]  # guest time is already counted in user/nice
                steal, total, seen = steal + v[7], total + sum(v), True
    except (OSError, ValueError):
        return None
    return (steal, total) if seen else None


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time taken by the hypervisor (steal) between two :func:`cpu_jiffies`
    readings, 0..1; None where either is unknown or no tick passed."""
    if not before or not after or after[1] <= before[1]:
        return None
    return max(0.0, min(1.0, (after[0] - before[0]) / (after[1] - before[1])))


def mem_available_gb() -> float:
    """``MemAvailable`` of ``/proc/meminfo`` in GiB; 16.0 where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 16.0


def compute_capabilities() -> list[str] | None:
    """Compute capabilities of every GPU nvidia-smi lists, without the dot (``["90"]``), sorted and
    unique; None without nvidia-smi or GPUs."""
    try:
        cp = capture(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], timeout=20)
    except Exception:  # noqa: BLE001 - no nvidia-smi: no NVIDIA GPU here
        return None
    caps = sorted({c.strip().replace(".", "") for c in cp.stdout.split() if c.strip()})
    return caps or None


def sm_clock(index: int) -> tuple[float, int] | None:
    """GPU ``index``'s SM clock (MHz) and active throttle-reason bits from nvidia-smi; None where it
    cannot say. (runner.GpuMonitor reads NVML instead when nvidia-ml-py is importable.)"""
    try:
        cp = capture(["nvidia-smi", "--query-gpu=clocks.sm,clocks_throttle_reasons.active",
                      "--format=csv,noheader,nounits", "-i", str(index)], timeout=10)
        clk, reasons = cp.stdout.strip().splitlines()[0].split(",")
        return float(clk), int(reasons.strip(), 16)
    except Exception:  # noqa: BLE001
        return None


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


def gpus() -> list[dict]:
    """Every GPU nvidia-smi lists: ``{index, uuid, bus_id, name, max_sm_clock_mhz, numa_node}`` (index:
    nvidia-smi's, PCI order; numa_node from sysfs, None where unknown); [] without nvidia-smi."""
    try:
        cp = capture(["nvidia-smi", "--query-gpu=index,uuid,pci.bus_id,name,clocks.max.sm",
                      "--format=csv,noheader,nounits"], timeout=20)
    except (OSError, Exception):  # noqa: BLE001 - no nvidia-smi: no NVIDIA GPU here
        return []
    if cp.returncode != 0:
        return []
    out = []
    for line in cp.stdout.strip().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 5 or not f[0].isdigit():
            continue
        out.append({"index": int(f[0]), "uuid": f[1], "bus_id": f[2], "name": f[3], "max_sm_clock_mhz": f[4],
                    "numa_node": numa_node(f[2])})
    return out


def numa_node(bus_id: str) -> int | None:
    """NUMA node of a PCI device from ``/sys/bus/pci/devices/<bus id>/numa_node`` (nvidia-smi's
    ``00000000:19:00.0`` is sysfs' ``0000:19:00.0``); None where unknown (-1, no sysfs)."""
    try:
        dom, rest = bus_id.lower().split(":", 1)
        txt = open(f"/sys/bus/pci/devices/{dom[-4:]}:{rest}/numa_node").read().strip()
        n = int(txt)
    except (OSError, ValueError):
        return None
    return n if n >= 0 else None


def node_cpus(node: int) -> list[int]:
    """CPU ids of NUMA node ``node`` (``/sys/devices/system/node/node<N>/cpulist``); [] where unknown."""
    try:
        txt = open(f"/sys/devices/system/node/node{node}/cpulist").read().strip()
    except OSError:
        return []
    return _cpu_list(txt)
