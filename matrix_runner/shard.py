"""Scale-out: the cases of a run sharded over the GPUs of a host (``--gpus``) or over jobs of a
scheduler (``--executor slurm``, through submitit).

Rules:

- A *shard* times a share of the cases (:func:`share`: whole shapes, round-robin in config order).
  Every version of a case runs in the same shard, on the same GPU: a ratio is only ever measured
  between versions on one device. Absolute times of different cases may come from different GPUs;
  the report pools only ratios.
- ``--gpus all|LIST`` (``--executor local``, the default): one shard per GPU, all in this driver,
  concurrently (one thread each running :func:`runner.run_all`). Each shard's workers see only its
  GPU (``CUDA_VISIBLE_DEVICES`` = the GPU's UUID) and are pinned to CPUs of their own
  (:func:`split_cpus`: the GPU's NUMA node where sysfs says, the machine's CPUs split evenly
  between the shards otherwise; then :func:`lockstep.plan_cpus` within that share). ``--gpus all``
  on a machine with one GPU (or none) is the unsharded run, unchanged. With ``--device cpu`` the
  LIST only names shards (tests).
- ``--executor slurm`` (and ``submitit-local``, the same path on this machine through submitit's
  LocalExecutor, for tests): ``--shards N`` jobs, one GPU each; job I runs ``matrix-run run --shard
  I/N --output RUN/shards/I ...`` (the hidden ``--shard``: time only share I of N, write its own
  results.json), then the driver merges the shards' results (:func:`results.merge_shards`) into
  RUN/results.json and the report. Envs are prepared by each job under the env's file lock, so a
  shared ``--envs-dir`` is built once and reused; the compile cache serves per-node builds.
- Statistics: the family (m of stats.select_family) is the whole run's comparisons in every shard
  (``family_extra`` of :func:`runner.run_all`: the other shards' comparisons); while it runs, a
  shard's e-BY selection is among its own comparisons, a subset of the run's, so its stopping rule is
  never laxer than the run's; a case's process sets come from its one shard, so the merged
  comparisons are :func:`results.comparisons` on the union of the cases.
- Faults: a shard whose thread or job is lost, or whose GPU fails, fails only its own cases (status
  error, ``error_kind`` "shard lost", naming the shard, GPU and job); the other shards are reported.
  ``--resume RUN`` reruns only the shards that did not finish (a job with no results, or an
  interrupted one, is resubmitted; a finished shard is kept).
"""
from __future__ import annotations

import argparse
import copy
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Callable

from . import lockstep, machine, results, runner
from .config import Case, Sampling
from .envs import EnvResult, UsageError

EXECUTORS = ("local", "slurm", "submitit-local")


def add_args(r: argparse.ArgumentParser) -> None:
    """The scale-out options of ``matrix-run run`` (one block)."""
    g = r.add_argument_group("scale-out (several GPUs, Slurm)")
    g.add_argument("--gpus", default=None, metavar="all|LIST",
                   help="shard the cases over these GPUs (nvidia-smi indices) or all of them, one shard per GPU, "
                        "timed at once; every version of a case runs on the same GPU (default: one GPU, as "
                        "CUDA_VISIBLE_DEVICES shows it)")
    g.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: shards in this process (default); slurm: one Slurm job per shard through submitit "
                        "(--shards jobs of one GPU each), results merged here; submitit-local: the slurm path with "
                        "submitit's local executor (tests)")
    g.add_argument("--shards", type=int, default=None, metavar="N",
                   help="jobs for --executor slurm|submitit-local (default: the number of --gpus given, else 2)")
    g.add_argument("--slurm-partition", metavar="NAME", help="Slurm partition of the jobs")
    g.add_argument("--slurm-account", metavar="NAME", help="Slurm account charged for the jobs")
    g.add_argument("--slurm-time", type=int, default=60, metavar="MIN",
                   help="Slurm time limit of each job, minutes (default 60; includes building/reusing envs)")
    g.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # I/N: a job's share (set by the driver)


#: Options that mean something only for shards as jobs (``--executor slurm|submitit-local``).
JOB_OPTIONS = ("--shards", "--slurm-partition", "--slurm-account", "--slurm-time")


def check_args(args, given: set[str]) -> None:
    """The scale-out options' usage checks, before anything is built or made; ``given``: the option
    names on the command line. The job options (:data:`JOB_OPTIONS`) with the local executor had been
    ignored without a word (new-user trial), and ``--executor slurm`` needs Slurm here (:func:`need_slurm`)."""
    if args.executor == "local":
        stray = [o for o in JOB_OPTIONS if o in given]
        if stray:
            raise UsageError(f"{', '.join(stray)} {'needs' if len(stray) == 1 else 'need'} --executor slurm or "
                             "submitit-local (one job per shard); the local executor (the default) shards over "
                             "this machine's GPUs, one per GPU of --gpus")
    if args.shards is not None and args.shards < 1:
        raise UsageError(f"--shards {args.shards}: give a positive number of jobs")
    if submitted(args):
        need_slurm(args.executor)


def need_slurm(executor: str) -> None:
    """UsageError where ``executor`` is slurm and Slurm's srun or sbatch is not on PATH (submitit's
    SlurmExecutor looks for srun when it is made, and submits with sbatch); it had been submitit's
    RuntimeError, an "internal error", after the run directory was made (new-user trial)."""
    missing = [t for t in ("srun", "sbatch") if shutil.which(t) is None] if executor == "slurm" else []
    if missing:
        raise UsageError(f"--executor slurm needs Slurm ({'/'.join(missing)} not found on PATH): run it on a "
                         "cluster's login node, or use --executor submitit-local to try it here")


# -- which shards ----------------------------------------------------------------------------------
def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``"I/N"`` -> (I, N), 0 <= I < N; None for None. UsageError naming the rule otherwise."""
    if text is None:
        return None
    try:
        i, n = (int(x) for x in str(text).split("/"))
    except ValueError:
        raise UsageError(f"--shard {text!r}: give I/N, e.g. 0/2") from None
    if not 0 <= i < n:
        raise UsageError(f"--shard {text!r}: I must be in 0..N-1")
    return i, n


def share(cases: list[Case], index: int, count: int) -> list[Case]:
    """Shard ``index`` of ``count``'s cases: the shapes (every op of a shape together) dealt
    round-robin in config order, or the cases themselves where there are fewer shapes than shards.
    Every (case, version) pair is in exactly one shard; config order is kept within a shard."""
    if count <= 1:
        return list(cases)
    keys = list(dict.fromkeys(_shape_key(c) for c in cases))
    if len(keys) >= count:
        mine = set(keys[index::count])
        return [c for c in cases if _shape_key(c) in mine]
    return list(cases[index::count])


def _shape_key(c: Case) -> tuple:
    d = c.to_dict()
    return tuple((k, str(v)) for k, v in sorted(d.items()) if k not in ("op", "id", "label"))


def resolve_gpus(request: str | None, device: str, found: list[dict] | None = None) -> list[dict]:
    """The GPUs of ``--gpus`` (dicts of :func:`machine.gpus`); [] means the unsharded run.

    ``None``: []. ``all``: every GPU nvidia-smi lists (only those in ``CUDA_VISIBLE_DEVICES`` where
    it is set, by index or UUID); one GPU or none gives []. ``LIST``: those nvidia-smi indices (a
    UsageError names the ones that do not exist). With ``device`` cpu, ``LIST`` only names shards
    (``{index, uuid: None}``) and ``all`` is []."""
    if request is None:
        return []
    if device == "cpu":
        if request == "all":
            return []
        return [{"index": i, "uuid": None, "name": "cpu", "numa_node": None} for i in _int_list(request, "--gpus")]
    found = machine.gpus() if found is None else found
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None and vis.strip():
        want = [v.strip() for v in vis.split(",") if v.strip()]
        found = [g for g in found if str(g["index"]) in want or any(g["uuid"].startswith(w) for w in want)]
    if request == "all":
        return found if len(found) > 1 else []
    idx = _int_list(request, "--gpus")
    by = {g["index"]: g for g in found}
    bad = [i for i in idx if i not in by]
    if bad:
        raise UsageError(f"--gpus {request}: no GPU {', '.join(map(str, bad))} here (nvidia-smi lists "
                         f"{', '.join(str(g['index']) for g in found) or 'none'}); give indices it lists, or all")
    return [by[i] for i in idx]


def gpu_indices(request: str) -> list[int]:
    """The indices of ``--gpus LIST`` (UsageError for anything but distinct integers, before the run
    prints or builds anything); which of them exist is checked by :func:`resolve_gpus`."""
    return _int_list(request, "--gpus")


def _int_list(text: str, opt: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{opt} {text!r}: give all or a comma list of GPU indices, e.g. 0,1") from None
    if not out or len(set(out)) != len(out):
        raise UsageError(f"{opt} {text!r}: give all or a comma list of distinct GPU indices, e.g. 0,1")
    return out


def split_cpus(allowed: list[int], gpus: list[dict]) -> list[list[int]]:
    """Each shard's CPUs: the allowed CPUs of its GPU's NUMA node (shared out evenly between the
    shards of one node), or, where a node is unknown or has no allowed CPU, an even contiguous
    share of all allowed CPUs. Shares never overlap."""
    n = len(gpus)
    by_node: dict = {}
    for i, g in enumerate(gpus):
        by_node.setdefault(g.get("numa_node"), []).append(i)
    out: list[list[int] | None] = [None] * n
    taken: set = set()
    for node, idx in by_node.items():
        if node is None:
            continue
        cpus = [c for c in machine.node_cpus(node) if c in allowed]
        if len(cpus) < len(idx):
            continue
        for j, i in enumerate(idx):
            out[i] = _chunk(cpus, len(idx), j)
            taken.update(out[i])
    rest_idx = [i for i in range(n) if out[i] is None]
    rest = [c for c in allowed if c not in taken]
    for j, i in enumerate(rest_idx):
        out[i] = _chunk(rest, len(rest_idx), j)
    return out  # type: ignore[return-value]


def _chunk(xs: list, n: int, j: int) -> list:
    k, r = divmod(len(xs), n)
    a = j * k + min(j, r)
    return xs[a:a + k + (1 if j < r else 0)]


# -- shards as threads of this driver --------------------------------------------------------------
def time_local(envs: list[EnvResult], cases: list[Case], sampling: Sampling, gpus: list[dict], *, device: str,
               quick: bool, work: Path, case_timeout: float, stop: threading.Event, data: dict, sets: list,
               cpus_request: str | None, on_set: Callable[[dict], None] = lambda r: None,
               on_progress: Callable[[str], None] = lambda m: None, elapsed_s: float = 0.0,
               log: Callable[[str], None] = lambda m: None) -> tuple[str, list[dict]]:
    """Time ``cases`` sharded over ``gpus`` at once, one :func:`runner.run_all` per GPU in its own
    thread; ``data`` and ``sets`` are filled as by run_all (set records carry ``shard`` and ``gpu``;
    ``sets`` and ``data`` of a resumed run are dealt back to their shards). Returns (why sampling
    stopped, one record per shard: index, gpu, cases, cpus, stop_reason, timing_phase_s)."""
    n = len(gpus)
    labels = [e.label for e in envs]
    shares = [share(cases, i, n) for i in range(n)]
    allowed = machine.allowed_cpus()
    parts = split_cpus(allowed, gpus) if cpus_request != "unpinned" else [[] for _ in gpus]
    lists = None
    if cpus_request not in (None, "auto", "unpinned"):
        want = lockstep.parse_cpus(cpus_request) or []
        if len(want) < n:
            raise UsageError(f"--cpus {cpus_request}: {len(want)} CPU(s) for {n} GPU shards; give at least one per GPU")
        lists = [_chunk(want, n, j) for j in range(n)]
    info, threads, lock = [], [], threading.Lock()
    # each shard its own copies of the envs: an env that fails on one GPU fails there only
    shard_envs = [[copy.copy(e) for e in envs] for _ in range(n)]
    shard_data = [dict() for _ in range(n)]
    shard_sets: list[list] = [[] for _ in range(n)]
    for rec in sets:  # a resumed run: each set back to its shard
        if isinstance(rec.get("shard"), int) and rec["shard"] < n:
            shard_sets[rec["shard"]].append(rec)
    for (lab, cid), cd in data.items():
        for i, sh in enumerate(shares):
            if any(c.id == cid for c in sh):
                shard_data[i][(lab, cid)] = cd
    for i, g in enumerate(gpus):
        if cpus_request == "unpinned":
            plan = lockstep.plan_cpus("unpinned")
        else:
            req = ",".join(map(str, lists[i])) if lists else "auto"
            mine = parts[i] + (lists[i] if lists else [])
            plan = lockstep.plan_cpus(req, n_sets=lockstep.pool_size(len(mine), sampling.cpu_hop), allowed=mine)
        info.append({"index": i, "count": n, "gpu": _gpu_rec(g), "cases": [c.id for c in shares[i]],
                     "cpus": plan, "stop_reason": None, "timing_phase_s": None})
        log(f"shard {i}/{n}: GPU {g['index']} ({g.get('uuid') or g.get('name')}), {len(shares[i])} case(s), "
            + (f"sets on CPU(s) {', '.join(map(str, plan['set_cpus']))}, driver thread on {plan['driver_cpu']}"
               if plan["pinned"] else f"unpinned ({plan['why']})"))

    def one(i: int) -> None:
        g = gpus[i]
        samp = copy.deepcopy(sampling)
        extra = (len(labels) - 1) * (len(cases) - len(shares[i]))
        env = {"CUDA_VISIBLE_DEVICES": g["uuid"]} if device == "cuda" and g.get("uuid") else None
        t0 = time.monotonic()

        def set_done(rec, _i=i):
            rec["shard"], rec["gpu_index"] = _i, g["index"]
            with lock:  # the caller's data and sets follow every shard (partial results.json)
                data.update(shard_data[_i])
                sets.append(rec)
                on_set(rec)

        try:
            reason = runner.run_all(shard_envs[i], shares[i], samp,
                                    device=device, quick=quick, work=work / f"shard{i}", case_timeout=case_timeout,
                                    stop=stop, data=shard_data[i], sets=shard_sets[i], cpus=info[i]["cpus"],
                                    on_set=set_done, on_progress=lambda m, _i=i: on_progress(f"shard {_i}: {m}"),
                                    elapsed_s=elapsed_s, family_extra=extra, gpu_index=g["index"], worker_env=env)
        except BaseException as ex:  # noqa: BLE001 - a lost shard fails its own cases only
            reason = f"driver error (shard {i}: {type(ex).__name__}: {ex})"
        info[i]["stop_reason"] = reason
        info[i]["timing_phase_s"] = round(time.monotonic() - t0, 2)

    for i in range(n):
        t = threading.Thread(target=one, args=(i,), name=f"matrix-run-shard-{i}", daemon=True)
        threads.append(t)
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(timeout=0.5)
    data.clear()
    sets.clear()
    for i in range(n):
        seen = clocks_seen(shard_sets[i])
        for key, cd in shard_data[i].items():
            cd.gpu = {**info[i]["gpu"], "shard": i, **seen}
            if info[i]["stop_reason"].startswith("driver error") and cd.status == "pending":
                cd.fail("shard lost", f"shard {i}/{n} on GPU {gpus[i]['index']} stopped: {info[i]['stop_reason']}")
            data[key] = cd
        sets.extend(shard_sets[i])
    for k, e in enumerate(envs):
        copies = [shard_envs[i][k] for i in range(n)]
        ok = [c for c in copies if c.status != "failed"]
        if not ok:  # failed on every GPU: the env failed
            e.status, e.error = "failed", copies[0].error
            continue
        if ok[0].import_checked:
            e.probe, e.import_checked = ok[0].probe, True
        for i, c in enumerate(copies):
            if c.status == "failed":  # this GPU only: its cases of that env fail, the rest is reported
                for case in shares[i]:
                    cd = runner.CaseData(e.label, case)
                    cd.gpu = {**info[i]["gpu"], "shard": i}
                    cd.fail("shard env failed", f"shard {i}/{n} on GPU {gpus[i]['index']}: {c.error}")
                    data[(e.label, case.id)] = cd
    # failed envs: an env is failed for the run when it failed in a shard (its copies in the others)
    reasons = [s["stop_reason"] for s in info]
    if all(r == reasons[0] for r in reasons):
        reason = reasons[0]
    elif any(r == "interrupted" for r in reasons):
        reason = "interrupted"
    else:
        reason = "; ".join(f"shard {i}: {r}" for i, r in enumerate(reasons))
    return reason, info


def clocks_seen(sets: list) -> dict:
    """The lowest and highest SM clock (MHz) runner.GpuMonitor saw over ``sets`` (None without)."""
    clocks = [r.get("gpu") for r in sets if r.get("gpu")]
    return {"sm_clock_mhz_min": min((c["sm_clock_mhz_min"] for c in clocks), default=None),
            "sm_clock_mhz_max": max((c["sm_clock_mhz_max"] for c in clocks), default=None)}


def _gpu_rec(g: dict) -> dict:
    return {k: g.get(k) for k in ("index", "uuid", "name", "bus_id", "numa_node")}


# -- shards as jobs (submitit) -----------------------------------------------------------------------
def submitted(args) -> bool:
    """Whether this run is to be sent to jobs (the driver side of ``--executor slurm|submitit-local``)."""
    return getattr(args, "executor", "local") != "local" and getattr(args, "shard", None) is None


def _without(argv: list[str], names: set[str]) -> list[str]:
    """``argv`` without the options ``names`` and their values (``--opt V`` or ``--opt=V``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a.split("=", 1)[0] in names:
            skip = "=" not in a
            continue
        out.append(a)
    return out


def job_argv(argv: list[str], index: int, count: int, out_dir: Path) -> list[str]:
    """The command line of shard ``index``'s job: the run's own, without the driver's scale-out and
    output options, with ``--shard I/N --output OUT/shards/I``."""
    out = _without(argv, {"--executor", "--shards", "--slurm-partition", "--slurm-account", "--slurm-time", "--gpus",
                          "--output", "--markdown", "--resume", "--shard", "--fail-on-regression"})
    if out and out[0] == "run":
        out = out[1:]
    return ["run", *out, "--shard", f"{index}/{count}", "--output", str(shard_dir(out_dir, index))]


def job_command(argv: list[str], index: int, count: int, out_dir: Path, resume: bool = False) -> list[str]:
    """What job ``index`` runs: ``python -m matrix_runner`` with :func:`job_argv`, or ``run --resume``
    of its own run directory where an earlier job of it was interrupted."""
    if resume:
        return [sys.executable, "-m", "matrix_runner", "run", "--resume", str(shard_dir(out_dir, index))]
    return [sys.executable, "-m", "matrix_runner", *job_argv(argv, index, count, out_dir)]


def job_record(job: tuple[int, int], mach: dict) -> dict:
    """A job's ``shard`` record: its index and count, host, and the GPU it sees (the first GPU of
    nvidia-smi within ``CUDA_VISIBLE_DEVICES``; None without one)."""
    vis = resolve_gpus("all", "cuda") or [g for g in machine.gpus()
                                          if os.environ.get("CUDA_VISIBLE_DEVICES") in (None, "", str(g["index"]), g["uuid"])]
    return {"index": job[0], "count": job[1], "host": mach.get("hostname"),
            "gpu": _gpu_rec(vis[0]) if vis else None}


def local_job_cpus(request: str | None, n: int, allowed: list[int] | None = None) -> list[list[int]] | None:
    """``--executor submitit-local``: the CPUs each of the ``n`` jobs may run on, which all share
    this machine (None: ``--cpus unpinned``, or no affinity here). Without this each job planned its
    sets on the whole machine and both pinned theirs to the same quietest core (new-user trial: two
    shards' sets on CPU 1 at once, each set twice as long, B1 S32 fwd 36.6 µs instead of ~33) -- what
    the local executor's :func:`split_cpus` prevents. ``auto``: an even contiguous share of the
    allowed CPUs each; a LIST: its CPUs split evenly, each job also given the allowed CPUs outside
    the list (its driver's), shared out likewise, and its ``--cpus`` is its part of the list
    (:func:`with_cpus`). A job's planner then sees only its share (lockstep.plan_cpus on the
    process's own affinity); a share of one CPU runs unpinned, and says so."""
    if request == "unpinned":
        return None
    allowed = machine.allowed_cpus() if allowed is None else allowed
    if not allowed:
        return None
    if request in (None, "auto"):
        return [_chunk(allowed, n, j) for j in range(n)]
    want = lockstep.parse_cpus(request) or []
    if len(want) < n:
        raise UsageError(f"--cpus {request}: {len(want)} CPU(s) for {n} jobs on this machine; give at least one per job")
    rest = [c for c in allowed if c not in want]
    return [sorted(set(_chunk(want, n, j)) | set(_chunk(rest, n, j))) for j in range(n)]


def with_cpus(argv: list[str], cpus: list[int]) -> list[str]:
    """``argv`` with its ``--cpus`` value replaced by ``cpus`` (a job's part of a --cpus LIST)."""
    return [*_without(argv, {"--cpus"}), "--cpus", ",".join(map(str, cpus))]


def pinned_command(cmd: list[str], cpus: list[int] | None) -> list[str]:
    """``cmd`` (a Python command line) run with its CPU affinity set to ``cpus`` first (None: as is)."""
    if not cpus:
        return cmd
    return [cmd[0], "-c", f"import os, sys; os.sched_setaffinity(0, {set(cpus)!r}); os.execv(sys.executable, [sys.executable] + sys.argv[1:])",
            *cmd[1:]]


def shard_dir(out_dir: Path, index: int) -> Path:
    return Path(out_dir) / "shards" / str(index)


def _executor(args, folder: Path, log: Callable[[str], None] = print):
    """submitit's executor for ``--executor slurm|submitit-local``. With submitit-local the Slurm-only
    options (``--slurm-partition``, ``--slurm-account``) have no Slurm to go to: it says so through
    ``log`` instead of dropping them without a word (new-user trial)."""
    try:
        import submitit
    except ImportError:
        raise UsageError(f"--executor {args.executor} needs submitit: pip install 'matrix-run[slurm]' "
                         "(or pip install submitit)") from None
    need_slurm(args.executor)  # --resume of a Slurm run: its options were not checked by cli
    if args.executor == "slurm":
        ex = submitit.AutoExecutor(folder=str(folder), cluster="slurm")
        params = {"timeout_min": args.slurm_time, "gpus_per_node": 1, "tasks_per_node": 1, "nodes": 1,
                  "name": "matrix-run"}
        if args.slurm_partition:
            params["slurm_partition"] = args.slurm_partition
        if args.slurm_account:
            params["slurm_account"] = args.slurm_account
        ex.update_parameters(**params)
    else:
        ex = submitit.AutoExecutor(folder=str(folder), cluster="local")
        ex.update_parameters(timeout_min=args.slurm_time, name="matrix-run")
        unused = [f"{o} {v}" for o, v in (("--slurm-partition", args.slurm_partition),
                                          ("--slurm-account", args.slurm_account)) if v]
        if unused:
            log(f"note: {', '.join(unused)} not used: submitit-local runs the jobs on this machine, without "
                "Slurm (they apply with --executor slurm)")
    return ex


def submit(args, argv: list[str], out_dir: Path, cases: list[Case], stop: threading.Event,
           prior: dict | None = None, log: Callable[[str], None] = print) -> dict:
    """Run the shards as jobs and merge their results: returns the merged results doc (written by
    the caller). With ``prior`` (``--resume``), a shard whose results finished is kept and only the
    others are resubmitted (``--resume`` of their own run directory where they wrote one)."""
    n = args.shards or (len(args.gpus.split(",")) if args.gpus and args.gpus != "all" else 2)
    if n < 1:
        raise UsageError(f"--shards {n}: give a positive number of jobs")
    out_dir = Path(out_dir)
    ex = _executor(args, out_dir / ".submitit", log)  # a UsageError without submitit
    import submitit
    from submitit.helpers import CommandFunction

    root = str(Path(__file__).resolve().parent.parent)  # this matrix_runner, whatever is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    jobs: dict[int, object] = {}
    stored = {s.get("index"): s for s in ((prior or {}).get("shards") or []) if isinstance(s, dict)}
    # submitit-local: every job on this machine, each on its own CPUs (local_job_cpus)
    req = getattr(args, "cpus", None)
    own = local_job_cpus(req, n) if args.executor == "submitit-local" else None
    listed = own is not None and req not in (None, "auto") and lockstep.parse_cpus(req) or []
    for i in range(n):
        d = shard_dir(out_dir, i)
        old = _load(d)
        if old is not None and (old.get("timing") or {}).get("stop_reason") not in ("interrupted", "running"):
            log(f"shard {i}/{n}: finished before ({d}); kept")
            continue
        job_args = with_cpus(argv, _chunk(listed, n, i)) if listed else argv
        fn = CommandFunction(pinned_command(job_command(job_args, i, n, out_dir, resume=old is not None),
                                            own[i] if own else None), verbose=True, cwd=os.getcwd(), env=env)
        jobs[i] = ex.submit(fn)
        log(f"shard {i}/{n}: job {jobs[i].job_id} submitted" + (" (resume)" if old is not None else "")
            + (f" on CPU(s) {', '.join(map(str, own[i]))} of this machine" if own else ""))
    lost: dict[int, str] = {}
    for i, job in jobs.items():
        while not job.done():
            if stop.is_set():
                job.cancel(check=False)
                lost[i] = f"shard {i}/{n} (job {job.job_id}): cancelled (interrupted); --resume resubmits it"
                break
            time.sleep(0.5)
        if i in lost:
            continue
        try:
            job.result()
        except submitit.core.utils.FailedJobError as ex_:  # the command exited non-zero: 3 = some case failed
            if _load(shard_dir(out_dir, i)) is None:
                lost[i] = (f"shard {i}/{n} (job {job.job_id}) failed without results: {_last_words(job, ex_)}; "
                           f"logs in {out_dir / '.submitit'}")
        except Exception as ex_:  # noqa: BLE001 - a lost job (killed, node failure, timeout)
            lost[i] = f"shard {i}/{n} (job {job.job_id}) was lost: {type(ex_).__name__}: {str(ex_)[:300]}"
    docs, extra = [], []
    for i in range(n):
        d = _load(shard_dir(out_dir, i))
        if d is None and i not in lost:
            lost[i] = f"shard {i}/{n}: no results in {shard_dir(out_dir, i)}"
        if d is not None:
            d.setdefault("shard", {"index": i, "count": n})
            if i in lost:  # partial results of a lost job: kept, its unfinished cases failed
                d["timing"] = {**(d.get("timing") or {}), "stop_reason": "interrupted"}
                for c in d.get("cases") or []:
                    if c.get("status") != "ok" and not c.get("error"):
                        c.update(status="error", error_kind="shard lost", error=lost[i])
            docs.append(d)
    measured = {c["id"] for d in docs for c in d.get("cases") or []}
    labels = _labels(docs, stored, args)
    for i, msg in lost.items():
        log(f"[lost] {msg}")
        for c in share(cases, i, n):
            if c.id in measured:
                continue
            for lab in labels:
                cd = runner.CaseData(lab, c)
                cd.fail("shard lost", msg)
                extra.append(results.case_record(cd, c))
    if not docs:
        raise UsageError("no shard wrote results: " + "; ".join(lost.values()))
    merged = results.merge_shards(docs, extra, [c.id for c in cases])
    for s in merged["shards"]:
        s["lost"] = lost.get(s.get("index"))
    for i in lost:
        if not any(s.get("index") == i for s in merged["shards"]):
            merged["shards"].append({"index": i, "count": n, "lost": lost[i], "stop_reason": "interrupted"})
    reasons = {s.get("stop_reason") for s in merged["shards"]}
    merged["timing"] = {**(merged.get("timing") or {}),
                        "stop_reason": "interrupted" if "interrupted" in reasons or lost else
                        "; ".join(sorted(str(r) for r in reasons)),
                        "timing_phase_s": max((s.get("timing_phase_s") or 0.0) for s in merged["shards"]),
                        "shards_lost": sorted(lost)}
    merged["settings"] = {**merged.get("settings", {}), "executor": args.executor, "shards": n}
    return merged


def _last_words(job, ex: BaseException) -> str:
    """The last line the job's command wrote to stderr (submitit re-raises it as FailedJobError)."""
    try:
        lines = [ln.strip() for ln in (job.stderr() or "").splitlines() if ln.strip()]
    except Exception:  # noqa: BLE001 - no log (a job lost with its node)
        lines = []
    lines = lines or [ln.strip() for ln in str(ex).splitlines() if ln.strip()]
    last = lines[-1] if lines else "no message"
    return last.split("FailedJobError: ", 1)[-1][:300]


def _load(d: Path) -> dict | None:
    try:
        return results.load(d / "results.json")
    except results.ResultsError:
        return None


def _labels(docs: list[dict], stored: dict, args) -> list[str]:
    for d in docs:
        return [e["label"] for e in d.get("envs") or []]
    from .envs import cross_torch, parse_torches, parse_versions
    return [r.label for r in cross_torch(parse_versions(args.versions), parse_torches(getattr(args, "torch", None)))]
