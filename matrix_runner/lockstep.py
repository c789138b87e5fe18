"""Stage 3 (driver side) — lockstep workers: spawn, pin, feed and read them, and blame a fault on its case.

The one place that talks to workers. A *worker* is ``ENV/bin/python matrix_runner/worker.py serve``
(protocol in :func:`worker.serve`): commands on its stdin, one JSON reply per command on its stdout,
its stderr in a log. A *process set* is one worker per env, all pinned to the same CPU core while
they are timed (the driver runs on another core): on the H200 machine a worker's CPU changes speed
over time and between cores, and two workers pinned to the same core at the same moment see the same
speed (``../shared/notes/h200-measurements.md``: A/A within +-1-3 % pinned in lockstep, +-6 %
unpinned). The driver gives every worker of the set a burst of one case in turn (a *cycle*), so
the bursts compared were timed on the same core within a few ms of each other.

Faults: a worker that exits or is killed while it works on a request fails that request's case
(:class:`WorkerDied`); one that sends nothing for the request's timeout is killed and its case fails
(:class:`WorkerHung`). The caller decides what else is lost (runner module doc).
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path

from . import machine, proc, stats
from .worker import PREIMPORT_ENV

WORKER = Path(__file__).with_name("worker.py")


class WorkerFault(Exception):
    """A worker died or hung while working on a request; ``kind`` is ``crash`` or ``timeout``."""

    kind = "crash"

    def __init__(self, msg: str, log: Path | None = None):
        super().__init__(msg)
        self.log = log


class WorkerDied(WorkerFault):
    kind = "crash"


class WorkerHung(WorkerFault):
    kind = "timeout"


def exit_reason(rc: int | None) -> str:
    """Human words for a worker's exit status (signals named; SIGKILL hints at the OOM killer)."""
    if rc is None:
        return "was stopped"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            return f"was killed by signal {-rc}"
        if name == "SIGKILL":
            return "was killed by SIGKILL (out of memory? the kernel's OOM killer sends SIGKILL)"
        return f"was killed by {name}"
    return f"exited with code {rc}"


def _tail(log: Path) -> str:
    t = proc.tail_of(log, 6).strip()
    return f"; log tail: {t}" if t else ""


class Worker:
    """One live worker process of one env. ``request`` sends a command and waits for its reply."""

    def __init__(self, label: str, python: str, log: Path, cpus: set[int] | None = None,
                 env_extra: dict | None = None, preimport: Path | None = None):
        """``preimport``: a JSON list of modules the worker imports before its hello
        (:func:`worker.preimport`; the runner learns them from an earlier set's workers of the env)."""
        self.label, self.log = label, log
        extra = {**(env_extra or {}), "PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}
        if preimport is not None:
            extra[PREIMPORT_ENV] = str(preimport)
        self.p = proc.spawn([python, str(WORKER), "serve"], log=log, piped=True, env_extra=extra)
        self._buf = b""
        #: replies read ahead by :meth:`read_ahead`, handed out first by the next reads
        self._ready: list[dict] = []
        self._writer: threading.Thread | None = None  # queue_commands' writer, joined before any send
        self.pid = self.p.pid
        self.hello: dict | None = None
        if cpus:  # while it imports, keep it off the set's core (its threads inherit this)
            set_affinity(self.pid, cpus)

    def _readline(self, timeout: float) -> dict:
        if self._ready:
            return self._ready.pop(0)
        return self._read_record(timeout)

    def _read_record(self, timeout: float) -> dict:
        end = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line, self._buf = self._buf[:nl], self._buf[nl + 1:]
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # not a protocol line
                if isinstance(rec, dict):
                    return rec
                continue
            left = end - time.monotonic()
            if left <= 0:
                raise WorkerHung(f"no reply for {timeout:g} s", self.log)
            r, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not r:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                try:
                    rc = self.p.wait(timeout=5)
                except Exception:  # noqa: BLE001
                    rc = None
                raise WorkerDied(f"the worker {exit_reason(rc)}{_tail(self.log)}", self.log)
            self._buf += chunk

    def read_ahead(self, n: int, timeout: float) -> int:
        """Wait up to ``timeout`` s in all for the worker's next ``n`` records (counting those
        already read ahead) and keep them: the next :meth:`wait_hello` / :meth:`reply` calls return
        them in order. Returns how many are waiting. Used to know that a prefetched set's set-ups
        (GPU work) are over before the running set times kernels. A worker that dies or is still
        busy ends the wait quietly: nothing is killed here, and the fault shows at the reply that
        would have met it."""
        end = time.monotonic() + timeout
        while len(self._ready) < n:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                rec = self._read_record(left)
            except WorkerFault:
                break
            self._ready.append(rec)
        return len(self._ready)

    def has_reply(self) -> bool:
        """Whether a whole record is waiting to be read, without waiting: reads what the pipe holds
        now into the buffer. A worker that has exited also answers True: nothing is left to wait for,
        and its fault shows at the next read."""
        if self._ready or b"\n" in self._buf:
            return True
        fd = self.p.stdout.fileno()
        r, _, _ = select.select([fd], [], [], 0)
        if r:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return True
            self._buf += chunk
        return b"\n" in self._buf

    def wait_hello(self, timeout: float) -> dict:
        """The worker's first reply (``hello`` with its env probe, or ``fatal``)."""
        self.hello = self._readline(timeout)
        return self.hello

    def queue_commands(self, cmds: list[dict]) -> None:
        """Send ``cmds`` without waiting for the worker to read them (their replies come in order,
        read with :meth:`reply`). A pipe holds 64 KiB and a worker that is still importing reads
        nothing, so writing a large config's set-ups directly blocked the driver (600 cases, ~180
        KB of commands: the driver waited 266 s on a worker working through them); a thread writes
        them instead, and :meth:`send` waits for it first, so commands never interleave. A worker
        that dies ends the write (broken pipe); its fault shows at the next reply."""
        self._join_writer()
        data = b"".join((json.dumps(c) + "\n").encode() for c in cmds)

        def write() -> None:
            view = memoryview(data)
            try:
                while view:
                    n = self.p.stdin.write(view)
                    view = view[n or 0:]
            except (BrokenPipeError, OSError, ValueError):
                pass

        self._writer = threading.Thread(target=write, name=f"queue-{self.label}", daemon=True)
        self._writer.start()

    def _join_writer(self) -> None:
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    def send(self, cmd: dict) -> None:
        self._join_writer()
        try:
            self.p.stdin.write((json.dumps(cmd) + "\n").encode())
        except (BrokenPipeError, OSError):
            rc = self.p.poll()
            self.kill()
            raise WorkerDied(f"the worker {exit_reason(rc)}{_tail(self.log)}", self.log) from None

    def reply(self, timeout: float) -> dict:
        """The reply to the command sent last (see :meth:`request`)."""
        try:
            return self._readline(timeout)
        except WorkerFault:
            self.kill()
            raise

    def request(self, cmd: dict, timeout: float) -> dict:
        """Send ``cmd`` and return its reply; raises :class:`WorkerDied` / :class:`WorkerHung`
        (the worker is then killed)."""
        try:
            self.send(cmd)
            return self._readline(timeout)
        except WorkerFault:
            self.kill()
            raise

    def kill(self) -> None:
        proc.kill_group(self.p, grace=1.0)

    def terminate(self) -> None:
        """SIGTERM the worker's process group and return at once (a worker keeps nothing that needs
        a clean exit; a graceful ``quit`` took ~0.7 s of torch and CUDA teardown per worker on the
        H200, one after another)."""
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """Stop the worker (SIGTERM, SIGKILL after 2 s: proc.kill_group) and close its pipes."""
        proc.kill_group(self.p, grace=2.0)
        for f in (self.p.stdin, self.p.stdout):
            try:
                f.close()
            except OSError:
                pass


class Hopper:
    """``sampling.cpu_hop``: keeps a process set on a CPU of its pool that runs at the fast speed now.

    Why (H200 machine, 2026-12-04, benchmarks/results/h200-cpu-map-12-04.txt and core_hop runs in
    benchmarks/results/h200-core-hop-12-04.txt): each vCPU switches by itself between two speeds (the
    probe reads ~3.3 or ~6.5 µs; not caused by our own processes: a busy process on any other vCPU
    changed nothing), at any moment some vCPUs are fast and others slow, and one vCPU's speed lasts
    a while (a cycle slow now is slow 0.5 s later with p 0.73, a fast one with p 0.36:
    benchmarks/results/state-persistence-12-04.txt). A set pinned
    to one core met the slow speed in 0-100 % of its cycles, and a host-bound ratio differs between
    the speeds (batch-512 S50 fwd 1.11x fast vs 1.20x slow), so the sets' mixes of speeds spread
    their ratios. A probe process that moved to the core a scout read fastest ran 95 % of its turns
    fast against 55 % for one that stayed (same 40 s). In real runs it is not better overall
    (config.Sampling.cpu_hop: measured side by side; sets with more moves had wider cycle
    spreads), so it is an option.

    How: a scout process (``worker.py scout``, the driver's interpreter) reads every pool CPU but the
    set's (and its SMT siblings), 1 ms each, a sweep at most every 20 ms. A set starts on the pool CPU read fastest (:meth:`place`); after
    each cycle (:meth:`after_cycle`), when every env's probe readings of that cycle were slow --
    above ``reach`` x that env's low reading (its 5th percentile so far in this run; each env's
    interpreter has its own scale) -- and the scout's freshest reading of another pool CPU is fast
    (within ``reach`` x the scout's own 5th percentile, at most ``max_age_s`` old), every worker of
    the set moves there (:func:`move_process`) before the next cycle, once the scout has had time to
    leave that CPU (``settle_s``). Both versions of a cycle are always timed on the same core; a move
    only changes where the following cycles run."""

    MIN_READINGS = 30  # an env's readings before its low level is trusted (one worker per env: from cycle ~32)

    def __init__(self, cpus: list[int], log: Path, python: str | None = None,
                 reach: float = math.exp(stats.STATE_REACH), max_age_s: float = 0.08, probe_ms: float = 1.0,
                 every_ms: float = 20.0):
        self.cpus = list(cpus)
        self.reach, self.max_age_s = reach, max_age_s
        self.settle_s = probe_ms / 1e3 + 0.0005
        self.at = -1
        self.latest: dict[int, tuple[float, float]] = {}  # cpu -> (monotonic s, µs)
        self._scout = _LowLevel(self.MIN_READINGS)  # the scout's readings of every pool CPU
        self._own: dict[str, _LowLevel] = {}  # env label -> its workers' readings (their own scale)
        self._lock = threading.Lock()
        self.sweeps = 0  # scout records read so far (health: :meth:`health`)
        self.p = proc.spawn([python or sys.executable, str(WORKER), "scout", "--cpus", ",".join(map(str, self.cpus)),
                             "--probe-ms", str(probe_ms), "--every-ms", str(every_ms)],
                            log=log, piped=True, env_extra={"PYTHONUNBUFFERED": "1"})
        self._reader = threading.Thread(target=self._read, daemon=True, name="matrix-run-scout")
        self._reader.start()

    def _read(self) -> None:
        fd, buf = self.p.stdout.fileno(), b""
        while True:
            try:
                chunk = os.read(fd, 1 << 14)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    rec = json.loads(line)
                    t, us = float(rec["t"]), rec["us"]
                except (ValueError, KeyError, TypeError):
                    continue
                with self._lock:
                    self.sweeps += 1
                    good = []
                    for c, v in us.items():
                        if isinstance(v, (int, float)) and v > 0:
                            self.latest[int(c)] = (t, float(v))
                            good.append(float(v))
                    self._scout.add(good)

    def health(self) -> dict:
        """What a set's record keeps of the scout: ``sweeps`` read so far in the run, ``age_s`` of the
        newest reading (s; None before any), ``alive`` (its process has not exited), ``low_us`` (its
        fast-level reference; None until ``MIN_READINGS`` readings)."""
        with self._lock:
            newest = max((t for t, _ in self.latest.values()), default=None)
            low, n = self._scout.low, self.sweeps
        # alive: its stdout still open (the reader ends at its end of input); not Popen.poll, which
        # would reap it and leave close()'s killpg a process group id that may be reused
        return {"sweeps": n, "age_s": None if newest is None else round(time.monotonic() - newest, 3),
                "alive": self._reader.is_alive(), "low_us": None if low is None else round(low, 3)}

    def _tell(self, cpu: int) -> None:
        self.at = cpu
        try:
            self.p.stdin.write(f"at {cpu}\n".encode())
        except (OSError, ValueError):
            pass

    def fastest(self, exclude: int | None = None) -> int | None:
        """The pool CPU the scout read fastest within ``max_age_s``, when that reading is at the fast
        level (within ``reach`` of the scout's low reading); else None."""
        now = time.monotonic()
        with self._lock:
            low = self._scout.low
            fresh = [(us, c) for c, (t, us) in self.latest.items() if c != exclude and now - t <= self.max_age_s]
        if low is None or not fresh:
            return None
        us, c = min(fresh)
        return c if us <= self.reach * low else None

    def place(self, default: int) -> int:
        """The CPU a set starts on: the fastest fresh one (:meth:`fastest`), else ``default``."""
        c = self.fastest()
        c = default if c is None else c
        self._tell(c)
        return c

    def after_cycle(self, refs: dict) -> int | None:
        """Given a cycle's probe readings (env label -> list of µs, one per burst), the CPU to move
        the set to before the next cycle, or None to stay."""
        slow = bool(refs)
        for lab, vals in refs.items():
            good = [v for v in vals if isinstance(v, (int, float)) and math.isfinite(v) and v > 0]
            low = self._own.setdefault(lab, _LowLevel(self.MIN_READINGS)).add(good)
            if low is None or not good or min(good) <= self.reach * low:
                slow = False
        if not slow:
            return None
        c = self.fastest(exclude=self.at)
        if c is not None:
            self._tell(c)
            # the scout reads the message before its next CPU: one it is probing now (c, at worst)
            # is left within probe_ms, before the set's next cycle runs there
            time.sleep(self.settle_s)
        return c

    def mark(self, cpu: int) -> None:
        """The set is on ``cpu`` (a move the OS refused: it stayed there); the scout skips it."""
        self._tell(cpu)

    def leave(self) -> None:
        """The set left its CPU (closed): the scout reads every pool CPU again."""
        self._tell(-1)

    def close(self) -> None:
        """Stop the scout and its reader thread (the thread ends at the pipe's end of input, before
        the pipe is closed: its descriptor is not read after another file may have reused it)."""
        proc.kill_group(self.p, grace=1.0)
        self._reader.join(timeout=5.0)
        for f in (self.p.stdin,) if self._reader.is_alive() else (self.p.stdin, self.p.stdout):
            try:
                f.close()
            except OSError:
                pass


class _LowLevel:
    """A running low level of speed-probe readings (µs) for :class:`Hopper`: the 5th percentile of
    the last 4,000 readings, recomputed whenever 16 more have come in, once ``least`` are in (None
    before): the fast speed's reading while at least 1 in 20 readings is at it."""

    def __init__(self, least: int):
        self.least, self.vals, self.low = least, [], None

    def add(self, vals: list[float]) -> float | None:
        """Add readings; return the low level."""
        n0 = len(self.vals)
        self.vals.extend(vals)
        if len(self.vals) >= self.least and len(self.vals) // 16 != n0 // 16:
            del self.vals[:-4000]
            s = sorted(self.vals)
            self.low = s[min(len(s) - 1, max(0, int(0.05 * (len(s) - 1) + 0.5)))]
        return self.low


def set_affinity(pid: int, cpus) -> bool:
    """Pin ``pid`` (0: this thread) to ``cpus``; False where the OS or a cgroup forbids it."""
    try:
        os.sched_setaffinity(pid, set(cpus))
        return True
    except (OSError, AttributeError, ValueError):
        return False


def move_process(pid: int, cpus) -> int:
    """Pin every thread of process ``pid`` to ``cpus`` (Linux /proc/PID/task); how many were moved
    (0 where the process is gone or the OS forbids it)."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        tids = [pid]
    n = 0
    for t in tids:
        n += set_affinity(t, cpus)
    return n


def _noise(cpu: int, seconds: float = 0.03) -> float:
    """Spread of a fixed busy loop's duration on ``cpu``: (p90 - p10) / median of ~50 µs chunks,
    timed with this thread pinned there."""
    if not set_affinity(0, {cpu}):
        return float("inf")
    ts = []
    end = time.perf_counter() + seconds
    pc = time.perf_counter_ns
    while time.perf_counter() < end:
        t0 = pc()
        x = 0
        for i in range(400):
            x += i
        ts.append(pc() - t0)
    ts.sort()
    n = len(ts)
    med = ts[n // 2]
    return (ts[int(0.9 * (n - 1))] - ts[int(0.1 * (n - 1))]) / med if med else float("inf")


def parse_cpus(request: str | None) -> list[int] | None:
    """The CPU ids of a ``--cpus`` list (None for auto/unpinned); ValueError naming what is wrong:
    not a list of integers, or CPUs this process may not run on."""
    if request in (None, "auto", "unpinned"):
        return None
    try:
        want = [int(x) for x in request.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--cpus {request!r}: give auto, unpinned or a comma list of CPU ids") from None
    twice = sorted({c for c in want if want.count(c) > 1})
    if twice:
        raise ValueError(f"--cpus {request!r}: CPU(s) {twice} listed more than once; give each CPU once "
                         "(each process set is pinned to one of them)")
    allowed = machine.allowed_cpus()
    if not want:  # '' or ',' (new-user trial: "CPU(s) [] not allowed")
        raise ValueError(f"--cpus {request!r}: the list is empty; give auto, unpinned or a comma list of CPU ids "
                         f"(allowed: {allowed})")
    bad = [c for c in want if c not in allowed]
    if bad:
        raise ValueError(f"--cpus {request!r}: CPU(s) {bad} not allowed to this process "
                         f"(allowed: {allowed})")
    return want


def hop_idle(cpus: dict | None) -> str | None:
    """Why ``sampling.cpu_hop`` can do nothing with the CPU plan ``cpus`` (:func:`plan_cpus`), or None
    when it can: a set moves only between pinned CPUs of its pool, so it needs pinning and two or more
    set CPUs (a 2-CPU machine has the driver's and one)."""
    if not (cpus or {}).get("pinned"):
        return "the process sets run unpinned" + (f" ({cpus['why']})" if (cpus or {}).get("why") else "")
    n = len(cpus.get("set_cpus") or [])
    if n < 2:
        return f"the process sets have {n} CPU to run on (a set moves between two or more; --cpus or a larger machine)"
    return None


def pool_size(n_cpus: int, hop: bool) -> int:
    """How many CPUs :func:`plan_cpus` gives the process sets out of ``n_cpus``: 4 (sets take turns
    on them), or with ``sampling.cpu_hop`` half of those beside the driver's, at least 4, so the
    scout has several to find a fast one among while the rest hold the next sets' starting workers
    (:class:`Hopper`)."""
    return max(4, (n_cpus - 1) // 2) if hop else 4


def plan_cpus(request: str | None, n_sets: int = 4, allowed: list[int] | None = None) -> dict:
    """Which CPU the driver runs on and which cores the process sets are pinned to.

    ``request``: ``auto`` (default) or ``None`` — the driver takes the first allowed CPU, the sets
    the ``n_sets`` quietest of the others by a short noise calibration (:func:`_noise`, ~30 ms per
    core); ``unpinned`` — no pinning; or a comma list of CPU ids for the sets. Returns ``{pinned,
    driver_cpu, set_cpus, why, noise}`` (and ``shared``, a sentence, when a --cpus list leaves the driver no
    CPU of its own); ``pinned`` is False with ``why`` where pinning cannot work
    (one CPU, an OS or cgroup that forbids it): the run then goes on unpinned and says so.
    ``allowed``: plan within these CPUs only (a shard's share of the machine; default: every CPU
    this process may run on)."""
    allowed = machine.allowed_cpus() if allowed is None else sorted(set(allowed) & set(machine.allowed_cpus()))
    out = {"pinned": False, "driver_cpu": None, "set_cpus": [], "spare_cpus": [], "why": None, "noise": None,
           "allowed": allowed}
    if request == "unpinned":
        out["why"] = "--cpus unpinned"
        return out
    if len(allowed) < 2:
        out["why"] = (f"only {len(allowed)} CPU allowed to this process: the driver and the workers cannot get "
                      "cores of their own" if allowed else "CPU affinity is not available on this OS")
        return out
    driver = allowed[0]
    if request and request != "auto":
        want = parse_cpus(request) or []
        if driver in want:
            rest = [c for c in allowed if c not in want]
            driver = rest[0] if rest else driver
        out.update(pinned=True, driver_cpu=driver, set_cpus=want)
        if driver in want:  # every allowed CPU listed: said, not done silently (new-user trial)
            out["shared"] = (f"the driver shares CPU {driver} with the process sets pinned there: --cpus lists "
                             f"every CPU allowed to this process ({allowed}); leave one out for the driver")
    else:
        cands = [c for c in allowed if c not in machine.siblings(driver)] or [c for c in allowed if c != driver]
        noise = {}
        before = machine.allowed_cpus()
        try:
            for c in cands[:32]:
                noise[c] = round(_noise(c), 4)
        finally:
            set_affinity(0, before)
        if not noise or all(v == float("inf") for v in noise.values()):
            out["why"] = "this process may not change CPU affinity (cgroup or OS)"
            return out
        ranked = sorted(noise, key=lambda c: noise[c])
        out.update(pinned=True, driver_cpu=driver, set_cpus=ranked[:max(1, n_sets)], noise=noise)
    busy = set().union(*(machine.siblings(c) for c in out["set_cpus"])) if out["set_cpus"] else set()
    out["spare_cpus"] = [c for c in allowed if c not in busy]
    return out
