"""Fault injection: crashing, hanging and failing workers, broken wheels, failing builds,
interruption (SIGINT/SIGTERM) and --resume. Every fault stays local: the other envs and cases are
measured (their samples are in results.json), the exit code says what happened, and the error text
names what failed.

Two layers:

- fake workers (tiny Python scripts speaking the worker's JSONL protocol, no torch) drive
  runner.run_worker_round / run_all through every failure path (SIGABRT, SIGKILL as sent by the OOM
  killer, SIGSEGV, a non-zero exit, a hang, a truncated record, a fatal error, a hang at start-up or
  between cases, malformed records, an interrupt, a driver bug, a resume) in about a second each;
- real CPU runs of the CLI with stand-in flash_attn packages (conftest.standins) with planted
  faults: abort, a hang, a raised error and an out-of-memory error in one env's cases; a truncated
  wheel, an sdist whose setup.py fails and a package whose import fails in three more envs; SIGINT
  during timing then --resume; SIGTERM during a source build.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
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
from matrix_runner import proc, results, runner
from matrix_runner.config import Case, Sampling
from matrix_runner.envs import EnvResult

# ---------------------------------------------------------------------------------------------
# fake workers
FAKE_HEAD = """#!{python}
import json, os, signal, sys, time
_a = sys.argv
spec = json.load(open(_a[_a.index("--spec") + 1]))
_f = open(_a[_a.index("--out") + 1], "a")
def w(**rec):
    _f.write(json.dumps(rec) + "\\n"); _f.flush()
def ok(c):
    w(type="result", case=c["id"], status="ok", seconds=0.01,
      metrics={{"wall_us": {{"samples": [10.0 + c["batch"], 11.0, 9.0], "inner": 1}},
               "host_us": {{"samples": [5.0, 5.5], "inner": 1}}}})
"""


def fake_env(tmp_path: Path, body: str, name: str = "fake") -> EnvResult:
    script = tmp_path / f"{name}-python"
    script.write_text(FAKE_HEAD.format(python=sys.executable) + textwrap.dedent(body))
    script.chmod(0o755)
    return EnvResult(name, "0.0", str(tmp_path), python=str(script), status="ok")


def cases(*batches: int) -> list[Case]:
    return [Case(op="fwd", batch=b, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16) for b in batches]


def fresh(env: EnvResult, cs: list[Case]) -> dict:
    return {(env.label, c.id): runner.CaseData(env.label, c) for c in cs}


def round_(env, cs, data, tmp_path, stop=None, **kw):
    kw.setdefault("case_timeout", 5.0)
    return runner.run_worker_round(env, cs, data, device="cpu", quick=True, seed=0, work=tmp_path, tag="r0",
                                   stop=stop or threading.Event(), **kw)


def pids_in(work: Path) -> list[int]:
    """Worker pids from the hello/pid lines the fake and real workers write."""
    out = []
    for f in work.rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("pid"):
                out.append(rec["pid"])
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


LOOP = """
w(type="hello", pid=os.getpid())
for c in spec["cases"]:
    w(type="start", case=c["id"], phase="timing")
    {fault}
    ok(c)
w(type="done")
"""


@pytest.mark.parametrize("fault,kind,needle", [
    ("if c['batch'] == 2: os.abort()", "crash", "killed by SIGABRT"),
    ("if c['batch'] == 2: os.kill(os.getpid(), signal.SIGKILL)", "crash", "OOM killer"),
    ("if c['batch'] == 2: os.kill(os.getpid(), signal.SIGSEGV)", "crash", "killed by SIGSEGV"),
    ("if c['batch'] == 2: sys.exit(7)", "crash", "exited with code 7"),
    ("if c['batch'] == 2: time.sleep(60)", "timeout", "--case-timeout 1"),
    ("if c['batch'] == 2: _f.write('{\"type\": \"result\", \"ca'); _f.flush(); os.abort()", "crash", "SIGABRT"),
])
def test_a_worker_fault_fails_that_case_only(tmp_path, fault, kind, needle):
    env = fake_env(tmp_path, LOOP.format(fault=fault))
    cs = cases(1, 2, 3)
    data = fresh(env, cs)
    t0 = time.monotonic()
    rec = round_(env, cs, data, tmp_path, case_timeout=1.0)
    assert time.monotonic() - t0 < 15
    bad = data[("fake", cs[1].id)]
    assert bad.status == "error" and bad.error_kind == kind and needle in bad.error, bad
    for c in (cs[0], cs[2]):  # before and after the fault: measured
        assert data[("fake", c.id)].status == "ok" and len(data[("fake", c.id)].rounds["wall_us"]) == 1
    assert rec["status"] == "ok" and rec["restarts"] == 1
    # the worker was restarted for the case after the fault only
    second = json.loads((tmp_path / "r0-1.spec.json").read_text())
    assert [c["id"] for c in second["cases"]] == [cs[2].id]
    assert not any(alive(p) for p in pids_in(tmp_path))


@pytest.mark.parametrize("body,needle", [
    ("w(type='hello', pid=os.getpid()); w(type='fatal', error='import flash_attn failed: planted')",
     "import flash_attn failed: planted"),
    ("print('worker boom', file=sys.stderr); sys.exit(4)", "exited with code 4 before any case"),
    ("w(type='hello', pid=os.getpid()); time.sleep(60)", "no progress for 1 s before its first case"),
])
def test_a_worker_that_never_gets_to_a_case_fails_the_round(tmp_path, body, needle):
    env = fake_env(tmp_path, body)
    cs = cases(1, 2)
    data = fresh(env, cs)
    t0 = time.monotonic()
    rec = round_(env, cs, data, tmp_path, start_timeout=1.0)
    assert time.monotonic() - t0 < 15
    assert rec["status"] == "failed" and needle in rec["error"]
    for c in cs:
        cd = data[("fake", c.id)]
        assert cd.status == "error" and cd.error_kind == "env" and needle in cd.error
    if "stderr" in body:
        assert "worker boom" in rec["error"]  # the log's tail is in the message
    assert not any(alive(p) for p in pids_in(tmp_path))


def test_a_crash_after_the_last_case_loses_nothing(tmp_path):
    env = fake_env(tmp_path, LOOP.format(fault="pass") + "os.abort()\n")
    cs = cases(1, 2)
    data = fresh(env, cs)
    rec = round_(env, cs, data, tmp_path)
    assert rec["restarts"] == 0 and all(d.status == "ok" for d in data.values())
    assert not (tmp_path / "r0-1.spec.json").exists()


def test_a_worker_that_keeps_doing_nothing_is_given_up(tmp_path):
    env = fake_env(tmp_path, "w(type='hello', pid=os.getpid())\n")  # exits 0 without timing anything
    cs = cases(1, 2)
    data = fresh(env, cs)
    rec = round_(env, cs, data, tmp_path)
    assert rec["status"] == "failed" and "gave up" in rec["error"]


def test_hung_between_cases_is_restarted_for_the_rest(tmp_path):
    body = """
w(type="hello", pid=os.getpid())
for c in spec["cases"]:
    w(type="start", case=c["id"])
    ok(c)
    if c["batch"] == 1: time.sleep(60)
"""
    env = fake_env(tmp_path, body)
    cs = cases(1, 2)
    data = fresh(env, cs)
    rec = round_(env, cs, data, tmp_path, start_timeout=3.0)
    assert all(d.status == "ok" for d in data.values()) and rec["restarts"] == 1
    assert not any(alive(p) for p in pids_in(tmp_path))


def test_malformed_worker_records_fail_their_case_not_the_driver(tmp_path):
    body = """
w(type="hello", pid=os.getpid())
w(type="start", case="not-asked-for")
w(type="result", case="not-asked-for", status="ok")
c0, c1, c2 = spec["cases"]
w(type="start", case=c0["id"])
w(type="result", case=c0["id"], metrics={"wall_us": {"samples": [1.0]}})  # no status
w(type="start", case=c1["id"])
w(type="result", case=c1["id"], status="ok", metrics={"wall_us": {"samples": [1.0]}, "host_us": {"samples": ["x"]}})
_f.write("not json\\n[1, 2]\\n"); _f.flush()
w(type="start", case=c2["id"])
ok(c2)
"""
    env = fake_env(tmp_path, body)
    cs = cases(1, 2, 3)
    data = fresh(env, cs)
    rec = round_(env, cs, data, tmp_path)
    for c in cs[:2]:
        cd = data[("fake", c.id)]
        assert cd.status == "error" and cd.error_kind == "protocol" and "could not be read" in cd.error
        assert cd.rounds["wall_us"] == []  # nothing half-folded
    assert data[("fake", cs[2].id)].status == "ok" and rec["status"] == "ok" and rec["restarts"] == 0
    assert ("fake", "not-asked-for") not in data


def test_a_driver_error_keeps_what_was_measured(tmp_path):
    env = fake_env(tmp_path, LOOP.format(fault="pass"))
    cs = cases(1, 2)
    data, rounds = {}, []

    def on_case(env_label, cid, status):
        if status == "ok" and cid == cs[1].id:
            raise RuntimeError("planted driver bug")

    reason = runner.run_all([env], cs, Sampling(min_rounds=2, max_rounds=2, time_budget_s=600), device="cpu",
                            quick=False, work=tmp_path, case_timeout=5, stop=threading.Event(), data=data,
                            rounds=rounds, on_case=on_case)
    assert reason.startswith("driver error (RuntimeError: planted driver bug")
    assert "planted driver bug" in (tmp_path / "driver-error.txt").read_text()
    assert all(len(data[("fake", c.id)].rounds["wall_us"]) == 1 for c in cs)
    assert not any(alive(p) for p in pids_in(tmp_path))


def test_stop_interrupts_the_round_keeps_finished_cases_and_leaves_no_worker(tmp_path):
    body = """
w(type="hello", pid=os.getpid())
for c in spec["cases"]:
    w(type="start", case=c["id"])
    if c["batch"] == 2: time.sleep(60)
    ok(c)
"""
    env = fake_env(tmp_path, body)
    cs = cases(1, 2, 3)
    data = fresh(env, cs)
    stop = threading.Event()

    def interrupt():  # what the SIGINT/SIGTERM handler does
        time.sleep(1.0)
        stop.set()
        proc.terminate_all()

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        with pytest.raises(runner.Interrupted):
            round_(env, cs, data, tmp_path, stop=stop)
        with pytest.raises(proc.Stopped):  # nothing new starts while stopping
            proc.spawn([sys.executable, "-c", "pass"], log=tmp_path / "x.log")
    finally:
        proc.reset()
    assert data[("fake", cs[0].id)].status == "ok"
    # the case the interrupt cut short is not blamed on the worker; the rest were not run
    assert data[("fake", cs[1].id)].status == "pending" and data[("fake", cs[2].id)].status == "pending"
    assert not any(alive(p) for p in pids_in(tmp_path))


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


def test_run_all_resumes_only_missing_rounds_and_cases(tmp_path):
    env = fake_env(tmp_path, LOOP.format(fault="pass"))
    cs = cases(1, 2, 3)
    data = fresh(env, cs)
    # earlier run: round 0 complete, round 1 done for case 1 only, case 3 failed in round 0
    for c in cs:
        data[("fake", c.id)].rounds["wall_us"].append([1.0, 2.0])
        data[("fake", c.id)].status = "ok"
    data[("fake", cs[0].id)].rounds["wall_us"].append([3.0, 4.0])
    data[("fake", cs[2].id)].status, data[("fake", cs[2].id)].error = "error", "planted"
    rounds = [{"env": "fake", "round": 0, "status": "ok"}]
    reason = runner.run_all([env], cs, Sampling(min_rounds=3, max_rounds=3, time_budget_s=600), device="cpu",
                            quick=False, work=tmp_path, case_timeout=5, stop=threading.Event(), data=data,
                            rounds=rounds, elapsed_s=10.0)
    assert "min_rounds" in reason or "max_rounds" in reason
    specs = {f.name: [c["batch"] for c in json.loads(f.read_text())["cases"]] for f in tmp_path.glob("*.spec.json")}
    assert specs == {"r1-fake-0.spec.json": [2], "r2-fake-0.spec.json": [1, 2]}
    assert data[("fake", cs[0].id)].rounds["wall_us"][:2] == [[1.0, 2.0], [3.0, 4.0]]
    assert [len(data[("fake", c.id)].rounds["wall_us"]) for c in cs] == [3, 3, 1]
    assert [r["round"] for r in rounds] == [0, 1, 2]


def test_case_data_round_trips_through_results_json(tmp_path):
    c = cases(4)[0]
    cd = runner.CaseData("e", c)
    for line in ({"status": "ok", "metrics": {"wall_us": {"samples": [1.5, 2.5]}, "host_us": {"samples": [1.0]}},
                  "correctness": {"out": {"max_abs_err": 0.001, "rel_err": 0.002, "finite": True}}},
                 {"status": "ok", "metrics": {"wall_us": {"samples": [1.25]}, "host_us": {"samples": [0.75]}},
                  "correctness": {"out": {"max_abs_err": 0.003, "rel_err": 0.001, "finite": True}}}):
        runner._fold(cd, {"case": c.id, "seconds": 0.5, **line})
    rec = json.loads(json.dumps(results.case_record(cd, c)))
    back = runner.data_from_results({"cases": [rec, {**rec, "id": "not-in-config"}]}, [c])
    assert list(back) == [("e", c.id)]
    cd2 = back[("e", c.id)]
    assert cd2.rounds == cd.rounds and cd2.status == "ok"
    assert results.case_record(cd2, c)["correctness"] == rec["correctness"]
    assert results.case_record(cd2, c)["metrics"] == rec["metrics"]


# ---------------------------------------------------------------------------------------------
# real CPU runs with planted faults
FAULTS = """
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
sampling: {min_rounds: 2, max_rounds: 2, time_budget_s: 600}
"""
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
    iface.write_text(text.replace(anchor, FAULTS.lstrip("\n") + anchor))
    with open(src / "flash_attn" / "__init__.py", "a") as f:
        f.write(f"\nimport json as _j, os as _o\n"
                f"with open({str(dumps)!r} + '/env-%d.json' % _o.getpid(), 'w') as _f:\n"
                f"    _j.dump(dict(_o.environ), _f)\n")
    _wheel(src, fl)
    # noimport=9.0.6: installs, but importing it fails (the preflight must catch it)
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
                 "--config", str(cfg), "--device", "cpu", "--offline", "--case-timeout", "5",
                 "--find-links", str(standins["wheels"]), "--find-links", str(fl),
                 "--envs-dir", str(root / "envs"), "--wheel-cache", str(root / "cache"), "--output", str(out),
                 env={SECRET: "hunter2"}, timeout=400)
    return {"cp": cp, "root": root, "out": out, "dumps": dumps, "seconds": time.monotonic() - t0,
            "res": load_results(out) if (out / "results.json").exists() else None}


def _case(res, env, batch):
    return next(c for c in res["cases"] if c["env"] == env and c["batch"] == batch)


def test_fault_run_exits_3_with_results_written(fault_run):
    cp, res = fault_run["cp"], fault_run["res"]
    assert cp.returncode == 3, cp.stderr[-4000:]
    assert "Traceback" not in cp.stderr
    # min_rounds = max_rounds = 2: two rounds, whether or not every verdict was decided by then
    assert res is not None and (res["timing"]["stop_reason"] == "max_rounds 2 reached" or res["timing"]["stop_reason"].startswith("all verdicts decided"))
    assert sorted({r["round"] for r in res["rounds"]}) == [0, 1]
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


def test_each_worker_fault_fails_its_case_only(fault_run):
    res = fault_run["res"]
    expect = {11: ("crash", "SIGABRT"), 13: ("timeout", "--case-timeout 5 s"),
              14: ("error", "RuntimeError: stand-in: planted error"), 15: ("oom", "OutOfMemoryError")}
    for batch, (kind, needle) in expect.items():
        c = _case(res, "faulty", batch)
        assert c["status"] == "error" and c["error_kind"] == kind and needle in c["error"], c
    # every other case of both envs: measured in both rounds
    for env, batches in (("faulty", (1, 2)), ("good", (1, 2, 11, 13, 14, 15))):
        for b in batches:
            c = _case(res, env, b)
            assert c["status"] == "ok", c
            w = c["metrics"]["wall_us"]
            assert w["n_rounds"] == 2 and len(w["samples"]) == 2 and all(len(s) >= 5 for s in w["samples"])
    # the measured shapes are compared
    assert {c["case"] for c in res["comparisons"] if c["candidate"] == "faulty"} == \
        {_case(res, "good", 1)["id"], _case(res, "good", 2)["id"]}
    # round 0: the worker was restarted after the abort and the hang; round 1 retried no failed case
    r = {(x["round"], x["env"]): x for x in res["rounds"]}
    assert r[(0, "faulty")]["restarts"] == 2 and r[(1, "faulty")]["restarts"] == 0
    spec = json.loads((fault_run["out"] / ".work" / "r1-faulty-0.spec.json").read_text())
    assert sorted(c["batch"] for c in spec["cases"]) == [1, 2]
    err = " ".join(fault_run["cp"].stderr.split())
    assert "4 case(s) failed" in err


def test_no_worker_outlives_the_run(fault_run):
    pids = pids_in(fault_run["out"] / ".work")
    assert len(pids) >= 4
    assert not [p for p in pids if alive(p)]


def test_workers_and_probes_see_only_the_allow_listed_environment(fault_run):
    dumps = list(fault_run["dumps"].glob("env-*.json"))
    assert len(dumps) >= 3  # the preflight probe and the worker processes of the faulty env
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
sampling: {min_rounds: 2, max_rounds: 2, time_budget_s: 600, min_effect: 0.05}
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


def _rounds_written(path: Path) -> int:
    try:
        return len(json.loads(path.read_text())["rounds"])
    except (OSError, ValueError, KeyError):
        return 0


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

    def one_round():
        # results.json is replaced atomically: a reader never sees a half-written file
        f = out / "results.json"
        if f.exists():
            try:
                json.loads(f.read_text())
            except ValueError:
                seen_invalid.append(1)
        return _rounds_written(f) >= 1

    _wait_for(one_round, 240, "a round in results.json", cli)
    time.sleep(0.7)  # into the next worker
    cli.signal_and_wait(sig)
    err = cli.stderr()
    assert cli.poll() == 130, err[-3000:]
    assert "interrupted" in err and "Traceback" not in err
    assert not seen_invalid
    assert not _stray(str(tmp_path)), _stray(str(tmp_path))
    assert not [q for q in pids_in(out / ".work") if alive(q)]
    first = load_results(out)
    assert first["timing"]["stop_reason"] == "interrupted"
    done = [r for r in first["rounds"] if r["status"] == "ok"]
    assert 1 <= len(done) < 4
    kept = {(c["env"], c["id"]): c["metrics"]["wall_us"]["samples"] for c in first["cases"] if c["metrics"]}
    assert kept and all(len(s) >= 1 for s in kept.values())

    cp = run_cli("--resume", str(out))
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "resuming" in cp.stderr
    res = load_results(out)
    assert res["run_id"] == first["run_id"] and res["command"] == first["command"] and len(res["resumed"]) == 1
    assert res["timing"]["stop_reason"] != "interrupted"
    for c in res["cases"]:
        assert c["status"] == "ok"
        w = c["metrics"]["wall_us"]
        assert w["n_rounds"] == 2, c["id"]
        # the rounds measured before the interrupt are kept as they were
        before = kept.get((c["env"], c["id"]), [])
        assert w["samples"][:len(before)] == before
    for env in ("2.6.3", "2.7.0.post2"):  # each round of each env ran exactly once
        assert sorted(r["round"] for r in res["rounds"] if r["env"] == env and r["status"] == "ok") == [0, 1]
    for e in res["envs"]:
        assert e["build"]["reused"] is True
    assert {c["candidate"] for c in res["comparisons"]} == {"2.7.0.post2"}

    # nothing left to resume; --resume takes no other option; a missing run dir is a usage error
    cp = run_cli("--resume", str(out))
    assert cp.returncode == 0 and "nothing to resume" in cp.stderr
    cp = run_cli("--resume", str(out), "--quick")
    assert cp.returncode == 2 and "give no other option" in cp.stderr
    cp = run_cli("--resume", str(tmp_path / "nope"))
    assert cp.returncode == 2 and "cannot read" in cp.stderr


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
    (e,) = res["envs"]
    assert e["status"] == "failed" and e["error"].startswith("interrupted")
