"""Fault injection: crashing, hanging and failing workers, broken wheels, failing builds,
interruption (SIGINT/SIGTERM) and --resume. Every fault stays local: the other envs and cases are
measured (their sets are in results.json), the exit code says what happened, and the error text
names what failed.

Two layers:

- fake workers (small Python scripts, no torch, speaking the lockstep ``worker.py serve`` protocol:
  one JSON command per line on stdin, one JSON reply per command on stdout, an unasked ``hello``
  first) drive runner.run_all through every failure path (SIGABRT, SIGKILL as sent by the OOM
  killer, SIGSEGV, a non-zero exit, a hang, a half-written reply; in a burst or at set-up; once or
  every time; a ``fatal`` or an exit or a hang before the worker is ready; an error reply; junk
  and malformed replies; an interrupt in each phase of a set; a driver bug; a resume) in about a
  second each;
- real CPU runs of the CLI with stand-in flash_attn packages (conftest.standins) with planted
  faults: abort, a hang, a raised error and an out-of-memory error in one env's cases; a truncated
  wheel, an sdist whose setup.py fails and a package whose import fails in three more envs; SIGINT
  during timing then --resume; SIGTERM during a source build.
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import pytest
from conftest import load_results, run_cli

import standin
from matrix_runner import lockstep, machine, proc, results, runner
from matrix_runner.config import Case, Sampling
from matrix_runner.envs import EnvResult

# ---------------------------------------------------------------------------------------------
# fake workers
#: A fake env's "python": run as ``PYTHON worker.py serve``, it ignores its arguments and serves
#: the protocol. It leaves ``pid-LABEL-PID`` in STATE, and logs every command it gets to
#: ``cmds-LABEL`` with the set it belongs to (``_set``, from the set's seed in ``config``).
#: {start} runs before the command loop (default: the hello); {fault} runs for each command
#: before the normal reply (``cmd``; ``batch(cmd)`` is its case's batch size).
FAKE = '''#!{python}
import json, os, random, signal, sys, time
STATE, LABEL = {state!r}, {label!r}
open(os.path.join(STATE, "pid-%s-%d" % (LABEL, os.getpid())), "w").close()
def send(**rec):
    sys.stdout.write(json.dumps(rec) + "\\n")
    sys.stdout.flush()
def once(name):  # True for the first worker of the test that gets here: a transient fault
    try:
        os.close(os.open(os.path.join(STATE, "once-" + name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False
specs, sid = {{}}, None
offset = random.uniform(0.9, 1.1)  # a process's own speed: keeps the comparisons undecided
def batch(cmd):
    return (cmd.get("spec") or specs.get(cmd.get("case")) or {{}}).get("batch")
def answer(cmd):
    op = cmd["cmd"]
    if op == "setup":
        specs[cmd["case"]] = cmd["spec"]
        return dict(status="ok", per_call_us=10.0, input_sets=1, seconds=0.01)
    if op == "burst":
        time.sleep(0.002)
        return dict(status="ok", us=(10.0 + batch(cmd)) * offset * random.uniform(0.99, 1.01), n=8, inner=1)
    if op == "finish":
        return dict(status="ok", notes=[],
                    correctness={{"out": {{"max_abs_err": 0.001, "rel_err": 0.002, "finite": True}}}})
    if op == "pin":
        return dict(status="ok", threads=1, cpus=[cmd["cpu"]])
    return dict(status="ok")
{start}
for line in sys.stdin:
    cmd = json.loads(line)
    if cmd["cmd"] == "config":
        sid = cmd["seed"] // 1000
    with open(os.path.join(STATE, "cmds-" + LABEL), "a") as f:
        f.write(json.dumps(dict(cmd, _set=sid, _pid=os.getpid())) + "\\n")
    if cmd["cmd"] == "quit":
        send(type="bye")
        break
{fault}
    send(type=cmd["cmd"], case=cmd.get("case"), **answer(cmd))
'''
HELLO = 'send(type="hello", schema="matrix-runner/lockstep/1", pid=os.getpid(), probe={})'


def fake_env(tmp_path: Path, label: str, fault: str = "", start: str = HELLO, checked: bool = True) -> EnvResult:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    script = tmp_path / f"{label}-python"
    script.write_text(FAKE.format(python=sys.executable, state=str(state), label=label, start=textwrap.dedent(start),
                                  fault=textwrap.indent(textwrap.dedent(fault).strip("\n"), "    ")))
    script.chmod(0o755)
    return EnvResult(label, "0.0", str(tmp_path / label), python=str(script), status="ok", import_checked=checked)


def cases(*batches: int) -> list[Case]:
    return [Case(op="fwd", batch=b, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16) for b in batches]


def run(envs: list[EnvResult], cs: list[Case], tmp_path: Path, *, max_sets: int = 3, work: str = "work",
        data: dict | None = None, sets: list | None = None, stop: threading.Event | None = None, **kw):
    """runner.run_all on fake workers: 0.2 s of cycles per set, 1 s case timeout, unpinned unless
    ``cpus`` is given. Returns (reason, data, sets)."""
    data = {} if data is None else data
    sets = [] if sets is None else sets
    kw.setdefault("case_timeout", 1.0)
    reason = runner.run_all(envs, cs, Sampling(set_seconds=0.2, time_budget_s=120, max_sets=max_sets, burst_ms=1.0),
                            device="cpu", quick=False, work=tmp_path / work, stop=stop or threading.Event(),
                            data=data, sets=sets, **kw)
    return reason, data, sets


def pids(tmp_path: Path, label: str = "") -> list[int]:
    """Pids of the fake workers started (of env ``label``, or all)."""
    return [int(f.name.rsplit("-", 1)[1]) for f in (tmp_path / "state").glob(f"pid-{label}*")]


def cmds(tmp_path: Path, label: str) -> list[dict]:
    """Every command env ``label``'s workers got, in order."""
    f = tmp_path / "state" / f"cmds-{label}"
    return [json.loads(x) for x in f.read_text().splitlines()] if f.exists() else []


def sent(tmp_path: Path, label: str, op: str, case: Case) -> list[int]:
    """The sets in which env ``label``'s workers got command ``op`` for ``case`` (one entry each)."""
    return [c["_set"] for c in cmds(tmp_path, label) if c["cmd"] == op and c.get("case") == case.id]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def measured(cd: runner.CaseData) -> list[int]:
    """The sets with wall-time cycles of ``cd``."""
    return sorted(s for s, v in cd.sets["wall_us"].items() if v)


FAULTS = {
    "abort": ("os.abort()", "crash", "killed by SIGABRT"),
    "oom-kill": ("os.kill(os.getpid(), signal.SIGKILL)", "crash", "OOM killer"),
    "segfault": ("os.kill(os.getpid(), signal.SIGSEGV)", "crash", "killed by SIGSEGV"),
    "exit": ("sys.exit(7)", "crash", "exited with code 7"),
    "hang": ("time.sleep(60)", "timeout", "--case-timeout 1 s"),
    "half-reply": ("sys.stdout.write('{\"type\": \"burst\", \"us'); sys.stdout.flush(); os.abort()", "crash", "SIGABRT"),
}
WHAT = {"burst": "burst", "setup": "set-up"}  # how the error text names the step


@pytest.mark.parametrize("phase", ["burst", "setup"])
def test_a_case_failed_in_one_of_three_envs_is_still_compared_between_the_other_two(tmp_path, phase):
    """New-user trial: a stand-in 2.8.3 that raised at batch 2 dropped the batch-2 cases from every
    version's timing ("not timed: it failed in 2.8.3"), 2.7.0.post2 vs 2.6.3 included. The failing
    env's workers skip the case from then on (no set-up, no bursts); the others keep timing it."""
    fault = (f'if cmd["cmd"] == "{phase}" and batch(cmd) == 2:\n'
             f'    send(type="{phase}", case=cmd.get("case"), status="error", error_kind="error", '
             f'error="RuntimeError: no kernel for batch 2")\n'
             f'    continue')
    envs = [fake_env(tmp_path, "a"), fake_env(tmp_path, "b"), fake_env(tmp_path, "bad", fault)]
    cs = cases(1, 2)
    reason, data, sets = run(envs, cs, tmp_path, max_sets=3)
    assert reason == "max_sets 3 reached"
    bad = data[("bad", cs[1].id)]
    assert bad.status == "error" and bad.error_kind == "error" and "no kernel for batch 2" in bad.error
    assert sent(tmp_path, "bad", phase, cs[1]) == [0]  # failed once, for good: never sent again
    assert sent(tmp_path, "bad", "setup", cs[1]) == [0]
    for lab in ("a", "b"):
        cd = data[(lab, cs[1].id)]
        assert cd.status == "ok" and cd.error is None and {1, 2} <= set(measured(cd)), (lab, cd)
        assert data[(lab, cs[0].id)].status == "ok"
    assert data[("bad", cs[0].id)].status == "ok" and 2 in measured(data[("bad", cs[0].id)])
    now = runner.comparisons_now(data, ["a", "b", "bad"], cs, Sampling(), "wall_us")
    assert ("a", "b", cs[1].id) in now and ("a", "bad", cs[1].id) not in now
    assert now[("a", "b", cs[1].id)]["n_sets"] >= 2


@pytest.mark.parametrize("name,phase", [(f, "burst") for f in FAULTS] + [("abort", "setup"), ("hang", "setup")])
def test_a_worker_fault_every_time_fails_that_case_after_one_retry(tmp_path, name, phase):
    code, kind, needle = FAULTS[name]
    envs = [fake_env(tmp_path, "good"), fake_env(tmp_path, "bad", f'if cmd["cmd"] == "{phase}" and batch(cmd) == 2:\n'
                                                                 f'    {code}')]
    cs = cases(1, 2, 3)
    t0 = time.monotonic()
    reason, data, sets = run(envs, cs, tmp_path, max_sets=3)
    assert time.monotonic() - t0 < 30
    assert reason == "max_sets 3 reached"
    bad = data[("bad", cs[1].id)]
    assert bad.status == "error" and bad.error_kind == kind, bad
    assert needle in bad.error and WHAT[phase] in bad.error, bad.error
    # faulted in set 0, retried once in set 1, faulted again: failed for the run, not tried in set 2
    assert bad.faults == 2 and [n.split(":")[0] for n in bad.notes] == ["set 0", "set 1"], bad.notes
    assert sent(tmp_path, "bad", phase, cs[1]) == [0, 1]
    assert sent(tmp_path, "good", "setup", cs[1]) == [0, 1]
    assert measured(bad) == []
    other = data[("good", cs[1].id)]  # the same case in the other env: not timed alone, never blamed
    assert other.status != "error" and other.error is None and other.faults == 0
    # the other cases of both envs: measured, at the latest in the set after the faults
    for env in ("good", "bad"):
        for c in (cs[0], cs[2]):
            cd = data[(env, c.id)]
            assert cd.status == "ok" and cd.faults == 0 and cd.error is None and 2 in measured(cd), (env, c.id, cd)
            assert cd.correctness
    if phase == "setup":  # the worker lost before the cycles: the rest could time one side only, so
        # the set ends there (new-user trial: sets of one env's cycles that no comparison used)
        assert [(s["set"], s["status"], s["cycles"]) for s in sets] == [(0, "failed", 0), (1, "failed", 0), (2, "ok", sets[2]["cycles"])]
        for s in sets[:2]:
            assert s["error"] == "bad: no worker left after set-up: no cycles, nothing to pair; the next set tries again"
        for c in cs:
            assert measured(data[("good", c.id)]) == ([] if c is cs[1] else [2])  # never one side alone
    else:
        assert [(s["set"], s["status"]) for s in sets] == [(0, "ok"), (1, "ok"), (2, "ok")]
    for s in sets[:2]:  # each set names the worker lost and the step
        assert WHAT[phase] in s["workers"]["bad"]["error"]
    assert "error" not in sets[2]["workers"]["bad"] and sets[2]["cycles"] > 0
    assert len(pids(tmp_path, "bad")) == 3  # one worker per set, none restarted inside a set
    assert not any(alive(p) for p in pids(tmp_path))


@pytest.mark.parametrize("name,phase", [("abort", "burst"), ("oom-kill", "burst"), ("hang", "burst"),
                                        ("abort", "setup")])
def test_a_transient_worker_fault_is_retried_in_the_next_set(tmp_path, name, phase):
    code, _, needle = FAULTS[name]
    envs = [fake_env(tmp_path, "good"),
            fake_env(tmp_path, "bad", f'if cmd["cmd"] == "{phase}" and batch(cmd) == 2 and sid == 0 and once("fault"):\n'
                                      f'    {code}')]
    cs = cases(1, 2, 3)
    before = machine.allowed_cpus()
    cpus = lockstep.plan_cpus("auto", n_sets=2)  # pinned where the machine lets us: pin commands, prefetch
    reason, data, sets = run(envs, cs, tmp_path, max_sets=3, cpus=cpus)
    assert machine.allowed_cpus() == before  # the driver's own pinning is undone
    assert reason == "max_sets 3 reached"
    bad = data[("bad", cs[1].id)]
    assert bad.status == "ok" and bad.error is None and bad.error_kind is None and bad.faults == 1, bad
    assert bad.notes[0].startswith("set 0: ") and needle in bad.notes[0] and WHAT[phase] in bad.notes[0], bad.notes
    assert "set 1: timed again after the earlier fault" in bad.notes
    assert measured(bad) == [1, 2] and bad.correctness
    for env in ("good", "bad"):
        for c in cs:
            assert data[(env, c.id)].status == "ok", (env, c.id)
    # wall cycles are paired between the envs by cycle id, in every set
    for c in cs:
        for s in (1, 2):
            g, b = data[("good", c.id)].sets["wall_us"][s], data[("bad", c.id)].sets["wall_us"][s]
            assert g.keys() == b.keys() and g
    for s in sets:
        assert s["pinned"] == cpus["pinned"] and (s["cpu"] in cpus["set_cpus"] if cpus["pinned"] else s["cpu"] is None)
    if cpus["pinned"]:
        assert {c["cpu"] for c in cmds(tmp_path, "good") if c["cmd"] == "pin"} <= set(cpus["set_cpus"])
    if cpus.get("spare_cpus"):  # set 1's config and set-ups were queued after set 0's cycles, without
        # the case under retry (set 0 faulted it); set 2's after set 1's, all cases (the retry went well).
        # A fault in set-up ends set 0 before its cycles (no worker left to pair), so nothing is queued then.
        for s, want in ((1, [] if phase == "setup" else [cs[0], cs[2]]), (2, cs)):
            got = [c for c in cmds(tmp_path, "good") if c["_set"] == s and c["cmd"] == "setup"]
            assert [c["case"] for c in got if c.get("warmup_s") == 0.0] == [c.id for c in want], got
    assert not any(alive(p) for p in pids(tmp_path))


@pytest.mark.parametrize("start,fault,checked,needles", [  # a worker that died or hung: transient (below)
    ('send(type="fatal", error="import flash_attn failed: planted")', "", True,
     ["import flash_attn failed: planted"]),
    ('print("worker boom", file=sys.stderr); sys.stdout.flush(); sys.exit(4)', "", True,
     ["worker did not start", "exited with code 4", "worker boom"]),
    ("time.sleep(60)", "", True, ["worker did not start", "no reply for 1 s"]),
    (HELLO, 'if cmd["cmd"] == "config":\n    send(type="fatal", error="CUDA is not available (planted)"); sys.exit(3)',
     True, ["CUDA is not available (planted)"]),
    (HELLO, 'if cmd["cmd"] == "config": time.sleep(60)', True, ["worker failed at start", "no reply for 1 s"]),
    ('send(type="hello", pid=os.getpid(), probe={"error": "import flash_attn failed: ImportError: planted"})', "",
     False, ["preflight (first worker in the env): import flash_attn failed: ImportError: planted"]),
], ids=["fatal-hello", "exit-before-hello", "hang-before-hello", "fatal-config", "hang-config", "import-check"])
def test_a_worker_that_cannot_start_fails_its_env_only(tmp_path, monkeypatch, start, fault, checked, needles):
    monkeypatch.setattr(runner, "START_TIMEOUT_S", 1.0)
    good, bad = fake_env(tmp_path, "good"), fake_env(tmp_path, "bad", fault, start=start, checked=checked)
    cs = cases(1, 2)
    t0 = time.monotonic()
    reason, data, sets = run([good, bad], cs, tmp_path, max_sets=4)
    assert time.monotonic() - t0 < 30
    # a worker that died or hung at start in an env that imported before (checked) is a transient
    # fault: that set is given up and the next one starts the env again; the second time it fails
    transient = checked and any(n in needles for n in ("no reply for 1 s", "exited with code 4"))
    starts = 2 if transient else 1
    assert bad.status == "failed" and good.status == "ok"
    for n in needles:
        assert n in bad.error, bad.error
    if checked:  # the set names the worker that failed (an import check failure is on the env record)
        assert needles[0] in sets[starts - 1]["workers"]["bad"]["error"]
    if transient:
        assert sets[0]["status"] == "failed" and "the next set tries again" in sets[0]["error"]
    assert not [k for k in data if k[0] == "bad"]  # a failed env's cases are not reported as measured
    assert len(pids(tmp_path, "bad")) == starts  # never started again after it failed
    # the set in which the env failed goes on with the other env; with one env left there is
    # nothing to compare: that set timed it, and the run stops
    assert reason == "one env: nothing to compare, one process set timed it", reason
    assert len(sets) == starts and "bad" in sets[-1]["error"]
    for c in cs:
        cd = data[("good", c.id)]
        assert cd.status == "ok" and measured(cd) == [starts - 1] and cd.correctness
    assert not any(alive(p) for p in pids(tmp_path))


def test_a_run_of_one_env_by_request_times_sets_to_its_budget(tmp_path):
    """tox's version envs (--backend here) each time one env; their merged report compares the runs'
    sets as independent groups, so each run needs several (new-user trial: one set each, and every
    merged ratio stayed "provisional"). One env left after the others failed still gets one set."""
    cs = cases(1)
    reason, data, sets = run([fake_env(tmp_path, "only")], cs, tmp_path, max_sets=3, alone=True)
    assert reason == "max_sets 3 reached" and measured(data[("only", cs[0].id)]) == [0, 1, 2]
    reason, data, sets = run([fake_env(tmp_path, "left")], cs, tmp_path, max_sets=3, work="w2")
    assert reason == "one env: nothing to compare, one process set timed it" and len(sets) == 1


def test_an_error_reply_fails_its_case_at_once(tmp_path):
    fault = """
        if cmd["cmd"] == "setup" and batch(cmd) == 2:
            send(type="setup", case=cmd["case"], status="error", error_kind="kernel-not-built",
                 error="RuntimeError: hdim16 fwd is not in this matrix-run slim build (planted)",
                 traceback="Traceback (most recent call last): planted")
            continue
        if cmd["cmd"] == "burst" and batch(cmd) == 3:
            send(type="burst", case=cmd["case"], status="error", error_kind="oom",
                 error="OutOfMemoryError: CUDA out of memory (planted)")
            continue
    """
    envs = [fake_env(tmp_path, "good"), fake_env(tmp_path, "bad", fault)]
    cs = cases(1, 2, 3)
    reason, data, sets = run(envs, cs, tmp_path, max_sets=3)
    # the one comparison left (batch 1) may be decided by its third set, by chance (the fake
    # processes' offsets are random): either way the run took its 3 sets
    assert reason == "max_sets 3 reached" or reason.startswith("all wall-time verdicts decided"), reason
    assert len(sets) == 3
    nb = data[("bad", cs[1].id)]
    assert nb.status == "error" and nb.error_kind == "kernel-not-built" and "slim build (planted)" in nb.error
    assert nb.faults == 0 and any("Traceback" in n for n in nb.notes)
    oom = data[("bad", cs[2].id)]
    assert oom.status == "error" and oom.error_kind == "oom" and "OutOfMemoryError" in oom.error and oom.faults == 0
    # not retried: the worker goes on, and the case is not sent again in this set or the next
    assert sent(tmp_path, "bad", "setup", cs[1]) == [0]
    assert len(sent(tmp_path, "bad", "burst", cs[2])) == 1 and sent(tmp_path, "bad", "setup", cs[2]) == [0]
    for env in ("good", "bad"):
        cd = data[(env, cs[0].id)]
        assert cd.status == "ok" and measured(cd) == [0, 1, 2]
    for c in cs[1:]:
        assert data[("good", c.id)].status != "error"
    assert all("error" not in s["workers"]["bad"] for s in sets)
    assert len(pids(tmp_path, "bad")) == 3
    assert not any(alive(p) for p in pids(tmp_path))


def test_a_run_whose_every_case_failed_stops_instead_of_timing_nothing(tmp_path):
    """New-user trial: every case failed in set 0 (an old torch), and the run went on for 27 more
    sets that timed nothing, to the end of its budget. Now it stops after the set that failed the last
    case; a crash is still retried once before that."""
    fault = """
        if cmd["cmd"] == "setup" and batch(cmd) == 1:
            send(type="setup", case=cmd["case"], status="error", error_kind="error", error="TypeError: planted")
            continue
        if cmd["cmd"] == "setup" and batch(cmd) == 2:
            os.abort()
    """
    envs = [fake_env(tmp_path, "good"), fake_env(tmp_path, "bad", fault)]
    cs = cases(1, 2)
    reason, data, sets = run(envs, cs, tmp_path, max_sets=10)
    assert reason == "every case failed (its error is in the report): nothing left to time", reason
    assert len(sets) == 2  # batch 2's crash in set 0 and its retry in set 1; batch 1 failed at once
    assert data[("bad", cs[0].id)].error_kind == "error" and data[("bad", cs[1].id)].faults == 2
    assert not any(alive(p) for p in pids(tmp_path))


def test_junk_and_malformed_replies_fail_their_case_not_the_driver(tmp_path):
    fault = """
        sys.stdout.write('not json\\n[1, 2]\\n"a string"\\n\\n')  # not protocol lines: skipped
        sys.stdout.flush()
        if cmd["cmd"] == "burst" and batch(cmd) == 2:
            send(type="burst", case=cmd["case"], status="ok", us="x")  # a reply whose value cannot be read
            continue
        if cmd["cmd"] == "burst" and batch(cmd) == 3:  # a reply in two pieces
            rec = json.dumps(dict(type="burst", case=cmd["case"], **answer(cmd)))
            sys.stdout.write(rec[:9]); sys.stdout.flush(); time.sleep(0.01)
            sys.stdout.write(rec[9:] + "\\n"); sys.stdout.flush()
            continue
    """
    envs = [fake_env(tmp_path, "good"), fake_env(tmp_path, "bad", fault, start='print("junk")\n' + HELLO)]
    cs = cases(1, 2, 3)
    reason, data, sets = run(envs, cs, tmp_path, max_sets=2)
    assert reason == "max_sets 2 reached"
    cd = data[("bad", cs[1].id)]
    assert cd.status == "error" and cd.error_kind == "protocol" and "could not be read" in cd.error, cd
    assert measured(cd) == [] and measured(data[("good", cs[1].id)]) == []  # nothing half-folded
    assert len(sent(tmp_path, "bad", "burst", cs[1])) == 1
    assert all(s["status"] == "ok" and "error" not in s["workers"]["bad"] for s in sets)  # the worker went on
    for env in ("good", "bad"):
        for c in (cs[0], cs[2]):
            assert data[(env, c.id)].status == "ok" and measured(data[(env, c.id)]) == [0, 1]
    assert len(pids(tmp_path, "bad")) == 2
    assert not any(alive(p) for p in pids(tmp_path))


@pytest.mark.parametrize("where", ["on_set", "inside a set"])
def test_a_driver_error_keeps_what_was_measured(tmp_path, monkeypatch, where):
    envs = [fake_env(tmp_path, "a"), fake_env(tmp_path, "b")]
    cs = cases(1, 2)
    sets: list = []

    def on_set(rec):
        if where == "on_set" and rec["set"] == 1:
            raise RuntimeError("planted driver bug")

    if where == "inside a set":  # in set 1's first cycle, after its replies came in
        real = runner._clock

        def clock(*a, **kw):
            if sets:
                raise RuntimeError("planted driver bug")
            return real(*a, **kw)

        monkeypatch.setattr(runner, "_clock", clock)
    reason, data, _ = run(envs, cs, tmp_path, max_sets=4, on_set=on_set, sets=sets)
    assert reason.startswith("driver error (RuntimeError: planted driver bug"), reason
    assert "planted driver bug" in (tmp_path / "work" / "driver-error.txt").read_text()
    done = [0, 1] if where == "on_set" else [0]
    for cd in data.values():
        assert cd.status == "ok" and measured(cd) == done
    assert [s["set"] for s in sets] == done
    assert len(pids(tmp_path)) == 2 * 2
    assert not any(alive(p) for p in pids(tmp_path))


def _interrupt_in(phase: str, stop: threading.Event, delay: float):
    """An on_progress callback that does what the SIGINT/SIGTERM handler does, ``delay`` s after
    set 1 reports ``phase``."""
    def on_progress(msg: str) -> None:
        if msg.startswith(f"set 1: {phase}"):
            def interrupt():
                time.sleep(delay)
                stop.set()
                proc.terminate_all()

            threading.Thread(target=interrupt, daemon=True).start()
    return on_progress


SLOW = {  # (start, fault) of fake workers that give an interrupt time to land in that phase
    "starting workers": ("time.sleep(0.5)\n" + HELLO, ""),
    "setting up": (HELLO, 'if cmd["cmd"] == "setup": time.sleep(0.3)'),
    "lockstep cycles": (HELLO, ""),
}


@pytest.mark.parametrize("phase", list(SLOW))
def test_stop_ends_the_set_keeps_what_was_timed_blames_nobody_and_leaves_no_worker(tmp_path, phase):
    start, fault = SLOW[phase]
    envs = [fake_env(tmp_path, "a", fault, start=start), fake_env(tmp_path, "b", fault, start=start)]
    cs = cases(1, 2, 3)
    stop = threading.Event()
    try:
        reason, data, sets = run(envs, cs, tmp_path, max_sets=10, stop=stop,
                                 on_progress=_interrupt_in(phase, stop, 0.1))
        assert reason == "interrupted"
        with pytest.raises(proc.Stopped):  # nothing new starts while stopping
            proc.spawn([sys.executable, "-c", "pass"], log=tmp_path / "x.log")
    finally:
        proc.reset()
    # the workers the interrupt stopped are not blamed: no env or case failed
    assert all(e.status == "ok" for e in envs)
    for cd in data.values():
        assert cd.status == "ok" and cd.faults == 0 and cd.error is None and not cd.notes, cd
        assert measured(cd)[0] == 0
    assert [(s["set"], s["status"]) for s in sets] == [(0, "ok"), (1, "interrupted")]
    assert "stopped by a signal" in sets[1]["error"] and not any("error" in w for w in sets[1]["workers"].values())
    assert not any(alive(p) for p in pids(tmp_path))


def test_signal_handlers_stop_commands_and_restore(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    restore = runner.install_signal_handlers(stop)
    try:
        p = proc.spawn([sys.executable, "-c", "import time; time.sleep(60)"], log=tmp_path / "s.log")
        os.kill(os.getpid(), signal.SIGTERM)
        t0 = time.monotonic()
        while p.poll() is None and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert stop.is_set() and p.returncode == -signal.SIGTERM
    finally:
        restore()
        proc.reset()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_second_signal_inside_the_first_handler_never_waits(tmp_path):
    """GNU timeout sends SIGINT to the driver and then to its process group: the second handler ran
    while the first one's Popen.poll held the command's wait lock, and Popen.wait there blocked
    forever (new-user trial, 2026-12-03). The handlers now only signal: with that lock held by
    someone else, both return at once, the first SIGTERMs and the second SIGKILLs the group."""
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = threading.Event()
    restore = runner.install_signal_handlers(stop)
    handler = signal.getsignal(signal.SIGINT)
    p = proc.spawn([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                    "print('ready', flush=True); time.sleep(60)"], log=tmp_path / "s.log")
    try:
        t0 = time.monotonic()
        while "ready" not in (tmp_path / "s.log").read_text() and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        assert p._waitpid_lock.acquire(timeout=5)  # as the interrupted poll of the first handler held it
        try:
            th = threading.Thread(target=lambda: (handler(signal.SIGINT, None), handler(signal.SIGINT, None)),
                                  daemon=True)
            th.start()
            th.join(timeout=10)
            assert not th.is_alive(), "a signal handler blocked"
        finally:
            p._waitpid_lock.release()
        assert stop.is_set()
        assert p.wait(timeout=10) == -signal.SIGKILL  # it ignored the SIGTERM; the second signal killed it
    finally:
        proc.kill_group(p, grace=0.0)
        restore()
        proc.reset()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _through_results(data: dict, sets: list, cs: list[Case]) -> tuple[dict, list]:
    """``data`` and ``sets`` as a resumed run gets them: written to results.json and read back."""
    doc = json.loads(json.dumps({"cases": [results.case_record(cd, cd.case) for cd in data.values()],
                                 "sets": sets}))
    return runner.data_from_results(doc, cs), doc["sets"]


def test_an_interrupted_run_resumes_with_new_sets_and_keeps_the_old_ones(tmp_path):
    envs = [fake_env(tmp_path, "a"), fake_env(tmp_path, "b")]
    cs = cases(1, 2)
    stop = threading.Event()
    try:
        reason, data, sets = run(envs, cs, tmp_path, max_sets=3, stop=stop,
                                 on_progress=_interrupt_in("lockstep cycles", stop, 0.1))
    finally:
        proc.reset()
    assert reason == "interrupted" and [s["status"] for s in sets] == ["ok", "interrupted"]
    before = {k: copy.deepcopy(cd.sets) for k, cd in data.items()}
    assert all(cd.sets["wall_us"][1] for cd in data.values())  # the interrupted set's cycles are kept
    # ... and counted (the set said "0 cycles" beside the cycles the report compares)
    assert sets[1]["cycles"] >= max(len(cd.sets["wall_us"][1]) for cd in data.values()) > 0, sets[1]
    data2, sets2 = _through_results(data, sets, cs)
    assert list(data2) == list(data)
    reason, data2, sets2 = run(envs, cs, tmp_path, max_sets=3, work="work2", data=data2, sets=sets2, elapsed_s=5.0)
    assert reason == "max_sets 3 reached"
    # the interrupted set does not count: sets 2 and 3 are new; nothing measured before is re-run
    assert [(s["set"], s["status"]) for s in sets2] == [(0, "ok"), (1, "interrupted"), (2, "ok"), (3, "ok")]
    assert sorted(p.name for p in (tmp_path / "work2").glob("*.log")) == ["s2-a.log", "s2-b.log", "s3-a.log",
                                                                          "s3-b.log"]
    for k, cd in data2.items():
        assert cd.status == "ok" and measured(cd) == [0, 1, 2, 3]
        for m in ("wall_us", "host_us"):
            for s, v in before[k][m].items():
                assert cd.sets[m][s] == v, (k, m, s)
        for s in (2, 3):  # paired by cycle id with the other env
            other = data2[("b" if k[0] == "a" else "a", k[1])]
            assert cd.sets["wall_us"][s].keys() == other.sets["wall_us"][s].keys()
    assert not any(alive(p) for p in pids(tmp_path))


def test_case_data_round_trips_through_results_json():
    c = cases(4)[0]
    cd = runner.CaseData("e", c)
    cd.sets["wall_us"] = {0: {0: 1.5, 3: 2.5, 7: 2.0}, 2: {1: 1.25}}
    cd.sets["host_us"] = {0: {1: 1.0, 4: 0.75}, 2: {0: 0.5}}
    cd.sets["device_us"] = {0: [0.5, 0.6], 2: [0.55]}
    cd.correctness = [{"out": {"max_abs_err": 0.001, "rel_err": 0.002, "finite": True}}]
    cd.status, cd.faults, cd.seconds = "ok", 1, 0.5
    cd.notes = ["set 0: a wall burst: the worker was killed by SIGABRT", "set 1: timed again after the earlier fault"]
    cd.inner, cd.clock_seconds, cd.kernels = {"wall_us": 3}, {"wall": 0.4}, [{"name": "k", "us": 0.5}]
    rec = json.loads(json.dumps(results.case_record(cd, c)))
    assert rec["metrics"]["wall_us"]["by_set"] == {"0": {"0": 1.5, "3": 2.5, "7": 2.0}, "2": {"1": 1.25}}
    back = runner.data_from_results({"cases": [rec, {**rec, "id": "not-in-config"}]}, [c])
    assert list(back) == [("e", c.id)]
    cd2 = back[("e", c.id)]
    assert cd2.sets == cd.sets  # set ids and cycle ids kept: the next sets pair with them
    assert (cd2.status, cd2.faults, cd2.notes, cd2.kernels) == (cd.status, cd.faults, cd.notes, cd.kernels)
    assert results.case_record(cd2, c) == rec
    # a failed case stays failed, with its kind, and is retried only as the runner decides
    bad = runner.CaseData("e", c)
    bad.fail("timeout", "the worker was stopped after --case-timeout 1 s during set-up")
    bad.faults = 2
    back = runner.data_from_results({"cases": [results.case_record(bad, c)]}, [c])[("e", c.id)]
    assert (back.status, back.error_kind, back.faults, back.error) == ("error", "timeout", 2, bad.error)


# ---------------------------------------------------------------------------------------------
# real CPU runs with planted faults
FAULTS_PLANTED = """
    _b = q.shape[0]
    if _b == 11:
        os.abort()
    if _b == 13:
        time.sleep(3600)
    if _b == 14:
        raise RuntimeError("stand-in: planted error")
    if _b == 15:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB (planted)")
"""
FAULT_CONFIG = """
title: planted faults
ops: [fwd]
shapes:
  - {batch: 11, seqlen: 16, nheads: 2, head_dim: 16}
  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}
  - {batch: 13, seqlen: 16, nheads: 2, head_dim: 16}
  - {batch: 14, seqlen: 16, nheads: 2, head_dim: 16}
  - {batch: 15, seqlen: 16, nheads: 2, head_dim: 16}
  - {batch: 2, seqlen: 16, nheads: 2, head_dim: 16}
sampling: {time_budget_s: 600, set_seconds: 3, max_sets: 40}
"""
#: Process sets of the fault run: set 0 ends when the noimport env fails its first worker's import
#: check; the abort fails batch 11 in sets 1 and 2 (a retry), the hang batch 13 in sets 3 and 4;
#: from set 5 on the faulty env's other cases are timed (14 and 15 fail at once in set 5).
FAULT_SETS = 7
SECRET = "MATRIX_RUN_TEST_SECRET_TOKEN"


def _wheel(src: Path, dest: Path) -> Path:
    """A py3-none-any wheel of a stand-in source tree (standin.make_source), zipped directly: the
    same files ``standin.build_wheel`` packs, without pip's seconds of start-up."""
    version = src.name.split("-", 1)[1]
    files = {f.relative_to(src).as_posix(): f.read_bytes()
             for f in sorted(src.rglob("*.py")) if f.name != "setup.py" and "__pycache__" not in f.parts}
    files["flash_attn/_build_info.py"] = b"TORCH_AT_BUILD = None\n"
    di = f"flash_attn-{version}.dist-info"
    files[f"{di}/METADATA"] = f"Metadata-Version: 2.1\nName: flash_attn\nVersion: {version}\n".encode()
    files[f"{di}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: matrix-run-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b'=').decode()},{len(b)}\n"
                     for n, b in files.items()) + f"{di}/RECORD,,\n"
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"flash_attn-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for n, b in files.items():
            z.writestr(n, b)
        z.writestr(f"{di}/RECORD", record)
    return out


def _sdist(dest: Path, version: str, setup_py: str) -> Path:
    """A flash_attn-VERSION.tar.gz whose setup.py is ``setup_py`` (for builds that fail or hang)."""
    src = dest.parent / f"src-{version}" / f"flash_attn-{version}"
    src.mkdir(parents=True)
    (src / "setup.py").write_text(textwrap.dedent(setup_py))
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"flash_attn-{version}.tar.gz"
    with tarfile.open(out, "w:gz") as tf:
        tf.add(src, arcname=src.name)
    return out


@pytest.fixture(scope="module")
def fault_run(standins, tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    fl = root / "find-links"
    fl.mkdir()
    dumps = root / "env-dumps"
    dumps.mkdir()
    # faulty=9.0.1: every planted fault, one per batch size; its import dumps the environment it sees
    src = standin.make_source(root / "src", "9.0.1")
    iface = src / "flash_attn" / "flash_attn_interface.py"
    anchor = "    if _FAULT and q.shape[0] == _FAULT_BATCH:\n"
    text = iface.read_text()
    assert anchor in text
    iface.write_text(text.replace(anchor, FAULTS_PLANTED.lstrip("\n") + anchor))
    with open(src / "flash_attn" / "__init__.py", "a") as f:
        f.write(f"\nimport json as _j, os as _o\n"
                f"with open({str(dumps)!r} + '/env-%d.json' % _o.getpid(), 'w') as _f:\n"
                f"    _j.dump(dict(_o.environ), _f)\n")
    _wheel(src, fl)
    # noimport=9.0.6: installs, but importing it fails (the first worker's import check must catch it)
    src = standin.make_source(root / "src", "9.0.6")
    (src / "flash_attn" / "__init__.py").write_text("raise ImportError('planted import failure')\n")
    _wheel(src, fl)
    # corrupt=9.0.4: a truncated wheel
    good = next(standins["wheels"].glob("flash_attn-2.6.3-*.whl")).read_bytes()
    (fl / "flash_attn-9.0.4-py3-none-any.whl").write_bytes(good[: len(good) // 3])
    # nobuild=9.0.5: an sdist whose setup.py fails
    _sdist(fl, "9.0.5", 'raise SystemExit("planted build failure: this sdist cannot be built")\n')
    cfg = root / "faults.yaml"
    cfg.write_text(FAULT_CONFIG)
    out = root / "out"
    t0 = time.monotonic()
    cp = run_cli("--versions", "good=2.6.3,faulty=9.0.1,corrupt=9.0.4,nobuild=9.0.5,noimport=9.0.6",
                 "--config", str(cfg), "--device", "cpu", "--offline", "--case-timeout", "4",
                 "--max-sets", str(FAULT_SETS), "--set-seconds", "0.4", "--burst-ms", "2", "--workers-per-env", "1",
                 "--find-links", str(standins["wheels"]), "--find-links", str(fl),
                 "--envs-dir", str(root / "envs"), "--wheel-cache", str(root / "cache"), "--output", str(out),
                 env={SECRET: "hunter2"}, timeout=400)
    return {"cp": cp, "root": root, "out": out, "dumps": dumps, "seconds": time.monotonic() - t0,
            "res": load_results(out) if (out / "results.json").exists() else None}


def _case(res, env, batch):
    return next(c for c in res["cases"] if c["env"] == env and c["batch"] == batch)


def _sets_of(c: dict) -> list[int]:
    """The process sets with wall-time cycles of a case record."""
    return sorted(int(s) for s, v in ((c["metrics"].get("wall_us") or {}).get("by_set") or {}).items() if v)


def test_fault_run_exits_3_with_results_written(fault_run):
    cp, res = fault_run["cp"], fault_run["res"]
    assert cp.returncode == 3, cp.stderr[-4000:]
    assert "Traceback" not in cp.stderr
    assert res is not None and res["schema"] == "matrix-runner/results/2"
    # the command line's sampling options win over the config's
    st = res["settings"]
    assert (st["max_sets"], st["set_seconds"], st["burst_ms"], st["workers_per_env"], st["case_timeout_s"]) == \
        (FAULT_SETS, 0.4, 2.0, 1, 4.0)
    assert res["timing"]["stop_reason"] == f"max_sets {FAULT_SETS} reached" or \
        res["timing"]["stop_reason"].startswith("all wall-time verdicts decided")
    assert [s["set"] for s in res["sets"]] == list(range(FAULT_SETS))
    # sets 0-3 lost the faulty env's worker in a set-up (a crash, then a hang, each retried once): each
    # ended before its cycles, as the good env could only have timed its side alone
    assert [s["status"] for s in res["sets"]] == ["failed"] * 4 + ["ok"] * (FAULT_SETS - 4)
    assert all(s["cycles"] == 0 and s["error"].startswith("faulty: no worker left after set-up: no cycles")
               and "set-up" in s["workers"]["faulty"]["error"] for s in res["sets"][:4])
    err = " ".join(fault_run["cp"].stderr.split())  # and the terminal says why (new-user trial: it did not)
    assert "set 0 failed: faulty: no worker left after set-up: no cycles, nothing to pair; the next set tries " \
           "again (" in err and "SIGABRT" in err.split("set 0 failed:")[1].split("set 1")[0], err
    assert (fault_run["out"] / "index.html").is_file()


def test_failed_envs_name_the_reason_and_show_the_log_tail(fault_run):
    res, err = fault_run["res"], " ".join(fault_run["cp"].stderr.split())
    envs = {e["label"]: e for e in res["envs"]}
    assert envs["good"]["status"] == "ok" and envs["faulty"]["status"] == "ok"
    for lab in ("corrupt", "nobuild", "noimport"):
        assert envs[lab]["status"] == "failed", envs[lab]
        assert f"✗ {lab}:" in err
    c = envs["corrupt"]
    assert "uv pip" in c["error"] and "flash_attn-9.0.4-py3-none-any.whl" in (c["error_tail"] or ""), c
    b = envs["nobuild"]
    assert "source build of flash-attn 9.0.5 failed" in b["error"]
    assert "planted build failure" in (b["error_tail"] or ""), b
    n = envs["noimport"]
    # found in the env (the torch-free check passes); the first worker's import check fails it, and
    # its record is marked so the next run re-checks and rebuilds it
    assert n["error"].startswith("preflight (first worker in the env):"), n
    assert "ImportError: planted import failure" in n["error"], n
    rec = json.loads((fault_run["root"] / "envs" / "noimport" / "matrix-run-env.json").read_text())
    assert rec["fingerprint"] is None and rec["status"] == "import-failed"
    assert "planted import failure" in rec["import_error"]
    assert not any(c["env"] in ("corrupt", "nobuild", "noimport") for c in res["cases"])
    # its worker was started once, in set 0 (which names it; the set would have gone on with the other
    # envs, but the faulty env's worker crashed in a set-up there: test_fault_run_exits_3_with_results_written)
    assert "preflight" in res["sets"][0]["workers"]["noimport"]["error"]
    assert "noimport" not in res["sets"][0]["error"].split(": no worker left")[0]  # not among the envs lost
    assert all("noimport" not in s["workers"] for s in res["sets"][1:])


def test_each_worker_fault_fails_its_case_only(fault_run):
    res = fault_run["res"]
    expect = {11: ("crash", ["SIGABRT", "set-up"], 2), 13: ("timeout", ["--case-timeout 4 s during set-up"], 2),
              14: ("error", ["RuntimeError: stand-in: planted error"], 0), 15: ("oom", ["OutOfMemoryError"], 0)}
    for batch, (kind, needles, faults) in expect.items():
        c = _case(res, "faulty", batch)
        assert c["status"] == "error" and c["error_kind"] == kind, c
        assert all(n in c["error"] for n in needles), c["error"]
        assert c["faults"] == faults and _sets_of(c) == [], c
    # a crash and a hang are retried once, in the next set; each set names the worker it lost (set 0
    # went on without the env that failed its import check)
    assert [n.split(":")[0] for n in _case(res, "faulty", 11)["notes"]] == ["set 0", "set 1"]
    assert [n.split(":")[0] for n in _case(res, "faulty", 13)["notes"]] == ["set 2", "set 3"]
    lost = {s["set"]: s["workers"].get("faulty", {}).get("error") or "" for s in res["sets"]}
    assert all("SIGABRT" in lost[s] for s in (0, 1)) and all("no reply for 4 s" in lost[s] for s in (2, 3))
    assert not lost[4] and not lost[5] and not lost[6]
    # every other case of both envs: measured, in lockstep pairs in the sets after the faults
    for b in (1, 2):
        g, f = _case(res, "good", b), _case(res, "faulty", b)
        assert g["status"] == "ok" and f["status"] == "ok" and g["correctness"]["ok"] and f["correctness"]["ok"]
        assert _sets_of(f) == [4, 5, 6] and {4, 5, 6} <= set(_sets_of(g))
        for s in ("4", "5", "6"):
            gw, fw = g["metrics"]["wall_us"]["by_set"][s], f["metrics"]["wall_us"]["by_set"][s]
            assert gw.keys() == fw.keys() and len(gw) >= 5
    for b in (11, 13, 14, 15):  # the good env's same cases are not blamed for the faulty env's faults
        g = _case(res, "good", b)
        assert ((g["status"] == "ok" and g["error"] is None) or
                (g["status"] == "not run" and g["error_kind"] == "not-run")) and g["faults"] == 0, g
    # only the measured shapes are compared
    assert {c["case"] for c in res["comparisons"] if c["candidate"] == "faulty"} == \
        {_case(res, "good", 1)["id"], _case(res, "good", 2)["id"]}
    err = " ".join(fault_run["cp"].stderr.split())
    assert re.search(r"\d+ case\(s\) failed in 1 env\(s\) \(crash, error, oom, timeout\)", err), err


def test_no_worker_outlives_the_run(fault_run):
    res = fault_run["res"]
    pids = {w["pid"] for s in res["sets"] for w in s["workers"].values() if w.get("pid")}
    pids |= {int(d.stem.split("-")[1]) for d in fault_run["dumps"].glob("env-*.json")}
    assert len(pids) >= 2 * (FAULT_SETS - 1)
    assert not [p for p in pids if alive(p)]
    assert not _stray(str(fault_run["root"]))


def test_workers_see_only_the_allow_listed_environment(fault_run):
    dumps = list(fault_run["dumps"].glob("env-*.json"))
    assert len(dumps) >= FAULT_SETS - 1  # the faulty env's workers, one per set
    for d in dumps:
        env = json.loads(d.read_text())
        assert SECRET not in env and "hunter2" not in env.values()
        assert "PATH" in env
        assert all(k in proc.ENV_ALLOW or k.startswith(proc.ENV_ALLOW_PREFIXES)
                   or k in ("PYTHONUNBUFFERED", "PYTHONNOUSERSITE", "LC_CTYPE") for k in env), sorted(env)


# ---------------------------------------------------------------------------------------------
# interruption and --resume
INTERRUPT_CONFIG = """
title: interrupt me
ops: [fwd, bwd]
shapes:
  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}
sampling: {time_budget_s: 300, set_seconds: 6, max_sets: 2, min_effect: 0.05}
"""


class _Cli:
    """``python -m matrix_runner ARGS`` in the background, output to files (a full pipe must never
    block it)."""

    def __init__(self, tmp: Path, *args: str):
        e = dict(os.environ, COLUMNS="200")
        self.out, self.err = tmp / "cli.stdout", tmp / "cli.stderr"
        with open(self.out, "w") as o, open(self.err, "w") as r:
            self.p = subprocess.Popen([sys.executable, "-m", "matrix_runner", *args], stdout=o, stderr=r, env=e)

    def poll(self):
        return self.p.poll()

    def stderr(self) -> str:
        return self.err.read_text()

    def signal_and_wait(self, sig, timeout: float = 60) -> float:
        t0 = time.monotonic()
        self.p.send_signal(sig)
        try:
            self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            pytest.fail(f"matrix-run did not stop within {timeout} s of {sig!r}: {self.stderr()[-3000:]}")
        return time.monotonic() - t0


def _wait_for(pred, timeout: float, what: str, cli: _Cli | None = None):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = pred()
        if v:
            return v
        if cli is not None and cli.poll() is not None:
            pytest.fail(f"matrix-run exited ({cli.poll()}) before {what}: {cli.stderr()[-3000:]}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _sets_written(path: Path) -> list:
    try:
        return json.loads(path.read_text())["sets"]
    except (OSError, ValueError, KeyError):
        return []


def _stray(marker: str) -> list[str]:
    """Live processes whose command line mentions ``marker`` (a test's tmp dir)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd and alive(int(d.name)):
                out.append(f"{d.name}: {cmd}")
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT], ids=["SIGINT"])
def test_interrupt_writes_results_then_resume_finishes_only_what_is_missing(standins, tmp_path, sig):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(INTERRUPT_CONFIG)
    out = tmp_path / "out"
    cli = _Cli(tmp_path, "--versions", "2.6.3,2.7.0.post2", "--config", str(cfg), "--device", "cpu", "--offline",
               "--find-links", str(standins["wheels"]), "--envs-dir", str(tmp_path / "envs"),
               "--wheel-cache", str(tmp_path / "cache"), "--output", str(out))
    seen_invalid = []

    def one_set():
        # results.json is replaced atomically: a reader never sees a half-written file
        f = out / "results.json"
        if f.exists():
            try:
                json.loads(f.read_text())
            except ValueError:
                seen_invalid.append(1)
        return _sets_written(f)

    s0 = _wait_for(one_set, 240, "a process set in results.json", cli)[0]
    # aim at the next set's 6 s of lockstep cycles (its workers were prefetched during the first set,
    # so it starts at once with its set-ups done); any phase must do
    assert s0["status"] == "ok"
    time.sleep(2.5)
    cli.signal_and_wait(sig)
    err = cli.stderr()
    assert cli.poll() == 130, err[-3000:]
    assert "interrupted" in err and "Traceback" not in err and "--resume" in err
    # the headline on stdout names the run's folder as stderr does (it said "--resume DIR": new-user trial)
    said = " ".join(cli.out.read_text().split())
    assert f"finish it with matrix-run --resume {out}." in said and "--resume DIR" not in said, said[-1500:]
    assert not seen_invalid
    assert not _stray(str(tmp_path)), _stray(str(tmp_path))
    first = load_results(out)
    assert first["timing"]["stop_reason"] == "interrupted"
    pids = {w["pid"] for s in first["sets"] for w in s["workers"].values() if w.get("pid")}
    assert pids and not [q for q in pids if alive(q)]
    # the interrupt is nobody's fault: no env or case failed, and nothing measured is lost
    assert all(e["status"] == "ok" for e in first["envs"])
    assert all(c["status"] == "ok" and not c["faults"] for c in first["cases"]), first["cases"]
    done = [s for s in first["sets"] if s["status"] == "ok"]
    assert len(done) == 1 and first["sets"][0]["status"] == "ok"
    # the terminal counts the sets as the report does (it said "0 process sets" beside a report of 1)
    n = len(first["sets"])
    cut = n - len(done)
    assert f"({n} process set{'s' if n != 1 else ''}" + (f", {cut} of them interrupted" if cut else "") in " ".join(err.split()), err[-1500:]
    kept = {(c["env"], c["id"]): c["metrics"]["wall_us"]["by_set"] for c in first["cases"]}
    assert len(kept) == 4 and all("0" in v for v in kept.values())
    # an interrupted set's cycles count as its cycles' time, not as closing it (new-user trial: "close 2.4 s")
    for s in first["sets"]:
        if s["status"] == "interrupted" and s["cycles"]:
            assert s["phase_s"].get("cycles", 0) > 0.5 > s["phase_s"].get("close", 0), s["phase_s"]

    # a run started under other sampling defaults (max_repeats was 1 until 2026-12-03) resumes with its own
    doc = json.loads((out / "results.json").read_text())
    assert doc["settings"]["max_repeats"] == 4
    # the default probe share rule and the sets it waits for are recorded (a resume keeps them)
    assert (doc["settings"]["probe_share"], doc["settings"]["probe_share_min_sets"]) == ("estimated", 3)
    doc["settings"]["probe_share_min_sets"] = 5  # as if started with another threshold
    doc["settings"]["max_repeats"] = 1
    del doc["settings"]["host_precision"]  # a run from before the setting: its host items were cycled to 1 %
    (out / "results.json").write_text(json.dumps(doc))
    cp = run_cli("--resume", str(out))
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "resuming" in cp.stderr
    # counted in words that agree with the count (new-user trial: "1 process sets")
    assert f"{n} process set{'s' if n != 1 else ''} and 4 case records kept" in " ".join(cp.stderr.split()), cp.stderr
    res = load_results(out)
    assert res["settings"]["max_repeats"] == 1 and res["settings"]["host_precision"] == 0.01
    assert res["settings"]["probe_share_min_sets"] == 5  # kept, not the current default
    assert res["run_id"] == first["run_id"] and res["command"] == first["command"] and len(res["resumed"]) == 1
    assert res["timing"]["stop_reason"] != "interrupted"
    # the budget counts the first session's time outside its timing phase too (new-user trial: a run
    # interrupted at 14.2 s and resumed ended at 41.2 s of a 40 s budget): envs were reused, so all of it
    ft, rt = first["timing"], res["timing"]
    assert ft["resumed_other_s"] is None and ft["budget_excluded_s"] >= 0
    assert rt["resumed_other_s"] == pytest.approx(ft["total_s"] - ft["budget_excluded_s"] - ft["timing_phase_s"], abs=0.02)
    assert rt["resumed_other_s"] >= ft["before_timing_s"] - 0.02 and rt["budget_excluded_s"] == ft["budget_excluded_s"]
    # the sets measured before the interrupt are kept as they were; new sets get new ids; an
    # interrupted set does not count towards max_sets
    assert [s["set"] for s in res["sets"]] == list(range(len(res["sets"])))
    assert res["sets"][:len(first["sets"])] == first["sets"]
    assert sum(s["status"] == "ok" for s in res["sets"]) == 2
    for c in res["cases"]:
        assert c["status"] == "ok"
        by = c["metrics"]["wall_us"]["by_set"]
        for sid, v in kept[(c["env"], c["id"])].items():
            assert by[sid] == v
        assert str(len(res["sets"]) - 1) in by  # timed in the new set
    for e in res["envs"]:
        assert e["build"]["reused"] is True
    assert {c["candidate"] for c in res["comparisons"]} == {"2.7.0.post2"}

    # nothing left to resume; --resume takes no other option; a missing run dir is a usage error
    cp = run_cli("--resume", str(out))
    assert cp.returncode == 0 and "nothing to resume" in cp.stderr
    cp = run_cli("--resume", str(out), "--quick")
    assert cp.returncode == 2 and "give no other option than --time-budget or --max-sets" in " ".join(cp.stderr.split())
    assert "--markdown FILE" not in cp.stderr
    cp = run_cli("--resume", str(out), "--markdown", str(tmp_path / "t.md"))  # new-user trial: where it goes instead
    assert cp.returncode == 2 and "for a Markdown table of the run: matrix-run report RUN_DIR/results.json " \
        "--markdown FILE" in " ".join(cp.stderr.split())

    # a finished run is extended by a larger budget (new-user trial: it could not be): one more set,
    # the earlier ones kept as they were, the larger budget in its settings and command
    assert res["timing"]["stop_reason"] == "max_sets 2 reached"
    cp = run_cli("--resume", str(out), "--max-sets", "2")
    assert cp.returncode == 2 and "--max-sets 2: the run's own is 2 sets; give more" in " ".join(cp.stderr.split())
    cp = run_cli("--resume", str(out), "--max-sets", "3")
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "max sets extended from 2 to 3" in " ".join(cp.stderr.split())
    ext = load_results(out)
    assert ext["sets"][:len(res["sets"])] == res["sets"] and sum(s["status"] == "ok" for s in ext["sets"]) == 3
    assert ext["timing"]["stop_reason"] == "max_sets 3 reached" and ext["settings"]["max_sets"] == 3
    assert ext["settings"]["planned_sets"] == res["settings"]["planned_sets"]  # the sequence's mixing is kept
    assert ext["command"][-2:] == ["--max-sets", "3"] and ext["command"][:-2] == res["command"]
    assert [{k: v for k, v in x.items() if k != "at"} for x in ext["extended"]] == [{"max_sets": [2, 3]}]
    assert ext["extended"][0]["at"] == ext["resumed"][-1]
    assert all(str(len(ext["sets"]) - 1) in c["metrics"]["wall_us"]["by_set"] for c in ext["cases"])
    assert "it was extended (max_sets 2 → 3)" in (out / "index.html").read_text()
    cp = run_cli("--resume", str(tmp_path / "nope"))
    assert cp.returncode == 2 and f"--resume {tmp_path / 'nope'}: no such directory" in " ".join(cp.stderr.split())


def test_sigterm_during_a_build_stops_it_and_writes_results(tmp_path):
    pidfile = tmp_path / "build.pid"
    fl = tmp_path / "fl"
    _sdist(fl, "9.1.0", f"""
        import os, sys, time
        if "bdist_wheel" in sys.argv:
            open({str(pidfile)!r}, "w").write(str(os.getpid()))
            time.sleep(300)
        raise SystemExit("not reached")
    """)
    out = tmp_path / "out"
    cli = _Cli(tmp_path, "--versions", "9.1.0", "--device", "cpu", "--offline", "--find-links", str(fl),
               "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"), "--output", str(out))
    _wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 180, "the build to start", cli)
    build_pid = int(pidfile.read_text())
    assert cli.signal_and_wait(signal.SIGTERM) < 30
    err = cli.stderr()
    assert cli.poll() == 130, err[-3000:]
    assert "Traceback" not in err
    _wait_for(lambda: not alive(build_pid), 5, "the build process to be gone")
    assert not _stray(str(tmp_path)), _stray(str(tmp_path))
    res = load_results(out)
    assert res["timing"]["stop_reason"] == "interrupted"
    assert res["sets"] == [] and res["cases"] == []
    (e,) = res["envs"]
    assert e["status"] == "failed" and e["error"].startswith("interrupted")


def test_the_time_budget_bounds_a_slow_set_up_without_blaming_the_case(tmp_path):
    """A case whose set-up outlasts the run's time budget (a GPU-sized config on a CPU: 200 s for one
    case under a 20 s budget, new-user trial) ends the set and the run at the budget, says so, and
    neither fails the case nor waits for --case-timeout; no worker is left running."""
    slow = 'if cmd["cmd"] == "setup" and batch(cmd) == 4:\n    time.sleep(60)\n'
    envs = [fake_env(tmp_path, "a", fault=slow), fake_env(tmp_path, "b", fault=slow)]
    cs = cases(2, 4)
    data, sets = {}, []
    t0 = time.monotonic()
    reason = runner.run_all(envs, cs, Sampling(set_seconds=0.2, time_budget_s=2.0, max_sets=3, burst_ms=1.0),
                            device="cpu", quick=False, work=tmp_path / "work", stop=threading.Event(),
                            data=data, sets=sets, case_timeout=60.0)
    took = time.monotonic() - t0
    assert took < 12, took  # the budget (2 s) plus the set's start, not the 60 s set-up
    assert reason.startswith("time budget 2 s spent while set 0 set up case B4 ") and "raise --time-budget" in reason
    assert len(sets) == 1 and sets[0]["status"] == "budget" and sets[0]["error"] == reason
    # the env it waited on (both would have), named, in one pair of parentheses (new-user trial: nested ones)
    assert re.fullmatch(r"time budget 2 s spent while set 0 set up case B4 .+ fwd \(inputs and first calls; waiting on "
                        r"a's worker, \d+ s into the set\): the cases set up so far were not timed; raise --time-budget "
                        r"\(where one case's set-up takes most of it, use smaller cases on this device\)", reason), reason
    assert sets[0]["phase_s"]["setup"] >= 1.0 and sets[0]["phase_s"].get("close", 0) < 1.0  # where the time went
    # one env's worker hangs where the other's set the case up at once: a hang, not the case's size,
    # so it points at --case-timeout (new-user trial: "raise --time-budget", useless below 300 s)
    hung = [fake_env(tmp_path, "a"), fake_env(tmp_path, "b", fault=slow)]
    reason_h = runner.run_all(hung, cs, Sampling(set_seconds=0.2, time_budget_s=2.0, max_sets=3, burst_ms=1.0),
                              device="cpu", quick=False, work=tmp_path / "work-h", stop=threading.Event(),
                              data={}, sets=[], case_timeout=60.0)
    assert re.search(r"waiting on b's worker.*: the cases set up so far were not timed; a's worker set it up in "
                     r"[\d,]+ ms in this set, so b's may hang in it: --case-timeout S \(now 60 s\) fails a case whose "
                     r"set-up or burst takes longer than S and goes on with the others; else raise --time-budget",
                     reason_h), reason_h
    for lab in ("a", "b"):
        cd = data[(lab, cs[1].id)]
        assert cd.status != "error" and cd.faults == 0 and not cd.sets["wall_us"]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids(tmp_path))
    # the budget counts from the run's start, as the time before timing does (second new-user trial:
    # a 20 s budget, 1.3 s of it calibrating the CPUs, ended at 21.5 s in a set-up): 1 s already spent
    data, sets = {}, []
    t0 = time.monotonic()
    reason = runner.run_all(envs, cs, Sampling(set_seconds=0.2, time_budget_s=2.0, max_sets=3, burst_ms=1.0),
                            device="cpu", quick=False, work=tmp_path / "work2", stop=threading.Event(),
                            data=data, sets=sets, case_timeout=60.0, elapsed_s=1.0)
    took = time.monotonic() - t0
    assert reason.startswith("time budget 2 s spent while set 0 set up case B4 ") and took < 1.9, (took, reason)
