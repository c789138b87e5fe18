"""Scale-out (shard module): sharding rules, the merge of shards' results (the same comparisons as
one run on the same data, Bonferroni over the whole run, never pairing across shards), and the
submitit path end to end on CPU: `--executor submitit-local` runs a sharded stand-in matrix (two
jobs, each `matrix-run run --shard I/2`), merges it, and a lost job fails only its own cases."""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from conftest import load_results, run_cli

from matrix_runner import cli, report, results, runner, shard
from matrix_runner.config import Case, Sampling, parse_config
from matrix_runner.envs import UsageError

CFG = parse_config({"ops": ["fwd", "bwd"], "shapes": [
    {"batch": b, "seqlen": s, "nheads": 2, "head_dim": 16} for b in (1, 2) for s in (16, 32, 64)]}, "test")


# -- rules ------------------------------------------------------------------------------------------
def test_share_partitions_the_cases_keeping_a_shapes_ops_together():
    cases = CFG.cases
    for n in (1, 2, 3, 4, 6, 7, 20):
        parts = [shard.share(cases, i, n) for i in range(n)]
        ids = [c.id for p in parts for c in p]
        assert sorted(ids) == sorted(c.id for c in cases) and len(set(ids)) == len(ids)  # each case once
        if n <= 6:  # 6 shapes: a shape's fwd and bwd in one shard, shards differ by at most one shape
            for p in parts:
                keys = {shard._shape_key(c) for c in p}
                assert len(p) == 2 * len(keys)
            assert max(map(len, parts)) - min(map(len, parts)) <= 2


def test_resolve_gpus_and_split_cpus(monkeypatch):
    found = [{"index": i, "uuid": f"GPU-{i}aaa", "name": "H200", "bus_id": f"00000000:{i:02x}:00.0",
              "numa_node": i // 2} for i in range(4)]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert shard.resolve_gpus(None, "cuda", found) == []
    assert shard.resolve_gpus("all", "cuda", found[:1]) == []  # one GPU: the unsharded run, as before
    assert [g["index"] for g in shard.resolve_gpus("all", "cuda", found)] == [0, 1, 2, 3]
    assert [g["index"] for g in shard.resolve_gpus("2,0", "cuda", found)] == [2, 0]
    with pytest.raises(UsageError, match="no GPU 7 here"):
        shard.resolve_gpus("0,7", "cuda", found)
    with pytest.raises(UsageError, match="comma list"):
        shard.resolve_gpus("0,x", "cuda", found)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,GPU-3")
    assert [g["index"] for g in shard.resolve_gpus("all", "cuda", found)] == [1, 3]
    assert [g["index"] for g in shard.resolve_gpus("0,1", "cpu")] == [0, 1]  # CPU: only shard names
    # CPUs: the NUMA node's CPUs where sysfs knows it, else an even share; never overlapping
    monkeypatch.setattr(shard.machine, "node_cpus", lambda n: list(range(8 * n, 8 * n + 8)))
    parts = shard.split_cpus(list(range(16)), found)
    assert parts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    monkeypatch.setattr(shard.machine, "node_cpus", lambda n: [])
    parts = shard.split_cpus([0, 1, 2, 3, 4], found[:2])
    assert parts == [[0, 1, 2], [3, 4]]


def test_job_argv_drops_the_drivers_options():
    argv = ["run", "--versions", "a,b", "--executor", "slurm", "--shards=3", "--slurm-partition", "gpu",
            "--gpus", "all", "--output", "R", "--max-sets", "4"]
    assert shard.job_argv(argv, 1, 3, Path("R")) == ["run", "--versions", "a,b", "--max-sets", "4",
                                                     "--shard", "1/3", "--output", str(Path("R/shards/1"))]
    assert shard.parse_shard("1/3") == (1, 3)
    with pytest.raises(UsageError):
        shard.parse_shard("3/3")


# -- the statistics of a sharded run ----------------------------------------------------------------
def _recorded(seed: int = 3) -> dict:
    """CaseData of two envs x the config's cases, 6 process sets of 12 cycles, candidate 1.0-1.3x."""
    rng = random.Random(seed)
    data = {}
    for k, c in enumerate(CFG.cases):
        eff = 1.0 + 0.06 * (k % 6)
        for lab, f in (("a", 1.0), ("b", eff)):
            cd = runner.CaseData(lab, c)
            cd.status = "ok"
            for m in ("wall_us", "host_us"):
                cd.sets[m] = {s: {cy: 50 * f * rng.lognormvariate(0, 0.04) for cy in range(12)} for s in range(6)}
            data[(lab, c.id)] = cd
    return data


def _doc(data: dict, cases: list[Case], settings: dict, sets: list | None = None) -> dict:
    recs = [results.case_record(data[(lab, c.id)], c) for c in cases for lab in ("a", "b")]
    return {"schema": results.SCHEMA, "run_id": "r", "envs": [{"label": "a", "status": "ok"},
                                                              {"label": "b", "status": "ok"}],
            "settings": settings, "cases": recs, "sets": sets or [], "timing": {"stop_reason": "x"},
            "comparisons": results.comparisons(recs, ["a", "b"], settings["min_effect"], settings=settings)}


def test_merged_shards_give_the_comparisons_of_one_run_on_the_same_data():
    data = _recorded()
    settings = {"alpha": 0.05, "min_effect": 0.05, "planned_sets": 8, "quick": False}
    whole = _doc(data, CFG.cases, settings)
    n = 3
    docs = [_doc(data, shard.share(CFG.cases, i, n), settings, [{"set": s} for s in range(6)]) for i in range(n)]
    for i, d in enumerate(docs):
        d["shard"] = {"index": i, "count": n}
    merged = results.merge_shards(list(reversed(docs)), case_order=[c.id for c in CFG.cases])
    assert [(c["id"], c["env"]) for c in merged["cases"]] == [(c["id"], c["env"]) for c in whole["cases"]]
    assert json.dumps(merged["comparisons"], sort_keys=True) == json.dumps(whole["comparisons"], sort_keys=True)
    assert {c["verdict"] for c in whole["comparisons"]} >= {"slower"}  # not a vacuous comparison
    assert len(merged["sets"]) == 18 and {s["shard"] for s in merged["sets"]} == {0, 1, 2}
    assert [s["index"] for s in merged["shards"]] == [2, 1, 0]
    # the running stopping rule of a shard (runner.comparisons_now with family_extra): the whole run's
    # Bonferroni level, and e-BY over the shard's own decided comparisons -- a subset of the run's
    # selection, so never narrower than the whole run's interval, and a decided verdict is the run's
    samp = Sampling(planned=8)  # tuned as the run's settings say (planned_sets 8)
    full = runner.comparisons_now(data, ["a", "b"], CFG.cases, samp, "wall_us")
    for v in full.values():  # e-BY: a decided one at alpha k/m (k decided alike), the rest at alpha/m
        k = sum(w["selection"] == v["selection"] for w in full.values()) if v["selection"] else 1
        assert v["alpha"] == samp.alpha * k / len(full)
    assert sum(v["selection"] == "faster/slower" for v in full.values()) >= 6
    for i in range(n):
        mine = shard.share(CFG.cases, i, n)
        part = runner.comparisons_now(data, ["a", "b"], mine, samp, "wall_us",
                                      family_extra=len(CFG.cases) - len(mine))
        assert set(part) == {k for k in full if k[2] in {c.id for c in mine}}  # (baseline, candidate, case)
        for k, v in part.items():
            assert v["alpha"] == samp.alpha * (v["selected"] or 1) / len(CFG.cases) <= full[k]["alpha"]
            assert v["ci_high"] >= full[k]["ci_high"] and v["ci_low"] <= full[k]["ci_low"]
            assert v["verdict"] in (full[k]["verdict"], "ambiguous")
            assert v["ratio"] == full[k]["ratio"] and v["set_log_ratios"] == full[k]["set_log_ratios"]
        narrower = runner.comparisons_now(data, ["a", "b"], mine, samp, "wall_us")
        assert any(narrower[k]["ci_high"] < part[k]["ci_high"] for k in part)
    # a case in two shards is refused: shards time disjoint shares
    with pytest.raises(results.ResultsError, match="in another shard too"):
        results.merge_shards([docs[0], docs[0]])


# -- end to end: submitit's local executor --------------------------------------------------------
TINY2 = """
title: sharded tiny
ops: [fwd]
shapes:
  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}
  - {batch: 2, seqlen: 32, nheads: 2, head_dim: 16}
"""


@pytest.fixture(scope="module")
def sharded_run(standins, tmp_path_factory):
    pytest.importorskip("submitit")
    root = tmp_path_factory.mktemp("shard")
    cfg = root / "cfg.yaml"
    cfg.write_text(TINY2)
    out = root / "run"
    common = ["--versions", "2.6.3,2.7.0.post2", "--config", str(cfg), "--device", "cpu", "--offline",
              "--find-links", str(standins["wheels"]), "--envs-dir", str(root / "envs"),
              "--wheel-cache", str(root / "cache"), "--max-sets", "1", "--set-seconds", "0.3", "--burst-ms", "2",
              "--workers-per-env", "1"]
    cp = run_cli(*common, "--executor", "submitit-local", "--shards", "2", "--output", str(out), timeout=300)
    return {"cp": cp, "out": out, "common": common, "root": root, "cfg": cfg}


def test_submitit_local_jobs_each_get_their_own_cpus(monkeypatch):
    """submitit-local runs every job on this machine: each plans its sets within its own share of the
    CPUs (new-user trial: both jobs pinned their sets to the same quietest core at once)."""
    monkeypatch.setattr(shard.machine, "allowed_cpus", lambda: list(range(16)))
    assert shard.local_job_cpus("auto", 2, list(range(16))) == [list(range(8)), list(range(8, 16))]
    assert shard.local_job_cpus(None, 3, [0, 1, 2, 3, 4]) == [[0, 1], [2, 3], [4]]
    assert shard.local_job_cpus("unpinned", 2, list(range(16))) is None
    # a --cpus LIST: its CPUs split between the jobs, each also given a share of the others (its driver's)
    assert shard.local_job_cpus("4,5,6,7", 2, list(range(8))) == [[0, 1, 4, 5], [2, 3, 6, 7]]
    with pytest.raises(UsageError, match="1 CPU\\(s\\) for 2 jobs"):
        shard.local_job_cpus("3", 2, list(range(8)))
    argv = ["run", "--versions", "a", "--cpus", "4,5,6,7", "--cpus=1", "--quick"]
    assert shard.with_cpus(argv, [4, 5]) == ["run", "--versions", "a", "--quick", "--cpus", "4,5"]
    cmd = shard.pinned_command([sys.executable, "-c", "import os, sys; print(sorted(os.sched_getaffinity(0)), sys.argv[1:])",
                                "x", "y"], [0])
    import subprocess

    monkeypatch.undo()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[0] ['x', 'y']"
    assert shard.pinned_command(["python", "-m", "m"], None) == ["python", "-m", "m"]


def test_submitit_local_runs_a_sharded_matrix_end_to_end(sharded_run):
    cp, out = sharded_run["cp"], sharded_run["out"]
    assert cp.returncode == 0, cp.stdout[-3000:] + cp.stderr[-3000:]
    res = load_results(out)
    ids = [c.id for c in parse_config(res["config"], "x").cases]
    assert [(c["id"], c["env"]) for c in res["cases"]] == [(i, e) for i in ids for e in ("2.6.3", "2.7.0.post2")]
    assert all(c["status"] == "ok" and c["metrics"]["wall_us"]["n_rounds"] >= 1 for c in res["cases"])
    assert [s["index"] for s in res["shards"]] == [0, 1] and res["timing"]["shards_lost"] == []
    for i, sid in enumerate(ids):  # each case timed by its own job, which wrote its own results
        sub = load_results(out / "shards" / str(i))
        assert sub["shard"]["index"] == i and [c["id"] for c in sub["cases"]] == [sid, sid]
        assert "--shard" in sub["command"] and f"{i}/2" in sub["command"]
    assert "--shard" not in res["command"] and "submitit-local" in res["command"]
    # each job planned within its own CPUs: no core pinned by both (local_job_cpus)
    allowed = [load_results(out / "shards" / str(i))["settings"]["cpus"]["allowed"] for i in range(2)]
    assert allowed[0] and allowed[1] and not set(allowed[0]) & set(allowed[1]), allowed
    # the run's own wall time (not a shard's), each shard's CPUs and timing, said in the terminal and the
    # report; the ratio's definition says how the sets were pinned (second new-user trial)
    assert res["timing"]["total_s"] >= max(s["timing_phase_s"] for s in res["shards"])
    assert all(s["cpus"] and s["cpus"]["allowed"] == a for s, a in zip(res["shards"], allowed))
    text = " ".join((cp.stdout + cp.stderr).split())
    assert "shard 0/2: timing " in text and "shard 1/2: timing " in text and "the shards timed at once" in text
    html = (out / "index.html").read_text()
    assert "one after another within each shard, the shards at once" in html
    pinned = [s["pinned"] for s in res["sets"]]
    if not any(pinned):  # one CPU per job (this 2-core machine): every set unpinned, and said so
        assert "fresh workers of every version, unpinned: the OS placed them" in report.view_model(res)["ratio_def"]
        assert "all pinned to one CPU core" not in html
    # the verdicts are those of one run on the same data (the union of the shards' sets)
    again = results.comparisons(res["cases"], ["2.6.3", "2.7.0.post2"], res["settings"]["min_effect"],
                                settings=res["settings"])
    assert json.dumps(results._finite(again), sort_keys=True) == json.dumps(res["comparisons"], sort_keys=True)
    assert (out / "index.html").exists()


def test_a_lost_job_fails_only_its_cases_and_resume_reruns_only_it(sharded_run, monkeypatch, tmp_path):
    """Through submitit's local executor: job 1 dies before it writes anything, job 0 'runs' by
    copying the first run's shard 0: shard 1's cases fail naming the job, shard 0's are reported;
    --resume then resubmits job 1 only (here it copies the first run's shard 1)."""
    src = sharded_run["out"] / "shards"
    out = tmp_path / "run"
    copy = "import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2])"
    calls = []

    def fake(argv, i, n, out_dir, resume=False):
        calls.append(i)
        if i == 0:
            return [sys.executable, "-c", copy, str(src / "0"), str(shard.shard_dir(out_dir, 0))]
        return [sys.executable, "-c", "import sys; print('node failure', file=sys.stderr); sys.exit(2)"]

    monkeypatch.setattr(shard, "job_command", fake)
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    rc = cli.main([*sharded_run["common"], "--executor", "submitit-local", "--shards", "2", "--output", str(out)])
    assert rc == cli.EXIT_FAILED and sorted(calls) == [0, 1]
    res = load_results(out)
    lost = [c for c in res["cases"] if c["status"] != "ok"]
    assert lost and all(c["error_kind"] == "shard lost" and "shard 1/2 (job " in c["error"]
                        and "node failure" in c["error"] for c in lost)
    ok = [c for c in res["cases"] if c["status"] == "ok"]
    assert {c["id"] for c in ok} == {c["id"] for c in load_results(src / "0")["cases"]}
    assert {c["id"] for c in lost}.isdisjoint({c["id"] for c in ok})
    assert res["timing"]["shards_lost"] == [1] and [s.get("lost") is not None for s in res["shards"]] == [False, True]
    assert {c["case"] for c in res["comparisons"]} == {c["id"] for c in ok}

    def fake2(argv, i, n, out_dir, resume=False):
        calls.append(("again", i))
        return [sys.executable, "-c", copy, str(src / "1"), str(shard.shard_dir(out_dir, 1))]

    monkeypatch.setattr(shard, "job_command", fake2)
    rc = cli.main(["--resume", str(out)])
    assert rc == cli.EXIT_OK, rc
    assert calls[2:] == [("again", 1)]  # only the lost shard is resubmitted
    res = load_results(out)
    assert all(c["status"] == "ok" for c in res["cases"]) and res["timing"]["shards_lost"] == []
    assert len(res["cases"]) == 4 and len(res["comparisons"]) == len(load_results(sharded_run["out"])["comparisons"])


def test_gpu_shards_run_at_once_each_on_its_gpu_and_a_lost_gpu_fails_only_its_cases(tmp_path, monkeypatch):
    """shard.time_local on fake workers (test_faults' protocol fakes): two shards, each a
    runner.run_all in its own thread; the workers of shard 1 see CUDA_VISIBLE_DEVICES = GPU 1's UUID,
    where env "new" cannot start (a lost GPU): only shard 1's cases of "new" fail, naming shard and
    GPU; shard 0 is measured and compared; set records and case records name their shard and GPU."""
    import threading

    from test_faults import HELLO, cases, fake_env

    monkeypatch.setattr(runner, "START_TIMEOUT_S", 2.0)
    monkeypatch.setattr(runner.GpuMonitor, "_read", lambda self: (1980.0, 0))
    lost = f'if os.environ.get("CUDA_VISIBLE_DEVICES") == "GPU-1b":\n    sys.exit(4)\n{HELLO}'
    envs = [fake_env(tmp_path, "base"), fake_env(tmp_path, "new", start=lost)]
    cs = cases(1, 2, 3, 4)
    gpus = [{"index": i, "uuid": f"GPU-{i}b", "name": "fake", "numa_node": None} for i in (0, 1)]
    data, sets = {}, []
    seen = []
    reason, info = shard.time_local(envs, cs, Sampling(set_seconds=0.2, time_budget_s=120, max_sets=2, burst_ms=1.0),
                                    gpus, device="cuda", quick=False, work=tmp_path / "work", case_timeout=2.0,
                                    stop=threading.Event(), data=data, sets=sets, cpus_request="unpinned",
                                    on_set=lambda r: seen.append((r["shard"], len(sets))))
    share = [[c.id for c in shard.share(cs, i, 2)] for i in (0, 1)]
    assert [s["cases"] for s in info] == share and all(s["gpu"]["uuid"] == f"GPU-{i}b" for i, s in enumerate(info))
    assert [e.status for e in envs] == ["ok", "ok"]  # failed on one GPU only: not failed for the run
    for cid in share[0]:
        for lab in ("base", "new"):
            cd = data[(lab, cid)]
            assert cd.status == "ok" and cd.sets["wall_us"] and cd.gpu["index"] == 0 and cd.gpu["shard"] == 0
            assert cd.gpu["sm_clock_mhz_max"] in (None, 1980.0)
    for cid in share[1]:
        cd = data[("new", cid)]
        assert cd.status == "error" and "shard 1/2 on GPU 1" in cd.error and "exited with code 4" in cd.error, cd.error
        assert data[("base", cid)].status != "error" and data[("base", cid)].gpu["index"] == 1
    assert {s["shard"] for s in sets} == {0, 1} and all(s["gpu_index"] == s["shard"] for s in sets)
    assert len(seen) == len(sets)  # on_set after every set of every shard, with the sets so far
    assert "shard 0" in reason or "max_sets" in reason
    cmp = runner.comparisons_now(data, ["base", "new"], cs, Sampling(), "wall_us")
    assert set(k[2] for k in cmp) == set(share[0])  # (baseline, candidate, case)


def test_a_resumed_gpu_sharded_run_deals_each_set_back_to_its_shard(tmp_path):
    """--resume of a --gpus run: the sets and cases read back from results.json go back to the shard
    that timed them; each shard goes on with its own next set ids, and nothing is re-timed."""
    import threading

    from test_faults import _through_results, cases, fake_env

    envs = [fake_env(tmp_path, "a"), fake_env(tmp_path, "b")]
    cs = cases(1, 2, 3)
    gpus = [{"index": i, "uuid": None, "name": "cpu", "numa_node": None} for i in (0, 1)]

    def go(data, sets, max_sets, work):
        return shard.time_local(envs, cs, Sampling(set_seconds=0.2, time_budget_s=120, max_sets=max_sets, burst_ms=1.0),
                                gpus, device="cpu", quick=False, work=tmp_path / work, case_timeout=2.0,
                                stop=threading.Event(), data=data, sets=sets, cpus_request="unpinned")

    data, sets = {}, []
    go(data, sets, 1, "w1")
    assert sorted((s["shard"], s["set"]) for s in sets) == [(0, 0), (1, 0)]
    first = {k: dict(cd.sets["wall_us"][0]) for k, cd in data.items()}
    data2, sets2 = _through_results(data, sets, cs)
    go(data2, sets2, 2, "w2")
    assert sorted((s["shard"], s["set"]) for s in sets2) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for k, cd in data2.items():
        assert cd.status == "ok" and sorted(cd.sets["wall_us"]) == [0, 1]
        assert cd.sets["wall_us"][0] == pytest.approx(first[k])  # kept as measured, not re-timed
