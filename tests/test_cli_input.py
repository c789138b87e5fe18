"""Command-line input a new user got wrong (new-user trial): Slurm asked for where there is none,
abbreviated options, options the command would have ignored, contradicting ones, and a closed
output pipe (``matrix-run ... | head -2``)."""
from __future__ import annotations

import argparse
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli

from matrix_runner import cli, entry, shard
from matrix_runner.errors import UsageError

VERSIONS = "2.6.3,2.7.0.post2"


def flat(text: str) -> str:
    return " ".join(text.split())


# -- --executor slurm without Slurm ------------------------------------------------------------------
def test_executor_slurm_without_slurm_is_a_usage_error_before_the_output_dir(tmp_path):
    """It was submitit's RuntimeError, "internal error", exit 4, with an empty run directory left."""
    bare = tmp_path / "bin"  # a PATH with no srun or sbatch
    bare.mkdir()
    out = tmp_path / "DIR"
    cp = run_cli("--versions", VERSIONS, "--device", "cpu", "--executor", "slurm", "--shards", "2", "-o", str(out),
                 "--envs-dir", str(tmp_path / "envs"), env={"PATH": str(bare)})
    assert cp.returncode == 2, cp.stderr
    assert ("--executor slurm needs Slurm (srun/sbatch not found on PATH): run it on a cluster's login node, "
            "or use --executor submitit-local to try it here") in flat(cp.stderr)
    assert "Traceback" not in cp.stderr and "internal error" not in cp.stderr
    assert not out.exists() and not (tmp_path / "envs").exists()


def test_need_slurm_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(shard.shutil, "which", lambda t: None if t == "sbatch" else f"/usr/bin/{t}")
    with pytest.raises(UsageError, match=r"\(sbatch not found on PATH\)"):
        shard.need_slurm("slurm")
    shard.need_slurm("submitit-local")  # submitit's local executor needs no Slurm
    monkeypatch.setattr(shard.shutil, "which", lambda t: f"/usr/bin/{t}")
    shard.need_slurm("slurm")


def test_a_resumed_slurm_run_without_slurm_is_a_usage_error(monkeypatch, tmp_path):
    """--resume takes --executor from results.json, past cli's check: shard._executor checks again."""
    pytest.importorskip("submitit")
    monkeypatch.setattr(shard.shutil, "which", lambda t: None)
    args = argparse.Namespace(executor="slurm", slurm_time=60, slurm_partition=None, slurm_account=None)
    with pytest.raises(UsageError, match="--executor slurm needs Slurm"):
        shard._executor(args, tmp_path / ".submitit")
    assert not (tmp_path / ".submitit").exists()


def test_submitit_local_says_the_slurm_only_options_are_not_used(tmp_path):
    """--slurm-partition/--slurm-account with submitit-local had been dropped without a word."""
    pytest.importorskip("submitit")
    said = []
    args = argparse.Namespace(executor="submitit-local", slurm_time=60, slurm_partition="gpu", slurm_account=None)
    shard._executor(args, tmp_path / ".submitit", said.append)
    assert said == ["note: --slurm-partition gpu not used: submitit-local runs the jobs on this machine, without "
                    "Slurm (they apply with --executor slurm)"]
    said.clear()
    shard._executor(argparse.Namespace(executor="submitit-local", slurm_time=60, slurm_partition=None,
                                       slurm_account=None), tmp_path / ".submitit", said.append)
    assert said == []


# -- abbreviations ------------------------------------------------------------------------------------
def test_no_parser_takes_abbreviations():
    ap = cli.build_parser()
    assert not ap.allow_abbrev
    assert all(not p.allow_abbrev for p in ap.get_default("_subparsers").values())


def test_version_for_versions_is_refused(tmp_path):
    """`run --version X` was taken as --versions; `--version X` printed matrix-run's version, exit 0."""
    out = tmp_path / "o"
    cp = run_cli("run", "--version", VERSIONS, "--device", "cpu", "-o", str(out), "--envs-dir", str(tmp_path / "e"))
    assert cp.returncode == 2, cp.stderr
    assert f"unrecognized arguments: --version {VERSIONS} (did you mean --versions?" in flat(cp.stderr)
    assert not out.exists()
    cp = run_cli("--version", VERSIONS)
    assert cp.returncode == 2 and "matrix-run" not in cp.stdout, cp.stdout
    assert f"--version takes no value (got {VERSIONS}): did you mean --versions?" in flat(cp.stderr)
    cp = run_cli("--version")
    assert cp.returncode == 0 and cp.stdout.startswith("matrix-run ")


def test_an_abbreviation_is_refused_naming_the_option(tmp_path):
    cp = run_cli("plan", "--versions", "2.6.3", "--envs", str(tmp_path))
    assert cp.returncode == 2 and "unrecognized arguments: --envs" in cp.stderr
    assert "(did you mean --envs-dir?)" in cp.stderr


def test_a_stored_command_line_with_an_abbreviation_still_resumes():
    """A run started before abbreviations were refused stored its command line as it was typed."""
    args = cli._parse_stored(["run", "--version", "2.6.3", "--time-bud", "30"])
    assert args.versions == "2.6.3" and args.time_budget == 30


# -- options that were ignored, or contradict each other ------------------------------------------------
@pytest.mark.parametrize("extra, needle", [
    (["--shards", "3"], "--shards needs --executor slurm or submitit-local"),
    (["--executor", "local", "--shards=3", "--slurm-time", "5"],
     "--shards, --slurm-time need --executor slurm or submitit-local"),
    (["--executor", "submitit-local", "--shards", "0"], "--shards 0: give a positive number of jobs"),
    (["--offline", "--index-url", "http://x"], "--offline and --index-url contradict each other"),
])
def test_ignored_or_contradicting_run_options_exit_2(extra, needle, tmp_path):
    out = tmp_path / "o"
    cp = run_cli("--versions", VERSIONS, "--device", "cpu", "-o", str(out), "--envs-dir", str(tmp_path / "e"), *extra)
    assert cp.returncode == 2, cp.stderr
    assert needle in flat(cp.stderr) and "Traceback" not in cp.stderr
    assert not out.exists()


def test_plan_refuses_offline_with_index_url(tmp_path):
    cp = run_cli("plan", "--versions", "2.6.3", "--offline", "--index-url=http://x", "--envs-dir", str(tmp_path))
    assert cp.returncode == 2 and "--offline and --index-url contradict each other" in flat(cp.stderr)


def test_envs_list_refuses_labels_and_all(tmp_path):
    """`envs list a b` listed every env, the labels ignored; labels are for `envs clean`."""
    cp = run_cli("envs", "list", "a", "b", "--envs-dir", str(tmp_path))
    assert cp.returncode == 2 and "envs list takes no labels (got a b)" in flat(cp.stderr)
    cp = run_cli("envs", "--all", "--envs-dir", str(tmp_path))
    assert cp.returncode == 2 and "envs list takes no --all" in flat(cp.stderr)
    cp = run_cli("envs", "list", "--envs-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stderr
    # none yet: a sentence, not an empty table (new-user trial)
    assert f"no envs in {tmp_path} yet" in flat(cp.stdout + cp.stderr) and "requested" not in cp.stdout + cp.stderr


def test_envs_list_names_an_unfinished_env_and_its_log(tmp_path):
    """A venv whose build failed before its record was written was listed as "no record" (new-user
    trial): it says what that means, where its log is, and that the next run builds it again."""
    from matrix_runner.envs.record import list_envs

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / ".logs").mkdir()
    (tmp_path / ".logs" / "a.log").write_text("uv pip install: exit 1\n")
    (row,) = list_envs(tmp_path)
    assert row["label"] == "a" and row["status"] == (
        f"unfinished: its build failed or was cut short (log: {tmp_path / '.logs' / 'a.log'}); the next run builds it again")
    cp = run_cli("envs", "list", "--envs-dir", str(tmp_path))
    assert cp.returncode == 0 and "unfinished: its build failed" in flat(cp.stdout), cp.stdout + cp.stderr


# -- a closed output pipe -----------------------------------------------------------------------------
def closed_pipe_run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``matrix-run ARGS`` with its stdout a pipe whose reader has gone (every write: EPIPE)."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "matrix_runner", *args], cwd=cwd, stdout=w,
                              stderr=subprocess.PIPE, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    finally:
        os.close(w)


def test_a_closed_stdout_pipe_keeps_the_commands_exit_code(tmp_path):
    """`matrix-run ... | head -2` exited 1, the regression code (rich's SystemExit(1) on EPIPE): the
    command now finishes, what it writes after the reader left goes nowhere, and the code is its own."""
    (tmp_path / "fl").mkdir()
    (tmp_path / "fl" / "flash_attn-2.6.3.tar.gz").write_bytes(b"")
    plan = ["plan", "--versions", "2.6.3", "--offline", "--archs", "90", "--envs-dir", "T", "--wheel-cache", "T2",
            "--find-links", "fl"]
    fixture = Path(__file__).parent / "fixtures" / "h200-first-run-results.json"
    for args, code in ((plan, 0), ([*plan, "--json"], 0), (["--help"], 0),
                       (["report", str(fixture), "-o", "R"], 0)):
        cp = closed_pipe_run(args, tmp_path)
        assert cp.returncode == code, (args, cp.stderr)
        assert "Traceback" not in cp.stderr and "Broken pipe" not in cp.stderr and "Exception" not in cp.stderr
    assert (tmp_path / "R" / "index.html").exists()  # the command ran to its end
    failing = ["plan", "--versions", "2.6.3", "--offline", "--archs", "90", "--envs-dir", "T", "--wheel-cache", "T2"]
    assert closed_pipe_run(failing, tmp_path).returncode == 3  # no way to obtain it: 3, as on a terminal


def test_pipe_guard_drops_what_follows_a_closed_pipe():
    r, w = os.pipe()
    f = os.fdopen(w, "w")
    os.close(r)
    g = entry.PipeGuard(f)
    try:
        assert g.write("x" * 200_000) == 200_000  # over a pipe's buffer: EPIPE inside the write
        g.write("more\n")
        g.flush()
        assert g.fileno() == w and not g.closed
    finally:
        f.close()


# -- --markdown onto a run's own files ---------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "reports" / "h200-aa-98"


def test_markdown_never_overwrites_a_runs_files_and_may_go_into_the_new_output_dir(tmp_path):
    """``report RUN -o D --markdown RUN/results.json`` had replaced the run's data with Markdown
    (exit 0), and ``compare A B -o D --markdown D/index.html`` the report; ``--markdown D/x.md``
    into the -o directory that report makes was refused as a missing directory."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(H200, run)
    (run / "results.json").write_bytes(__import__("gzip").decompress((run / "results.json.gz").read_bytes()))
    before = (run / "results.json").read_bytes()
    for target in (run / "results.json", tmp_path / "new" / "index.html", tmp_path / "x" / "results.json.gz"):
        cp = run_cli("report", str(run), "-o", str(tmp_path / "new"), "--markdown", str(target))
        assert cp.returncode == 2, cp.stdout + cp.stderr
        why = "that is a results file this command reads" if target.parent == run else \
            f"that is the name of a run's own file ({target.name})"
        assert f"{why}, which this would overwrite" in flat(cp.stderr), cp.stderr
    cp = run_cli("compare", str(run), str(H200), "-o", str(tmp_path / "cmp"), "--markdown",
                 str(tmp_path / "cmp" / "index.html"))
    assert cp.returncode == 2 and "index.html" in cp.stderr
    # a results file read under another name is refused too
    other = tmp_path / "a.json"
    other.write_bytes(before)
    cp = run_cli("compare", str(other), str(H200), "--markdown", str(other))
    assert cp.returncode == 2 and "that is a results file this command reads" in flat(cp.stderr), cp.stderr
    assert (run / "results.json").read_bytes() == before and other.read_bytes() == before
    # into the -o directory report and compare make: written
    for cmd in (["report", str(run), "-o", str(tmp_path / "new")], ["compare", str(run), str(H200), "-o", str(tmp_path / "c2")]):
        md = Path(cmd[-1]) / "summary.md"
        cp = run_cli(*cmd, "--markdown", str(md))
        assert cp.returncode == 0, cp.stderr
        assert md.read_text().strip() and (Path(cmd[-1]) / "index.html").exists()


def test_report_refuses_to_merge_a_run_that_shares_no_case_with_the_first(tmp_path):
    """``report RUN_A RUN_B`` of two configs had merged them and exited 0 with "not compared in 12
    (failed or not run)": nothing had failed, nothing could be compared (``compare`` refused)."""
    other = ROOT / "reports" / "h200-fa4-vs-2.8.3-bf16"
    cp = run_cli("report", str(H200), str(other), "-o", str(tmp_path / "m"))
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert f"{other}/results.json.gz: no case in common with {H200}/results.json.gz (the first run" in flat(cp.stderr)
    assert not (tmp_path / "m").exists()
    cp = run_cli("report", str(H200), str(ROOT / "reports" / "h200-aa-97"), "-o", str(tmp_path / "ok"))
    assert cp.returncode == 0, cp.stderr  # one config: merged as before


def test_one_version_written_two_ways_is_one_env_not_a_silent_aa_run():
    """``--versions 2.6.3,v2.6.3`` (and ``2.7.0.post2,2.7.0post2``) had become an A/A run without a
    word, while ``2.6.3,2.6.3`` was refused with the A/A advice."""
    from matrix_runner.envs.requests import parse_versions
    for text in ("2.6.3,v2.6.3", "2.7.0.post2,2.7.0post2", "2.7.0-post2,2.7.0.post2", "2.6.3.0,2.6.3"):
        first, second = text.split(",")
        with pytest.raises(UsageError, match=f"appears twice \\('{first}' and '{second}' are one version, "):
            parse_versions(text)
    assert [(r.label, r.version) for r in parse_versions("2.7.0-post2,V2.6.3")] == \
        [("2.7.0.post2", "2.7.0.post2"), ("2.6.3", "2.6.3")]
    assert [r.label for r in parse_versions("a=2.6.3,b=v2.6.3")] == ["a", "b"]  # an A/A run said so


def test_markdown_through_a_link_or_onto_the_output_dir_is_refused(tmp_path):
    """Second trial: a symbolic or hard link to a run's results passed the name check and the run's
    data became Markdown; ``--markdown`` equal to ``-o`` wrote the report, then failed."""
    import gzip
    import shutil
    run = tmp_path / "run"
    shutil.copytree(H200, run)
    before = (run / "results.json.gz").read_bytes()
    (tmp_path / "link.md").symlink_to(run / "results.json.gz")
    cp = run_cli("report", str(run), "-o", str(tmp_path / "o1"), "--markdown", str(tmp_path / "link.md"))
    assert cp.returncode == 2 and "that is a results file this command reads" in flat(cp.stderr), cp.stderr
    cp = run_cli("report", str(H200), "-o", str(tmp_path / "o1"), "--markdown", str(tmp_path / "link.md"))
    assert cp.returncode == 2 and "that is the name of a run's own file (results.json.gz)" in flat(cp.stderr), cp.stderr
    plain = tmp_path / "r2.json"
    plain.write_bytes(gzip.decompress(before))
    os.link(plain, tmp_path / "hl.md")
    cp = run_cli("compare", str(run), str(plain), "--markdown", str(tmp_path / "hl.md"))
    assert cp.returncode == 2 and "that is a results file this command reads" in flat(cp.stderr), cp.stderr
    assert (run / "results.json.gz").read_bytes() == before and plain.read_bytes() == gzip.decompress(before)
    for cmd in (["report", str(run)], ["compare", str(run), str(plain)]):
        out = tmp_path / f"o-{cmd[0]}"
        cp = run_cli(*cmd, "-o", str(out), "--markdown", str(out))
        assert cp.returncode == 2 and "is a directory (the -o directory)" in flat(cp.stderr), cp.stderr
        assert not out.exists()
    # a hard link to a run's file the command does not read: the Markdown replaces the link's name
    # only (a new file renamed over it), the run's file keeps its content; a symbolic link to a
    # plain file is written through (its target gets the Markdown)
    log = run / "console.log"
    log.write_text("the run's log\n")
    os.link(log, tmp_path / "log-link.md")
    (tmp_path / "sym.md").symlink_to(tmp_path / "target.md")
    for name in ("log-link.md", "sym.md"):
        cp = run_cli("report", str(run), "-o", str(tmp_path / f"o-{name}"), "--markdown", str(tmp_path / name))
        assert cp.returncode == 0, cp.stderr
    assert log.read_text() == "the run's log\n"
    assert (tmp_path / "log-link.md").read_text().startswith("### ") and os.stat(tmp_path / "log-link.md").st_nlink == 1
    assert (tmp_path / "sym.md").is_symlink() and (tmp_path / "target.md").read_text().startswith("### ")
    # compare -o FILE: a file, not "holds a run"
    f = tmp_path / "afile"
    f.write_text("x")
    cp = run_cli("compare", str(run), str(plain), "-o", str(f))
    assert cp.returncode == 2 and f"-o {f}: is a file; give a directory" in flat(cp.stderr), cp.stderr


def test_extending_a_run_is_refused_where_more_sets_would_add_nothing():
    """``--resume RUN --time-budget S``/``--max-sets N`` (pipeline.check_extension): above the run's own,
    for a run stopped on its budget or max_sets or interrupted; never for a --quick run or one whose
    verdicts were decided or that had nothing left to time."""
    from matrix_runner.errors import UsageError
    from matrix_runner.pipeline import check_extension, extendable, with_flag

    def doc(stop, **st):
        return {"timing": {"stop_reason": stop}, "settings": {"time_budget_s": 60.0, "max_sets": 40, **st}}

    budget = "time budget 60 s: another process set would overrun it"
    check_extension("R", doc(budget), {"time_budget_s": 120.0}, False)
    check_extension("R", doc("max_sets 40 reached"), {"max_sets": 50}, False)
    check_extension("R", doc("interrupted"), {"time_budget_s": 61.0}, True)
    for d, ext, needle in (
            (doc(budget), {"time_budget_s": 60.0}, "--time-budget 60: the run's own is 60 s; give more"),
            (doc(budget), {"time_budget_s": float("inf")}, "--time-budget inf: give a positive number, a finite one"),
            (doc("max_sets 40 reached"), {"max_sets": 0}, "--max-sets 0: give a positive number"),
            # the limit that stopped the run must be raised (new-user trial: --max-sets on a budget stop)
            (doc(budget), {"max_sets": 50}, "R --max-sets: that run stopped on its time budget (time budget 60 s: "
             "another process set would overrun it): raising --max-sets alone would time nothing more; give "
             "--time-budget above its 60"),
            (doc("max_sets 40 reached"), {"time_budget_s": 90.0}, "give --max-sets above its 40"),
            # room for another set: 35 s spent on 5 sets under a 40 s budget
            ({**doc(budget, time_budget_s=40.0), "timing": {"stop_reason": budget, "timing_phase_s": 35.0},
              "sets": [{}] * 5}, {"time_budget_s": 41.0}, "--time-budget 41: the run has spent 35 s timing 5 process "
             "sets (~7.0 s each): give at least 42 s for another set to fit"),
            # a quick run is said first, before any value (new-user trial)
            (doc("quick: one process set", quick=True, max_sets=40), {"max_sets": 5}, "that was a --quick run"),
            (doc("quick: one process set", quick=True), {"time_budget_s": 120.0}, "that was a --quick run"),
            ({**doc(budget), "shards": [{"index": 0}]}, {"max_sets": 41}, "R --max-sets: that run was sharded"),
            (doc("all wall-time verdicts decided, every interval within ±1% of its ratio (anytime-valid intervals)"),
             {"time_budget_s": 120.0}, "more sets would stop at once"),
            (doc("every case failed (its error is in the report): nothing left to time"), {"max_sets": 41},
             "more time would not time more")):
        with pytest.raises(UsageError, match=re.escape(needle)):
            check_extension("R", d, ext, False)
    assert extendable(budget) and extendable("max_sets 3 reached") and not extendable(None)
    assert with_flag(["matrix-run", "--time-budget", "60", "-o", "x"], "--time-budget", "120") == \
        ["matrix-run", "--time-budget", "120", "-o", "x"]
    assert with_flag(["matrix-run", "--time-budget=60"], "--time-budget", "120") == ["matrix-run", "--time-budget=120"]
    assert with_flag(["matrix-run", "--versions", "a,b"], "--max-sets", "9") == ["matrix-run", "--versions", "a,b",
                                                                                  "--max-sets", "9"]


def test_a_resume_with_a_larger_budget_raises_an_automatic_max_sets_with_it(tmp_path):
    """``--resume RUN --time-budget 240`` of a one-minute run whose max_sets was the default: its
    max_sets follows the budget (40 per minute: 160), or it would stop at its 40th set (~90 s on the
    H200); a --max-sets given with it is kept; a run whose max_sets was its own number keeps it."""
    import json
    import shutil

    from matrix_runner import pipeline
    from matrix_runner.results import read_text
    src = Path(__file__).resolve().parents[1] / "reports" / "h200-aa-116"
    run = tmp_path / "aa-116"
    shutil.copytree(src, run)

    def resume(*extra, where=run):
        argv = ["run", "--resume", str(where), *extra]
        new, _, doc = pipeline.resume_args(cli._parse_stored(argv), argv, cli._parse_stored)
        new.doc = doc
        return new

    new = resume("--time-budget", "240")  # a run from before max_sets_auto, on the built-in default
    assert (new.time_budget, new.max_sets, new.resumed_max_sets_auto) == (240.0, 160, True)
    assert new.extended == {"time_budget_s": [60.0, 240.0], "max_sets": [40, 160]}
    # the stored command gets the typed flag only: the raised max_sets stays automatic (new-user trial:
    # "--max-sets 44" had been written into it, a fixed cap for whoever reran it)
    assert new.doc["command"][-2:] == ["--time-budget", "240"] and "--max-sets" not in new.doc["command"]
    new = resume("--time-budget", "240", "--max-sets", "60")
    assert (new.max_sets, new.resumed_max_sets_auto, new.extended["max_sets"]) == (60, False, [40, 60])
    doc = json.loads(read_text(run / "results.json.gz"))
    doc["settings"]["max_sets_auto"] = False  # a run given its own max_sets
    (run / "results.json.gz").unlink()
    (run / "results.json").write_text(json.dumps(doc))
    new = resume("--time-budget", "240")
    assert (new.max_sets, new.resumed_max_sets_auto, new.extended) == (40, False, {"time_budget_s": [60.0, 240.0]})
    # --max-sets auto makes it follow the budget from now on, and is stored as typed
    new = resume("--time-budget", "240", "--max-sets", "auto")
    assert (new.max_sets, new.resumed_max_sets_auto, new.extended["max_sets"]) == (160, True, [40, 160])
    assert new.doc["command"][-4:] == ["--time-budget", "240", "--max-sets", "auto"]
    from matrix_runner.errors import UsageError
    with pytest.raises(UsageError, match=re.escape("--max-sets auto: at its 60 s budget that is 40 sets, no more "
                                                   "than its own 40: give a larger --time-budget to extend it")):
        resume("--max-sets", "auto")
    assert pipeline.max_sets_followed({**doc, "settings": {**doc["settings"], "max_sets_auto": True}})
    old = {**doc, "settings": {k: v for k, v in doc["settings"].items() if k != "max_sets_auto"}}
    assert pipeline.max_sets_followed(old)
    assert not pipeline.max_sets_followed({**old, "command": old["command"] + ["--max-sets", "40"]})
    assert not pipeline.max_sets_followed({**old, "config_source": "my.yaml"})
    # a refusal names the flags given, not the max_sets raised with them (new-user trial: a quick run's
    # "--time-budget --max-sets: that was a --quick run")
    quick = tmp_path / "q"
    shutil.copytree(src.parent / "h200-aa-quick-10", quick)
    from matrix_runner.errors import UsageError
    with pytest.raises(UsageError, match=re.escape(f"--resume {quick} --time-budget: that was a --quick run")):
        resume("--time-budget", "120", where=quick)


def test_a_larger_time_budget_raises_an_automatic_max_sets():
    """``--time-budget 240`` with the default ``max_sets: auto``: 160 sets may run (40 a minute), not
    the 40 that had stopped such a run after ~90 s; ``--max-sets N`` or a config's number is kept."""
    import threading

    from matrix_runner import pipeline
    from matrix_runner.config import load_config, parse_config

    def samp(extra, cfg=None):
        argv = ["run", "--versions", "a=2.6.3,b=2.6.3", "--device", "cpu", *extra]
        cfg = cfg or load_config(None)
        pipeline.Run(cli._parse_stored(argv), argv, threading.Event(), None)._check_numbers(cfg, cfg.sampling)
        return cfg.sampling

    s = samp(["--time-budget", "240"])
    assert (s.max_sets, s.max_sets_auto) == (160, True) and s.planned_sets > 40
    s = samp(["--time-budget", "240", "--max-sets", "50"])
    assert (s.max_sets, s.max_sets_auto) == (50, False)
    s = samp([])
    assert (s.max_sets, s.max_sets_auto) == (40, True)
    s = samp(["--set-seconds", "0.5", "--time-budget", "90"])  # shorter sets: more a minute
    assert (s.max_sets, s.max_sets_auto) == (120, True)
    s = samp(["--time-budget", "240"], parse_config({"sampling": {"max_sets": 45}}))
    assert (s.max_sets, s.max_sets_auto) == (45, False)
    s = samp(["--time-budget", "240", "--max-sets", "auto"], parse_config({"sampling": {"max_sets": 45}}))
    assert (s.max_sets, s.max_sets_auto) == (160, True)  # the command line puts a config's number back to auto
    cp = run_cli("--versions", "2.6.3", "--max-sets", "lots")
    assert cp.returncode == 2 and "argument --max-sets: invalid whole-number-or-auto value: 'lots'" in cp.stderr


def test_a_finished_run_is_told_which_limit_to_raise_to_time_more(tmp_path, capsys):
    """--resume of a run that stopped on its max_sets: the advice is --max-sets (new-user trial: it said
    --time-budget, which then refused: "raising --time-budget alone would time nothing more")."""
    import json
    import shutil

    from matrix_runner import pipeline
    from matrix_runner.results import read_text
    run = tmp_path / "aa"
    shutil.copytree(Path(__file__).resolve().parents[1] / "reports" / "h200-aa-116", run)
    doc = json.loads(read_text(run / "results.json.gz"))
    (run / "results.json.gz").unlink()
    for stop, want in ((f"max_sets {doc['settings']['max_sets']} reached",
                        f"raise its max_sets: matrix-run --resume {run} --max-sets N (more than its "
                        f"{doc['settings']['max_sets']})"),
                       ("time budget 60 s: another process set would overrun it",
                        f"give it a larger budget: matrix-run --resume {run} --time-budget S (more than its 60 s)")):
        doc["timing"]["stop_reason"] = stop
        (run / "results.json").write_text(json.dumps(doc))
        argv = ["run", "--resume", str(run)]
        _, _, prior = pipeline.resume_args(cli._parse_stored(argv), argv, cli._parse_stored)
        r = capsys.readouterr()
        out = " ".join((r.err + " " + r.out).split())
        assert prior is None and f"nothing to resume; to time more process sets, {want}" in out, out


def test_report_of_a_run_whose_rescue_copy_holds_more_sets_says_where_it_is(tmp_path, monkeypatch, capsys):
    """A full disk left a 1-set results.json in the run folder and every set in a rescue copy (new-user
    trial): `report RUN` showed the stale file as the run, without a word of the copy."""
    import json
    import tempfile

    from matrix_runner import pipeline
    from matrix_runner.results import read_text
    doc = json.loads(read_text(Path(__file__).resolve().parents[1] / "reports" / "h200-aa-116" / "results.json.gz"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    rescue = Path(tempfile.mkdtemp(prefix=f"{pipeline.RESCUE_PREFIX}{doc['run_id']}-")) / "results.json"
    rescue.write_text(json.dumps(doc))
    stale = {**doc, "sets": doc["sets"][:1]}
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps(stale))
    assert cli.main(["report", str(tmp_path / "run")]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (f"warning: {tmp_path / 'run' / 'results.json'} holds 1 process set(s), but a rescue copy of this run with "
            f"{len(doc['sets'])} is at {rescue}") in err, err
    rescue.unlink()
    assert cli.main(["report", str(tmp_path / "run")]) == 0
    assert "rescue copy" not in capsys.readouterr().err
