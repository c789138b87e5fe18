"""Stage 3 (driver side) — interleaved rounds of worker processes, and when to stop sampling.

One *round* is one fresh worker process in one env timing every case once. Rounds alternate
between envs (A B, B A, A B, ... — each env's position alternates so drift hits both alike) until
every wall-time comparison has a verdict (after ``min_rounds`` per env), or ``max_rounds``, or the
time budget is reached. A worker that crashes, hangs past ``case_timeout`` seconds without
finishing a case, or hits an error fails that case only; the driver restarts the worker for the
remaining cases. Failed cases are not retried in later rounds.

Resuming: ``data`` may come pre-filled from an earlier run's results.json
(:func:`data_from_results`; the case id is the key). A case has taken part in as many rounds as it
has per-round sample lists, so :func:`run_all` starts at the first round some case misses and, in
each round, runs only the cases that miss it.

Interruption: :func:`install_signal_handlers` makes SIGINT and SIGTERM set ``stop`` and stop every
running command (``proc.terminate_all``); the round in progress ends with :class:`Interrupted`,
keeping the cases it finished.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import envs as envmod
from . import proc, stats
from .config import Case, Sampling
from .envs import WORKER, EnvResult
from .proc import capture, kill_group, spawn, tail_of

METRICS = ("wall_us", "host_us", "device_us", "graph_us")
SPEC_SCHEMA = "matrix-runner/worker-spec/1"
#: Seconds a worker may show no progress outside a case (importing torch and flash_attn at start-up,
#: between cases) before it is stopped; at least ``case_timeout``.
START_TIMEOUT_S = 180.0


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
    """The run was stopped (SIGINT/SIGTERM): measured cases are kept, nothing more is started."""


def run_worker_round(env: EnvResult, cases: list[Case], data: dict, *, device: str, quick: bool,
                     seed: int, work: Path, tag: str, case_timeout: float, stop: threading.Event,
                     on_case: Callable[[str, str], None] = lambda cid, status: None,
                     start_timeout: float | None = None, device_pass: bool = True) -> dict:
    """Run one round of ``cases`` in ``env`` (restarting the worker after a crash or hang), folding
    the results into ``data[(env.label, case.id)]``. Returns the round record.

    Per case: a worker killed by a signal (segfault, abort, the OOM killer's SIGKILL) or exiting
    inside a case fails that case (``crash``); a case running longer than ``case_timeout`` s is
    stopped and failed (``timeout``); the worker is restarted for the cases after it. A worker that
    dies, reports a fatal error or shows no progress for ``start_timeout`` s (default
    max(case_timeout, START_TIMEOUT_S)) before finishing any case fails the round and its cases
    (``env``). Raises :class:`Interrupted` when ``stop`` is set (the worker is stopped first).
    ``device_pass`` False skips the worker's profiler pass (see :func:`device_pass_needed`)."""
    t0 = time.monotonic()
    if start_timeout is None:
        start_timeout = max(case_timeout, START_TIMEOUT_S)
    todo = [c for c in cases if data[(env.label, c.id)].status != "error"]
    rec: dict = {"env": env.label, "tag": tag, "status": "ok", "error": None, "restarts": 0}
    attempt = 0
    while todo:
        if stop.is_set():
            raise Interrupted()
        spec = {"schema": SPEC_SCHEMA, "device": device, "quick": quick, "seed": seed,
                "cases": [c.to_dict() for c in todo], "correctness": True, "device_pass": device_pass}
        spec_path = work / f"{tag}-{attempt}.spec.json"
        out_path = work / f"{tag}-{attempt}.jsonl"
        log = work / f"{tag}-{attempt}.log"
        spec_path.write_text(json.dumps(spec))
        out_path.unlink(missing_ok=True)
        try:
            p = spawn([env.python, str(WORKER), "run", "--spec", str(spec_path), "--out", str(out_path)],
                      env_extra={"PYTHONUNBUFFERED": "1", "PYTHONNOUSERSITE": "1"}, log=log)
        except proc.Stopped:
            raise Interrupted() from None
        done_ids, current, pos, fatal, phase = set(), None, 0, None, "timing"
        started = last = time.monotonic()
        timed_out = None  # "case": the current case ran too long; "idle": no progress outside a case
        try:
            while True:
                if stop.is_set():
                    raise Interrupted()  # the finally below stops the worker
                rc = p.poll()
                pos, lines = _read_new(out_path, pos)
                if lines:
                    last = time.monotonic()
                for line in lines:
                    t = line.get("type") if isinstance(line, dict) else None
                    cd = data.get((env.label, line.get("case"))) if t in ("start", "result", "device") else None
                    if t in ("start", "result", "device") and cd is None:
                        continue  # a case this round did not ask for: ignored
                    if t == "start":
                        current, started = line["case"], time.monotonic()
                        phase = line.get("phase", "timing")
                        if phase == "timing":
                            on_case(line["case"], "start")
                    elif t == "result":
                        try:
                            _fold(cd, line)
                        except (KeyError, TypeError, ValueError, AttributeError) as ex:
                            cd.status, cd.error_kind = "error", "protocol"
                            cd.error = f"the worker's result record could not be read ({type(ex).__name__}: {ex})"
                        done_ids.add(line["case"])
                        current = None
                        on_case(line["case"], cd.status)
                    elif t == "device":
                        try:
                            _fold_device(cd, line)
                        except (KeyError, TypeError, ValueError, AttributeError) as ex:
                            cd.notes.append(f"device_us: the worker's record could not be read ({type(ex).__name__}: {ex})")
                        current = None
                    elif t == "fatal":
                        fatal = fatal or str(line.get("error") or "the worker reported a fatal error")
                    elif t == "hello" and not env.import_checked:
                        fatal = _import_check(env, line)
                if rc is not None and not lines:
                    break
                now = time.monotonic()
                if current and now - started > case_timeout:
                    timed_out = "case"
                    break
                if not current and now - last > start_timeout:
                    timed_out = "idle"
                    break
                time.sleep(0.05)
        finally:
            if p.poll() is None:
                kill_group(p)
        if stop.is_set():  # killed by the interrupt, not by a fault of its own: nothing is failed
            raise Interrupted()
        if timed_out == "case":
            rec["restarts"] += 1
            cd = data[(env.label, current)]
            if phase == "device":  # wall/host of every case are in; only this device clock is lost
                cd.notes.append(f"device_us: the profiler pass ran longer than --case-timeout {case_timeout:g} s; "
                                "the worker was stopped")
                break
            cd.status, cd.error_kind = "error", "timeout"
            cd.error = f"the case ran longer than --case-timeout {case_timeout:g} s; the worker was stopped"
            done_ids.add(current)
            on_case(current, "error")
        elif timed_out == "idle" and not done_ids:
            rec.update(status="failed", error=f"the worker showed no progress for {start_timeout:g} s before its "
                                              f"first case (hung at start-up?) and was stopped: {tail_of(log, 8)}")
            for c in todo:
                cd = data[(env.label, c.id)]
                cd.status, cd.error, cd.error_kind = "error", rec["error"], "env"
            break
        elif timed_out == "idle":  # hung between cases: restart for the rest
            rec["restarts"] += 1
        elif fatal:
            rec.update(status="failed", error=fatal)
            for c in todo:
                cd = data[(env.label, c.id)]
                if c.id not in done_ids:
                    cd.status, cd.error, cd.error_kind = "error", fatal, "env"
            break
        elif current and phase == "device":  # died in the profiler pass: wall/host stay, device is lost
            cd = data[(env.label, current)]
            cd.notes.append(f"device_us: the worker {_exit_reason(p.returncode)} during the profiler pass")
            rec["restarts"] += 1
            break
        elif current:  # the worker died inside a case: that case fails, the rest go on
            cd = data[(env.label, current)]
            how = _exit_reason(p.returncode)
            cd.status, cd.error_kind = "error", "crash"
            cd.error = f"the worker {how} during this case; log tail: {tail_of(log, 6)}"
            done_ids.add(current)
            on_case(current, "error")
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
            rec.update(status="failed", error=f"gave up after {attempt} worker restarts; "
                                              f"{len(todo)} case(s) not timed this round")
            break
    rec["seconds"] = round(time.monotonic() - t0, 2)
    return rec


def _import_check(env: EnvResult, hello: dict) -> str | None:
    """The full preflight of an env whose import was not checked yet (envs module doc), on its first
    worker's ``hello`` probe. On success the env's probe becomes the worker's (torch, GPU) and the
    record is updated; on failure the env is marked failed and the error returned (the round stops
    before timing anything)."""
    p = hello.get("probe") if isinstance(hello.get("probe"), dict) else {"error": "the worker's hello has no probe"}
    err = envmod.check_probe(p, env.env_dir, env.version)
    if err:
        err = f"preflight (first worker in the env): {err}"
        env.status, env.error = "failed", err
    else:
        env.probe, env.import_checked = {**p, "import_checked": True}, True
    try:
        envmod.record_import_check(env.env_dir, p, err)
    except OSError:
        pass
    return err


def _exit_reason(rc: int | None) -> str:
    if rc is None:
        return "was stopped"
    if rc < 0:
        import signal

        try:
            name = signal.Signals(-rc).name
        except ValueError:
            return f"was killed by signal {-rc}"
        if name == "SIGKILL":
            return "was killed by SIGKILL (out of memory? the kernel's OOM killer sends SIGKILL)"
        return f"was killed by {name}"
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
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return pos + len(chunk[:end + 1].encode("utf-8")), out


def _fold(cd: CaseData, line: dict) -> None:
    """Fold one ``result`` record into ``cd``. The record is read completely before ``cd`` changes,
    so a malformed one (raising KeyError/TypeError/ValueError) leaves ``cd`` as it was."""
    status = line["status"]
    seconds = float(line.get("seconds") or 0)
    notes = [str(n) for n in line.get("notes") or []]
    clock = {k: float(v) for k, v in (line.get("clock_seconds") or {}).items()}
    add = {}
    if status == "ok":
        for m, v in (line.get("metrics") or {}).items():
            if m in cd.rounds and v.get("samples"):
                add[m] = ([float(x) for x in v["samples"]], v.get("inner"))
        for name, v in (line.get("correctness") or {}).items():
            if name != "skipped":  # what results._worst_correctness reads
                float(v["max_abs_err"]), float(v["rel_err"]), bool(v["finite"])
    cd.seconds += seconds
    _add_clock_seconds(cd, {"clock_seconds": clock})
    for n in notes:
        if n not in cd.notes:
            cd.notes.append(n)
    if status != "ok":
        cd.status, cd.error, cd.error_kind = "error", line.get("error"), line.get("error_kind")
        if line.get("traceback"):
            cd.notes.append(str(line["traceback"])[-1200:])
        return
    cd.status = "ok"
    for m, (samples, inner) in add.items():
        cd.rounds[m].append(samples)
        cd.inner[m] = inner
    if line.get("kernels"):
        cd.kernels = line["kernels"]
    if line.get("correctness"):
        cd.correctness.append(line["correctness"])


def _fold_device(cd: CaseData, line: dict) -> None:
    """Fold one ``device`` record into ``cd`` (read completely first, like :func:`_fold`)."""
    clock = {k: float(v) for k, v in (line.get("clock_seconds") or {}).items()}
    notes = [str(n) for n in line.get("notes") or []]
    v = (line.get("metrics") or {}).get("device_us")
    samples = [float(x) for x in v["samples"]] if v and v.get("samples") else None
    cd.seconds += clock.get("device", 0.0)
    _add_clock_seconds(cd, {"clock_seconds": clock})
    for n in notes:
        if n not in cd.notes:
            cd.notes.append(n)
    if samples:
        cd.rounds["device_us"].append(samples)
    if line.get("kernels"):
        cd.kernels = line["kernels"]


def _add_clock_seconds(cd: CaseData, line: dict) -> None:
    for k, v in (line.get("clock_seconds") or {}).items():
        cd.clock_seconds[k] = round(cd.clock_seconds.get(k, 0.0) + float(v), 3)


def decided(data: dict, baseline: str, envs: list[str], cases: list[Case], min_effect: float,
            metric: str = "wall_us") -> tuple[int, int]:
    """(undecided, total) comparisons of ``metric``: undecided = ambiguous at the stop level
    (:data:`stats.STOP_LEVEL`, stricter than the reported 95 %: the runner tests after every round)."""
    und = tot = 0
    for cand in envs:
        if cand == baseline:
            continue
        for c in cases:
            b, k = data[(baseline, c.id)], data[(cand, c.id)]
            if b.status != "ok" or k.status != "ok":
                continue
            cmp = stats.compare(b.rounds[metric], k.rounds[metric], min_effect, n_boot=400, level=stats.STOP_LEVEL)
            if cmp is None:
                continue
            tot += 1
            und += cmp["verdict"] == "ambiguous"
    return und, tot


def device_pass_needed(data: dict, labels: list[str], cases: list[Case], r: int, min_rounds: int,
                       min_effect: float) -> bool:
    """Whether round ``r``'s workers run the profiler pass (device_us). Kernel time barely varies
    between processes (on the H200, the same to 0.1 µs in 12 of 12 cases across processes), and the
    pass cost ~1.1 s of a ~8 s worker process there, so it runs in the first ``min_rounds`` rounds
    and afterwards only while some device comparison is still ambiguous or some ok case has no
    device sample yet; the time saved goes to more processes for the wall clock."""
    if r < min_rounds:
        return True
    live = [data[(lab, c.id)] for lab in labels for c in cases if data[(lab, c.id)].status == "ok"]
    if any(not cd.rounds["device_us"] for cd in live):
        return True
    return len(labels) > 1 and decided(data, labels[0], labels, cases, min_effect, metric="device_us")[0] > 0


def rounds_done(cd: CaseData) -> int:
    """Rounds a case has taken part in: one wall-time sample list per round."""
    return len(cd.rounds["wall_us"])


def run_all(envs: list[EnvResult], cases: list[Case], sampling: Sampling, *, device: str, quick: bool,
            work: Path, case_timeout: float, stop: threading.Event, data: dict, rounds: list,
            on_round: Callable[[dict], None] = lambda r: None,
            on_case: Callable[[str, str, str], None] = lambda env, cid, status: None,
            elapsed_s: float = 0.0) -> str:
    """Interleave rounds over the ok ``envs`` and return why sampling stopped.

    ``data`` (filled here) maps ``(env_label, case_id)`` to :class:`CaseData`; ``rounds`` receives
    one record per worker process. Both are up to date whenever ``on_round`` is called, so the
    caller can write partial results. To resume, pass ``data`` and ``rounds`` of the earlier run
    and its timing seconds as ``elapsed_s``: only the rounds and cases still missing are run."""
    if not envs:
        return "no env could be timed"
    work.mkdir(parents=True, exist_ok=True)
    labels = [e.label for e in envs]
    for e in envs:
        for c in cases:
            data.setdefault((e.label, c.id), CaseData(e.label, c))
    min_r, max_r = (1, 1) if quick else (sampling.min_rounds, sampling.max_rounds)
    t0 = time.monotonic() - elapsed_s
    monitor = GpuMonitor(device == "cuda")
    live = [rounds_done(data[(e.label, c.id)]) for e in envs for c in cases
            if data[(e.label, c.id)].status != "error"]
    r = min(live) if live else 0  # 0 on a fresh run; on a resume, the first round some case misses

    def why_stop(r: int) -> str | None:
        if not labels:
            return "no env could be timed (every env failed its import check)"
        if r >= min_r:
            und, tot = decided(data, labels[0], labels, cases, sampling.min_effect)
            if tot and not und:
                return f"all verdicts decided (at the {stats.STOP_LEVEL:.1%} stop level)"
            if len(labels) < 2:
                return "single env: min_rounds reached"
            # stop when another round would overrun the budget (rounds take about the same time)
            elapsed = time.monotonic() - t0
            if elapsed + elapsed / r > sampling.time_budget_s:
                why = f"time budget {sampling.time_budget_s:g} s: another round would overrun it"
                if elapsed > sampling.time_budget_s:
                    why += f" (min_rounds {min_r} came first and took {elapsed:.0f} s)"
                return why
        if r >= max_r:
            return "quick: one round per env" if quick else f"max_rounds {max_r} reached"
        return None

    try:
        while not (reason := why_stop(r)):
            order = envs[r % len(envs):] + envs[:r % len(envs)]
            # decided once per round, so both processes of a round agree (paired device rounds)
            dev_pass = device == "cuda" and device_pass_needed(data, labels, cases, r, min_r, sampling.min_effect)
            for e in order:
                todo = [c for c in cases if data[(e.label, c.id)].status != "error"
                        and rounds_done(data[(e.label, c.id)]) <= r]
                if not todo:
                    continue
                t_round = time.monotonic()
                try:
                    with monitor:
                        rec = run_worker_round(e, todo, data, device=device, quick=quick,
                                               seed=1000 * r + labels.index(e.label), work=work,
                                               tag=f"r{r}-{e.label}", case_timeout=case_timeout, stop=stop,
                                               on_case=lambda cid, st, _e=e.label: on_case(_e, cid, st),
                                               device_pass=dev_pass)
                except (Interrupted, KeyboardInterrupt):
                    rounds.append({"env": e.label, "tag": f"r{r}-{e.label}", "status": "interrupted",
                                   "error": "stopped by a signal; the cases this worker finished are kept",
                                   "restarts": 0, "round": r, "gpu": None,
                                   "seconds": round(time.monotonic() - t_round, 2)})
                    raise
                rec["round"] = r
                rec["device_pass"] = dev_pass
                rec["gpu"] = monitor.summary()
                rounds.append(rec)
                if e.status == "failed":  # its import check failed: nothing of it was timed
                    for c in cases:
                        data.pop((e.label, c.id), None)
                    envs = [x for x in envs if x is not e]
                    labels = [x.label for x in envs]
                on_round(rec)
            r += 1
    except (Interrupted, KeyboardInterrupt):
        stop.set()
        reason = "interrupted"
    except Exception as e:  # noqa: BLE001 - a driver bug or a full disk must not lose what was measured
        import traceback

        log = work / "driver-error.txt"
        try:
            log.write_text(traceback.format_exc())
        except OSError:
            pass
        reason = f"driver error ({type(e).__name__}: {e}; traceback in {log})"
    return reason


def case_data_from_record(rec: dict, case: Case) -> CaseData:
    """A :class:`CaseData` rebuilt from one entry of results.json's ``cases`` (for --resume): the
    per-round samples of every metric, status, error, notes, kernels and the worst correctness."""
    cd = CaseData(rec["env"], case)
    metrics = rec.get("metrics") or {}
    for m in METRICS:
        samples = (metrics.get(m) or {}).get("samples") or []
        cd.rounds[m] = [[float(x) for x in r] for r in samples if r]
    corr = rec.get("correctness") or {}
    if corr.get("tensors"):
        cd.correctness = [corr["tensors"]]
    elif corr.get("skipped"):
        cd.correctness = [{"skipped": corr["skipped"]}]
    cd.status = rec.get("status") if rec.get("status") in ("ok", "error") else "pending"
    cd.error, cd.error_kind = rec.get("error"), rec.get("error_kind")
    cd.kernels = rec.get("kernels")
    cd.notes = list(rec.get("notes") or [])
    cd.seconds = float(rec.get("seconds") or 0.0)
    cd.inner = dict(rec.get("inner") or {})
    cd.clock_seconds = dict(rec.get("clock_seconds") or {})
    return cd


def data_from_results(doc: dict, cases: list[Case]) -> dict:
    """``{(env, case id): CaseData}`` from a results.json document, for the cases of ``cases``
    (matched by case id; records of other cases are left out)."""
    by_id = {c.id: c for c in cases}
    out = {}
    for rec in doc.get("cases") or []:
        c = by_id.get(rec.get("id"))
        if c is not None and rec.get("env"):
            out[(rec["env"], c.id)] = case_data_from_record(rec, c)
    return out


def install_signal_handlers(stop: threading.Event) -> Callable[[], None]:
    """SIGINT (Ctrl-C) and SIGTERM stop the run cleanly: the first sets ``stop`` and SIGTERMs every
    running worker, build and install (``proc.terminate_all``; no new command starts), so the
    caller can write what was measured; a second one SIGKILLs them. Returns a function that
    restores the previous handlers. Does nothing outside the main thread."""
    import signal

    count = [0]

    def handler(signum, frame):
        count[0] += 1
        stop.set()
        if count[0] == 1:
            proc.terminate_all()
        else:
            proc.kill_all(grace=0.0)

    prev = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            prev[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass

    def restore() -> None:
        for sig, h in prev.items():
            signal.signal(sig, h)

    return restore


def stop_on_signals(stop: threading.Event) -> None:
    """Older name of :func:`install_signal_handlers` (handlers stay installed)."""
    install_signal_handlers(stop)
