"""The command line: no-GPU behaviour, exit codes, bad input."""
import json
import re
from pathlib import Path

import pytest
from conftest import load_results, run_cli


def test_no_gpu_says_so_plainly_and_writes_results(tmp_path):
    cp = run_cli("--versions", "2.6.3,2.7.0.post2", "--envs-dir", str(tmp_path / "envs"),
                 "--wheel-cache", str(tmp_path / "cache"), "--output", str(tmp_path / "out"), "--offline")
    assert cp.returncode == 3
    assert "Traceback" not in cp.stderr and "Traceback" not in cp.stdout
    text = " ".join(cp.stderr.split())
    assert "flash-attn needs an NVIDIA GPU" in text
    assert "Nothing was built or timed" in text and "--device cpu" in text
    res = load_results(tmp_path / "out")
    assert [e["status"] for e in res["envs"]] == ["skipped", "skipped"]
    assert res["settings"]["device"] == "none"
    assert "flash-attn needs an NVIDIA GPU" in (tmp_path / "out" / "index.html").read_text()
    assert not (tmp_path / "envs" / "2.6.3").exists()
    # `report` of it says that nothing was measured (it printed an empty, garbled table: new-user trial)
    cp = run_cli("report", str(tmp_path / "out"), "-o", str(tmp_path / "rep"))
    text = " ".join((cp.stdout + cp.stderr).split())
    assert cp.returncode == 0 and "that run measured nothing: no NVIDIA GPU was visible where it ran" in text, text
    assert "case op" not in text  # no empty table
    assert "flash-attn needs an NVIDIA GPU" in (tmp_path / "rep" / "index.html").read_text()


@pytest.mark.parametrize("args,needle", [
    (["--versions", "2.6.3;rm -rf ~"], "is not a PEP 440 version"),
    (["--versions", "../../x=2.6.3"], "label '../../x' may only use"),
    (["--versions", "a=2.6.3,a=2.7.0"], "label 'a' appears twice"),
    (["--versions", ""], "give at least one flash-attn version"),
    (["--versions", "2.6.3", "--torch", "latest"], "--torch 'latest'"),
    (["--versions", "2.6.3", "--archs", "hopper"], "--archs 'hopper'"),
    (["--versions", "2.6.3", "--config", "/nonexistent.yaml"], "cannot read the file"),
    (["--versions", "2.6.3", "--config", "defualt"], "did you mean the built-in config 'default'? built-in configs by name:"),
])
def test_bad_input_exits_2_with_a_clear_message(args, needle, tmp_path):
    cp = run_cli(*args, "--envs-dir", str(tmp_path / "envs"), "--output", str(tmp_path / "o"))
    assert cp.returncode == 2, cp.stderr
    assert needle in " ".join(cp.stderr.split())
    assert "Traceback" not in cp.stderr


def test_plan_json(standins, tiny_config, tmp_path):
    import json
    cp = run_cli("plan", "--versions", "2.6.3,b=2.7.0.post2", "--config", str(tiny_config), "--json",
                 "--find-links", str(standins["wheels"]), "--envs-dir", str(tmp_path / "envs"),
                 "--wheel-cache", str(tmp_path / "cache"))
    assert cp.returncode == 0, cp.stderr
    plan = json.loads(cp.stdout)
    assert [(p["label"], p["method"]) for p in plan] == [("2.6.3", "find-links"), ("b", "find-links")]
    assert plan[0]["wheel"].endswith("flash_attn-2.6.3-py3-none-any.whl")


def test_an_output_dir_that_cannot_be_created_is_a_usage_error_naming_the_option(tmp_path):
    """New-user trial: --output /proc/x said "/proc/x: No such file or directory", naming no option."""
    out = "/proc/matrix-run-no-such-dir/out"
    cp = run_cli("--versions", "2.6.3", "--envs-dir", str(tmp_path / "envs"), "--output", out)
    assert cp.returncode == 2, cp.stderr
    assert f"--output {out}: cannot create it" in " ".join(cp.stderr.split()) and "Traceback" not in cp.stderr
    # report's -o too (new-user trial: "error: /proc/rep: No such file or directory")
    run = Path(__file__).resolve().parents[1] / "reports" / "h200-aa-103"
    cp = run_cli("report", str(run), "-o", out)
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.strip() == (f"error: -o {out}: cannot create it (No such file or directory); give a directory "
                                 "you can write"), cp.stderr


@pytest.mark.parametrize("args,needle", [
    (["--versions", "2.6.3", "--fail-on-regression", "-3"], "--fail-on-regression -3: give a finite percentage >= 0"),
    (["pln", "--versions", "2.6.3"], "unknown subcommand 'pln'"),
    # the subcommand's name and help, not the top level's
    (["--versions", "2.6.3", "--quik"], "matrix-run run: error: unrecognized arguments: --quik (did you mean --quick?)"),
    (["--versions", "2.6.3", "--quik"], "(every option: matrix-run run -h)"),
    (["--versions", ".venv=2.6.3"], "must start with a letter or digit"),
    # two local labels of one version had become two envs of one cached wheel: a silent A/A
    (["--versions", "2.6.3+cu12,2.6.3+cu13"], "--versions: '2.6.3+cu12': 2.6.3+cu12 carries a local build label "
     "(+cu12); matrix-run picks the build of a version for this machine's torch and CUDA itself (its wheel key): "
     "give 2.6.3, or the path of a wheel file to time that build"),
    (["--versions", "fa4=flash-attn-4==4.0.0b36+local"], "carries a local build label (+local); give flash-attn-4==4.0.0b36"),
    (["--versions", "2.6.3,2.7.0.post2", "--quick", "--fail-on-regression", "5"],
     "--fail-on-regression with --quick: a quick run gives provisional ratios"),
    # a gate below min_effect could never fail on a change it calls "same" (new-user trial)
    (["--versions", "2.6.3,2.7.0.post2", "--fail-on-regression", "2"],
     "--fail-on-regression 2 is below min_effect (5 %): a change between 2 % and 5 % is called 'same' and could "
     "not fail the gate; give --min-effect 0.02 too, or a PCT of at least 5"),
    (["--versions", "2.6.3,2.7.0.post2", "--fail-on-regression", "0"],
     "could not fail the gate; give a PCT of at least 5"),  # no --min-effect 0 (refused itself)
    (["--versions", "2.6.3,2.7.0.post2", "--fail-on-regression", "inf"],
     "--fail-on-regression inf: give a finite percentage >= 0"),
    # a quick run times one set of 2 s: these flags were accepted and did nothing (new-user trial)
    (["--versions", "2.6.3,2.7.0.post2", "--quick", "--max-sets", "5"],
     "--max-sets 5 with --quick: a quick run times one process set of 2 s of cycles, whatever --max-sets says"),
    (["--versions", "2.6.3,2.7.0.post2", "--quick", "--set-seconds", "0.5"],
     "--set-seconds 0.5 with --quick: a quick run times one process set of 2 s of cycles"),
    # argparse keeps the last: an extension by --time-budget=90 --time-budget 30 went to 30 (new-user trial)
    (["--resume", "nowhere", "--time-budget=90", "--time-budget", "30"],
     "--resume RUN_DIR --time-budget: given 2 times; give it once"),
])
def test_more_bad_input_exits_2(args, needle, tmp_path):
    cp = run_cli(*args, "--envs-dir", str(tmp_path / "envs"), "--output", str(tmp_path / "o"))
    assert cp.returncode == 2, cp.stderr
    assert needle in " ".join(cp.stderr.split())
    assert "usage:" not in cp.stderr  # run's usage block (20+ lines) hid the error line (new-user trial)


REPO = Path(__file__).resolve().parents[1]


def test_a_single_valued_option_given_twice_is_warned_of(tmp_path):
    """argparse keeps the last value without a word (`-o a ... -o b` wrote to b: carried over since an
    early new-user trial). A warning, not an error: a script's defaults followed by an override is a
    common use (the tests themselves do it)."""
    run = REPO / "reports" / "h200-aa-117"
    cp = run_cli("report", str(run), "-o", "a", "--output", "b", cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "warning: --output: given 2 times; only the last counts" in " ".join(cp.stderr.split())
    assert (tmp_path / "b" / "index.html").is_file() and not (tmp_path / "a").exists()
    cp = run_cli("plan", "--versions", "2.6.3", "--versions", "2.7.0.post2", "--envs-dir", "envs", cwd=tmp_path)
    assert ("warning: --versions: given 2 times; only the last counts (several versions go in one list: "
            "--versions 2.6.3,2.7.0.post2)") in " ".join(cp.stderr.split()), cp.stderr


def test_repeatable_options_may_repeat():
    from matrix_runner import cli
    run = cli.build_parser().get_default("_subparsers")["run"]
    assert cli._given_twice(run, ["run", "--find-links", "a", "--find-links", "b", "--yes", "--yes"]) is None
    assert cli._given_twice(run, ["run", "--time-budget", "5", "--max-sets=3", "--time-budget=7"]) == \
        "--time-budget: given 2 times"
    assert cli._given_twice(run, ["run", "-o", "x", "--", "-o"]) is None  # after --: not options


def test_an_invalid_choice_is_one_line_and_a_short_usage_is_still_shown(tmp_path):
    cp = run_cli("--build", "tiny")
    lines = cp.stderr.splitlines()  # (how argparse quotes the choices differs between Python versions)
    assert cp.returncode == 2 and len(lines) == 2, cp.stderr
    assert lines[0].startswith("matrix-run run: error: argument --build: invalid choice: 'tiny' (choose from ")
    assert lines[1] == "(every option: matrix-run run -h)"
    cp = run_cli("report")  # report's usage is two lines: it shows what is required
    assert cp.returncode == 2 and cp.stderr.startswith("usage: matrix-run report") and \
        "the following arguments are required: RESULTS.json|DIR" in cp.stderr
    assert "Traceback" not in cp.stderr


def test_report_without_output_prints_the_table_and_writes_nothing(tmp_path):
    """`report RUN` (no -o) had been refused; it prints the run's verdict table and names its own
    HTML report, writing nothing but a --markdown file; several runs are merged the same way."""
    import shutil
    reports = Path(__file__).resolve().parents[1] / "reports"
    run = tmp_path / "aa-116"
    shutil.copytree(reports / "h200-aa-116", run)
    before = sorted(p.name for p in run.iterdir())
    cp = run_cli("report", str(run), cwd=tmp_path)
    out = " ".join(cp.stdout.split())
    assert cp.returncode == 0, cp.stderr
    assert "b vs a: no difference beyond ±5% in any of 12 cases. Same in 12." in out, out
    assert f"its HTML report: {run / 'index.html.gz'}" in " ".join(cp.stderr.split())  # messages: stderr
    assert sorted(p.name for p in run.iterdir()) == before and sorted(p.name for p in tmp_path.iterdir()) == ["aa-116"]
    md = tmp_path / "s.md"
    cp = run_cli("report", str(run), str(reports / "h200-aa-115"), "--markdown", str(md), cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    err = " ".join(cp.stderr.split())
    assert "merging 2 runs into one report" in err and f"Markdown: {md}; no HTML written (give -o DIR for an HTML report)" in err, err
    assert md.read_text().startswith("### flash-attn: small-batch host overhead")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["aa-116", "s.md"]
    # verdicts recomputed at another --min-effect: the run's own page (at its own) is not offered
    cp = run_cli("report", str(run), "--min-effect", "0.2", cwd=tmp_path)
    err = " ".join(cp.stderr.split())
    assert cp.returncode == 0 and "no HTML written (give -o DIR for an HTML report of these verdicts)" in err, err
    assert "its HTML report" not in err and sorted(p.name for p in run.iterdir()) == before


def test_unwritable_output_and_markdown_are_refused_before_anything_runs(tmp_path):
    import os
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere (root without capabilities dropped)")
        for extra, needle in ((["--output", str(ro)], f"--output {ro}: {ro} is not writable"),
                              (["--output", str(tmp_path / "o"), "--markdown", str(ro / "x.md")], "--markdown"),
                              (["--output", str(ro / "sub")], "is not writable")):
            cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--envs-dir", str(tmp_path / "envs"), *extra)
            assert cp.returncode == 2 and needle in " ".join(cp.stderr.split()), cp.stderr
            assert not (tmp_path / "envs" / "2.6.3").exists()
    finally:
        ro.chmod(0o755)


def test_report_refuses_to_overwrite_another_runs_results(tmp_path):
    import json
    import shutil
    from pathlib import Path
    h200 = Path(__file__).resolve().parents[1] / "reports" / "h200-2.6.3-vs-2.7.0.post2"
    other = tmp_path / "other"
    shutil.copytree(h200, other)
    doc = json.loads((other / "results.json").read_text())
    doc["run_id"] = "another-run"
    (other / "results.json").write_text(json.dumps(doc))
    before = (other / "results.json").read_bytes()
    cp = run_cli("report", str(h200 / "results.json"), "-o", str(other))
    assert cp.returncode == 2 and "already holds another run's results.json (run another-run)" in " ".join(cp.stderr.split())
    assert (other / "results.json").read_bytes() == before
    # re-rendering a copy of the same run into its own directory is fine
    same = tmp_path / "same"
    shutil.copytree(h200, same)
    cp = run_cli("report", str(h200 / "results.json"), "-o", str(same))
    assert cp.returncode == 0, cp.stderr
    # but not with verdicts at another --min-effect, nor a merge: they would replace the run's own record
    # (new-user trial: `report RUN -o RUN --min-effect 0.01` rewrote it without a word)
    before = (same / "results.json").read_bytes()
    for extra, what in ((["--min-effect", "0.01"], "its verdicts at --min-effect 0.01"),
                        ([str(h200.parent / "h200-aa-59")], "the merge of the runs")):
        cp = run_cli("report", str(same), *extra, "-o", str(same))
        assert cp.returncode == 2 and f"writing {what} there would replace that run's own record" in \
            " ".join(cp.stderr.split()), cp.stderr
        assert (same / "results.json").read_bytes() == before


def test_report_and_compare_refuse_a_directory_holding_an_archived_run(tmp_path):
    """An archived run keeps results.json.gz: `report RUN -o ARCHIVED_RUN` had written a results.json
    beside it, which every reader then took for the archived run (new-user trial: aa-59 read as aa-60),
    and `compare -o` wrote its index.html there."""
    import shutil
    from pathlib import Path
    reports = Path(__file__).resolve().parents[1] / "reports"
    archived = tmp_path / "aa-59"
    shutil.copytree(reports / "h200-aa-59", archived)
    assert (archived / "results.json.gz").is_file() and not (archived / "results.json").exists()
    cp = run_cli("report", str(reports / "h200-aa-60"), "-o", str(archived))
    assert cp.returncode == 2, cp.stderr
    assert "already holds another run's results.json.gz" in " ".join(cp.stderr.split())
    assert sorted(p.name for p in archived.iterdir()) == ["console.log", "index.html.gz", "results.json.gz"]
    cp = run_cli("compare", str(reports / "h200-aa-58"), str(reports / "h200-aa-60"), "-o", str(archived))
    assert cp.returncode == 2 and "holds a run" in cp.stderr, cp.stderr
    assert not (archived / "index.html").exists()


def test_plan_flags_an_env_dir_that_run_would_refuse(standins, tiny_config, tmp_path):
    (tmp_path / "envs" / "2.6.3").mkdir(parents=True)
    cp = run_cli("plan", "--versions", "2.6.3", "--config", str(tiny_config),
                 "--find-links", str(standins["wheels"]), "--envs-dir", str(tmp_path / "envs"),
                 "--wheel-cache", str(tmp_path / "cache"))
    assert cp.returncode == 3
    assert "exists and is not a matrix-run env" in " ".join((cp.stdout + cp.stderr).split())


def test_writability_checks_name_the_unwritable_directory(tmp_path, monkeypatch):
    # (as root every directory is writable, so the subprocess test above skips: check the rule here)
    import os

    from matrix_runner import envs, pipeline
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(pipeline.os, "access", lambda p, mode: False if str(p).startswith(str(ro)) else real(p, mode))
    with pytest.raises(envs.UsageError, match=f"--output {ro}/a/b: {ro} is not writable"):
        pipeline.check_writable_dir(ro / "a" / "b", "--output")
    with pytest.raises(envs.UsageError, match="--markdown .*x.md: not writable"):
        pipeline.check_writable_file(ro / "x.md", "--markdown")
    with pytest.raises(envs.UsageError, match="does not exist"):
        pipeline.check_writable_file(tmp_path / "nope" / "x.md", "--markdown")
    with pytest.raises(envs.UsageError, match="--markdown /dev/null/x.md: /dev/null is not a directory"):
        pipeline.check_writable_file(Path("/dev/null/x.md"), "--markdown")  # it exists (new-user trial)
    (tmp_path / "f").write_text("")
    with pytest.raises(envs.UsageError, match="is not a directory"):
        pipeline.check_writable_dir(tmp_path / "f" / "out", "--output")
    pipeline.check_writable_dir(tmp_path / "new" / "deeper", "--output")  # creatable: fine
    # a directory given as the Markdown file, and a file system that refuses files though access()
    # says yes to root (/proc): refused before anything runs (both were found only at the end)
    with pytest.raises(envs.UsageError, match="--markdown .*: is a directory; give a file path"):
        pipeline.check_writable_file(tmp_path, "--markdown")
    import tempfile
    monkeypatch.setattr(pipeline.os, "access", real)

    def refuse(*a, **k):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    with pytest.raises(envs.UsageError, match="no file can be written in .*Operation not permitted"):
        pipeline.check_writable_file(tmp_path / "x.md", "--markdown")


def test_resume_of_a_run_that_measured_nothing_says_so(tmp_path):
    (tmp_path / "run").mkdir()
    cp = run_cli("--resume", str(tmp_path / "run"))
    assert cp.returncode == 2 and "that run stopped before it measured anything" in " ".join(cp.stderr.split())


def test_resume_of_a_run_without_a_gpu_refuses_and_gives_the_command_to_run_again(tmp_path):
    """A run on a machine without a GPU writes results (every env 'skipped', stop reason "no GPU"); a
    --resume of it had said "that run finished ... nothing to resume" and exited 0 (new-user trial)."""
    from matrix_runner import results
    run = tmp_path / "run"
    run.mkdir()
    doc = {"schema": results.SCHEMA, "command": ["matrix-run", "--versions", "2.6.3,2.7.0.post2"],
           "timing": {"stop_reason": "no GPU"}, "envs": [], "cases": [], "comparisons": [], "sets": []}
    (run / "results.json").write_text(json.dumps(doc))
    cp = run_cli("--resume", str(run))
    err = " ".join(cp.stderr.split())
    assert cp.returncode == 2, cp.stderr
    assert "that run measured nothing (no NVIDIA GPU was visible" in err
    assert "start it again: matrix-run --versions 2.6.3,2.7.0.post2" in err


@pytest.mark.parametrize("spec", [">=2.6", "<2.7", "~=2.6.3", "==2.6.3"])
def test_a_version_specifier_is_refused_as_one_not_read_as_a_label(spec):
    """`--versions ">=2.6,..."` had answered "label '>' may only use letters ..." (new-user trial)."""
    from matrix_runner.envs import requests
    with pytest.raises(requests.UsageError, match=f"--versions: '{re.escape(spec)}' is a version specifier; matrix-run "
                                                   "times exact versions"):
        requests.parse_versions(spec)


def test_too_many_workers_per_env_is_a_usage_error_naming_the_bound(tmp_path):
    cp = run_cli("--versions", "2.6.3", "--workers-per-env", "50", "--output", str(tmp_path / "out"))
    assert cp.returncode == 2, cp.stderr
    assert "--workers-per-env 50: give at most 8" in " ".join(cp.stderr.split())


@pytest.mark.parametrize("gpus", ["abc", "0,0", "1,x"])
def test_a_malformed_gpus_list_is_refused_before_the_run_prints_or_creates_anything(tmp_path, gpus):
    """--gpus abc printed the run's header and output directory before its error (new-user trial)."""
    cp = run_cli("--versions", "2.6.3", "--gpus", gpus, "--output", str(tmp_path / "out"))
    assert cp.returncode == 2, cp.stderr
    assert f"--gpus {gpus!r}: give all or a comma list of" in " ".join(cp.stderr.split())
    assert "output:" not in cp.stdout and "env(s)" not in cp.stdout and not (tmp_path / "out").exists()


def test_fail_on_regression_leaves_out_the_sdpa_control_by_impl_not_by_name():
    """Issue #14: the SDPA control was dropped by its id's "-sdpa" suffix."""
    from matrix_runner import pipeline
    from matrix_runner.config import Case

    fa = Case(op="fwd", batch=2, seqlen_q=64, seqlen_k=64, nheads=4, nheads_k=4, head_dim=32).to_dict()
    sd = Case(op="fwd", batch=2, seqlen_q=64, seqlen_k=64, nheads=4, nheads_k=4, head_dim=32, impl="sdpa").to_dict()
    fa["id"] = fa["label"] = "my-flash-attn-case-vs-sdpa"  # a flash-attn case whose name ends in -sdpa
    sd["id"] = sd["label"] = "control"  # an SDPA control whose name does not say so
    cases = [dict(c, env=env) for c in (fa, sd) for env in ("a", "b")]
    comps = [{"baseline": "a", "candidate": "b", "case": c["id"], "label": c["label"], "op": "fwd",
              "metric": m, "verdict": "slower", "ratio": 1.5} for c in (fa, sd) for m in ("wall_us", "host_us")]
    doc = {"cases": cases, "comparisons": comps}
    assert [c["case"] for c in pipeline.regressions(doc, 10)] == ["my-flash-attn-case-vs-sdpa"]
    assert pipeline.regressions(doc, 60) == []  # 50 % slower is under a 60 % threshold


def test_fail_on_regression_says_what_it_could_not_judge_and_exits_3_where_nothing_was_decided(capsys):
    """New-user trial: a budget that fit one process set gave "provisional 1.57x" and the gate passed
    silently (exit 0). Now: no interval over the threshold -> exit 3 naming it; an undecided interval
    reaching over it -> a warning; a decided slower -> exit 1 as before; all clear -> it says passed."""
    import threading
    from types import SimpleNamespace

    from matrix_runner import errors, pipeline

    def doc(**wall):
        c = {"baseline": "a", "candidate": "b", "case": "x", "label": "B2 S64", "op": "fwd", "metric": "wall_us",
             "ratio": 1.57, "ci_low": 1.0, "ci_high": 2.0, "unbounded": False, **wall}
        return {"cases": [{"env": e, "id": "x"} for e in ("a", "b")], "comparisons": [c],
                "envs": [{"label": e, "status": "ok"} for e in ("a", "b")]}

    def gate(d, code=0):
        r = pipeline.Run(SimpleNamespace(fail_on_regression=5.0), [], threading.Event(), None)
        r.doc, r.samp = d, SimpleNamespace(time_budget_s=35.0)
        return r.gate(code), " ".join(capsys.readouterr().err.split())  # the console wraps at 80 columns

    code, err = gate(doc(verdict="provisional"))
    assert code == errors.EXIT_FAILED and "not judged" in err and "1.57x" in err and "raise --time-budget" in err
    assert gate(doc(verdict="provisional", ratio=1.02))[0] == 0  # under the threshold: nothing to judge
    code, err = gate(doc(verdict="ambiguous"))
    assert code == 0 and "could still be over 5%" in err
    code, err = gate(doc(verdict="ambiguous", ci_high=1.04))
    assert code == 0 and "passed (no wall time over 5% slower)" in err
    assert gate(doc(verdict="slower"), errors.EXIT_FAILED)[0] == errors.EXIT_REGRESSION  # 1 wins over 3
    assert gate(doc(verdict="provisional"), errors.EXIT_FAILED)[0] == errors.EXIT_FAILED
    # second new-user trial: a run that compared nothing "passed"; a "slower" under the threshold whose
    # interval reaches over it passed without a word; an interrupted run had no gate at all
    nothing = doc(verdict="slower")
    nothing["comparisons"] = []
    code, err = gate(nothing)
    assert code == errors.EXIT_FAILED and "not judged: nothing was compared (b vs a x: not compared)" in err, err
    gone = doc(verdict="slower", ratio=1.5)
    gone["envs"].append({"label": "c", "status": "failed"})
    g = pipeline.gate_outcome(gone, 5.0)
    assert g["outcome"] == "failed" and g["not_judged"] == ["env c: failed, not compared"]
    gone["comparisons"][0]["ratio"] = 1.02
    assert pipeline.gate_outcome(gone, 5.0)["outcome"] == "not judged"
    code, err = gate(doc(verdict="slower", ratio=1.04, ci_low=1.02, ci_high=1.07))
    assert code == 0 and "passed, but 1 comparison(s) could still be over 5%" in err and "[1.02, 1.07]" in err
    cut = doc(verdict="slower", ratio=1.02, ci_high=1.03)
    cut["timing"] = {"stop_reason": "interrupted"}
    g = pipeline.gate_outcome(cut, 5.0)
    assert g["outcome"] == "not judged" and g["exit"] == errors.EXIT_INTERRUPTED and "--resume" in g["text"]


def test_the_exit_line_on_cases_not_timed_says_why_once(capsys):
    """Cases the budget left untimed: the closing line counts them, names those failed in another env,
    and gives the stop reason without nesting its parentheses in more (new-user trial)."""
    import threading
    from types import SimpleNamespace

    from matrix_runner import errors, pipeline
    r = pipeline.Run(SimpleNamespace(fail_on_regression=None), [], threading.Event(), None)
    r.env_results = [SimpleNamespace(label=e, status="ok", error=None) for e in ("a", "b")]
    r.reason = "time budget 9 s spent while set 1 set up case B4 fwd (inputs and first calls; 3 s into the set)"
    r.doc = {"cases": [{"env": "a", "id": "x", "status": "not run"}, {"env": "b", "id": "x", "status": "not run"},
                       {"env": "a", "id": "y", "status": "not run"}, {"env": "b", "id": "y", "status": "error",
                                                                     "error_kind": "oom"}]}
    assert r.exit_code() == errors.EXIT_FAILED
    err = " ".join(capsys.readouterr().err.split())
    assert "1 case(s) failed in 1 env(s) (oom); see the report" in err
    assert ("2 case(s) not timed, see the report; 1 of them failed in another env; sampling stopped: time budget 9 s "
            "spent while set 1 set up case B4 fwd (inputs and first calls; 3 s into the set)") in err, err


def test_the_gate_outcome_is_kept_in_results_and_shown_in_every_report(tmp_path, capsys):
    """New-user trial: --fail-on-regression's outcome was an exit code and a line on stderr only. It is
    written to results.json ``gate`` with the run, shown in the HTML, the Markdown and `report`'s
    terminal, and dropped from a re-rendered report whose verdicts are recomputed."""
    import gzip
    import threading
    from types import SimpleNamespace

    from matrix_runner import errors, pipeline, results

    src = Path(__file__).resolve().parent.parent / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-10" / "results.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc.pop("gate", None)
    r = pipeline.Run(SimpleNamespace(fail_on_regression=50.0, markdown=str(tmp_path / "s.md")), [], threading.Event(), None)
    r.doc, r.samp, r.out_dir = doc, SimpleNamespace(time_budget_s=60.0), tmp_path / "run"
    r.out_dir.mkdir()
    r._write_files()
    assert r.gate(0) == errors.EXIT_REGRESSION
    g = results.load(r.out_dir / "results.json")["gate"]
    slower = [c for c in doc["comparisons"] if c["metric"] == "wall_us" and c["verdict"] == "slower" and c["ratio"] > 1.5]
    assert g["outcome"] == "failed" and g["exit"] == 1 and g["threshold_pct"] == 50.0
    assert len(g["regressions"]) == len(slower) > 0 and not g["not_judged"]
    # the backward cases are slower at 1.48-1.49x, under 50 %, but their intervals reach above 1.5
    assert g["undecided"] and all(u.endswith(" bwd 1.48x") or u.endswith(" bwd 1.49x") for u in g["undecided"]), g
    assert g["text"].startswith(f"--fail-on-regression 50: failed: {len(slower)} regression(s) over 50%: 2.7.0.post2 vs 2.6.3 ")
    html = (r.out_dir / "index.html").read_text()
    assert 'id="gate"' in html and "--fail-on-regression 50: failed" in html and "the gate's own exit code: 1" in html
    assert "**--fail-on-regression 50: failed" in (tmp_path / "s.md").read_text()
    capsys.readouterr()
    cp = run_cli("report", str(r.out_dir), "-o", str(tmp_path / "re"))
    assert cp.returncode == 0 and "--fail-on-regression 50: failed" in " ".join(cp.stderr.split()), cp.stderr[-2000:]
    # at 300 % nothing is over: passed; re-rendered at another --min-effect: judged again on those
    # verdicts, and said so (second new-user trial: the gate had vanished); a merge has none
    r.args.fail_on_regression = 300.0
    r._write_files()
    assert results.load(r.out_dir / "results.json")["gate"]["outcome"] == "passed" and r.gate(0) == 0
    cp = run_cli("report", str(r.out_dir), "-o", str(tmp_path / "re2"), "--min-effect", "0.1")
    assert cp.returncode == 0, cp.stderr
    g2 = results.load(tmp_path / "re2" / "results.json")["gate"]
    assert g2["outcome"] == "passed" and g2["text"].endswith("judged again on the verdicts at --min-effect 0.1; the run's own: passed")
    assert "judged again on the verdicts at --min-effect 0.1" in " ".join(cp.stderr.split())
    assert "gate" not in results.merge([results.load(r.out_dir / "results.json"), results.load(tmp_path / "re" / "results.json")])
    # an interrupted run: not judged
    doc["timing"]["stop_reason"] = "interrupted"
    r._write_files()
    assert results.load(r.out_dir / "results.json")["gate"]["outcome"] == "not judged"


def test_a_config_of_over_500_cases_needs_yes(standins, tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("dtype: [float16, torch.bfloat16]\ncausal: [false, true]\nops: [fwd, bwd]\n"
                   "shapes:\n  - {batch: [1, 2, 4, 8], seqlen: [16, 32, 48, 64, 80, 96, 112, 128], nheads: [2, 4], head_dim: 16}\n")
    common = ["--versions", "2.6.3", "--config", str(big), "--envs-dir", str(tmp_path / "envs"),
              "--wheel-cache", str(tmp_path / "cache"), "--find-links", str(standins["wheels"]), "--offline"]
    for cmd in (["plan"], ["--output", str(tmp_path / "o")]):
        cp = run_cli(*cmd, *common)
        assert cp.returncode == 2, cp.stderr
        text = " ".join(cp.stderr.split())
        assert "error: the config expands to 512 cases (axes: dtype 2; causal 2; shapes[0]: batch 4 x seqlen 8 x nheads 2;" in text
        assert "pass --yes to time them all" in text and "Traceback" not in text
    assert not (tmp_path / "o").exists()
    cp = run_cli("plan", *common, "--yes", "--json")
    assert cp.returncode == 0, cp.stderr
    import json
    (item,) = json.loads(cp.stdout)
    assert item["method"] == "find-links"


def _plan_lines(width: int) -> list[str]:
    from pathlib import Path

    from rich.console import Console

    from matrix_runner import envs, ui
    items = [envs.PlanItem(label="2.6.3", version="2.6.3", env_dir=Path("envs/2.6.3"), method="source-slim", key={},
                           key_id="3f9a2c1d7e8b", kernels=["fwd_hdim32_fp16", "fwd_split_hdim32_fp16", "bwd_hdim32_fp16"],
                           archs=["90"], estimate_s=360, jobs={"max_jobs": 5}, notes=["sdist from PyPI (sha256 checked)"]),
             envs.PlanItem(label="new", version="2.7.0.post2", env_dir=Path("envs/new"), method="failed", key={},
                           key_id="–", kernels="–", archs="–",
                           error="flash_fwd_hdim224_fp16_sm80.cu:12: cannot parse [template] 'x'")]
    con = Console(record=True, width=width, color_system=None)
    ui.print_plan(items, con)
    return [ln.rstrip() for ln in con.export_text().splitlines()]


def test_plan_is_one_block_per_env_that_fits_narrow_terminals():
    assert _plan_lines(80) == [
        "Plan: where each env's flash-attn comes from",
        "2.6.3",
        "  method     source-slim · ~6.0 min (MAX_JOBS=5)",
        "  wheel key  3f9a2c1d7e8b · archs 90",
        "  kernels    3: fwd_hdim32_fp16, fwd_split_hdim32_fp16, bwd_hdim32_fp16",
        "  note       sdist from PyPI (sha256 checked)",
        "new  flash-attn 2.7.0.post2",
        "  method  failed: flash_fwd_hdim224_fp16_sm80.cu:12: cannot parse [template] 'x'"]
    narrow = _plan_lines(50)
    assert max(map(len, narrow)) <= 50
    # values wrap at spaces, never inside a word ("source-sl / im" in the 7-column table)
    assert narrow[2:6] == ["  method     source-slim · ~6.0 min (MAX_JOBS=5)", "  wheel key  3f9a2c1d7e8b · archs 90",
                           "  kernels    3: fwd_hdim32_fp16,", "             fwd_split_hdim32_fp16,"]


def test_plan_output_fits_80_columns_when_not_a_tty(standins, tiny_config, tmp_path):
    import os
    import subprocess
    import sys
    e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    cp = subprocess.run([sys.executable, "-m", "matrix_runner", "plan", "--versions", "2.6.3,b=2.7.0.post2",
                         "--config", str(tiny_config), "--find-links", str(standins["wheels"]), "--offline",
                         "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache")],
                        capture_output=True, text=True, env=e, timeout=300)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert [ln for ln in lines if ln.startswith(("2.6.3", "b "))] == ["2.6.3", "b  flash-attn 2.7.0.post2"]
    assert sum(ln.split() == ["method", "find-links"] for ln in lines) == 2


@pytest.mark.parametrize("extra,named", [
    (["--time-budget", "5"], "--time-budget"), (["--quick"], "--quick"), (["--device=cpu", "--max-sets", "2"], "--device, --max-sets"),
    (["--output", "o"], "--output"),
])
def test_plan_refuses_the_runs_timing_options(extra, named, tmp_path):
    cp = run_cli("plan", "--versions", "2.6.3", "--envs-dir", str(tmp_path / "envs"), "--offline", *extra)
    assert cp.returncode == 2, cp.stderr
    err = " ".join(cp.stderr.split())
    assert f"error: plan does not take {named}: " in err and "timing options change how `run` times the cases" in err
    if "--device" in named:  # says why plan has no --device
        assert (f"error: plan does not take {named}: it always plans for this machine's torch (its CUDA, or none), "
                "whatever --device says;") in err and "--device: --device" not in err  # it was doubled
    assert not (tmp_path / "envs").exists()
    cp = run_cli("plan", "--versions", "2.6.3", "--bogus")
    assert cp.returncode == 2 and "unrecognized arguments: --bogus" in cp.stderr


def test_plan_with_backend_here_describes_this_interpreter(tmp_path):
    """`plan --backend here` (a tox version env) says what run's preflight would find in this interpreter
    and builds nothing (new-user trial: it planned a uv slim build and failed on the CUDA archs)."""
    import sys
    cp = run_cli("plan", "--backend", "here", "--versions", "fa=2.6.3", "--envs-dir", str(tmp_path / "envs"))
    out = " ".join(cp.stdout.split())
    try:
        import flash_attn  # noqa: F401 - the test env's own (none in CI)
        has_fa = True
    except ImportError:
        has_fa = False
    if not has_fa:
        assert cp.returncode == 3, cp.stderr
        assert out == (f"fa: --backend here: this interpreter ({sys.executable}) is the env; nothing is built or installed; "
                       "import flash_attn failed: ModuleNotFoundError: No module named 'flash_attn': run would stop there"), out
        cp = run_cli("plan", "--backend", "here", "--versions", "fa=2.6.3", "--json")
        (item,) = json.loads(cp.stdout)
        assert (item["method"], item["status"], item["flash_attn_version"]) == ("here", "failed", None)
    assert not any((tmp_path / "envs").rglob("*"))  # nothing built there
    cp = run_cli("plan", "--backend", "here", "--versions", "2.6.3,2.7.0.post2")
    assert cp.returncode == 2 and "give exactly one --versions entry" in cp.stderr


def test_envs_and_wheelhouse_tables_become_blocks_when_narrow():
    from rich.console import Console

    from matrix_runner import ui
    rows = [["2.7.0.post2", "2.7.0.post2", "ok", "2.11.0+cu130", "3.12.3",
             "flash_attn-2.7.0.post2-cp312-cp312-linux_x86_64.whl", "2026-12-01T06:00:00+00:00", "912"]]
    cols = ["label", "requested", "status", "torch", "python", "wheel", "created", "MB"]
    narrow = Console(record=True, width=80, color_system=None)
    ui.table_or_blocks("envs in envs", cols, rows, narrow)
    lines = [ln.rstrip() for ln in narrow.export_text().splitlines()]
    assert max(map(len, lines)) <= 80
    assert lines == ["envs in envs", "2.7.0.post2", "  requested  2.7.0.post2", "  status     ok",
                     "  torch      2.11.0+cu130", "  python     3.12.3",
                     "  wheel      flash_attn-2.7.0.post2-cp312-cp312-linux_x86_64.whl",
                     "  created    2026-12-01T06:00:00+00:00", "  MB         912"]
    wide = Console(record=True, width=200, color_system=None)
    ui.table_or_blocks("envs in envs", cols, rows, wide)
    assert any(" ".join(ln.split()) == " ".join(r for r in rows[0]) for ln in wide.export_text().splitlines())


def test_gpu_sized_configs_warn_before_a_cpu_run():
    """New-user trial: `--config varlen --device cpu` sat 10 min in set-up without a word. The built-in
    GPU configs get a warning naming the largest call; the README's small CPU shapes do not."""
    from matrix_runner import pipeline
    from matrix_runner.config import load_config, parse_config
    w = pipeline.cpu_size_warning(load_config("varlen").cases)
    assert w and "GPU-sized" in w and "GFLOP" in w
    w = pipeline.cpu_size_warning(load_config("kvcache-decode").cases)
    assert w and "GB of KV cache per call" in w
    small = parse_config({"shapes": [{"batch": 2, "seqlen": 64, "nheads": 2, "embed_dim": 32}]})
    assert pipeline.cpu_size_warning(small.cases) is None


def test_a_second_run_into_an_output_in_use_is_refused_and_the_lock_goes_with_the_run(tmp_path):
    from filelock import FileLock
    out = tmp_path / "o"
    out.mkdir()
    lk = FileLock(str(out / ".matrix-run.lock"))
    lk.acquire()  # stands in for a run that is still timing into this directory
    try:
        cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--envs-dir", str(tmp_path / "envs"), "--output", str(out))
        assert cp.returncode == 2 and "is in use by another matrix-run that is still running" in " ".join(cp.stderr.split())
        assert "Traceback" not in cp.stderr
    finally:
        lk.release()
    # a run refused after taking the lock (an unwritable --markdown) leaves no lock file behind, and
    # the directory it created goes with it
    cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--markdown", str(tmp_path / "no-such-dir" / "x.md"),
                 "--envs-dir", str(tmp_path / "envs"), "--output", str(tmp_path / "p"))
    assert cp.returncode == 2 and "--markdown" in cp.stderr, cp.stderr
    assert not (tmp_path / "p").exists()


def test_compare_of_runs_without_a_common_case_says_so(tmp_path):
    import json
    from pathlib import Path

    from matrix_runner import results
    src = results.find(Path(__file__).resolve().parents[1] / "reports" / "h200-aa-4")  # archived: results.json.gz
    doc = json.loads(results.read_text(src))
    for c in doc["cases"]:
        c["id"] = "x" + c["id"]
    for c in doc["comparisons"]:
        c["case"] = "x" + c["case"]
    (tmp_path / "b.json").write_text(json.dumps(doc))
    cp = run_cli("compare", str(src), str(tmp_path / "b.json"))
    assert cp.returncode == 2, cp.stdout + cp.stderr
    assert "the two runs have no case in common (A: 12 case(s)" in " ".join(cp.stderr.split())
    assert "warning" not in cp.stderr  # (the same run_id) warnings only where there is a comparison (new-user trial)


def test_the_run_is_one_pipeline_of_the_named_steps_and_cli_only_parses_and_dispatches(monkeypatch):
    """Issue #14: the run has one owner (pipeline.Run) whose steps run in the order its module doc
    names; cli.py imports no stage module (it parses and dispatches)."""
    import ast
    import re
    import threading
    from pathlib import Path
    from types import SimpleNamespace

    from matrix_runner import cli, pipeline

    order = re.search(r"^\s+(settings ->.*)$", pipeline.__doc__, re.MULTILINE).group(1).split(" -> ")
    assert order == ["settings", "output", "device", "envs", "timing", "explain", "write", "exit_code"]
    seen = []
    for step in order:
        monkeypatch.setattr(pipeline.Run, step, lambda self, _s=step: seen.append(_s) or 0)
    monkeypatch.setattr(pipeline.shard, "submitted", lambda args: False)
    r = pipeline.Run(SimpleNamespace(), [], threading.Event(), None)
    r.device_kind = "cuda"
    assert r.execute() == 0 and seen == order
    imported = {a.name for n in ast.walk(ast.parse(Path(cli.__file__).read_text()))
                if isinstance(n, ast.ImportFrom) and n.level == 1 and not n.module for a in n.names}
    assert imported <= {"__version__", "commands", "pipeline", "shard", "wheels"}, imported


def test_ctrl_c_while_the_cli_loads_is_one_line_and_exit_130(monkeypatch, capsys):
    """The console script (matrix_runner.entry) imports the CLI inside a KeyboardInterrupt guard: a
    Ctrl-C in the ~1-2 s of numpy/scipy/rich imports printed an import traceback (new-user trial,
    ``timeout -s INT 2 matrix-run ...``); the CLI itself turns one before a run's own handlers exist
    into exit 130 too."""
    import sys
    import types

    from matrix_runner import cli, entry
    fake = types.ModuleType("matrix_runner.cli")

    def interrupted(name):
        raise KeyboardInterrupt
    fake.__getattr__ = interrupted
    monkeypatch.setitem(sys.modules, "matrix_runner.cli", fake)
    assert entry.main(["--help"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted while starting: nothing was run"
    monkeypatch.setitem(sys.modules, "matrix_runner.cli", cli)

    def parse_interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli.commands, "cmd_plan", parse_interrupted)
    assert cli.main(["plan", "--versions", "2.6.3"]) == 130
    assert "interrupted: nothing was measured yet" in capsys.readouterr().err


def test_run_takes_o_for_its_output_like_report_and_compare():
    from matrix_runner import cli
    assert cli.build_parser().parse_args(["run", "-o", "X", "--versions", "2.6.3"]).output == "X"


def test_report_on_a_directory_says_which_runs_it_merges(tmp_path):
    """`report DIR` merges every run found below DIR (one per tox env); it did so silently, so
    `report reports/` gave a report of every archived run without a word. It now names them."""
    import shutil
    from pathlib import Path
    reports = Path(__file__).resolve().parents[1] / "reports"
    runs = tmp_path / "runs"
    for name in ("h200-aa-59", "h200-aa-60"):
        shutil.copytree(reports / name, runs / "tox" / name)
    cp = run_cli("report", str(runs), "-o", str(tmp_path / "merged"))
    assert cp.returncode == 0, cp.stderr
    said = " ".join((cp.stdout + cp.stderr).split())
    assert f"{runs}: merging the 2 runs found below it into one report: tox/h200-aa-59, tox/h200-aa-60 " in said, said
    # a merged report below it (an earlier `tox -e report` into reports/tox/html) is not a run: its envs
    # came back as copies of themselves (2.6.3' vs 2.6.3, "same 1.00x")
    cp = run_cli("report", str(runs), "-o", str(runs / "tox" / "html2"))
    assert cp.returncode == 0, cp.stderr
    said = " ".join((cp.stdout + cp.stderr).split())
    assert "merging the 2 runs found below it into one report: tox/h200-aa-59, tox/h200-aa-60 " in said, said
    # one run given twice (a directory and a file in it, or a merged report with one of its runs) is
    # refused: it came out as an A/A of identical data ("2.6.3' vs 2.6.3": new-user trial)
    for twice in ([str(runs / "tox" / "h200-aa-59"), str(runs / "tox" / "h200-aa-59" / "results.json.gz")],
                  [str(runs / "tox" / "html2"), str(runs / "tox" / "h200-aa-60")]):
        cp = run_cli("report", *twice, "-o", str(tmp_path / "twice"))
        assert cp.returncode == 2 and "would be merged twice" in " ".join(cp.stderr.split()), cp.stderr
        assert not (tmp_path / "twice").exists()
    # one run below the directory: reported alone, nothing to announce
    shutil.rmtree(runs / "tox" / "h200-aa-60")
    cp = run_cli("report", str(runs), "-o", str(tmp_path / "one"))
    assert cp.returncode == 0, cp.stderr
    assert "merging" not in cp.stdout + cp.stderr


def test_a_run_that_timed_nothing_is_left_out_of_a_merge_and_named(tmp_path):
    """`tox -e report` over version envs one of which failed (its flash-attn did not import): the runs
    that timed something are merged, the empty one is named with its env's error (new-user trial: the
    merge stopped on "no case in common with ... merge runs of one config")."""
    import gzip
    import shutil
    from pathlib import Path

    from matrix_runner import results
    reports = Path(__file__).resolve().parents[1] / "reports"
    empty = json.loads(gzip.decompress((reports / "h200-aa-81" / "results.json.gz").read_bytes()))
    empty.update(run_id="20261206-000000-fa-x", cases=[], sets=[], comparisons=[])
    empty["envs"] = [{**empty["envs"][0], "label": "fa-x", "status": "failed",
                      "error": "preflight: this interpreter imports flash_attn 2.6.3, not the requested 2.7.0.post2\nmore"}]
    results.write_json(tmp_path / "tox" / "fa-x" / "results.json", empty)
    for n in (81, 82):
        shutil.copytree(reports / f"h200-aa-{n}", tmp_path / "tox" / f"aa-{n}")
    cp = run_cli("report", str(tmp_path / "tox"), "-o", str(tmp_path / "html"))
    assert cp.returncode == 0, cp.stderr
    err = " ".join(cp.stderr.split())
    assert (f"warning: {tmp_path / 'tox' / 'fa-x' / 'results.json'} timed nothing (fa-x: failed (preflight: this "
            "interpreter imports flash_attn 2.6.3, not the requested 2.7.0.post2)): left out of the merged report") in err, err
    merged = results.load(tmp_path / "html")
    assert merged["merged_from"] == [results.load(reports / f"h200-aa-{n}")["run_id"] for n in (81, 82)]
    assert any("timed nothing" in w for w in merged["merge_warnings"])
    assert "timed nothing" in (tmp_path / "html" / "index.html").read_text()


def test_report_of_named_runs_names_them_and_warns_when_their_machines_differ(tmp_path):
    """`report RUN RUN` merged silently, even a CPU run with an H200 run or two H200 runs whose CPU
    speed probes read 3.74 and 6.42 µs (new-user trial 2026-12-04); it now names the runs (stderr) and
    warns as `compare` does (commands.machine_differences), and the merge still succeeds (exit 0)."""
    import gzip
    from pathlib import Path

    from matrix_runner import results
    reports = Path(__file__).resolve().parents[1] / "reports"
    fast, slow = (reports / f"h200-2.6.3-vs-2.7.0.post2-12-04-{n}" for n in (16, 17))
    cp = run_cli("report", str(fast), str(slow), "-o", str(tmp_path / "merged"))
    assert cp.returncode == 0, cp.stderr
    err = " ".join(cp.stderr.split())
    assert ("merging 2 runs into one report: h200-2.6.3-vs-2.7.0.post2-12-04-16, "
            "h200-2.6.3-vs-2.7.0.post2-12-04-17") in err, err
    assert ("warning: h200-2.6.3-vs-2.7.0.post2-12-04-16 (A) and h200-2.6.3-vs-2.7.0.post2-12-04-17 (B): the CPU "
            "ran at another speed: the speed probe (the same Python work in every worker) read a median of 3.74 µs "
            "in A and 6.42 µs in B (72% apart)") in err, err
    assert err.count("warning:") == 1 and "the merged report pools them" in err
    # and the merged report's HTML and Markdown carry it (new-user trial: stderr only)
    page = (tmp_path / "merged" / "index.html").read_text()
    assert "<b>Warning:</b> h200-2.6.3-vs-2.7.0.post2-12-04-16 (A) and h200-2.6.3-vs-2.7.0.post2-12-04-17 (B): the CPU " \
           "ran at another speed" in page and "this report pools them" in page
    assert len(results.load(tmp_path / "merged")["merge_warnings"]) == 1
    cp = run_cli("report", str(tmp_path / "merged"), "-o", str(tmp_path / "again"), "--markdown", str(tmp_path / "m.md"))
    assert cp.returncode == 0, cp.stderr
    assert "**Warning:** h200-2.6.3-vs-2.7.0.post2-12-04-16 (A) and" in (tmp_path / "m.md").read_text()
    out = " ".join(cp.stdout.split())  # both runs hold 2.6.3 and 2.7.0.post2: the second's are renamed
    cp = run_cli("report", str(fast), str(slow), "-o", str(tmp_path / "merged2"))
    assert ("merged runs: ratio between runs (an env from another run than the baseline's): the ratio of the two "
            "runs' medians of per-set medians, not paired" in out and "(a label marked ' was renamed: the same "
            "label in two runs)" in out and "ratio within a run: paired cycle by cycle" in out), cp.stdout
    assert results.load(tmp_path / "merged")["merged_from"] == [results.load(r)["run_id"] for r in (fast, slow)]
    # a merge is not a run: --resume refuses it and names its runs (new-user trial: it was resumed, its two
    # runs' sets under repeated ids, merged_from lost, after "nothing to resume" had suggested --time-budget)
    for extra in ([], ["--time-budget", "90"]):
        cp = run_cli("--resume", str(tmp_path / "merged"), *extra)
        assert cp.returncode == 2 and " ".join(cp.stderr.split()).endswith(
            "that is a merged report of 2 runs (run ids 20261204-035746-2.6.3-vs-2.7.0.post2, "
            "20261204-035851-2.6.3-vs-2.7.0.post2), not a run; resume one of those runs (its own --output folder), then merge again with matrix-run report "
            "RUN RUN -o DIR"), cp.stderr
    assert results.load(tmp_path / "merged")["merged_from"] == [results.load(r)["run_id"] for r in (fast, slow)]
    # runs of one CPU state: named, no warning
    cp = run_cli("report", str(reports / "h200-aa-81"), str(reports / "h200-aa-82"), "-o", str(tmp_path / "same"))
    assert cp.returncode == 0 and "merging 2 runs into one report: h200-aa-81, h200-aa-82" in " ".join(
        cp.stderr.split()), cp.stderr
    assert "warning" not in cp.stderr, cp.stderr
    # a run on the CPU merged with one on the H200: another device (aa-81's probe reads as aa-82's)
    doc = json.loads(gzip.decompress((reports / "h200-aa-81" / "results.json.gz").read_bytes()))
    doc["settings"]["device"], doc["machine"]["gpu"] = "cpu", None
    results.write_json(tmp_path / "cpu-run" / "results.json", doc)
    cp = run_cli("report", str(reports / "h200-aa-82"), str(tmp_path / "cpu-run"), "-o", str(tmp_path / "mixed"))
    assert cp.returncode == 0, cp.stderr
    err = " ".join(cp.stderr.split())
    assert "merging 2 runs into one report: h200-aa-82, cpu-run" in err, err
    assert ("warning: h200-aa-82 (A) and cpu-run (B): A ran on cuda, B on cpu; the merged report pools them"
            in err and err.count("warning:") == 1), err
    # a DIR with more runs named beside it: the DIR's note names its own, the merge note every run
    runs = tmp_path / "runs"
    for name in ("h200-aa-59", "h200-aa-60"):
        (runs / name).mkdir(parents=True)
        (runs / name / "results.json.gz").write_bytes((reports / name / "results.json.gz").read_bytes())
    cp = run_cli("report", str(runs), str(reports / "h200-aa-81"), "-o", str(tmp_path / "dir-and-run"))
    assert cp.returncode == 0, cp.stderr
    assert "merging 3 runs into one report: h200-aa-59, h200-aa-60, h200-aa-81" in " ".join(cp.stderr.split())


def test_a_hand_damaged_results_file_is_a_usage_error_not_an_internal_one(tmp_path):
    """A schema-valid results.json without `envs` gave `internal error: StopIteration`, and a ratio "x"
    a TypeError, exit 3 (new-user trial 2026-12-04): each is now named, exit 2, and nothing is written."""
    import gzip
    from pathlib import Path

    from matrix_runner import results
    doc = json.loads(gzip.decompress((Path(__file__).resolve().parents[1] / "reports" / "h200-aa-82" /
                                      "results.json.gz").read_bytes()))
    cases = {"no-envs": lambda d: d.pop("envs"), "ratio-x": lambda d: d["comparisons"][0].update(ratio="x"),
             "env-label": lambda d: d["envs"][1].pop("label"), "sets-dict": lambda d: d.update(sets={}),
             "no-cases": lambda d: d.pop("cases"), "case-str": lambda d: d["cases"].__setitem__(3, "x"),
             "case-id": lambda d: d["cases"][0].update(id=7), "env-status": lambda d: d["envs"][0].pop("status"),
             "comparison-list": lambda d: d["comparisons"].__setitem__(2, []),
             "settings-str": lambda d: d.update(settings="cuda")}
    said = {}
    for name, damage in cases.items():
        d = json.loads(json.dumps(doc))
        damage(d)
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.json").write_text(json.dumps(d))
        with pytest.raises(results.ResultsError) as ei:
            results.load(tmp_path / name)
        assert str(ei.value).startswith(f"{tmp_path / name / 'results.json'}: ")
        said[name] = str(ei.value).split(": ", 1)[1]
    assert said == {"no-envs": "envs is missing: every run records its envs; restore the file from its run",
                    "ratio-x": "comparisons[0].ratio is 'x', not a number: restore the file from its run",
                    "env-label": "envs[1].label is missing: restore the file from its run",
                    "sets-dict": "sets is dict, not a list: restore the file from its run",
                    "no-cases": "cases is missing: every run records its cases; restore the file from its run",
                    "case-str": "cases[3] is str, not an object: restore the file from its run",
                    "case-id": "cases[0].id is int, not a string: restore the file from its run",
                    "env-status": "envs[0].status is missing: restore the file from its run",
                    "comparison-list": "comparisons[2] is list, not an object: restore the file from its run",
                    "settings-str": "settings is str, not an object: restore the file from its run"}
    for cmd in (["report", str(tmp_path / "no-envs"), "-o", str(tmp_path / "out")],
                ["report", str(tmp_path / "ratio-x"), "-o", str(tmp_path / "out")],
                ["compare", str(tmp_path / "no-cases"), str(tmp_path / "case-id")]):
        cp = run_cli(*cmd)
        assert cp.returncode == 2, cp.stderr
        assert cp.stderr.startswith(f"error: {cmd[1]}/results.json: ") and "Traceback" not in cp.stderr, cp.stderr
    assert not (tmp_path / "out").exists()


def test_an_internal_error_has_its_own_exit_code(monkeypatch, capsys):
    """A bug of ours exited 3, which --help gives to a failed env or case: CI could not tell them apart."""
    from matrix_runner import cli, errors

    def boom(args):
        raise RuntimeError("a bug")
    monkeypatch.setattr(cli.commands, "cmd_plan", boom)
    assert cli.main(["plan", "--versions", "2.6.3"]) == errors.EXIT_INTERNAL == 4
    err = capsys.readouterr().err
    assert err.startswith("internal error: RuntimeError: a bug (please report; traceback follows)")
    assert "4 internal error" in cli.EXIT_HELP


def test_fail_on_regression_with_one_env_is_refused_before_anything_runs(tmp_path):
    """One version, --fail-on-regression: nothing compared, yet the gate printed "passed" and exited 0
    (new-user trial 2026-12-04). Now exit 2 before anything is built or timed, saying why and what to do."""
    cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--fail-on-regression", "5", "--offline",
                 "-o", str(tmp_path / "o"), "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "c"))
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.strip() == ("error: --fail-on-regression with one env (2.6.3): nothing is compared, so the gate "
                                 "could never fail; give two or more --versions (e.g. 2.6.3,2.7.0.post2), or drop "
                                 "--fail-on-regression"), cp.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "c").exists() and not any((tmp_path / "envs").iterdir())
    # --backend here always times one env: the advice is another backend, not more --versions
    cp = run_cli("--versions", "x=2.6.3", "--backend", "here", "--fail-on-regression", "5", "-o", str(tmp_path / "o"),
                 "--envs-dir", str(tmp_path / "envs"))
    assert cp.returncode == 2, cp.stderr
    assert ("--fail-on-regression with one env (x): nothing is compared, so the gate could never fail; --backend here "
            "times one env: use --backend uv with two or more --versions, or drop --fail-on-regression"
            ) in " ".join(cp.stderr.split()), cp.stderr
    assert not (tmp_path / "o").exists()


def test_version_and_envs_dir_errors_name_the_real_problem(tmp_path):
    from matrix_runner import envs
    with pytest.raises(envs.UsageError, match=r"'=2.6.3' has an empty label before '='; write LABEL=VERSION \(e.g. "
                                              r"a=2.6.3\) or the version alone \(2.6.3\)"):
        envs.parse_versions("=2.6.3,b=2.7.0.post2")
    with pytest.raises(envs.UsageError, match=">=2.6' is a version specifier"):
        envs.parse_versions(">=2.6")
    afile = tmp_path / "afile"
    afile.write_text("x")
    cp = run_cli("plan", "--versions", "2.6.3", "--envs-dir", str(afile))
    assert cp.returncode == 2 and f"--envs-dir {afile}: is a file, not a directory" in cp.stderr, cp.stderr


def test_one_version_says_at_the_start_that_there_is_nothing_to_compare(tmp_path):
    """New-user trial: a typo'd --versions (one entry) ran a whole run with nothing to compare and said
    so only in the report. Now the banner says it, before anything is built."""
    (tmp_path / "fl").mkdir()
    cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--offline", "--find-links", str(tmp_path / "fl"),
                 "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "c"), "-o", str(tmp_path / "o"))
    out = " ".join(cp.stderr.split())
    assert ("note: one env (2.6.3): nothing to compare; its own times (µs, TFLOP/s) are taken to the "
            "time budget, with no verdict; to compare, give two or more, comma-separated (e.g. --versions "
            "2.6.3,2.7.0.post2)") in out, cp.stderr
    assert out.index("nothing to compare") < out.index("Plan:")  # before anything is built
    cp = run_cli("--versions", "a=2.6.3,b=2.6.3", "--device", "cpu", "--offline", "--find-links", str(tmp_path / "fl"),
                 "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "c"), "-o", str(tmp_path / "o2"))
    assert "nothing to compare" not in cp.stderr, cp.stderr
    # a failed env is named again at the end, after the time line (new-user trial: only mid-log)
    tail = " ".join(cp.stderr.split("time: envs")[-1].split())
    assert "env a failed: no wheel for key" in tail and "env b failed: no wheel for key" in tail, cp.stderr
    assert cp.returncode == 3
    # its first line only; an env with no error text on record says so, not "failed: failed"
    from matrix_runner.pipeline import failed_env_line
    assert failed_env_line("a", "failed", "uv pip install: exit 1\nlong log") == "env a failed: uv pip install: exit 1"
    assert failed_env_line("a", "failed", None) == failed_env_line("a", None, "  ") == \
        "env a failed (no error text on record; see the log above)"


def test_publish_of_one_runs_folder_and_resume_of_a_missing_one_say_what_to_give(tmp_path):
    """Second new-user trial of 2026-12-05 night: `publish reports/RUN` said "no run found under" a
    run's own folder and wrote an empty site (exit 3); `--resume /nonexistent` named no option."""
    run = REPO / "reports" / "h200-aa-89"
    cp = run_cli("publish", str(run), "-o", str(tmp_path / "site"))
    assert cp.returncode == 2, cp.stderr
    assert " ".join(cp.stderr.split()) == (
        f"error: {run}: is one run's folder (it holds results.json.gz); publish takes the folder that holds runs: "
        f"give {run.parent} (or `matrix-run report {run} -o DIR` for this run's report alone)")
    assert not (tmp_path / "site").exists()
    cp = run_cli("publish", str(run / "results.json.gz"), "-o", str(tmp_path / "site"))
    assert cp.returncode == 2 and f"{run / 'results.json.gz'}: is one run's results; publish takes the folder that " \
        f"holds runs: give {run.parent}" in " ".join(cp.stderr.split()), cp.stderr
    cp = run_cli("--resume", str(tmp_path / "a"), "--resume", str(tmp_path / "b"))  # third new-user trial
    assert cp.returncode == 2 and cp.stderr.strip() == "error: --resume: given 2 times; give one run's folder"
    cp = run_cli("--resume", str(tmp_path / "nowhere"))
    assert cp.returncode == 2 and f"--resume {tmp_path / 'nowhere'}: no such directory; give the folder of the " \
        "interrupted run (its --output)" in " ".join(cp.stderr.split()), cp.stderr
