"""`matrix-run run` as one pipeline of named steps -- the run's one owner.

    settings -> output -> device -> envs -> timing -> explain -> write -> exit_code

:class:`Run` holds one invocation's state; each step is a method that reads what the steps before
it set and sets what the steps after it read (the table below), so a newcomer can follow a value
from the command line to results.json in one file:

=========== ===========================================================================================
settings    the config (or a resumed run's stored one), the command line's overrides, every usage
            check of the numbers, the version requests (checked on the index), the run id
output      the run directory (``--output`` or ``reports/<run id>``), its run lock, ``--markdown``
device      the driver's probe and :mod:`machine` metadata, cuda / cpu / none, the GPUs (``--gpus``),
            the settings record, the plan of every env (printed)
envs        every env prepared in parallel threads (:mod:`envs`); one failing env never sinks the rest
timing      the timing phase: process sets of lockstep cycles (:mod:`runner`, or :mod:`shard` per GPU);
            results so far are written after the first set, then every ``PARTIAL_EVERY_S``
explain     the ``--explain`` pass (:mod:`explain`), its own workers; its failure never fails the run
write       results.json (:mod:`results`), index.html and Markdown (:mod:`report`), the summary lines
exit_code   0 / 1 (a regression over ``--fail-on-regression``) / 3 (an env or case failed) / 130
=========== ===========================================================================================

:func:`run` wraps the pipeline: signals (SIGINT/SIGTERM stop workers and builds; what was measured
is written; exit 130), ``--resume``, and the clean-up that leaves nothing running. ``--executor``
runs submit shards after the output step instead (:mod:`shard`). Errors: :mod:`errors` (a usage
error before the output directory holds anything removes the directory it created).
"""
from __future__ import annotations

import glob
import hashlib
import math
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout
from rich.console import Console
from rich.markup import escape

from . import (
    __version__,
    explain,
    lockstep,
    machine,
    proc,
    report,
    results,
    runner,
    shard,
    stats,
    wheels,
)
from . import envs as envmod
from .config import (
    MAX_CASES,
    MAX_WORKERS_PER_ENV,
    MIN_SET_SECONDS,
    SAMPLING_FLAGS,
    WORKERS_PER_ENV_WHY,
    ConfigError,
    Sampling,
    auto_max_sets,
    load_config,
    parse_config,
)
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REGRESSION, StageFailed, UsageError
from .ui import console, print_plan, progress, warn


def options(args) -> envmod.Options:
    """The env settings of ``plan`` and ``run`` (:class:`envs.Options`) from their command line;
    UsageError for bad ``--archs``, ``--torch``, ``--torch-index``, ``--find-links``."""
    envs_dir = Path(args.envs_dir).expanduser()
    if envs_dir.exists() and not envs_dir.is_dir():  # it said "afile: File exists" (new-user trial)
        raise UsageError(f"--envs-dir {args.envs_dir}: is a file, not a directory: give a directory for the envs")
    try:
        envs_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--envs-dir {args.envs_dir}: cannot create it ({e.strerror or e})") from None
    archs = None
    if args.archs:
        archs = [a.strip().replace(".", "").replace("sm_", "") for a in args.archs.split(",") if a.strip()]
        if not all(a.isdigit() and len(a) in (2, 3) for a in archs):
            raise UsageError(f"--archs {args.archs!r}: give compute capabilities like 90 or 80,90")
    torches = envmod.parse_torches(args.torch)
    if getattr(args, "backend", "uv") == "here" and len(torches) > 1:
        raise UsageError(f"--backend here times this interpreter's torch: --torch {args.torch!r} lists several; "
                                "use --backend uv for a torch axis")
    if args.torch_index and torches == ["inherit"]:
        raise UsageError(f"--torch-index {args.torch_index}: it is where a pinned torch comes from, and "
                                "--torch inherit installs none; add a version (--torch X.Y.Z) or drop --torch-index")
    fl = []
    for d in args.find_links:
        p = Path(d).expanduser().resolve()
        if not p.is_dir():
            raise UsageError(f"--find-links {d}: not a directory")
        fl.append(p)
    cache = Path(args.wheel_cache).expanduser().resolve() if args.wheel_cache else wheels.default_cache_dir()
    return envmod.Options(envs_dir=envs_dir.resolve(), cache_dir=cache, find_links=fl, offline=args.offline,
                          torches=torches, torch_index=args.torch_index, build=args.build, archs=archs,
                          index_url=args.index_url, rebuild=args.rebuild,
                          compile_cache=getattr(args, "compile_cache", True))


def run_name(labels: list[str], limit: int = 120) -> str:
    """The labels part of a run id (the default output folder's name): ``A-vs-B``, cut to ``limit``
    characters with a hash of the whole when longer (several 64-character labels, or a torch axis,
    made a folder name over the file system's 255 bytes)."""
    name = "-vs-".join(labels)
    if len(name) <= limit:
        return name
    return name[:limit - 9].rstrip("-.+") + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]


def plan_all(reqs, cases, opts, dprobe) -> list[envmod.PlanItem]:
    """Every env's plan (:func:`envs.plan_env`), in order; compile units two envs share are planned
    once (the later build waits for the earlier one, then hits the compile cache), and the cores are
    shared by the builds that compile at the same time (:func:`envs.share_jobs`)."""
    items = []
    n_builds = len(reqs)
    planned_units: dict = {}  # compile units shared by envs of this run: the later build waits, then hits
    for r in reqs:
        items.append(envmod.plan_env(r, cases, opts, dprobe, n_builds_hint=n_builds, planned_units=planned_units))
    envmod.share_jobs(items)
    return items


#: Seconds between two writes of a running run's partial results.json (and after its first set):
#: a kill -9 of the driver loses at most this much of what was measured (SIGINT/SIGTERM lose
#: nothing: the results are written before exiting). A write after every set (the 0.74 MB of a 60 s
#: seed run: the document built, then written and fsync'd, 0.2 s on the 2-core CPU machine) sat
#: between two sets every ~1.4 s, 30 times a minute.
PARTIAL_EVERY_S = 5.0

#: What a CPU does with torch's attention in the stand-in, order of magnitude (2-core machine:
#: ~5-20 GFLOP/s in fp32 SDPA): only used to warn before a GPU-sized config is timed on a CPU.
CPU_FLOPS_PER_S = 10e9

def cpu_size_warning(cases) -> str | None:
    """A warning when ``--device cpu`` meets GPU-sized cases: the largest call at
    :data:`CPU_FLOPS_PER_S` would take more than 0.5 s (set-up alone warms every case up in every
    worker), else None. (New-user trial: ``--config varlen`` on a CPU sat 10 minutes in set-up.)"""
    worst = max(cases, key=lambda c: c.flops(), default=None)
    if worst is None:
        return None
    kv = max(cases, key=lambda c: c.kv_read_bytes() or 0)
    if (kv.kv_read_bytes() or 0) > 256e6:  # decode: few FLOPs, a GPU-sized KV cache
        return (f"this config is GPU-sized for --device cpu: {kv.label} reads {kv.kv_read_bytes() / 1e9:.1f} GB of "
                "KV cache per call; use small shapes on a CPU (README, 'Without a GPU')")
    s = worst.flops() / CPU_FLOPS_PER_S
    if s <= 0.5:
        return None
    return (f"this config is GPU-sized for --device cpu: its largest call ({worst.label} {worst.op}, "
            f"{worst.flops() / 1e9:,.0f} GFLOP) takes ~{s:,.0f} s on a CPU, and every case is set up and warmed "
            "up in every worker before timing starts; use small shapes on a CPU (README, 'Without a GPU')")


def check_writable_dir(d: Path, opt: str) -> None:
    """Raise UsageError unless ``d`` is, or can be created as, a directory this user can write
    (checked before anything is built or timed, so a bad path never costs a run)."""
    d = Path(d).expanduser()
    probe = d
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise UsageError(f"{opt} {d}: {probe} is not a directory")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{opt} {d}: {probe} is not writable; give a directory you can write")


#: The files a run directory holds that a report must never overwrite (``--markdown``).
RUN_FILES = ("results.json", "results.json.gz", "index.html", "index.html.gz", "console.log")


def check_writable_file(f: Path, opt: str, creates: Path | None = None, inputs: tuple = ()) -> None:
    """Raise UsageError unless file ``f`` can be written (its directory exists and is writable).
    ``creates``: a directory the command makes before it writes ``f`` (the ``-o`` of report and
    compare): ``f`` may lie in it while it does not exist yet. Refused as well: a path named like a
    run's own files (:data:`RUN_FILES`) and any of ``inputs`` (the results the command reads) --
    ``--markdown RUN/results.json`` had replaced a run's data with Markdown (new-user trial)."""
    f = Path(f).expanduser()
    if f.is_dir() or (creates is not None and f.resolve() == Path(creates).expanduser().resolve()):
        raise UsageError(f"{opt} {f}: is a directory" + (" (the -o directory)" if not f.is_dir() else "")
                         + f"; give a file path (e.g. {f / 'summary.md'})")

    def same(a: Path, b: Path) -> bool:  # one file, by path or through a link (symbolic or hard)
        try:
            return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
        except OSError:
            return False
    read = [results.find(q) if q.is_dir() else q for q in (Path(x).expanduser() for x in inputs)]
    hit = any(same(q, f) for q in read)
    if f.name in RUN_FILES or f.resolve().name in RUN_FILES or hit:
        raise UsageError(f"{opt} {f}: " + ("that is a results file this command reads" if hit else
                                            f"that is the name of a run's own file ({f.resolve().name})")
                         + f", which this would overwrite; give another file, e.g. {f.parent / 'summary.md'}")
    if creates is not None and f.parent.resolve() == Path(creates).expanduser().resolve() and not f.parent.exists():
        f = Path(creates).expanduser().resolve()  # made before f is written: its nearest existing parent must take it
        while not f.parent.is_dir():
            f = f.parent
    if not f.parent.is_dir():  # new-user trial: /dev/null/x.md was said not to exist
        raise UsageError(f"{opt} {f}: " + (f"{f.parent} is not a directory" if f.parent.exists() else
                                           f"the directory {f.parent} does not exist"))
    if (f.exists() and not os.access(f, os.W_OK)) or not os.access(f.parent, os.W_OK | os.X_OK):
        raise UsageError(f"{opt} {f}: not writable; give a path you can write")
    try:  # access() says yes to root on file systems that refuse files (/proc): try one
        tempfile.TemporaryFile(dir=f.parent).close()
    except OSError as ex:
        raise UsageError(f"{opt} {f}: no file can be written in {f.parent} ({ex.strerror or ex}); "
                         "give a path you can write") from None


def gated_walls(doc: dict) -> list[dict]:
    """The wall-time comparisons of ``doc`` that ``--fail-on-regression`` judges: the SDPA control (a
    case record's ``impl``, not its id; records before impl: flash_attn) left out, as it times torch,
    not flash-attn."""
    impl = {(c["env"], c["id"]): c.get("impl", "flash_attn") for c in doc.get("cases") or []}
    return [c for c in doc.get("comparisons") or [] if c["metric"] == "wall_us"
            and impl.get((c["candidate"], c["case"]), "flash_attn") != "sdpa"]


def unjudged(doc: dict, pct: float) -> list[dict]:
    """The wall-time comparisons (:func:`gated_walls`) that ``--fail-on-regression PCT`` cannot
    judge: no interval yet (``provisional``: one process set; or ``unbounded``: too few sets) while
    the ratio itself is above 1 + PCT/100, or undecided (``ambiguous``) with an interval that reaches
    above it. Without them a gate passed silently where the run decided nothing (new-user trial: a
    budget that fit one set, 1.57x "provisional", exit 0)."""
    lim = 1 + pct / 100
    return [c for c in gated_walls(doc)
            if (c["verdict"] == "provisional" or c.get("unbounded")) and c["ratio"] > lim
            or c["verdict"] == "ambiguous" and not c.get("unbounded") and (c.get("ci_high") or 0) > lim]


def regressions(doc: dict, pct: float) -> list[dict]:
    """The wall-time comparisons (:func:`gated_walls`) that ``--fail-on-regression PCT`` fails on:
    slower by more than ``pct`` percent."""
    return [c for c in gated_walls(doc) if c["verdict"] == "slower" and (c["ratio"] - 1) * 100 > pct]


def gate_outcome(doc: dict, pct: float, budget_s: float | None = None) -> dict:
    """What ``--fail-on-regression PCT`` decides on the run ``doc``, as stored in results.json
    ``gate`` and shown in the report (new-user trial: it was only an exit code and a line on stderr):
    ``{threshold_pct, outcome, exit, regressions, not_judged, undecided, text}``. ``outcome``:

    - "failed" (exit 1): a wall-time "slower" by more than PCT (:func:`regressions`);
    - "not judged" (exit 3; 130 for an interrupted run): no regression, but something the gate should
      judge has no verdict: a comparison over PCT without an interval yet (:func:`unjudged`), a case
      of the run not compared at all (failed or not run in an env: a run that compared nothing had
      "passed"), an env that failed, or the run was interrupted (``--resume`` finishes it);
    - "passed" (exit 0); ``undecided`` names the comparisons whose interval still reaches above PCT
      (undecided ones, and "slower" ones whose ratio is under PCT but whose interval is not).

    The lists name comparisons as "CANDIDATE vs BASELINE LABEL OP RATIOx" (cases not compared: "...
    LABEL OP: not compared")."""
    def name(c):
        return f"{c['candidate']} vs {c['baseline']} {c['label']} {c['op']} {c['ratio']:.2f}x"

    lim = 1 + pct / 100
    head = f"--fail-on-regression {pct:g}"
    wall = gated_walls(doc)
    bad = regressions(doc, pct)
    open_ = unjudged(doc, pct)
    no_interval = [c for c in open_ if c["verdict"] == "provisional" or c.get("unbounded")]
    later = [c for c in open_ if c not in no_interval] + [
        c for c in wall if c["verdict"] == "slower" and c not in bad and (c.get("ci_high") or 0) > lim]
    # what was never compared: envs that failed, and the cases of each pair with no wall comparison
    done = {(c["baseline"], c["candidate"], c["case"]) for c in wall}
    label = {c["id"]: f"{c.get('label', c['id'])} {c.get('op', '')}".strip() for c in doc.get("cases") or []}
    ids = list(dict.fromkeys(c["id"] for c in doc.get("cases") or [] if c.get("impl", "flash_attn") != "sdpa"))
    pairs = results.env_pairs(doc.get("envs") or [])
    none = ([name(c) for c in no_interval]
            + [f"env {e['label']}: {e.get('status') or 'failed'}, not compared" for e in doc.get("envs") or []
               if e.get("status") != "ok"]
            + [f"{k} vs {b} {label[cid]}: not compared" for b, k in pairs for cid in ids if (b, k, cid) not in done])
    stopped = (doc.get("timing") or {}).get("stop_reason") == "interrupted"
    if bad:
        outcome, code = "failed", EXIT_REGRESSION
        text = f"{head}: failed: {len(bad)} regression(s) over {pct:g}%: " + ", ".join(name(c) for c in bad)
    elif stopped:
        outcome, code = "not judged", EXIT_INTERRUPTED
        text = (f"{head}: not judged: the run was interrupted before its verdicts (matrix-run --resume finishes "
                "it, and the gate is decided then)")
    elif none or not pairs:
        outcome, code = "not judged", EXIT_FAILED
        text = (f"{head}: not judged: " + ("nothing was compared" if not wall else f"{len(none)} without a verdict")
                + (f" ({'; '.join(none)})" if none else "")
                + ("; a comparison over the threshold without an interval needs more process sets: raise "
                   "--time-budget" + (f" ({budget_s:g} s)" if budget_s else "") if no_interval else ""))
    elif later:
        outcome, code = "passed", EXIT_OK
        text = (f"{head}: passed, but {len(later)} comparison(s) could still be over {pct:g}% (their intervals "
                "reach above it): " + ", ".join(f"{name(c)} [{c['ci_low']:.2f}, {c['ci_high']:.2f}]" for c in later))
    else:
        outcome, code = "passed", EXIT_OK
        text = f"{head}: passed (no wall time over {pct:g}% slower)"
    return {"threshold_pct": pct, "outcome": outcome, "exit": code, "regressions": [name(c) for c in bad],
            "not_judged": none, "undecided": [name(c) for c in later], "text": text}


#: What a run interrupted in its ``--explain`` pass says of its explanation (results.json ``explain.notes``).
EXPLAIN_INTERRUPTED = ("the explain pass was interrupted (SIGINT/SIGTERM): the parts it had not finished are "
                       "missing, and a worker lost in it was stopped by the interrupt; run again with --explain "
                       "for a whole explanation")


def run(args, argv: list[str], parse: Callable[[list[str]], object]) -> int:
    """Run (or, with ``--resume``, finish) a benchmark: :class:`Run`'s steps with signals handled and
    everything cleaned up. ``parse`` turns a stored command line back into arguments (``--resume``).
    SIGINT/SIGTERM stop workers and builds (nothing is left running), the results measured so far are
    written and the exit code is 130. Raises :mod:`errors`' classes for usage errors (exit 2)."""
    stop = threading.Event()
    restore = runner.install_signal_handlers(stop)
    cwd = os.getcwd()
    r = None
    try:
        prior = None
        if args.resume:
            args, argv, prior = resume_args(args, argv, parse)
            if prior is None:
                return EXIT_OK
        elif args.versions is None:
            raise UsageError("--versions is required (or --resume RUN_DIR)")
        r = Run(args, argv, stop, prior)
        return r.execute()
    except Exception as e:
        if isinstance(e, UsageError) and r is not None:
            r.release_output()
            made = r.created_output
            if made is not None and made.is_dir() and not any(made.iterdir()):
                made.rmdir()  # created by this run, which stopped before writing anything into it
        # a step cut short by the interrupt failed (a probe, a download; the torch probe it killed
        # reads as "cannot import torch"): not a fault, not the user's input
        if stop.is_set():
            if prior is not None and prior.get("sets"):  # a resume: the earlier part's sets stay where they were
                console.print(f"[yellow]interrupted before this part measured anything; the "
                              f"{len(prior['sets'])} process sets measured before are kept in "
                              f"{escape(str(args.resume))}: finish it with matrix-run --resume "
                              f"{escape(shlex.quote(str(args.resume)))}[/]")
            else:
                console.print("[yellow]interrupted before anything was measured[/]")
            return EXIT_INTERRUPTED
        raise
    finally:
        proc.kill_all()  # nothing started by this run outlives it
        restore()
        if r is not None:
            r.close()
        proc.reset()
        os.chdir(cwd)


def resume_args(args, argv: list[str], parse: Callable[[list[str]], object]):
    """(args, argv, results doc) of the run in ``args.resume``, re-read from its results.json:
    the stored command line (``parse``d again) and config, output into the same directory.
    (args, argv, None) when that run finished (nothing to resume). UsageError / ResultsError when
    there is nothing to resume from."""
    rest, skip, given = [], False, []
    for a in argv[1:]:
        if skip:
            skip = False
        elif a in EXTEND_FLAGS:
            skip = True  # its value
            given.append(a)
        elif a == "--resume":
            pass
        elif a.split("=", 1)[0] in EXTEND_FLAGS:
            given.append(a.split("=", 1)[0])
        elif a != args.resume and a != f"--resume={args.resume}":
            rest.append(a)
    twice = sorted({f for f in given if given.count(f) > 1})
    if twice:  # argparse keeps the last (new-user trial: --time-budget=90 --time-budget 30 extended to 30)
        raise UsageError(f"--resume RUN_DIR {twice[0]}: given {given.count(twice[0])} times; give it once")
    if rest:
        md = any(a.split("=", 1)[0] == "--markdown" for a in rest)  # new-user trial: where it goes instead
        raise UsageError(f"--resume RUN_DIR takes every setting from RUN_DIR/results.json; give no other "
                         f"option than {' or '.join(EXTEND_FLAGS)} to extend it (got {' '.join(rest)})"
                         + ("; for a Markdown table of the run: matrix-run report RUN_DIR/results.json --markdown FILE"
                            if md else ""))
    extend = {key: getattr(args, dest(flag)) for flag, key in EXTEND_FLAGS.items()
              if getattr(args, dest(flag), None) is not None}
    run_dir = Path(args.resume).expanduser().resolve()
    if run_dir.name in results.NAMES:
        run_dir = run_dir.parent
    if not run_dir.exists():  # new-user trial: "/x: cannot read (No such file or directory)" named no option
        raise UsageError(f"--resume {args.resume}: no such directory; give the folder of the interrupted run "
                         "(its --output), which holds its results.json")
    if run_dir.is_dir() and not results.find(run_dir).exists():
        raise UsageError(f"--resume {args.resume}: no results.json there: that run stopped before it "
                         "measured anything or wrote results; start it again with its original command")
    doc = results.load(run_dir)  # results.json, or an archived run's results.json.gz
    if results.is_merge(doc):
        # a `report RUN RUN -o DIR` merge (new-user trial: it was resumed as if a run, its sets of
        # two runs under repeated ids, its between-run comparisons dropped, merged_from lost)
        raise UsageError(f"--resume {args.resume}: that is a merged report of {len(doc['merged_from'])} runs "
                         f"(run ids {', '.join(map(str, doc['merged_from']))}), not a run; resume one of those runs "
                         "(its own --output folder), then merge again with matrix-run report RUN RUN -o DIR")
    stopped = (doc.get("timing") or {}).get("stop_reason")
    if stopped == "no GPU":  # its envs were skipped and nothing was timed: a resume would add nothing
        cmd = " ".join(str(a) for a in (doc.get("command") or ["matrix-run"]))
        raise UsageError(f"--resume {args.resume}: that run measured nothing (no NVIDIA GPU was visible where it "
                         f"ran; its envs were skipped); on a machine with a GPU start it again: {cmd}")
    st = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    more = fuller_rescue(doc)
    if more:  # new-user trial: a resume from the older partial save went on, and its own rescue then
        # overwrote the one with more sets
        f, n = more
        k = len(doc.get("sets") or [])
        raise UsageError(f"--resume {args.resume}: its results.json holds {k} process set{'s' if k != 1 else ''} "
                         f"(stopped: {stopped}), but a rescue of this run with {n} is at {f} (written when "
                         f"results.json could not be): make room, move that file to {run_dir / 'results.json'}, "
                         "then resume")
    unfinished = stopped in ("interrupted", "running") or (doc.get("timing") or {}).get("shards_lost")
    named = [f for f, key in EXTEND_FLAGS.items() if key in extend]  # the flags given (messages name these)
    # the run's max_sets followed its budget, and still does unless --max-sets N is given now; --max-sets
    # auto makes it follow from now on (its own budget given again counts as not given)
    typed_auto = extend.get("max_sets") == "auto"
    if typed_auto:
        del extend["max_sets"]
        if "time_budget_s" in extend and extend["time_budget_s"] == st.get("time_budget_s"):
            del extend["time_budget_s"]
    followed = isinstance(st.get("max_sets"), int) and (typed_auto or (max_sets_followed(doc) and "max_sets" not in extend))
    budget = extend.get("time_budget_s", st.get("time_budget_s") if typed_auto else None)  # the one it follows
    auto = None
    if followed and isinstance(budget, (int, float)):
        # max_sets: auto follows the larger budget (config.Sampling.max_sets; a --resume --time-budget
        # 120 of a one-minute run would stop at its 40th set, ~75-90 s in on the H200)
        ss = st.get("set_seconds")
        auto = max(st["max_sets"], auto_max_sets(budget, ss if isinstance(ss, (int, float)) and ss > 0 else 1.0))
        if auto > st["max_sets"]:
            extend["max_sets"] = auto
    if typed_auto and not extend and auto is not None:
        raise UsageError(f"--resume {args.resume} --max-sets auto: at its {budget:g} s budget that is {auto} sets, no "
                         f"more than its own {st['max_sets']}: give a larger --time-budget to extend it")
    if extend:
        check_extension(args.resume, doc, extend, bool(unfinished), named)
    elif not unfinished:
        q = shlex.quote(str(args.resume))
        if isinstance(stopped, str) and stopped.startswith("max_sets") and isinstance(st.get("max_sets"), int):
            # it stopped on its max_sets: a larger budget alone times nothing more (new-user trial: the advice
            # was --time-budget, which then said to raise --max-sets)
            more = f"; to time more process sets, raise its max_sets: matrix-run --resume {q} --max-sets N (more than its {st['max_sets']})"
        elif extendable(stopped) and isinstance(st.get("time_budget_s"), (int, float)):
            more = (f"; to time more process sets, give it a larger budget: matrix-run --resume {q} "
                    f"--time-budget S (more than its {st['time_budget_s']:g} s)")
        else:
            more = ""
        console.print(f"{run_dir}: that run finished (stopped: {stopped}); nothing to resume{more}")
        return args, argv, None
    cmd = [str(a) for a in (doc.get("command") or [])[1:]]
    if not cmd or "--resume" in cmd:
        raise results.ResultsError(f"{run_dir / 'results.json'}: no command line stored to resume from")
    src = results.find(run_dir)
    st = doc.get("settings") or {}
    if not isinstance(st, dict):
        raise results.ResultsError(f"{src}: settings is {type(st).__name__}, not an object: restore the file "
                                   "or start that run again with its original command")
    new_argv = ["run", *cmd]
    new = parse(new_argv)
    cwd = st.get("cwd")
    if isinstance(cwd, str) and cwd and Path(cwd).is_dir():
        if Path(cwd).resolve() != Path.cwd().resolve():  # said, not done silently (new-user trial)
            console.print(f"resuming in {cwd}, where the run was started: its command's relative paths "
                          "(--envs-dir, --find-links, --config) are read from there")
        os.chdir(cwd)  # the stored command's relative paths are relative to it
    elif isinstance(cwd, str) and cwd:  # refused: it had built envs wherever the resume ran (new-user trial)
        raise UsageError(f"{src}: the run was started in {cwd}, which is not here, and its command's relative "
                         f"paths (--envs-dir, --find-links, --config) would be read from {Path.cwd()}: set "
                         "settings.cwd in that results.json to the directory they are relative to, or start the run "
                         "again with its original command")
    new.output, new.resume = str(run_dir), str(run_dir)
    new.resumed_max_sets_auto = followed  # its max_sets kept following the budget (Run._check_numbers)

    def bad(key: str, rule: str):
        return UsageError(stored_settings_error(src, f"settings.{key} = {st[key]!r}: {rule}"))
    if st.get("device") in ("cuda", "cpu"):
        new.device = st["device"]
    elif st.get("device") is not None:  # it had been ignored, and the resume ran on the command's device
        raise bad("device", "must be cuda or cpu (where the run timed its calls)")
    for arg, key in (*((dest(flag), key) for flag, key in RESUMED_FLAGS.items()),
                     ("quick", "quick"), ("cpus", "cpus_request")):
        v = st.get(key)
        if v is None or (st.get("quick") is True and key in ("max_sets", "set_seconds")):
            continue  # a quick run's one set of quick_set_seconds: the flags are refused with --quick
        if key == "quick" and not isinstance(v, bool):
            raise bad(key, "must be true or false")
        if key == "cpus_request":
            if not isinstance(v, str):
                raise bad(key, "must be a string (auto, unpinned or a comma list of CPU ids)")
            try:
                lockstep.parse_cpus(v)
            except ValueError as ex:
                why = str(ex).split(": ", 1)[-1]
                if "not allowed" in why:  # another machine's CPUs, not a damaged file (review)
                    raise UsageError(f"{src}: the run was pinned with --cpus {v}, and {why}: resume it on the "
                                     "machine it ran on, or set settings.cpus_request to auto in that "
                                     "results.json") from None
                raise bad(key, why) from None
        if key not in ("quick", "cpus_request"):
            whole = key in ("max_sets", "workers_per_env")
            if isinstance(v, bool) or not isinstance(v, int if whole else (int, float)) or not math.isfinite(v) or v <= 0:
                raise bad(key, "must be a positive " + ("whole number" if whole else "number"))
        setattr(new, arg, v)  # the values the run used, whatever today's defaults are
    if extend:  # the larger budget, kept by later resumes (settings) and in the command, as if given at the start
        for flag, key in EXTEND_FLAGS.items():
            if key in extend:
                setattr(new, dest(flag), extend[key])
                if flag in named:  # as typed; a max_sets raised with the budget stays automatic
                    value = "auto" if key == "max_sets" and typed_auto else f"{extend[key]:g}"
                    doc["command"] = with_flag(doc.get("command") or [], flag, value)
        new.extended = {key: [st.get(key), v] for key, v in extend.items()}
    return new, new_argv, doc


def max_sets_followed(doc: dict) -> bool:
    """Whether the run ``doc`` took its max_sets from its budget (config ``max_sets: auto``, no
    ``--max-sets``): its settings say so (``max_sets_auto``); a run from before the setting did if it
    had the then default 40 from the built-in config or a config without the key, and no --max-sets
    on its command line."""
    st = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    if isinstance(st.get("max_sets_auto"), bool):
        return st["max_sets_auto"]
    if st.get("max_sets") != 40 or not isinstance(st.get("max_sets"), int):
        return False
    cmd = [str(a) for a in doc.get("command") or []]
    if any(a == "--max-sets" or a.startswith("--max-sets=") for a in cmd):
        return False
    if doc.get("config_source") in ("built-in default", None):
        return True
    conf = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    samp = conf.get("sampling") if isinstance(conf.get("sampling"), dict) else {}
    return samp.get("max_sets") in (None, "auto")


#: The rescue folders of results.json files that could not be written (Run._write_files), under
#: the temporary directory: PREFIX + run id + "-" + a unique suffix.
RESCUE_PREFIX = "matrix-run-rescue-"


def fuller_rescue(doc: dict) -> tuple[Path, int] | None:
    """The rescue copy of run ``doc`` (:func:`rescues_of`) with the most process sets, where it has more
    than ``doc`` itself (its results.json is then a partial save left behind by a write that failed),
    as (its results.json, its sets); else None."""
    more = [(f, n) for f, n in rescues_of(doc) if n > len(doc.get("sets") or [])]
    return more[0] if more else None


def rescues_of(doc: dict) -> list[tuple[Path, int]]:
    """The rescue copies of the run ``doc`` (results.json files under the temporary directory whose
    run id is ``doc``'s), each with its number of process sets, most sets first. Unreadable ones are
    left out."""
    rid = doc.get("run_id")
    if not isinstance(rid, str) or not rid:
        return []
    found = []
    for f in Path(tempfile.gettempdir()).glob(f"{RESCUE_PREFIX}{glob.escape(rid)}*/results.json"):
        try:
            other = results.load(f.parent)
        except Exception:  # noqa: BLE001 - a damaged rescue is no better than the run's own file
            continue
        if other.get("run_id") == rid:
            found.append((f, len(other.get("sets") or [])))
    return sorted(found, key=lambda x: -x[1])


def check_here_versions(reqs: list) -> None:
    """``--backend here`` (run and plan) times this interpreter: exactly one ``--versions`` entry, else
    UsageError."""
    if len(reqs) != 1:
        raise UsageError("--backend here times this interpreter: give exactly one --versions entry")


def failed_env_line(label: str, status: str | None, error: object) -> str:
    """The run's closing line for an env that did not come up: ``env LABEL STATUS: first line of its
    error``; with no error text on record, says so (it had printed "failed: failed")."""
    first = (str(error).strip().splitlines() or [""])[0] if error else ""
    return f"env {label} {status or 'failed'}" + (f": {first}" if first else " (no error text on record; see the log above)")


def held_run_hint(out_dir: Path, name: str) -> str:
    """What ``--output DIR`` that holds a run's ``name`` (results.json / .gz) can do instead: finish
    that run (unfinished), extend it (stopped on its budget), or nothing (new-user trial: a finished
    run was to be "finished with --resume", which then said "nothing to resume")."""
    if name != "results.json":
        return ""
    try:
        stopped = (results.load(out_dir).get("timing") or {}).get("stop_reason")
    except Exception:  # noqa: BLE001 - unreadable: --resume says why
        stopped = "interrupted"
    q = shlex.quote(str(out_dir))
    if stopped in ("interrupted", "running"):
        return f", or finish that run with --resume {q}"
    if extendable(stopped):
        return f", or time more sets for that run with --resume {q} --time-budget S"
    return ""


def cuda_resume_error(where, none: str) -> str:
    """The error of ``--resume RUN`` for a run timed on cuda where ``none`` (why no GPU is seen here)."""
    return (f"{where}: the run timed its calls on cuda (settings.device in its results.json), and {none}: "
            "resume it on a machine with an NVIDIA GPU")


def dest(flag: str) -> str:
    """The argparse attribute of a long option (``--time-budget`` -> ``time_budget``)."""
    return flag[2:].replace("-", "_")


#: The flags ``--resume RUN_DIR`` takes, to extend a run (a finished one too): its settings keys.
EXTEND_FLAGS = {"--time-budget": "time_budget_s", "--max-sets": "max_sets"}


def extendable(stopped) -> bool:
    """Whether a run that stopped for ``stopped`` (timing.stop_reason) times more process sets with a
    larger budget: it stopped on its time budget or its max_sets (runner.run_all's reasons), not
    because its verdicts were decided or nothing was left to time."""
    return isinstance(stopped, str) and stopped.startswith(("time budget", "max_sets"))


def check_extension(where, doc: dict, extend: dict, unfinished: bool, named: list | None = None) -> None:
    """UsageError unless ``--resume WHERE`` with ``extend`` ({settings key: value} of
    :data:`EXTEND_FLAGS`) can time more process sets of the run ``doc``: each value above the run's
    own, and the run interrupted, or stopped on its budget or max_sets (:func:`extendable`), not a
    ``--quick`` one. The anytime-valid intervals allow it: they hold however the sets' number was
    chosen, after looking included (stats.t_cs), so sets added to a finished run keep their level;
    the sequence's mixing stays the run's (``planned_sets`` is kept by a resume, never re-tuned to
    the new budget)."""
    st = doc.get("settings") if isinstance(doc.get("settings"), dict) else {}
    timing = doc.get("timing") if isinstance(doc.get("timing"), dict) else {}
    stopped = timing.get("stop_reason")
    # the flags the command gave (named; a max_sets raised with the budget was not typed: new-user trial)
    flags = ' '.join(named if named is not None else [f for f in EXTEND_FLAGS if EXTEND_FLAGS[f] in extend])
    if st.get("quick") is True:  # before the values (new-user trial: "give more", then "a quick run")
        raise UsageError(f"--resume {where} {flags}: that was a --quick run, one process set; start a full run to "
                         "time more")
    if doc.get("shards"):  # a shard that finished is kept as it is by a resume (shard module)
        raise UsageError(f"--resume {where} {flags}: that run was sharded over GPUs or jobs, and a resume only "
                         "re-runs the shards that did not finish: start it again with the larger budget")
    if not unfinished and not extendable(stopped):
        why = ("more sets would stop at once" if isinstance(stopped, str) and stopped.startswith("all wall-time")
               else "more time would not time more")
        raise UsageError(f"--resume {where}: that run stopped because {stopped}: {why}")
    if not unfinished:  # the limit that stopped it must be raised (new-user trial: --max-sets 50 on a run
        # that stopped on its budget ran one set past that budget)
        need = "--time-budget" if stopped.startswith("time budget") else "--max-sets"
        if EXTEND_FLAGS[need] not in extend:
            raise UsageError(f"--resume {where} {flags}: that run stopped on its "
                             f"{'time budget' if need == '--time-budget' else 'max_sets'} ({stopped}): raising "
                             f"{flags} alone would time nothing more; give {need} above its "
                             + (format(st[EXTEND_FLAGS[need]], "g") + (" s" if need == "--time-budget" else " sets")
                                if isinstance(st.get(EXTEND_FLAGS[need]), (int, float)) else "own"))
    n = sum(1 for x in doc.get("sets") or [] if isinstance(x, dict) and x.get("status") != "interrupted")
    spent = timing.get("timing_phase_s")
    for flag, key in EXTEND_FLAGS.items():
        if key not in extend:
            continue
        v, old = extend[key], st.get(key)
        unit = " s" if key == "time_budget_s" else " sets"
        if not (v > 0 and math.isfinite(v)):
            raise UsageError(f"{flag} {v:g}: give a positive number" + (", a finite one" if v > 0 else ""))
        if isinstance(old, (int, float)) and not isinstance(old, bool) and v <= old:
            raise UsageError(f"--resume {where} {flag} {v:g}: the run's own is {old:g}{unit}; give more to extend it "
                             + ("(the earlier sessions' time counts towards it)" if key == "time_budget_s" else
                                "(its sets so far count towards it)"))
        if key == "time_budget_s" and n and isinstance(spent, (int, float)) and v < spent + spent / n:
            # the runner sets up and times a resumed run's set whatever the budget left (runner.run_all)
            raise UsageError(f"--resume {where} {flag} {v:g}: the run has spent {spent:.0f} s timing {n} process "
                             f"sets (~{spent / n:.1f} s each): give at least {math.ceil(spent + spent / n)} s for "
                             "another set to fit")


def with_flag(argv: list, flag: str, value: str) -> list:
    """``argv`` with ``flag``'s value set to ``value`` (``--flag V`` or ``--flag=V`` replaced, else
    ``--flag V`` added)."""
    out, i = [], 0
    found = False
    while i < len(argv):
        a = str(argv[i])
        if a == flag and i + 1 < len(argv):
            out += [flag, value]
            i += 2
            found = True
            continue
        if a.startswith(flag + "="):
            out.append(f"{flag}={value}")
            found = True
        else:
            out.append(argv[i])
        i += 1
    return out if found else [*out, flag, value]


def stored_settings_error(src, why: str) -> str:
    """The message of a resumed run whose results.json (``src``) holds a setting its checks refuse
    (``why`` names it as results.json has it: settings.X)."""
    return (f"{src}: the run's stored settings: {why} -- fix that results.json or start the run again with its "
            "original command")


#: The flags whose values a resumed run takes from its results.json ``settings`` (:func:`resume_args`),
#: and their keys there: an error in one names the key, not a flag nobody typed.
RESUMED_FLAGS = {**SAMPLING_FLAGS, "--case-timeout": "case_timeout_s"}

#: The sampling rules a resumed run keeps from its results.json ``settings`` where today's defaults
#: differ (the numbers the command line can set come back through :func:`resume_args`).
RESUMED_SAMPLING = ("host_every", "max_repeats", "speed_adjust", "prefetch_spawn", "preimport", "prefetch_depth",
                    "host_precision", "cpu_state", "cpu_hop", "probe_share", "min_burst_samples", "cuda_at_start")


def resumed_config(prior: dict, src: str):
    """The config of the run being resumed: its stored config with the sampling rules it ran under
    (:data:`RESUMED_SAMPLING`, from ``settings``) put back, checked by the same rules as a config
    file (:func:`config.parse_config`), so a results.json whose settings were edited or damaged is a
    ConfigError naming it (``src``: its path) and the setting, before anything is built. A run from
    before ``host_precision`` existed cycled its decided host items to 1 %. ``settings`` is a mapping
    or missing (:func:`resume_args` refuses any other)."""
    conf = prior.get("config")
    st = prior.get("settings") or {}
    if isinstance(conf, dict):
        samp = conf.get("sampling")
        samp = dict(samp) if isinstance(samp, dict) else ({} if samp is None else samp)
        if isinstance(samp, dict):
            samp.update({k: st[k] for k in RESUMED_SAMPLING if st.get(k) is not None})
            if st and "host_precision" not in st:
                samp["host_precision"] = 0.01
            if st.get("probe_share") is None:  # made before the setting existed: the whole difference counted
                samp["probe_share"] = "full"
            conf = {**conf, "sampling": samp}
    try:
        # the config's own source, as the run recorded it (a resume had overwritten it with results.json's path)
        cfg = parse_config(conf, prior.get("config_source") or "results.json", max_cases=None)
        if st.get("probe_share") is None and cfg.sampling.speed_adjust:
            console.print(f"{src}: its settings have no probe_share (a run from before the setting, or an edited "
                          "file): the resumed sets count the whole between-worker probe difference "
                          "(sampling.probe_share: full, the rule before it existed)")
        if cfg.sampling.probe_share == "estimated":  # the threshold the run started with (8 before it was stored)
            cfg.sampling.probe_share_min_sets = stats.recorded_min_sets(st)
        return cfg
    except ConfigError as ex:
        msg = str(ex)
        for k in RESUMED_SAMPLING:  # a value taken from settings is named as results.json has it (new-user trial)
            if st.get(k) is not None:
                msg = msg.replace(f"sampling.{k}", f"settings.{k}")
        raise ConfigError(stored_settings_error(src, msg)) from None


class ResultsNotWritten(StageFailed):
    """The run's results.json could not be written where it belongs (a full disk): exit 3, never 2 --
    nothing the user typed was wrong (:meth:`Run._write_files` says where they went instead)."""


class Run:
    """One ``matrix-run run`` invocation; :meth:`execute` runs the steps in order (module doc).

    ``args``: run's parsed command line; ``argv``: as given (stored in results.json for
    ``--resume``); ``stop``: set by SIGINT/SIGTERM; ``prior``: the results doc of the run being
    resumed, or None."""

    def __init__(self, args, argv: list[str], stop: threading.Event, prior: dict | None):
        self.args, self.argv, self.stop, self.prior = args, argv, stop, prior
        # t_inv: this invocation's start; t_start: the run's (a resume's earlier invocations included)
        self.t_start = self.t_inv = time.monotonic()
        self.created_output: Path | None = None  # removed again if a usage error stops the run early
        self.out_lock: FileLock | None = None
        self.env_holds: ExitStack | None = None
        self.env_results: list = []
        self.items: list = []
        self.data: dict = {}
        self.sets: list = []
        self.reason = "no env could be timed"
        self.env_s = self.timing_s = 0.0
        self.doc: dict = {}

    def execute(self) -> int:
        self.settings()
        self.output()
        if shard.submitted(self.args):  # scale-out (shard module): --executor slurm|submitit-local
            return self.submit_shards()
        self.device()
        if self.device_kind == "none":
            return self.no_gpu()
        self.envs()
        self.timing()
        self.explain()
        self.write()
        return self.exit_code()

    # ---- settings ------------------------------------------------------------------------------
    def settings(self) -> None:
        """The config, the command line's overrides of its sampling, every usage check of the numbers
        (before anything is built), the version requests (a version the index lacks is a usage
        error) and the run id."""
        args, prior = self.args, self.prior
        if prior is None:
            cfg = load_config(args.config, max_cases=None if args.yes else MAX_CASES)
            self._check_numbers(cfg, cfg.sampling)
        else:  # the config as the run stored it (the file may have changed since; its size was accepted)
            src = results.find(Path(args.resume))
            cfg = resumed_config(prior, str(src))
            self.t_start -= float(((prior.get("timing") or {}).get("total_s")) or 0.0)
            try:
                self._check_numbers(cfg, cfg.sampling)
            except UsageError as ex:  # its numbers come from its results.json, not from flags anybody typed
                why = str(ex)
                for flag, key in RESUMED_FLAGS.items():
                    why = why.replace(flag, f"settings.{key}")
                raise UsageError(stored_settings_error(src, why)) from None
        self._check_requests(cfg, cfg.sampling)
        if prior is not None:  # its stored settings and the requests checked before a word of resuming
            # (new-user trial: "time budget extended from 60 to 90 s", then refused: no GPU here)
            ext = getattr(self.args, "extended", None) or {}
            n_sets, n_cases = len(prior.get("sets") or []), len(prior.get("cases") or [])
            console.print(f"resuming {prior.get('run_id')} in {src.parent}: {n_sets} process "
                          f"set{'s' * (n_sets != 1)} and {n_cases} case record{'s' * (n_cases != 1)} kept"
                          + "".join(f"; {'time budget' if k == 'time_budget_s' else 'max sets'} extended from "
                                    f"{'–' if a is None else format(a, 'g')} to {b:g}{' s' if k.endswith('_s') else ''}"
                                    + (" (max_sets: auto, raised with the budget)"
                                       if k == "max_sets" and getattr(self.args, "resumed_max_sets_auto", False) else "")
                                    for k, (a, b) in ext.items()))

    def _check_numbers(self, cfg, samp) -> None:
        """The command line's overrides of the sampling, and every usage check of the numbers."""
        args = self.args
        for flag, attr in SAMPLING_FLAGS.items():
            v = getattr(args, dest(flag))
            if v is not None and not (attr == "max_sets" and v == "auto"):
                setattr(samp, attr, v)
        if getattr(args, "max_sets", None) == "auto":
            samp.max_sets_auto = True
        elif getattr(args, "max_sets", None) is not None:  # given, or a resumed run's own (auto if it was)
            samp.max_sets_auto = bool(getattr(args, "resumed_max_sets_auto", False))
        samp.follow_budget()  # max_sets: auto follows a --time-budget (config.Sampling.max_sets)
        for name, v in (("--max-sets", samp.max_sets), ("--set-seconds", samp.set_seconds), ("--burst-ms", samp.burst_ms),
                        ("--workers-per-env", 1 if samp.workers_per_env is None else samp.workers_per_env),
                        ("--time-budget", samp.time_budget_s), ("--case-timeout", args.case_timeout)):
            if not (v > 0 and math.isfinite(v)):
                raise UsageError(f"{name} {v:g}: give a positive number" + (", a finite one" if v > 0 else ""))
        fail = getattr(args, "fail_on_regression", None)
        if fail is not None and 0 <= fail / 100 < samp.min_effect - 1e-9:
            # verdicts are against min_effect: a change between PCT and it is "same", which the gate
            # passed (new-user trial: 1.033x [1.023, 1.043] "same", --fail-on-regression 2 passed)
            raise UsageError(f"--fail-on-regression {fail:g} is below min_effect ({samp.min_effect * 100:g} %): a "
                             f"change between {fail:g} % and {samp.min_effect * 100:g} % is called 'same' and could "
                             "not fail the gate; give " + (f"--min-effect {fail / 100:g} too, or " if fail > 0 else "")
                             + f"a PCT of at least {samp.min_effect * 100:g}")
        if (samp.workers_per_env or 1) > MAX_WORKERS_PER_ENV:
            raise UsageError(f"--workers-per-env {samp.workers_per_env}: give at most {MAX_WORKERS_PER_ENV} "
                             f"({WORKERS_PER_ENV_WHY})")
        if samp.set_seconds < MIN_SET_SECONDS:
            raise UsageError(f"--set-seconds {samp.set_seconds:g}: give at least {MIN_SET_SECONDS:g} (s of cycles per "
                             "process set; below that a set of fresh workers holds hardly a cycle)")
        if samp.burst_ms > samp.max_burst_ms:
            raise UsageError(f"--burst-ms {samp.burst_ms:g}: give at most {samp.max_burst_ms:g} (half of the "
                             f"{samp.set_seconds:g} s of a set's cycles: a cycle is a burst of each worker)")
        if samp.set_seconds > samp.max_set_seconds and not args.quick:
            if getattr(args, "set_seconds", None) is None:  # the budget alone is too small (new-user trial)
                raise UsageError(f"--time-budget {samp.time_budget_s:g}: give at least {2 * samp.set_seconds:g} s "
                                 f"(two process sets of {samp.set_seconds:g} s of cycles: an interval needs two; "
                                 "narrow ones need many more), or --quick for one set's ratios")
            raise UsageError(f"--set-seconds {samp.set_seconds:g} with a {samp.time_budget_s:g} s budget: give at most half "
                             "the budget (an interval needs at least two process sets), or a larger --time-budget")
        if not 0 < samp.min_effect < 1:
            raise UsageError(f"--min-effect {samp.min_effect}: give a fraction between 0 and 1 (0.05 = 5%)")

    def _check_requests(self, cfg, samp) -> None:
        """The flags' syntax (--gpus, --fail-on-regression, --cpus), the version requests (a version the
        index lacks is a usage error) and the run id."""
        args, prior = self.args, self.prior
        if (prior is not None and (prior.get("settings") or {}).get("device") == "cuda"
                and not shutil.which("nvidia-smi") and not Path("/dev/nvidiactl").exists()):
            # after the stored settings' checks, before its --find-links are read: a committed H200 run
            # resumed on a CPU machine failed on "--find-links /work/main/.carry/built: not a directory"
            # (new-user trial); the driver's probe (device) decides where nvidia-smi is there
            raise UsageError(cuda_resume_error(args.resume, "no CUDA device is visible here (no nvidia-smi, no "
                                                            "/dev/nvidiactl)"))
        if getattr(args, "gpus", None) not in (None, "all"):  # its syntax now; which GPUs exist once probed
            shard.gpu_indices(args.gpus)
        if args.fail_on_regression is not None and not (args.fail_on_regression >= 0
                                                        and math.isfinite(args.fail_on_regression)):
            raise UsageError(f"--fail-on-regression {args.fail_on_regression:g}: give a finite percentage >= 0 "
                             "(5 = fail when a candidate is slower by more than 5%)")
        for flag in ("--max-sets", "--set-seconds"):  # a quick run times one set of quick_set_seconds
            v = getattr(args, dest(flag), None)
            if getattr(args, "quick", False) and v is not None:  # new-user trial: --quick --max-sets 5 ran one set
                raise UsageError(f"{flag} {v:g} with --quick: a quick run times one process set of "
                                 f"{Sampling.quick_set_seconds:g} s of cycles, whatever {flag} says; drop --quick "
                                 f"(a full run times sets until its verdicts are decided or --time-budget is spent) "
                                 f"or drop {flag}")
        if args.fail_on_regression is not None and getattr(args, "quick", False):
            raise UsageError("--fail-on-regression with --quick: a quick run gives provisional ratios from one "
                             "process set, never a slower verdict, so the gate could never fail; drop --quick "
                             "(a full run decides within --time-budget) or drop --fail-on-regression")
        try:  # before anything is built
            lockstep.parse_cpus(args.cpus)
        except ValueError as ex:
            raise UsageError(str(ex)) from None
        reqs = envmod.parse_versions(args.versions)
        opts = options(args)
        if args.fail_on_regression is not None and len(envmod.cross_torch(reqs, opts.torches)) < 2:
            # a gate that compared nothing said "passed" (new-user trial 2026-12-04)
            how = ("--backend here times one env: use --backend uv with two or more --versions"
                   if args.backend == "here" else "give two or more --versions (e.g. 2.6.3,2.7.0.post2)")
            raise UsageError(f"--fail-on-regression with one env ({reqs[0].label}): nothing is compared, so the "
                             f"gate could never fail; {how}, or drop --fail-on-regression")
        if args.backend == "uv":  # before anything is built: a version the index lacks is a usage error
            for w in envmod.check_versions(reqs, opts):
                warn(w)
        if args.backend == "here":
            check_here_versions(reqs)
        self.cfg, self.samp, self.opts = cfg, samp, opts
        self.reqs = envmod.cross_torch(reqs, opts.torches)
        self.created = datetime.now(timezone.utc)
        self.run_id = self.created.strftime("%Y%m%d-%H%M%S") + "-" + run_name([r.label for r in self.reqs])
        if prior is not None:
            self.run_id, self.created = prior["run_id"], datetime.fromisoformat(prior["created"])

    # ---- output --------------------------------------------------------------------------------
    def output(self) -> None:
        """The run directory (``--output``, else ``reports/<run id>``, made unique), its run lock (one
        run per directory at a time) and the ``--markdown`` path's check; prints the banner."""
        args, prior = self.args, self.prior
        if args.output:
            out_dir = Path(args.output)
            held = [n for n in results.NAMES if (out_dir / n).exists()]
            if prior is None and held:  # an archived run's results.json.gz too (new-user trial: a new
                # results.json beside it hid it from every reader)
                raise UsageError(f"--output {out_dir} already holds a run ({held[0]}); give another "
                                 f"--output" + held_run_hint(out_dir, held[0]))
            if out_dir.exists() and not out_dir.is_dir():
                raise UsageError(f"--output {out_dir} is a file, not a directory")
            check_writable_dir(out_dir, "--output")
            if not out_dir.exists():
                self.created_output = out_dir
            try:
                out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # new-user trial: /proc/x said "No such file or directory", naming no option
                self.created_output = None
                raise UsageError(f"--output {out_dir}: cannot create it ({e.strerror or e}); give a directory "
                                 "you can write") from None
        else:
            check_writable_dir(Path("reports"), "reports/ (the default --output)")
            base, n = Path("reports") / self.run_id, 1
            while True:  # two runs started in the same second get their own directories
                out_dir = base if n == 1 else base.with_name(f"{base.name}-{n}")
                try:
                    out_dir.mkdir(parents=True, exist_ok=prior is not None)
                    if prior is None:
                        self.created_output = out_dir
                    break
                except FileExistsError:
                    n += 1
            self.run_id = out_dir.name
        self.out_dir = out_dir
        # one run per output directory at a time: two runs started together into one --output both
        # passed the results.json check above and the later one overwrote the other's results
        self.out_lock = FileLock(str(out_dir / ".matrix-run.lock"))
        try:
            self.out_lock.acquire(timeout=0)
        except Timeout:
            raise UsageError(f"--output {out_dir} is in use by another matrix-run that is still running; give "
                             "another --output, or wait for that run to finish") from None
        if args.markdown:
            check_writable_file(Path(args.markdown), "--markdown")
        # two lines: a long output path on the first line wrapped it mid-way in 80 columns
        console.print(f"[bold]matrix-run[/] {__version__}: {len(self.reqs)} env(s), {len(self.cfg.cases)} case(s) "
                      f"({self.cfg.source})")
        console.print(f"  output: {escape(str(out_dir))}", soft_wrap=True)
        if len(self.reqs) == 1 and prior is None:  # new-user trial: a typo'd list ran with nothing to compare, unsaid
            how = ("--backend here times this interpreter alone; for a comparison use --backend uv with two or more "
                   "--versions" if args.backend == "here" else
                   "to compare, give two or more, comma-separated (e.g. --versions 2.6.3,2.7.0.post2)")
            console.print(f"[yellow]note:[/] one env ({escape(self.reqs[0].label)}): nothing to compare; its own "
                          f"times (µs, TFLOP/s) are taken to the time budget, with no verdict; {escape(how)}")

    def _command(self) -> list[str]:
        argv = self.argv
        return ["matrix-run", *argv[1:]] if argv and argv[0] == "run" else ["matrix-run", *argv]

    def submit_shards(self) -> int:
        """``--executor slurm|submitit-local``: the shards as jobs (:func:`shard.submit`), their results
        merged and written here."""
        args, prior = self.args, self.prior
        doc = shard.submit(args, self.argv, self.out_dir, self.cfg.cases, self.stop, prior, log=console.print)
        doc.update(run_id=self.run_id, created=self.created.isoformat(timespec="seconds"), title=self.cfg.title,
                   command=(prior or {}).get("command") or ["matrix-run", *self.argv[1:]])
        # the run's own wall time: a shard's total had stood for it, shorter than the longest shard's
        # timing (second new-user trial: "timing 28.6 s · total 26.9 s")
        doc["timing"]["total_s"] = round(time.monotonic() - self.t_start, 2)
        self.doc = doc
        self._write_files()
        for s in doc.get("shards") or []:  # each job's timing and CPUs (the jobs' own terminals are their logs)
            cp = s.get("cpus") or {}
            where = (f"sets on CPU(s) {', '.join(map(str, cp.get('set_cpus') or []))}" if cp.get("pinned") else
                     f"sets unpinned ({cp.get('why')})" if cp else "CPUs not recorded")
            console.print(f"[dim]shard {s.get('index')}/{s.get('count')}: timing {s.get('timing_phase_s') or 0:.1f} s, "
                          f"{where}; stopped: {s.get('lost') or s.get('stop_reason')}[/]")
        console.print(f"[dim]time: {doc['timing']['total_s']:.1f} s in all, the shards timed at once[/]")
        if doc["timing"]["shards_lost"]:
            console.print(f"[yellow]shard(s) {doc['timing']['shards_lost']} lost: their cases failed; "
                          f"rerun them with matrix-run --resume {shlex.quote(str(self.out_dir))}[/]")
        if self.stop.is_set():
            return EXIT_INTERRUPTED
        code = EXIT_FAILED if any(c["status"] != "ok" for c in doc["cases"]) or doc["timing"]["shards_lost"] else EXIT_OK
        return self.gate(code) if args.fail_on_regression is not None else code

    # ---- device --------------------------------------------------------------------------------
    def device(self) -> None:
        """The driver's probe and the machine record, the device (cuda / cpu / none), the GPUs of a
        ``--gpus`` run, the settings record and the env plans (printed). UsageError for
        ``--device cuda`` without a visible GPU."""
        args, prior, samp, opts = self.args, self.prior, self.samp, self.opts
        t_probe = time.monotonic()
        dprobe = envmod.probe(sys.executable)
        mach = machine.collect(dprobe)
        self.base_timing = {"probe_s": round(time.monotonic() - t_probe, 2)}
        torch_info = dprobe.get("torch") or {}
        device = args.device
        no_gpu_msg = None
        if device == "cuda" and not (torch_info.get("cuda_available") or mach.get("nvidia_smi")):
            none = (f"no CUDA device is visible here (nvidia-smi is missing and torch "
                    f"{torch_info.get('version', '(not importable)')} reports none)")
            if prior is not None:  # a --resume takes the device from results.json: no flag to name (new-user trial)
                raise UsageError(cuda_resume_error(args.resume, none))
            raise UsageError(f"--device cuda: {none}; run on a machine with an NVIDIA GPU, or use --device cpu")
        if device == "auto":
            has_gpu = bool(torch_info.get("cuda_available") or mach.get("nvidia_smi"))
            device = "cuda" if has_gpu else "none"
            if not has_gpu:
                torch_says = (f"torch {torch_info['version']} reports no CUDA device" if torch_info.get("version") else
                              f"torch cannot be imported by {sys.executable} (install a CUDA build of torch there)")
                shown = ("showed the plan for each env, " if dprobe.get("torch") or "inherit" not in opts.torches else "")
                no_gpu_msg = ("flash-attn needs an NVIDIA GPU (its kernels are CUDA-only), and none is visible here: "
                              f"nvidia-smi is missing and {torch_says}. "
                              f"Nothing was built or timed. Did instead: checked the config and the versions, {shown}"
                              "and wrote results.json and index.html marking every env 'skipped'. "
                              "Run on a machine with an NVIDIA GPU, or use --device cpu to exercise the pipeline on CPU "
                              "(real flash-attn rejects CPU tensors; README.md, 'Without a GPU', shows a stand-in).")
        self.gpus = shard.resolve_gpus(args.gpus, device)  # [] = one GPU, as before; else one shard per GPU
        if args.gpus is not None and device == "cpu":  # new-user trial: it ran "GPU 0 (cpu)" without a word
            console.print(f"[yellow]note:[/] --gpus {escape(args.gpus)} with --device cpu uses no GPU: "
                          + ("the list only splits the cases into shards, each timed on its own CPUs"
                             if self.gpus else "one unsharded run"))
        self.job = shard.parse_shard(args.shard)  # a job's share of the cases (--executor slurm)
        settings = {"device": device, "torch": ",".join(opts.torches), "quick": args.quick,
                    "min_effect": samp.min_effect, "method": results.METHOD, "alpha": samp.alpha,
                    "planned_sets": samp.planned_sets, "max_sets": samp.max_sets, "max_sets_auto": samp.max_sets_auto,
                    # what a set's cycles ran for: a --quick run's one set runs quick_set_seconds
                    "set_seconds": samp.quick_set_seconds if args.quick else samp.set_seconds,
                    "burst_ms": samp.burst_ms, "workers_per_env": samp.workers_per_env,
                    "host_every": samp.host_every, "max_repeats": samp.max_repeats, "host_precision": samp.host_precision,
                    "speed_adjust": samp.speed_adjust, "prefetch_spawn": samp.prefetch_spawn, "cpu_state": samp.cpu_state,
                    "cpu_hop": samp.cpu_hop, "probe_share": samp.probe_share,
                    "min_burst_samples": samp.min_burst_samples, "cuda_at_start": samp.cuda_at_start,
                    # earlier pinned sets before a share is estimated (runner.apply_probe_share)
                    "probe_share_min_sets": ((samp.probe_share_min_sets or stats.PROBE_SHARE_MIN_SETS)
                                             if samp.probe_share == "estimated" else None),
                    # a set's probe difference counts only up to this many times the earlier sets' largest
                    "probe_share_reach": stats.PROBE_SHARE_REACH if samp.probe_share == "estimated" else None,
                    "probe_first_reach": stats.PROBE_FIRST_REACH if samp.probe_share == "estimated" else None,
                    "preimport": samp.preimport, "prefetch_depth": samp.prefetch_depth, "cpus_request": args.cpus, "time_budget_s": samp.time_budget_s,
                    "fail_on_regression": args.fail_on_regression,
                    "case_timeout_s": args.case_timeout, "build": opts.build, "offline": opts.offline,
                    "find_links": [str(p) for p in opts.find_links], "no_gpu_message": no_gpu_msg,
                    "cwd": (prior or {}).get("settings", {}).get("cwd") or os.getcwd(),
                    "gpus": [g["index"] for g in self.gpus] or None}
        self.base_doc = {"schema": results.SCHEMA, "run_id": self.run_id,
                         "created": self.created.isoformat(timespec="seconds"), "title": self.cfg.title,
                         "command": self._command(), "config": self.cfg.raw, "config_source": self.cfg.source,
                         "settings": settings, "machine": mach, "matrix_run_version": __version__}
        if prior is not None:
            self.base_doc["command"] = prior["command"]
            at = datetime.now(timezone.utc).isoformat(timespec="seconds")
            self.base_doc["resumed"] = [*(prior.get("resumed") or []), at]
            ext = getattr(args, "extended", None)  # --resume RUN --time-budget S: [the run's, the new] per key
            if prior.get("extended") or ext:
                self.base_doc["extended"] = [*(prior.get("extended") or []), *([{"at": at, **ext}] if ext else [])]
        if args.backend == "uv" and (dprobe.get("torch") or "inherit" not in opts.torches or device != "none"):
            # (without torch and --torch inherit, plan_env raises the usage error that says to install it;
            # only a no-GPU run, which builds nothing, goes on without a plan)
            self.items = plan_all(self.reqs, self.cfg.cases, opts, dprobe)
        if self.items:
            print_plan(self.items)
        if device == "cpu":
            warning = cpu_size_warning(self.cfg.cases)
            if warning:
                warn(warning)
        self.dprobe, self.machine, self.device_kind, self.no_gpu_msg = dprobe, mach, device, no_gpu_msg

    def no_gpu(self) -> int:
        """No GPU and no ``--device cpu``: every env 'skipped', results and report written, exit 3."""
        console.print(f"[yellow]{escape(self.no_gpu_msg)}[/]")
        items, opts = self.items, self.opts
        self.env_results = [envmod.EnvResult(r.label, r.version, str(opts.envs_dir / r.label), status="skipped",
                                             error="no NVIDIA GPU visible",
                                             plan=(items[i].to_dict() if i < len(items) else None), axis=r.axis)
                            for i, r in enumerate(self.reqs)]
        self.reason = "no GPU"
        self.doc = self.finish_doc(self.reason)
        self._write_files()
        return EXIT_FAILED

    # ---- envs ----------------------------------------------------------------------------------
    def envs(self) -> None:
        """Every env prepared (:func:`envs.prepare_env` in parallel threads; ``--backend here``: this
        interpreter), held until the run ends (``envs clean`` leaves them alone); a line per env.
        UsageError when a resumed env now holds another wheel than the run being resumed."""
        t_env = time.monotonic()
        reqs, opts = self.reqs, self.opts
        if self.args.backend != "here":
            self.env_holds = ExitStack()
            envmod.hold_envs(opts.envs_dir, [r.label for r in reqs], self.env_holds)
            self.env_results = prepare_envs(reqs, self.items, opts, self.dprobe, self.cfg.cases)
        else:
            self.env_results = [envmod.prepare_here(reqs[0], self.dprobe)]
        self.env_s = time.monotonic() - t_env
        for e in self.env_results:
            if e.status == "ok":
                how = "reused" if e.build.get("reused") else e.build.get("method")
                if e.build.get("rebuilt_because"):  # a reused env found broken and made again
                    how = f"rebuilt by {how}: the existing env was broken"
                cc = ((e.build.get("source_build") or {}).get("compile_cache") or {}).get("stats")
                hits = (f", compile cache {sum(cc['hits'].values())} hits / {sum(cc['misses'].values())} misses"
                        if cc else "")
                pkg = (e.probe["flash_attn"].get("subject") or "flash_attn").replace("-", "_")
                console.print(f"  [green]✓[/] {e.label}: {pkg} {e.probe['flash_attn']['version']} ({how}, "
                              f"{e.build.get('seconds', 0):.1f} s{hits})")
            else:
                console.print(f"  [red]✗ {escape(e.label)}: {escape(str(e.error))}[/]")
                if e.error_tail:
                    console.print("[dim]" + escape("\n".join("    " + ln for ln in e.error_tail.splitlines()[-12:])) + "[/]")
        if self.prior is not None:  # never pool samples of two different builds under one label
            before = {e["label"]: (e.get("build") or {}).get("wheel_sha256") for e in self.prior.get("envs", [])}
            for e in self.env_results:
                now = e.build.get("wheel_sha256") if e.status == "ok" else None
                if before.get(e.label) and now and before[e.label] != now:
                    raise UsageError(
                        f"--resume: env {e.label} now has another flash-attn wheel (sha256 {now[:12]}…) than the run "
                        f"being resumed ({before[e.label][:12]}…); its samples cannot be pooled: start a new run")

    # ---- timing: process sets --------------------------------------------------------------------
    def timing(self) -> None:
        """The timing phase: process sets of lockstep cycles over the envs that are ok (:mod:`runner`;
        one shard per GPU with ``--gpus``: :func:`shard.time_local`); results so far written after
        the first set, then every :data:`PARTIAL_EVERY_S`. The time budget holds what this invocation spent before timing (the driver's
        probe, the plan; checking envs when every one was reused) but not env building or installing
        (minutes on a cold cache): with warm envs a --time-budget 60 run takes at most 60 s in all
        (plus writing the report)."""
        prior, base_doc, stop = self.prior, self.base_doc, self.stop
        ok_envs = [e for e in self.env_results if e.status == "ok"]
        prior_tm = float(((prior or {}).get("timing") or {}).get("timing_phase_s") or 0.0)
        t_tm = time.monotonic() - prior_tm  # a resumed run's timing phase includes the earlier one
        before_s = max(0.0, time.monotonic() - self.t_inv - self.env_s)
        self.base_timing["before_timing_s"] = round(before_s, 2)
        built = not (ok_envs and all((e.build or {}).get("reused") for e in ok_envs))
        if not built:
            # envs only checked, nothing built or installed: that check is part of the minute too
            # (0.01-0.44 s on the H200, 2026-12-03; one run ended at 60.69 s with 0.44 s of it)
            before_s += self.env_s
        # what the budget leaves out, over every session of the run: building and installing envs
        pt = (prior or {}).get("timing") or {}
        excluded = float(pt.get("budget_excluded_s") or 0.0) + (self.env_s if built else 0.0)
        self.base_timing["budget_excluded_s"] = round(excluded, 2)
        # a resumed run's earlier sessions: their time outside the timing phase counts as well (their
        # start-up, the results written at their end; new-user trial: a run interrupted at 14.2 s and
        # resumed ended at 41.2 s of a 40 s budget, the first session's 1.5 s of it uncounted). Records
        # from before budget_excluded_s: their last session's time before timing.
        prior_other = 0.0
        if prior:
            prior_other = (max(0.0, float(pt.get("total_s") or 0.0) - float(pt["budget_excluded_s"]) - prior_tm)
                           if "budget_excluded_s" in pt else float(pt.get("before_timing_s") or 0.0))
        self.base_timing["resumed_other_s"] = round(prior_other, 2) if prior else None
        before_s += prior_other
        base_doc["timing"] = self.base_timing
        # measured process sets of the run being resumed (case id + env label is the key)
        self.data = data = runner.data_from_results(prior, self.cfg.cases) if prior else {}
        self.sets = sets = list(prior.get("sets") or []) if prior else []
        if stop.is_set():  # interrupted while envs were prepared
            self.reason = "interrupted"
            for e in self.env_results:
                if e.status != "ok" and not str(e.error).startswith("interrupted"):
                    e.status, e.error = "failed", f"interrupted: {e.error}"
        elif ok_envs:
            self.reason = self._time_sets(ok_envs, data, sets, t_tm, prior_tm, before_s)
        self.timing_s = time.monotonic() - t_tm
        for e in ok_envs:
            if e.status == "failed":  # failed the import check in its first worker
                console.print(f"  [red]✗ {escape(e.label)}: {escape(str(e.error))}[/]")

    def _time_sets(self, ok_envs, data, sets, t_tm, prior_tm, before_s) -> str:
        """The CPU plan, the sampling's pace settings, then the process sets; returns the stop reason."""
        args, samp, base_doc, gpus, cfg = self.args, self.samp, self.base_doc, self.gpus, self.cfg
        try:  # sharded over GPUs: each shard plans its own share of the CPUs (shard.time_local)
            cpus = (lockstep.plan_cpus(args.cpus, n_sets=lockstep.pool_size(len(machine.allowed_cpus()), samp.cpu_hop))
                    if not gpus else {"pinned": None, "sharded": True})
        except ValueError as ex:
            raise UsageError(str(ex)) from None
        base_doc["settings"]["cpus"] = cpus
        idle = lockstep.hop_idle(cpus) if samp.cpu_hop and not gpus else None
        if idle:  # said up front, not found in the report (runner.run_all records it there)
            warn(f"sampling.cpu_hop: true does nothing in this run: {idle}")
        if samp.workers_per_env is None and not gpus:  # auto: 1 (config.Sampling.workers_per_env)
            samp.workers_per_env = 1
        base_doc["settings"]["workers_per_env"] = samp.workers_per_env
        # the machine's pace, for tuning the confidence sequence (Sampling.planned_sets): a set's
        # workers import torch as the driver's probe did, in parallel on the spare cores, where the
        # runner starts them during the previous set (its rule: there are spare cores), else after it
        spare = len(cpus.get("spare_cpus") or [])
        n_workers = len(ok_envs) * (samp.workers_per_env or 1)
        if not gpus:  # a sharded run's shards plan their own share of the CPUs
            samp.prefetch = spare > 0
            if samp.prefetch_depth is None:  # auto (config.Sampling.depth_for); the runner decides alike
                samp.prefetch_depth = samp.depth_for(spare, n_workers, self.base_timing["probe_s"], samp.set_seconds)
            elif samp.prefetch_depth > 1 and spare < samp.prefetch_depth * n_workers:
                warn(f"sampling.prefetch_depth {samp.prefetch_depth}: {samp.prefetch_depth * n_workers} workers "
                     f"would start at once on {spare} spare CPU(s); their imports then slow one another and the sets "
                     "wait for them (a 2-core machine got 2 sets instead of 4): use auto")
            samp.start_s = self.base_timing["probe_s"] * math.ceil(n_workers * samp.prefetch_depth / max(1, spare))
        base_doc["settings"]["prefetch_depth"] = samp.prefetch_depth
        samp.before_s = before_s
        prior_planned = ((self.prior or {}).get("settings") or {}).get("planned_sets")
        if prior_planned:  # --resume: the sets already judged keep their sequence
            samp.planned = int(prior_planned)
        base_doc["settings"]["planned_sets"] = samp.planned_sets
        if cpus["pinned"]:
            console.print(f"[dim]process sets pinned to CPU(s) {', '.join(map(str, cpus['set_cpus']))} "
                          f"(driver on CPU {cpus['driver_cpu']})[/]")
            if cpus.get("shared"):
                warn(cpus["shared"])
        elif cpus["pinned"] is not None:
            warn(f"workers run unpinned ({cpus['why']}): process sets are not timed on one core, so CPU speed "
                 "changes are not shared; intervals are wider")
        with progress() as prog:
            task = prog.add_task("timing", total=None)

            def on_progress(msg):
                prog.update(task, description=msg)

            last_write = [-math.inf]

            def on_set(rec):
                # results so far, so that a crash or kill of the driver keeps them: after the first
                # set, then at most every PARTIAL_EVERY_S (each write is on the path between two sets)
                if time.monotonic() - last_write[0] >= PARTIAL_EVERY_S:
                    try:
                        t_fin = time.monotonic()
                        partial = self.finish_doc("running", time.monotonic() - t_tm)
                        # what the final results will take after the last set (runner's budget check)
                        samp.finish_s = max(samp.finish_s, time.monotonic() - t_fin)
                        results.write_json(self.out_dir / "results.json", partial)
                    except Exception as ex:  # noqa: BLE001 - a partial write must never stop the run
                        console.print(f"[dim]partial results not written to {self.out_dir / 'results.json'} "
                                      f"({escape(str(ex))}): the run goes on, and writes them at its end[/]")
                    last_write[0] = time.monotonic()
                if not console.is_terminal:  # a log: the sets as lines (no spinner there)
                    console.print(f"set {rec['set']}: {rec['cycles']} cycles, {rec['seconds']:.1f} s"
                                  + (f", cpu {rec['cpu']}" if rec.get("cpu") is not None else ", unpinned"))
                if rec.get("status") == "failed" and rec.get("error"):  # why, with the workers' own errors
                    lost = "; ".join(f"{k}: {w['error']}" for k, w in (rec.get("workers") or {}).items()
                                     if isinstance(w, dict) and w.get("error") and w["error"] not in rec["error"])
                    console.print(f"[yellow]set {rec['set']} failed: {escape(rec['error'])}"
                                  + (f" ({escape(lost)})" if lost else "") + "[/]")

            work = self.out_dir / ".work"
            if gpus:  # one shard per GPU, at once (shard module)
                reason, base_doc["shards"] = shard.time_local(
                    ok_envs, cfg.cases, samp, gpus, device=self.device_kind, quick=args.quick, work=work,
                    case_timeout=args.case_timeout, stop=self.stop, data=data, sets=sets, cpus_request=args.cpus,
                    on_set=on_set, on_progress=on_progress, elapsed_s=prior_tm, log=console.print)
                return reason
            job = self.job
            mine = shard.share(cfg.cases, *job) if job else cfg.cases
            if job:
                base_doc["shard"] = shard.job_record(job, self.machine)
            # the budget holds the plan above too (plan_cpus' noise calibration: ~30 ms per core, ~0.5 s
            # on the H200's 16; uncounted, runs ended up to 0.3 s past a 60 s budget, 2026-12-04)
            reason = runner.run_all(ok_envs, mine, samp, device=self.device_kind, quick=args.quick, work=work,
                                    case_timeout=args.case_timeout, stop=self.stop, data=data, sets=sets, cpus=cpus,
                                    on_set=on_set, on_progress=on_progress,
                                    elapsed_s=before_s + (time.monotonic() - t_tm),
                                    family_extra=(len(ok_envs) - 1) * (len(cfg.cases) - len(mine)),
                                    timing=self.base_timing, alone=len(self.reqs) == 1)
            for cd in data.values() if job else ():  # a job's cases: its GPU and the clocks seen
                cd.gpu = {**(base_doc["shard"].get("gpu") or {}), "shard": job[0], **shard.clocks_seen(sets)}
            return reason

    # ---- explain -------------------------------------------------------------------------------
    def explain(self) -> None:
        """``--explain``: the explain pass (:func:`explain.run`, its own workers) with a progress line;
        a failure of the pass itself is reported and never fails the run."""
        ok_envs = [e for e in self.env_results if e.status == "ok"]
        if not (getattr(self.args, "explain", False) and ok_envs and self.reason != "interrupted"
                and not self.stop.is_set()):
            return
        console.print("[dim]explain: layers, frame profile, call counts, first calls (own worker processes)[/]")
        t_explain = time.monotonic()
        raw = None  # what the pass returned; an interrupt that cut it short leaves a bare record
        try:
            with progress() as prog:
                task = prog.add_task("explain", total=None)
                raw = explain.run(ok_envs, self.cfg.cases, device=self.device_kind, work=self.out_dir / ".work",
                                  case_timeout=self.args.case_timeout, cpus=self.base_doc["settings"].get("cpus"),
                                  settings=self.cfg.explain, on_progress=lambda m: prog.update(task, description=m))
        except proc.Stopped:
            pass
        except Exception as ex:  # noqa: BLE001 - the explanation is extra: never lose the run for it
            if not self.stop.is_set():  # (interrupted: a step the interrupt cut short, not a failure)
                console.print(f"[yellow]explain pass failed: {escape(f'{type(ex).__name__}: {ex}')}[/]")
                self.base_doc["explain"] = {"schema": explain.SCHEMA, "envs": [e.label for e in ok_envs],
                                            "notes": [f"explain pass failed: {ex}"]}
                return
        if raw is None:
            raw = {"schema": explain.SCHEMA, "envs": [e.label for e in ok_envs], "notes": []}
        raw["seconds"] = round(time.monotonic() - t_explain, 1)  # the time line names it (new-user trial)
        if self.stop.is_set():  # interrupted in the pass (new-user trial: it exited 0, the explanation
            # silently partial, a worker "killed by SIGTERM" and py-spy's exit blamed on ptrace)
            raw["interrupted"] = True
            raw.setdefault("notes", []).insert(0, EXPLAIN_INTERRUPTED)
        err = (raw.get("profile") or {}).get("error")
        if err and not raw.get("interrupted"):  # (interrupted: a profiler it stopped, not ptrace)
            console.print(f"[yellow]explain: {escape(err)}[/]")  # it names 'matrix-run[explain]'
        self.base_doc["explain"] = raw

    # ---- write ---------------------------------------------------------------------------------
    def finish_doc(self, reason: str, timing_s: float | None = None) -> dict:
        """The results document (:mod:`results`' schema) of what is measured so far: envs, case records
        in config order, comparisons, sets, timing; ``reason``: why sampling stopped."""
        doc = dict(self.base_doc)
        env_results, cfg = self.env_results, self.cfg
        doc["envs"] = [e.to_dict() for e in env_results]
        cases = [results.case_record(cd, cd.case) for cd in self.data.values()]
        # keep config order: by case then env order
        order = {c.id: i for i, c in enumerate(cfg.cases)}
        labels = [e.label for e in env_results]
        cases.sort(key=lambda c: (order.get(c["id"], 0), labels.index(c["env"]) if c["env"] in labels else 0))
        doc["cases"] = cases
        ok_labels = [e.label for e in env_results if e.status == "ok"]
        doc["comparisons"] = results.comparisons(cases, ok_labels, doc["settings"]["min_effect"],
                                                 settings=doc["settings"], pairs=results.env_pairs(doc["envs"]),
                                                 sets=self.sets)
        doc["sets"] = self.sets
        doc["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        doc["timing"] = {**(self.base_doc.get("timing") or {}), "env_phase_s": round(self.env_s, 2),
                         "timing_phase_s": round(self.timing_s if timing_s is None else timing_s, 2),
                         "total_s": round(time.monotonic() - self.t_start, 2), "stop_reason": reason}
        return doc

    def _write_files(self) -> None:
        """results.json, index.html, ``--markdown``; the terminal table; where they are. A results.json
        that cannot be written (a full disk: new-user trial, which had ended in "error: No space left on
        device", exit 2, with the last partial write's 3 of 6 sets) is written to a rescue folder under
        the temporary directory instead, and the error names both and how to go on (exit 3). Each
        rescue gets a folder of its own (tempfile.mkdtemp): a resume that hit the same full disk had
        overwritten the first rescue's sets (new-user trial)."""
        doc, out_dir = self.doc, self.out_dir
        pct = getattr(self.args, "fail_on_regression", None)
        doc.pop("gate", None)  # a resumed run's earlier one: decided again on all its sets
        if pct is not None:  # an interrupted run's too: "not judged" (the README: whichever it is)
            doc["gate"] = gate_outcome(doc, pct, self.samp.time_budget_s)
        try:
            results.write_json(out_dir / "results.json", doc)
        except OSError as ex:
            rescue = Path(tempfile.gettempdir()) / f"{RESCUE_PREFIX}{doc.get('run_id') or 'run'}-..."
            try:
                rescue = Path(tempfile.mkdtemp(prefix=f"{RESCUE_PREFIX}{doc.get('run_id') or 'run'}-"))
                results.write_json(rescue / "results.json", doc)
                kept = (f"every set measured ({len(doc.get('sets') or [])}) was written to {rescue / 'results.json'} "
                        f"instead: once {out_dir} can be written, move it there (or give `matrix-run report "
                        f"{rescue}` for its report)")
            except OSError as ex2:
                kept = (f"nor to {rescue} ({ex2.strerror or ex2}): {out_dir / 'results.json'} holds the sets up to "
                        "its last partial write, if any")
            raise ResultsNotWritten(
                f"results not written to {out_dir / 'results.json'} ({ex.strerror or ex}); {kept}; "
                f"`matrix-run --resume {out_dir}` then adds sets") from None
        try:
            p = report.write_html(doc, out_dir, "results.json")
        except OSError as ex:  # the results are written: the report can be made from them later
            p = None
            warn(f"report not written to {out_dir / 'index.html'} ({ex.strerror or ex}): "
                 f"`matrix-run report {out_dir}` writes it from the results")
        md = getattr(self.args, "markdown", None)
        if md:
            report.write_markdown(md, report.markdown(doc))
        if doc["cases"]:
            report.terminal_table(doc, Console(), run_dir=str(out_dir))
        # and the Markdown where asked for (new-user trial: written, the terminal did not say so)
        console.print(f"results: {out_dir / 'results.json'}" + (f"\nreport:  {p}" if p else "")
                      + (f"\nMarkdown: {md}" if md else ""))

    def write(self) -> None:
        """The results document written (:meth:`_write_files`), the explanation's summary, and where
        the time went (envs, timing, per clock, start-up)."""
        self.doc = doc = self.finish_doc(self.reason)
        self._write_files()
        if doc.get("explain"):
            for line in explain.summary_lines(explain.analyze(doc)):
                console.print(line, markup=False)
        per_clock: dict = {}
        for c in doc["cases"]:
            for k, v in (c.get("clock_seconds") or {}).items():
                per_clock[k] = per_clock.get(k, 0.0) + v
        in_cases = sum(per_clock.values())
        spent = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_clock.items(), key=lambda kv: -kv[1]))
        sets = self.sets
        n = len(sets)  # as the report counts them: an interrupted set's cycles are kept and compared
        cut = sum(1 for r in sets if r.get("status") == "interrupted")
        timing_s = self.timing_s
        console.print(f"[dim]time: envs {self.env_s:.1f} s, timing {timing_s:.1f} s ({n} process set{'s' if n != 1 else ''}"
                      + (f", {cut} of them interrupted" if cut else "") + "; "
                      f"stopped: {self.reason})" + (f"; in cases {in_cases:.1f} s ({spent}), process start-up and "
                                                    f"imports {max(timing_s - in_cases, 0):.1f} s" if per_clock else "")
                      + (f"; explain pass {doc['explain']['seconds']:.1f} s"
                         if isinstance((doc.get("explain") or {}).get("seconds"), (int, float)) else "")
                      + "[/]")

    # ---- exit code -----------------------------------------------------------------------------
    def exit_code(self) -> int:
        """130 interrupted; 1 a wall-time regression over ``--fail-on-regression``; 3 an env or case
        failed, or nothing was timed; else 0 (errors.py). Says why on the console."""
        doc, reason, args = self.doc, self.reason, self.args
        if reason == "interrupted":
            console.print(f"[yellow]interrupted: results measured so far are written; finish the run with "
                          f"matrix-run --resume {shlex.quote(str(self.out_dir))}[/]")
            return EXIT_INTERRUPTED
        if (doc.get("explain") or {}).get("interrupted"):
            console.print(f"[yellow]interrupted in the explain pass: the timing is complete and written; "
                          f"{EXPLAIN_INTERRUPTED}[/]")
            return EXIT_INTERRUPTED
        code = EXIT_OK
        ok_envs = [e for e in self.env_results if e.status == "ok"]
        failed_cases = [c for c in doc["cases"] if c["status"] != "ok"]
        if reason.startswith("driver error"):
            console.print(f"[red]{reason}[/]")
        if len(ok_envs) < len(self.env_results) or failed_cases or not ok_envs or reason.startswith("driver error"):
            code = EXIT_FAILED
            not_run = [c for c in failed_cases if c["status"] == "not run"]
            failed = [c for c in failed_cases if c["status"] != "not run"]
            for e in self.env_results:  # at the end too, not only mid-log (new-user trial: a typo'd
                # version's env failed and the run closed with "one env: nothing to compare" alone)
                if e.status != "ok":
                    console.print(f"[yellow]{escape(failed_env_line(e.label, e.status, e.error))}[/]")
            if failed:
                kinds = sorted({c.get("error_kind") or "error" for c in failed})
                n_env = len({c["env"] for c in failed})
                console.print(f"[yellow]{len({c['id'] for c in failed})} case(s) failed in {n_env} env(s) "
                              f"({', '.join(kinds)}); see the report[/]")
            if not_run:
                # why, without nesting the reason's own parentheses in more (new-user trial): a case
                # failed in another env is not timed in this one either
                ids = {c["id"] for c in not_run}
                elsewhere = ids & {c["id"] for c in failed}
                console.print(f"[yellow]{len(ids)} case(s) not timed, see the report; "
                              + (f"{len(elsewhere)} of them failed in another env; " if elsewhere else "")
                              + f"sampling stopped: {escape(reason)}[/]")
        if args.fail_on_regression is not None:
            code = self.gate(code)
        return code

    def gate(self, code: int) -> int:
        """``--fail-on-regression PCT``: :func:`gate_outcome` (stored in results.json by
        :meth:`_write_files`), said on the console; exit 1 on a regression, 3 when one over PCT could
        not be judged, else ``code``."""
        g = self.doc.get("gate") or gate_outcome(self.doc, self.args.fail_on_regression, self.samp.time_budget_s)
        style = {"failed": "red", "not judged": "yellow"}.get(g["outcome"], "yellow" if g["undecided"] else "dim")
        console.print(f"[{style}]{escape(g['text'])}[/]")
        if g["outcome"] == "failed":
            return EXIT_REGRESSION
        if g["outcome"] == "not judged":
            return max(code, EXIT_FAILED)
        return code

    # ---- clean-up ------------------------------------------------------------------------------
    def release_output(self) -> None:
        """Release the output directory's run lock (taken in :meth:`output`) and remove its file."""
        lk, self.out_lock = self.out_lock, None
        if lk is not None and lk.is_locked:
            lk.release()
            Path(lk.lock_file).unlink(missing_ok=True)

    def close(self) -> None:
        """The env holds and the run lock released (every path out of :func:`run`)."""
        if self.env_holds is not None:
            self.env_holds.close()
            self.env_holds = None
        self.release_output()


def prepare_envs(reqs, items, opts, dprobe, cases) -> list:
    """Every env prepared in parallel threads (builds run as subprocesses), with a progress line per
    env; an env's exception becomes its failed :class:`envs.EnvResult` (one env never sinks the others)."""
    res: list = [None] * len(reqs)
    with progress() as prog:
        tasks = {r.label: prog.add_task(f"{r.label}: planning", total=None) for r in reqs}

        def on_progress(label, msg):
            prog.update(tasks[label], description=f"{label}: {msg}")
            if not console.is_terminal:  # a log gets each step as a line (a build: one per compile unit)
                console.print(f"{label}: {msg}", markup=False, soft_wrap=True)

        def one(i):
            r = reqs[i]
            try:
                out = envmod.prepare_env(r, items[i], opts, dprobe, cases, on_progress)
            except Exception as e:  # noqa: BLE001 - one env never sinks the others
                out = envmod.EnvResult(r.label, r.version, str(items[i].env_dir), status="failed",
                                       error=f"{type(e).__name__}: {e}", axis=r.axis)
            prog.update(tasks[r.label], description=f"{r.label}: {out.status}", total=1, completed=1)
            return out

        with ThreadPoolExecutor(max_workers=max(1, len(reqs))) as ex:
            for i, out in enumerate(ex.map(one, range(len(reqs)))):
                res[i] = out
    return res
