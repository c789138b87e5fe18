"""Stage 3 (driver side) — interleaved rounds of worker processes, and when to stop sampling.

One *round* is one fresh worker process in one env timing every case once. Rounds alternate
between envs (A B, B A, A B, ... — each env's position alternates so drift hits both alike) until
every wall-time comparison has a verdict (after ``min_rounds`` per env), or ``max_rounds``, or the
time budget is reached. A worker that crashes, hangs past ``case_timeout`` seconds without
finishing a case, or hits an error fails that case only; the driver restarts the worker for the
remaining cases. Failed cases are not retried in later rounds.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import stats
from .config import Case, Sampling
from .envs import WORKER, EnvResult
from .proc import capture, kill_group, spawn, tail_of

METRICS = ("wall_us", "host_us", "device_us", "graph_us")
SPEC_SCHEMA = "matrix-runner/worker-spec/1"


@dataclass
class CaseData:
    """Everything measured for one (env, case) across rounds."""

    env: str
    case: Case
    rounds: dict = field(default_factory=lambda: {m: [] for m in METRICS})
    kernels: list | None = None
    correctness: list = field(default_factory=list)
    status: str = "pending"  # pending | ok | error
    error: str | None = None
    error_kind: str | None = None
    notes: list = field(default_factory=list)
    seconds: float = 0.0
    inner: dict = field(default_factory=dict)
    clock_seconds: dict = field(default_factory=dict)


class GpuMonitor:
    """Samples the GPU's SM clock and throttle reasons once a second during a round (NVML via
    nvidia-ml-py when importable, else nvidia-smi). Idle (0x1) is not counted as throttling."""

    IGNORED = 0x1  # GPU idle

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._stop = threading.Event()
        self.samples: list[tuple[float, int]] = []
        self._nvml = None
        if enabled:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
            except Exception:  # noqa: BLE001
                self._nvml = None

    def _read(self) -> tuple[float, int] | None:
        if self._nvml:
            nv, h = self._nvml
            try:
                return (float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                        int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)))
            except Exception:  # noqa: BLE001
                return None
        try:
            cp = capture(["nvidia-smi", "--query-gpu=clocks.sm,clocks_throttle_reasons.active",
                          "--format=csv,noheader,nounits", "-i", "0"], timeout=10)
            clk, reasons = cp.stdout.strip().splitlines()[0].split(",")
            return float(clk), int(reasons.strip(), 16)
        except Exception:  # noqa: BLE001
            return None

    def __enter__(self):
        self.samples = []
        self._stop.clear()
        if self.enabled:
            self._t = threading.Thread(target=self._loop, daemon=True)
            self._t.start()
        return self

    def _loop(self):
        while not self._stop.wait(1.0):
            r = self._read()
            if r:
                self.samples.append(r)

    def __exit__(self, *exc):
        if self.enabled:
            self._stop.set()
            self._t.join(timeout=15)

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        clocks = [c for c, _ in self.samples]
        mask = 0
        for _, r in self.samples:
            mask |= r
        return {"sm_clock_mhz_min": min(clocks), "sm_clock_mhz_max": max(clocks),
                "throttle_mask": hex(mask & ~self.IGNORED), "throttled": bool(mask & ~self.IGNORED & ~0x4),
                "n": len(self.samples)}


class Interrupted(Exception):
    pass


def run_worker_round(env: EnvResult, cases: list[Case], data: dict, *, device: str, quick: bool,
                     seed: int, work: Path, tag: str, case_timeout: float, stop: threading.Event,
                     on_case: Callable[[str, str], None] = lambda cid, status: None) -> dict:
    """Run one round of ``cases`` in ``env`` (restarting the worker after a crash or hang), folding
    the results into ``data[(env.label, case.id)]``. Returns the round record."""
    t0 = time.monotonic()
    todo = [c for c in cases if data[(env.label, c.id)].status != "error"]
    rec: dict = {"env": env.label, "tag": tag, "status": "ok", "error": None, "restarts": 0}
    attempt = 0
    while todo:
        if stop.is_set():
            raise Interrupted()
        spec = {"schema": SPEC_SCHEMA, "device": device, "quick": quick, "seed": seed,
                "cases": [c.to_dict() for c in todo], "correctness": True}
        spec_path = work / f"{tag}-{attempt}.spec.json"
        out_path = work / f"{tag}-{attempt}.jsonl"
        log = work / f"{tag}-{attempt}.log"
        spec_path.write_text(json.dumps(spec))
        out_path.unlink(missing_ok=True)
        p = spawn([env.python, str(WORKER), "run", "--spec", str(spec_path), "--out", str(out_path)],
                  env_extra={"PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}, log=log)
        done_ids, current, started, pos, fatal, phase = set(), None, time.monotonic(), 0, None, "timing"
        try:
            while True:
                if stop.is_set():
                    kill_group(p)
                    raise Interrupted()
                rc = p.poll()
                pos, lines = _read_new(out_path, pos)
                for line in lines:
                    t = line.get("type")
                    if t == "start":
                        current, started = line["case"], time.monotonic()
                        phase = line.get("phase", "timing")
                        if phase == "timing":
                            on_case(line["case"], "start")
                    elif t == "result":
                        _fold(data[(env.label, line["case"])], line)
                        done_ids.add(line["case"])
                        current = None
                        on_case(line["case"], line["status"])
                    elif t == "device":
                        _fold_device(data[(env.label, line["case"])], line)
                        current = None
                    elif t == "fatal":
                        fatal = line["error"]
                if rc is not None and not lines:
                    break
                if current and time.monotonic() - started > case_timeout:
                    kill_group(p)
                    cd = data[(env.label, current)]
                    cd.status, cd.error_kind = "error", "timeout"
                    cd.error = f"the case ran longer than --case-timeout {case_timeout:g} s; the worker was stopped"
                    done_ids.add(current)
                    on_case(current, "error")
                    current = None
                    rec["restarts"] += 1
                    break
                time.sleep(0.05)
        finally:
            if p.poll() is None:
                kill_group(p)
        if fatal:
            rec.update(status="failed", error=fatal)
            for c in todo:
                cd = data[(env.label, c.id)]
                if c.id not in done_ids:
                    cd.status, cd.error, cd.error_kind = "error", fatal, "env"
            break
        if current and phase == "device":  # died in the profiler pass: wall/host stay, device is lost
            cd = data[(env.label, current)]
            cd.notes.append(f"device_us: the worker {_exit_reason(p.returncode)} during the profiler pass")
            rec["restarts"] += 1
            todo = []
            break
        if current:  # the worker died inside a case: that case fails, the rest go on
            cd = data[(env.label, current)]
            how = _exit_reason(p.returncode)
            cd.status, cd.error_kind = "error", "crash"
            cd.error = f"the worker {how} during this case; log tail: {tail_of(log, 6)}"
            done_ids.add(current)
            rec["restarts"] += 1
        elif p.returncode not in (0, None) and not done_ids:
            rec.update(status="failed", error=f"worker {_exit_reason(p.returncode)} before any case: {tail_of(log, 8)}")
            for c in todo:
                cd = data[(env.label, c.id)]
                cd.status, cd.error, cd.error_kind = "error", rec["error"], "env"
            break
        todo = [c for c in todo if c.id not in done_ids]
        attempt += 1
        if attempt > len(cases) + 2:
            break
    rec["seconds"] = round(time.monotonic() - t0, 2)
    return rec


def _exit_reason(rc: int | None) -> str:
    if rc is None:
        return "was stopped"
    if rc < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"was killed by signal {-rc}"
    return f"exited with code {rc}"


def _read_new(path: Path, pos: int) -> tuple[int, list[dict]]:
    if not path.exists():
        return pos, []
    with open(path, encoding="utf-8") as f:
        f.seek(pos)
        chunk = f.read()
    # only complete lines; a partial last line is read next time
    end = chunk.rfind("\n")
    if end < 0:
        return pos, []
    out = []
    for line in chunk[:end].splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return pos + len(chunk[:end + 1].encode("utf-8")), out


def _fold(cd: CaseData, line: dict) -> None:
    cd.seconds += float(line.get("seconds") or 0)
    _add_clock_seconds(cd, line)
    for n in line.get("notes") or []:
        if n not in cd.notes:
            cd.notes.append(n)
    if line["status"] != "ok":
        cd.status, cd.error, cd.error_kind = "error", line.get("error"), line.get("error_kind")
        if line.get("traceback"):
            cd.notes.append(line["traceback"][-1200:])
        return
    cd.status = "ok"
    for m, v in (line.get("metrics") or {}).items():
        if m in cd.rounds and v.get("samples"):
            cd.rounds[m].append(v["samples"])
            cd.inner[m] = v.get("inner")
    if line.get("kernels"):
        cd.kernels = line["kernels"]
    if line.get("correctness"):
        cd.correctness.append(line["correctness"])


def _fold_device(cd: CaseData, line: dict) -> None:
    cd.seconds += float((line.get("clock_seconds") or {}).get("device") or 0)
    _add_clock_seconds(cd, line)
    for n in line.get("notes") or []:
        if n not in cd.notes:
            cd.notes.append(n)
    v = (line.get("metrics") or {}).get("device_us")
    if v and v.get("samples"):
        cd.rounds["device_us"].append(v["samples"])
    if line.get("kernels"):
        cd.kernels = line["kernels"]


def _add_clock_seconds(cd: CaseData, line: dict) -> None:
    for k, v in (line.get("clock_seconds") or {}).items():
        cd.clock_seconds[k] = round(cd.clock_seconds.get(k, 0.0) + float(v), 3)


def decided(data: dict, baseline: str, envs: list[str], cases: list[Case], min_effect: float) -> tuple[int, int]:
    """(undecided, total) wall-time comparisons: undecided = ambiguous verdicts."""
    und = tot = 0
    for cand in envs:
        if cand == baseline:
            continue
        for c in cases:
            b, k = data[(baseline, c.id)], data[(cand, c.id)]
            if b.status != "ok" or k.status != "ok":
                continue
            cmp = stats.compare(b.rounds["wall_us"], k.rounds["wall_us"], min_effect, n_boot=400)
            if cmp is None:
                continue
            tot += 1
            und += cmp["verdict"] == "ambiguous"
    return und, tot


def run_all(envs: list[EnvResult], cases: list[Case], sampling: Sampling, *, device: str, quick: bool,
            work: Path, case_timeout: float, stop: threading.Event, data: dict, rounds: list,
            on_round: Callable[[dict], None] = lambda r: None,
            on_case: Callable[[str, str, str], None] = lambda env, cid, status: None) -> str:
    """Interleave rounds over the ok ``envs`` and return why sampling stopped.

    ``data`` (filled here) maps ``(env_label, case_id)`` to :class:`CaseData`; ``rounds`` receives
    one record per worker process. Both are up to date whenever ``on_round`` is called, so the
    caller can write partial results."""
    work.mkdir(parents=True, exist_ok=True)
    labels = [e.label for e in envs]
    data.update({(e.label, c.id): CaseData(e.label, c) for e in envs for c in cases})
    min_r, max_r = (1, 1) if quick else (sampling.min_rounds, sampling.max_rounds)
    t0 = time.monotonic()
    monitor = GpuMonitor(device == "cuda")
    reason = "max_rounds"
    r = 0
    try:
        while r < max_r:
            order = envs[r % len(envs):] + envs[:r % len(envs)]
            for e in order:
                with monitor:
                    rec = run_worker_round(e, cases, data, device=device, quick=quick, seed=1000 * r + labels.index(e.label),
                                           work=work, tag=f"r{r}-{e.label}", case_timeout=case_timeout, stop=stop,
                                           on_case=lambda cid, st, _e=e.label: on_case(_e, cid, st))
                rec["round"] = r
                rec["gpu"] = monitor.summary()
                rounds.append(rec)
                on_round(rec)
            r += 1
            if r >= min_r:
                und, tot = decided(data, labels[0], labels, cases, sampling.min_effect)
                if tot and not und:
                    reason = "all verdicts decided"
                    break
                if len(labels) < 2 and r >= min_r:
                    reason = "single env: min_rounds reached"
                    break
            if time.monotonic() - t0 > sampling.time_budget_s and r >= min_r:
                reason = f"time budget {sampling.time_budget_s:g} s reached"
                break
        else:
            reason = "quick: one round per env" if quick else f"max_rounds {max_r} reached"
    except (Interrupted, KeyboardInterrupt):
        stop.set()
        reason = "interrupted"
    return reason


def stop_on_signals(stop: threading.Event) -> None:
    """Make SIGTERM set ``stop`` (SIGINT raises KeyboardInterrupt, which the CLI turns into stop)."""
    import signal

    def handler(signum, frame):
        stop.set()

    try:
        signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        pass


