"""The subcommands other than ``run`` (which is :mod:`pipeline`): ``plan``, ``report``, ``compare``,
``explain``, ``publish``, ``envs``, ``wheelhouse`` -- each a short function over its stage's module,
taking the parsed arguments and returning the exit code (errors.py). cli.py parses and dispatches."""
from __future__ import annotations

import json
import os
import sys
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from . import envs as envmod
from . import explain, report, results, wheels
from .config import FUNCS, MAX_CASES, load_config
from .errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, UsageError
from .pipeline import check_here_versions, check_writable_dir, check_writable_file, options, plan_all
from .ui import console, print_plan, table_or_blocks, warn


def _case_kernels(cases, sdist) -> dict:
    """case id -> the kernel stems it dispatches to (with the sdist's HEADDIM_SWITCH when known)."""
    from . import build as buildmod

    dispatch = buildmod.read_dispatch(Path(sdist) if sdist else None)
    return {c.id: buildmod.case_kernels(c, dispatch) for c in cases}


def cmd_plan(args) -> int:
    cfg = load_config(args.config, max_cases=None if args.yes else MAX_CASES)
    reqs = envmod.parse_versions(args.versions)
    opts = options(args)
    if args.backend == "uv":
        for w in envmod.check_versions(reqs, opts):
            warn(w)
    reqs = envmod.cross_torch(reqs, opts.torches)
    dprobe = envmod.probe(sys.executable)
    if args.backend == "here":  # this interpreter is the env: what run's preflight would find (new-user
        # trial: plan described a uv slim build, "no GPU is visible to choose the CUDA archs", exit 3)
        check_here_versions(reqs)
        res = envmod.prepare_here(reqs[0], dprobe)
        fa = (dprobe or {}).get("flash_attn") or {}
        if args.json:
            print(json.dumps([{"label": res.label, "version": reqs[0].version, "method": "here", "python": sys.executable,
                               "flash_attn_version": fa.get("version"), "status": res.status, "error": res.error}],
                             indent=1, default=str))
        else:
            Console(highlight=False).print(
                f"{res.label}: --backend here: this interpreter ({sys.executable}) is the env; nothing is built or "
                "installed; " + (f"it imports flash_attn {fa.get('version')}, as requested" if res.status == "ok"
                                 else str(res.error).removeprefix("preflight: ") + ": run would stop there"),
                markup=False)
        return EXIT_OK if res.status == "ok" else EXIT_FAILED
    items = plan_all(reqs, cfg.cases, opts, dprobe)
    fa2 = any(r.package == envmod.subjects.DEFAULT for r in reqs)  # the kernel files below are flash-attn 2's
    per_case = _case_kernels(cfg.cases, next((i.sdist for i in items if i.sdist), None)) if fa2 else {}
    if args.json:
        print(json.dumps([{**i.to_dict(), "case_kernels": per_case} for i in items], indent=1, default=str))
    else:  # the plan is this command's output: stdout (run prints it to stderr, with its progress)
        out = Console(highlight=False)
        print_plan(items, out)
        if fa2:
            out.print("flash-attn 2 kernel files per case (slim builds compile the union; build.case_kernels):")
            dtypes = len({c.dtype for c in cfg.cases}) > 1  # the label leaves the dtype out
            grid = Table.grid(padding=(0, 1))  # a wrapped kernel list stays in its column (new-user trial)
            grid.add_column(no_wrap=True)
            grid.add_column()
            for c in cfg.cases[:PLAN_CASES_SHOWN]:
                grid.add_row(Text(f"  {c.label}{' ' + c.dtype if dtypes else ''} {c.op} ({FUNCS[c.func]}):"),
                             Text(", ".join(per_case[c.id]) or "none (torch)"))
            out.print(grid)
            if len(cfg.cases) > PLAN_CASES_SHOWN:  # a 12,800-case plan had printed 22,893 lines (new-user trial)
                out.print(f"  … and {len(cfg.cases) - PLAN_CASES_SHOWN} more cases (matrix-run plan --json lists "
                          "every case's kernel files)")
    return EXIT_FAILED if any(i.method == "failed" for i in items) else EXIT_OK


#: Cases whose kernel files ``matrix-run plan`` prints one line each; --json gives them all.
PLAN_CASES_SHOWN = 50


def cmd_wheelhouse(args) -> int:
    from . import wheelhouse

    reqs = envmod.parse_versions(args.versions)
    # a local sdist or wheel (run takes one; parse_versions checked it): copied in as it is (second
    # new-user trial: it was looked up on the index as a version)
    local = [r for r in reqs if r.package == envmod.subjects.DEFAULT and r.is_path and Path(r.version).expanduser().is_file()]
    versions = [r if r.package != envmod.subjects.DEFAULT else r.version for r in reqs if r not in local]
    if Path(args.output).exists() and not Path(args.output).is_dir():
        raise UsageError(f"-o {args.output} is a file: give a directory for the wheelhouse (made if missing)")
    cache = Path(args.wheel_cache).expanduser().resolve() if args.wheel_cache else wheels.default_cache_dir()
    rows = wheelhouse.collect(versions, Path(args.output), python_version=args.python_version, cache=cache,
                              index_url=args.index_url, include_cache=not args.no_cache_wheels,
                              requirements=tuple(r.strip() for r in args.requirements.split(",") if r.strip()),
                              find_links=tuple(Path(d).expanduser().resolve() for d in args.find_links),
                              no_index=args.no_index)
    for r in local:
        p = Path(r.version).expanduser()
        wheelhouse._copy(p, Path(args.output) / p.name)
        rows.insert(0, {"item": f"{r.label}: local file", "file": p.name, "status": "ok",
                        "detail": f"sha256 {wheels.sha256_file(p)[:16]}…; on the node: --versions {r.label}=DIR/{p.name}"})
    table_or_blocks(f"wheelhouse {escape(str(args.output))}", ["item", "file", "status", "detail"],
                     [[escape(r["item"]), escape(r["file"] or "–"),
                       r["status"] if r["status"] == "ok" else f"[red]{escape(r['status'])}[/]", escape(r["detail"] or "")]
                      for r in rows], Console())
    return EXIT_OK if all(r["status"] == "ok" for r in rows) else EXIT_FAILED


def cmd_envs(args) -> int:
    envs_dir = Path(args.envs_dir)
    if not envs_dir.is_dir():
        raise UsageError(f"--envs-dir {envs_dir}: no such directory (matrix-run creates envs in envs/ "
                                "of the directory it runs from, or in --envs-dir)")
    rows = envmod.list_envs(envs_dir)
    if args.action in (None, "list"):
        if not rows:  # an empty table said nothing (new-user trial)
            console.print(f"no envs in {escape(str(envs_dir))} yet: matrix-run makes one per version when it runs")
            return EXIT_OK

        def cell(v) -> str:
            return "–" if v is None else escape(str(v))

        table_or_blocks(f"envs in {escape(str(envs_dir))}",
                         ["label", "requested", "status", "torch", "python", "wheel", "created", "MB"],
                         [[cell(r[k]) for k in ("label", "requested", "status", "torch", "python", "wheel", "created",
                                                "size_mb")] for r in rows], Console())
        return EXIT_OK
    import shutil

    wanted = set(args.labels)
    if not wanted and not args.all:
        ours = [r for r in rows if not r.get("foreign")]
        size = sum(float(r.get("size_mb") or 0) for r in ours)
        raise UsageError(
            f"envs clean: name the envs to remove (matrix-run envs clean LABEL ...), or give --all to remove "
            f"every env in {envs_dir} ({len(ours)} env(s), {size:.1f} MB: "
            f"{', '.join(r['label'] for r in ours) or 'none'}); `matrix-run envs list` shows them")
    if wanted and args.all:
        raise UsageError("envs clean: give labels or --all, not both")
    unknown = wanted - {r["label"] for r in rows}
    if unknown:
        raise UsageError(f"envs clean: no env named {', '.join(sorted(unknown))} in {envs_dir}")
    foreign = [r for r in rows if r["label"] in wanted and r.get("foreign")]
    if foreign:  # named, and left alone: it had exited 0 having removed nothing (new-user trial)
        raise UsageError(f"envs clean: {', '.join(r['path'] for r in foreign)}: not a matrix-run env (no env record, "
                         "no build log of matrix-run's), so it is never removed by matrix-run; remove it yourself "
                         "if you mean to")
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


def _refuse_other_run(out: Path, res: dict, sources: list[Path], cmd: str) -> Path:
    """UsageError where ``-o`` ``out`` holds another run's results (``cmd`` would leave a report there
    that does not match them: explain did, new-user trial); returns the results file there (may not
    exist). A copy of the same run (same run id), or one of ``sources`` itself, is fine."""
    existing = results.find(out) if out.is_dir() else out / "results.json"
    if existing.is_file() and existing.resolve() not in {p.resolve() for p in sources}:
        try:
            other = json.loads(results.read_text(existing)).get("run_id")
        except (OSError, ValueError, AttributeError, EOFError):
            other = None
        if other is None or other != res.get("run_id"):
            raise UsageError(f"-o {out}: already holds another run's {existing.name} (run {other}); {cmd} "
                             "would overwrite its report with one that does not match it: give another -o")
    return existing


def _no_run_twice(paths: list[Path], runs: list[dict]) -> None:
    """UsageError where one run would be merged twice (new-user trial: `report RUN RUN/results.json`,
    a copy of a run, or a merged report with one of its runs, each gave "2.6.3' vs 2.6.3", an A/A of
    identical data): by run id, a merged report's being those of the runs it holds."""
    where: dict = {}
    for p, r in zip(paths, runs):
        ids = r["merged_from"] if results.is_merge(r) else [r.get("run_id")]
        for i in ids:
            if i is None:
                continue
            if i in where:
                raise UsageError(f"run {i} would be merged twice: {where[i]} and {p} both hold it (a copy, the "
                                 "same run named twice, or a merged report with one of its runs): give it once")
            where[i] = p


def _is_merge(path: Path) -> bool:
    """Whether the results file ``path`` is a merged report (results.merge), not a run."""
    try:
        return results.is_merge(json.loads(results.read_text(path)))
    except (OSError, ValueError, AttributeError, EOFError):
        return False


#: Runs (and machine warnings) named when ``report`` merges several runs (``report DIR``, ``report RUN
#: RUN ...``); the rest are counted.
REPORT_LIST_MAX = 8


def cmd_report(args) -> int:
    """``matrix-run report RUN... [-o DIR]``: one run as it was, or several merged, rendered to
    DIR/index.html (and DIR/results.json where it differs from the run's own); without ``-o`` the
    verdict table is only printed, and nothing is written but ``--markdown FILE`` (third new-user
    trial, 2026-12-05: ``report RUN`` was refused for the missing -o, though the table was wanted)."""
    if args.markdown:  # before anything is read or written (it was found only at the end)
        check_writable_file(Path(args.markdown), "--markdown", creates=Path(args.output) if args.output else None,
                            inputs=tuple(args.results))
    paths: list[Path] = []
    for a in args.results:
        p = Path(a)
        if not p.exists() and not Path(f"{a}.gz").exists():
            # second new-user trial: `tox -e report` before any version env said "cannot read" alone
            tox = p.name == "tox" and p.parent.name == "reports"
            raise UsageError(f"{p}: no such file or directory; give a run's directory or its results.json"
                             + ("; `tox -e report` merges what the version envs wrote there: run them first "
                                "(`tox -e fa-2.6.3,fa-2.7.0.post2`, on a GPU machine)" if tox else ""))
        if p.is_dir():  # e.g. reports/tox: every results.json below it (one per tox env)
            # one results file per run directory, as results.find picks it (plain before archived)
            found = sorted({results.find(f.parent) for name in results.NAMES for f in p.rglob(name)})
            if not found:
                raise results.ResultsError(f"{p}: no results.json below this directory")
            # a merged report written into the searched dir earlier is not one of its runs; but a run
            # re-rendered into its own directory (report RUN -o RUN) is that run
            below = [f for f in found if args.output is None or f.parent.resolve() != Path(args.output).resolve()] or found
            # nor is any other merged report below it (results.merge: merged_from), e.g. reports/tox/html
            # from an earlier `tox -e report`, whose envs came back as copies of themselves ("2.6.3'")
            below = [f for f in below if not _is_merge(f)] or below
            if len(below) > 1:  # say what is merged (it used to be silent: `report reports/` took every run)
                names = [f.parent.relative_to(p).as_posix() or "." for f in below]
                more = f" and {len(names) - REPORT_LIST_MAX} more" if len(names) > REPORT_LIST_MAX else ""
                console.print(f"{p}: merging the {len(below)} runs found below it into one report: "
                              f"{', '.join(names[:REPORT_LIST_MAX])}{more} (give one run's directory or "
                              "results.json to report on it alone)")
            paths += below
        else:
            paths.append(p)
    noted = len(args.results) == 1  # one DIR: its runs are named above
    args.results = [str(p) for p in paths]
    if args.min_effect is not None and not 0 < args.min_effect < 1:
        raise UsageError(f"--min-effect {args.min_effect}: give a fraction between 0 and 1 (0.05 = 5%)")
    runs = [results.load(p) for p in args.results]
    _no_run_twice(paths, runs)
    from .pipeline import fuller_rescue

    for q, r in zip(paths, runs):  # a results.json left behind by a write that failed (a full disk): the
        # run's own rescue copy holds more sets (new-user trial: the stale file was reported as the run)
        more = fuller_rescue(r)
        if more:
            print(f"warning: {q} holds {len(r.get('sets') or [])} process set(s), but a rescue copy of this run "
                  f"with {more[1]} is at {more[0]} (written when results.json could not be): report that one, "
                  f"or move it over {q} once there is room", file=sys.stderr)
    left_out = []
    if len(runs) > 1 and any(r.get("cases") for r in runs):
        # a run that timed nothing (its env failed: a tox version env whose flash-attn did not import)
        # is left out and named, not a reason to merge nothing (new-user trial: "no case in common")
        for q, r in zip(paths, runs):
            if not r.get("cases"):
                why = "; ".join(f"{e.get('label')}: {e.get('status')}" + (f" ({str(e['error']).splitlines()[0][:160]})"
                                                                           if e.get("error") else "")
                                for e in r.get("envs", [])) or "no env"
                left_out.append(f"{q} timed nothing ({why}): left out of the merged report")
        keep = [i for i, r in enumerate(runs) if r.get("cases")]
        paths, runs = [paths[i] for i in keep], [runs[i] for i in keep]
        args.results = [str(q) for q in paths]
        for w in left_out:
            print(f"warning: {w}", file=sys.stderr)
    if len(runs) > 1:
        # the merge compares every env with the first run's first env, case by case: a run of another
        # config had come out as "not compared in 12 (failed or not run)", exit 0 (new-user trial)
        first = {c["id"] for c in runs[0].get("cases", [])}
        apart = [str(q) for q, r in zip(paths[1:], runs[1:]) if not first & {c["id"] for c in r.get("cases", [])}]
        if apart:
            raise UsageError(f"{', '.join(apart)}: no case in common with {paths[0]} (the first run, whose first env "
                             "every merged env is compared with, case by case): a merged report of them would "
                             "compare nothing; report each run alone, or merge runs of one config")
    warns = left_out + (_merge_notes(paths, runs, noted) if len(runs) > 1 else [])
    res = results.merge(runs, args.min_effect)
    g = runs[0].get("gate") if len(runs) == 1 else None
    if isinstance(g, dict) and isinstance(g.get("threshold_pct"), (int, float)) and res is not runs[0]:
        # one run re-rendered at another --min-effect: its gate judged again on these verdicts, and
        # said so (second new-user trial: it vanished, while the report's command still showed it)
        from .pipeline import gate_outcome

        res["gate"] = gate_outcome(res, float(g["threshold_pct"]))
        res["gate"]["text"] += (f" — judged again on the verdicts at --min-effect {args.min_effect:g}; the run's "
                                f"own: {g.get('outcome')}")
    if warns:
        res["merge_warnings"] = warns
    rewrites = len(runs) > 1 or args.min_effect is not None  # a results.json unlike any one run's
    if args.output is None:  # print only (and --markdown)
        _report_terminal(res, runs, paths, args.markdown)
        # the run's own page, where it shows these verdicts (not a merge, nor verdicts recomputed at
        # another --min-effect: new-user trial, the page then disagreed with the table)
        page = [paths[0].parent / n for n in ("index.html", "index.html.gz")] if len(runs) == 1 and not rewrites else []
        page = [q for q in page if q.exists()]
        md = f"Markdown: {args.markdown}; " if args.markdown else ""
        console.print(f"{md}its HTML report: {page[0]}" if page else
                      f"{md}no HTML written (give -o DIR for an HTML report" + (" of these verdicts)" if len(runs) == 1 else ")"))
        return EXIT_OK
    out = Path(args.output)
    # a run's results there, plain or archived (.gz: a results.json written beside it would be read
    # in its place, results.find; new-user trial)
    existing = _refuse_other_run(out, res, paths, "report")
    if rewrites and existing.is_file() and existing.resolve() in {p.resolve() for p in paths}:
        # new-user trial: `report RUN -o RUN --min-effect 0.01` replaced the run's own record, verdicts
        # and settings (a later --resume went on with them), without a word
        what = "the merge of the runs" if len(runs) > 1 else f"its verdicts at --min-effect {args.min_effect:g}"
        raise UsageError(f"-o {args.output}: holds one of the runs read ({existing.name}); writing {what} there "
                         "would replace that run's own record: give another -o")
    check_writable_dir(out, "-o")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # new-user trial: "error: /proc/rep: No such file or directory", naming no option
        raise UsageError(f"-o {out}: cannot create it ({e.strerror or e}); give a directory you can write") from None
    json_name = None
    if rewrites:
        results.write_json(out / "results.json", res)
        json_name = "results.json"
    else:
        src = paths[0].resolve()  # the file found (a run dir's results.json, or an archived run's .gz)
        if src.parent == out.resolve():
            json_name = src.name
        else:
            results.write_json(out / "results.json", res)
            json_name = "results.json"
    # an archived run re-rendered into its own folder keeps its report archived (new-user trial: a
    # plain index.html appeared beside the older index.html.gz, as explain's did)
    p = report.write_html(res, out, json_name, gz=(json_name or "").endswith(".gz") and report.html_archived(out))
    _report_terminal(res, runs, paths, args.markdown)
    console.print(f"report: {p}")
    return EXIT_OK


def _report_terminal(res: dict, runs: list[dict], paths: list[Path], markdown: str | None) -> None:
    """``report``'s output beside its HTML: the ``--markdown`` file, if asked for, then what it prints
    (the verdict table and gate line, or why a run has none)."""
    if markdown:
        report.write_markdown(markdown, report.markdown(res))
    unmeasured = [r for r in runs if (r.get("timing") or {}).get("stop_reason") == "no GPU"]
    if unmeasured and len(unmeasured) == len(runs):  # its envs were skipped: an empty table said nothing of why
        console.print("that run measured nothing: no NVIDIA GPU was visible where it ran, so every env was skipped "
                      "(its report says so); run it on a machine with a GPU")
    else:
        # one run read: its --resume advice names its folder (a merge is never resumed)
        report.terminal_table(res, Console(), run_dir=str(paths[0].resolve().parent) if len(runs) == 1 else None)
        if report.gate_line(res):
            console.print(report.gate_line(res), markup=False)


def _merge_notes(paths: list[Path], runs: list[dict], noted: bool) -> list[str]:
    """What ``report`` says before it merges several runs into one report: which runs (unless
    ``report DIR`` named them already: ``noted``), and, on stderr, each run whose machine differs from
    the first one's where it moves every ratio (:func:`machine_differences`: another device or GPU,
    or the CPU at another speed), as ``compare`` warns (new-user trial 2026-12-04: a CPU run merged
    with an H200 run, and two H200 runs whose probes read 3.74 and 6.42 µs, merged without a word).
    At most :data:`REPORT_LIST_MAX` runs or warnings are named; the rest are counted. Returns every
    warning, which the merged report's HTML and Markdown carry too (new-user trial: stderr only)."""
    names = [(p.parent.name if p.name in results.NAMES else p.as_posix()) or p.as_posix() for p in paths]
    if not noted:
        more = f" and {len(names) - REPORT_LIST_MAX} more" if len(names) > REPORT_LIST_MAX else ""
        console.print(f"merging {len(runs)} runs into one report: {', '.join(names[:REPORT_LIST_MAX])}{more}")
    warns = [f"{names[0]} (A) and {names[i]} (B): {why}" for i in range(1, len(runs))
             for why in machine_differences(runs[0], runs[i]) + stack_differences(runs[0], runs[i])
             + setting_differences(runs[0], runs[i])]
    for w in warns[:REPORT_LIST_MAX]:
        print(f"warning: {w}; the merged report pools them", file=sys.stderr)
    if len(warns) > REPORT_LIST_MAX:
        print(f"warning: and {len(warns) - REPORT_LIST_MAX} more such differences among the merged runs", file=sys.stderr)
    return warns


def _results_path(a: str) -> Path:
    return results.find(a)


def machine_differences(a: dict, b: dict) -> list[str]:
    """How the machines of runs ``a`` and ``b`` differ where it moves every ratio: the device the
    cases ran on (``settings.device``: cuda / cpu), the GPU model (``machine.gpu``), and the CPU's
    speed while they ran (:func:`report.probe_median_us` more than :data:`report.PROBE_SPEED_WARN` apart: two
    runs of the same versions on the H200 seven minutes apart read 2.6.3's batch-2 forward call at
    50.0 and 32.4 µs, probe medians 6.5 and 3.5 µs; new-user trial 2026-12-03)."""
    out = []
    da, db = ((d.get("settings") or {}).get("device") for d in (a, b))
    if da and db and da != db:
        out.append(f"A ran on {da}, B on {db}")
    ga, gb = ((d.get("machine") or {}).get("gpu") for d in (a, b))
    if da == db == "cuda" and ga and gb and ga != gb:
        out.append(f"A ran on {ga}, B on {gb}")
    pa, pb = report.probe_median_us(a), report.probe_median_us(b)
    if pa and pb and max(pa, pb) / min(pa, pb) - 1 > report.PROBE_SPEED_WARN:
        out.append(f"the CPU ran at another speed: the speed probe (the same Python work in every worker) read a median "
                   f"of {pa:.2f} µs in A and {pb:.2f} µs in B ({max(pa, pb) / min(pa, pb) - 1:.0%} apart), so host "
                   "overhead differs between the runs by itself")
    return out


def stack_differences(a: dict, b: dict) -> list[str]:
    """How the software under the envs of runs ``a`` and ``b`` differs where it moves host overhead by
    itself: the torch builds (``envs[].torch``) and Python versions (``envs[].python``) their ok envs ran
    on, when the two runs' sets differ (new-user trial: tox version envs that installed torch 2.14.1 were
    compared with a run on 2.13.0 without a word; torch's dispatcher is most of a small call's host time)."""
    out = []
    for key, what in (("torch", "torch"), ("python", "Python")):
        va, vb = (sorted({str(e.get(key)) for e in d.get("envs", []) if e.get("status") == "ok" and e.get(key)})
                  for d in (a, b))
        if va and vb and va != vb:
            out.append(f"A's envs ran on {what} {', '.join(va)}, B's on {', '.join(vb)}: host overhead follows "
                       f"{what}, so the ratios between the runs compare {what} builds as much as versions")
    return out


def build_differences(a: dict, b: dict, pairs: list[tuple[str, str]]) -> list[str]:
    """Env pairs of ``compare`` (label in A, label in B) holding the same flash-attn version but different
    builds (``envs[].build.wheel_sha256``): a slim and a full build, other archs or compilers, or a
    patched one (new-user trial: two builds of one version compared as "faster 0.90x" without a word)."""
    ea, eb = ({e["label"]: e for e in d.get("envs", [])} for d in (a, b))
    out = []
    for la, lb in pairs:
        x, y = ea.get(la) or {}, eb.get(lb) or {}
        wa, wb = ((e.get("build") or {}).get("wheel_sha256") for e in (x, y))
        va, vb = (e.get("flash_attn_version") or e.get("requested_version") for e in (x, y))
        if wa and wb and wa != wb and va and va == vb:
            name = la if la == lb else f"{la} (A) / {lb} (B)"
            out.append(f"{name}: another build of {va} on each side (wheel sha256 {str(wa)[:12]}… in A, {str(wb)[:12]}… "
                       "in B): their ratios compare the builds, not only the machines")
    return out


def setting_differences(a: dict, b: dict) -> list[str]:
    """Sampling settings of runs ``a`` and ``b`` that make their version ratios answer different
    questions: ``cpu_state`` (usual: the ratio at one CPU speed; all: averaged over the speeds the run
    met; new-user trial 2026-12-04: a usual run compared with an all run without a word), and
    ``cpu_hop`` (a run whose sets moved to follow the fast CPU speed -- its recorded moves, not
    the setting -- met it more often), ``probe_share`` (the setting, ``full`` where a run
    predates it: two runs under the same rule can record different shares, as their data differ), and
    ``min_burst_samples`` (1 where a run predates it); and, in one line, any of
    :data:`SAMPLED_SETTINGS` that both runs record and that differ."""
    out = []
    sa, sb = ((d.get("settings") or {}).get("cpu_state") or "all" for d in (a, b))
    if sa != sb:
        what = {"usual": "only the turns at its CPU's usual speed", "all": "every turn"}
        out.append(f"A's version ratios count {what.get(sa, sa)} (sampling.cpu_state: {sa}), B's {what.get(sb, sb)} "
                   f"(sampling.cpu_state: {sb}): where a call is part host work, they are ratios at different CPU "
                   "speeds")
    ha, hb = (sum(s.get("hops") or 0 for s in d.get("sets") or []) > 0 for d in (a, b))
    if ha != hb:  # lockstep.Hopper: the run whose sets moved met the fast speed more often
        out.append(f"{'A' if ha else 'B'}'s process sets moved between CPUs to follow the fast speed "
                   f"(sampling.cpu_hop), {'B' if ha else 'A'}'s stayed on one CPU each: they met the CPU's two "
                   "speeds in different shares, and host-heavy ratios differ between the speeds")
    pa, pb = ((d.get("settings") or {}).get("probe_share") or "full" for d in (a, b))  # missing: from before it, full
    if pa != pb:  # the setting, not the shares: a run's shares follow its data (review, new-user trial)
        est = "A" if pa == "estimated" else "B"
        out.append(f"{est}'s speed adjustment counted the share of its sets' between-worker probe differences that "
                   f"earlier sets' calls followed (sampling.probe_share: estimated), {'B' if est == 'A' else 'A'}'s all "
                   "of them (full): where the "
                   "workers' probes differ without the calls following, the two take the ratio differently")
    ma, mb = (int((d.get("settings") or {}).get("min_burst_samples") or 1) for d in (a, b))  # missing: 1
    if ma != mb:  # a stalled sample moves a burst of few samples (long calls) in one run and not the other
        out.append(f"A's bursts held at least {ma} timed sample(s), B's {mb} (sampling.min_burst_samples): "
                   "for long calls, a stalled sample moves the run with fewer more often")
    other = [f"{key} A {_setting(va)}, B {_setting(vb)}" for key in SAMPLED_SETTINGS
             for va, vb in [tuple((d.get("settings") or {}).get(key) for d in (a, b))]
             if va is not None and vb is not None and va != vb]
    if other:  # new-user trial: runs differing in these were merged and compared without a word
        out.append("A and B were sampled differently (" + "; ".join(other) + "): their ratios and µs are not "
                   "measured alike, so a difference between them may come from that as much as from the versions")
    return out


#: The ``settings`` of a run, beyond those :func:`setting_differences` words on their own, that change
#: how its calls were sampled or its ratios taken (not only how long it ran: time_budget_s,
#: max_sets, alpha and min_effect move the intervals' width or the verdicts, which the reports show):
#: a run that lacks one (from before it was recorded) is not compared on it.
SAMPLED_SETTINGS = ("method", "quick", "set_seconds", "burst_ms", "workers_per_env", "host_every", "max_repeats",
                    "host_precision", "speed_adjust", "preimport", "cuda_at_start")


def _setting(v) -> str:
    return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else str(v)


def compare_warnings(a: dict, b: dict, pa, pb) -> list[str]:
    """What ``compare`` warns of runs ``a`` and ``b`` (read from ``pa`` and ``pb``), in the terminal,
    the HTML and the Markdown: the same run twice; a copy of one run resumed apart from it (same run
    id, different sets: the sets they share are the same measurements, which pulls the ratios towards
    1 -- the new-user trial's copy was told "every ratio is 1 by construction" while it had 7 new sets
    each side); :func:`machine_differences`; :func:`setting_differences`."""
    out = []
    if a.get("run_id") and a.get("run_id") == b.get("run_id"):
        if a.get("sets") == b.get("sets") and a.get("cases") == b.get("cases"):
            out.append(f"A and B are the same run ({a['run_id']}: {pa} and {pb}); every ratio below is 1 by "
                       "construction, not a measured A/A")
        else:
            same = 0
            for x, y in zip(a.get("sets") or [], b.get("sets") or []):  # the leading sets they share
                if x != y:
                    break
                same += 1
            out.append(f"A and B share a run id ({a['run_id']}: {pa} and {pb}): one is a copy of the other, resumed "
                       "or edited apart; " + (f"their first {same} process set(s) are the same measurements, which "
                                              "pulls every ratio below towards 1" if same else
                                              "they share no process set"))
    out += [f"{why}: the ratios B/A below compare machines as much as versions" for why in machine_differences(a, b)]
    return out + stack_differences(a, b) + build_differences(a, b, report.pair_envs(a, b)) + setting_differences(a, b)


def cmd_compare(args) -> int:
    if args.markdown:
        check_writable_file(Path(args.markdown), "--markdown", creates=Path(args.output) if args.output else None,
                            inputs=(args.a, args.b))
    pa, pb = _results_path(args.a), _results_path(args.b)
    a, b = results.load(pa), results.load(pb)
    if args.min_effect is not None and not 0 < args.min_effect < 1:
        raise UsageError(f"--min-effect {args.min_effect}: give a fraction between 0 and 1 (0.05 = 5%)")
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
    # the warnings, once there is a comparison to warn about (they had come before the error that
    # there was none: new-user trial)
    cmp["warnings"] = compare_warnings(a, b, pa, pb)
    for why in cmp["warnings"]:  # and in the HTML and Markdown (new-user trial: they were in the terminal only)
        print(f"warning: {why}", file=sys.stderr)
    report.compare_terminal(cmp, Console())
    if args.output:
        if Path(args.output).is_file():
            raise UsageError(f"-o {args.output}: is a file; give a directory (made if missing) for index.html")
        held = results.find(args.output)  # a run's results.json or its archive (.gz)
        if held.exists():
            raise UsageError(f"-o {args.output}: holds a run ({held.name}); its index.html would be "
                             "overwritten; give another directory")
        console.print(f"report: {report.write_compare_html(cmp, Path(args.output))}")
    if args.markdown:
        report.write_markdown(args.markdown, report.compare_markdown(cmp))
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
    _refuse_other_run(out, doc, [Path(path)], "explain")
    here = out.resolve() == Path(path).parent.resolve()  # the run's own folder, however it is spelled
    # elsewhere: the raw-data link points back at the run's own results (third new-user trial: none)
    link = Path(path).name if here else Path(os.path.relpath(Path(path).resolve(), out.resolve())).as_posix()
    p = report.write_html(doc, out, link, gz=here and report.html_archived(out))
    for line in explain.summary_lines(explain.analyze(doc)):
        print(line)
    print(f"report: {p}")
    return EXIT_OK


def cmd_publish(args) -> int:
    from . import publish

    site = Path(args.output)
    src = Path(args.reports_dir)
    if src.is_file() and src.name in results.NAMES:  # RUN/results.json(.gz): "not a directory" said no more
        raise UsageError(f"{src}: is one run's results; publish takes the folder that holds runs: give "
                         f"{src.parent.parent} (or `matrix-run report {src.parent} -o DIR` for this run's report alone)")
    own = results.find(src) if src.is_dir() else None
    if own is not None and own.is_file():  # new-user trial: "no run found under" a run's own folder
        raise UsageError(f"{src}: is one run's folder (it holds {own.name}); publish takes the folder "
                         f"that holds runs: give {src.parent if str(src.parent) != '.' else 'its parent'} (or "
                         f"`matrix-run report {src} -o DIR` for this run's report alone)")
    if site.exists() and (not site.is_dir() or (any(site.iterdir()) and not (site / publish.MARKER).exists())):
        raise UsageError(f"-o {site}: exists and is not a site matrix-run published (no {publish.MARKER}); "
                                "give a new or empty directory")
    if site.resolve() == Path(args.reports_dir).resolve():
        raise UsageError("-o must differ from REPORTS_DIR (e.g. REPORTS_DIR/site or another directory)")
    out = publish.build_site(Path(args.reports_dir), site, rerender=args.rerender)
    for w in out["warnings"]:
        warn(w)
    for r in out["runs"]:
        console.print(f"  {r['name']}: {r['date']} · {r['gpu']} · {', '.join(e['label'] for e in r['envs'])}")
    console.print(f"site: {out['index']} ({len(out['runs'])} run(s))")
    if not out["runs"]:  # second new-user trial: exit 3 with no word of why
        warn(f"no run found under {args.reports_dir}: a run is a folder holding results.json or results.json.gz "
             "(what `matrix-run run --output DIR` writes); the site lists none")
    return EXIT_OK if out["runs"] else EXIT_FAILED
