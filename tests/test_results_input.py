"""results.load on hand-edited or mistaken input: a clear error (exit 2) naming the file, the field and
what to do, never an internal error (exit 4) from report, compare, publish or --resume (new-user trial
2026-12-05: envs [] gave StopIteration, settings.min_effect "5%" a TypeError, a ratio of -1.0 went into
the report, config "hello" was blamed on the YAML file, an empty file or an index.html said only
"Expecting value: line 1 column 1 (char 0)")."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import run_cli

from matrix_runner import results

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "reports" / "h200-aa-68"  # a committed run (archived: results.json.gz, index.html.gz)


@pytest.fixture(scope="module")
def doc() -> dict:
    return json.loads(results.read_text(SRC))


def _write(tmp_path: Path, name: str, d) -> Path:
    """``d`` as RUN/results.json under tmp_path (plain: as a user edits it); returns the file."""
    run = tmp_path / name
    run.mkdir(parents=True, exist_ok=True)
    p = run / "results.json"
    p.write_text(d if isinstance(d, str) else json.dumps(d))
    return p


def _edited(doc: dict, edit) -> dict:
    d = json.loads(json.dumps(doc))
    edit(d)
    return d


def _first_cycle(d: dict, key: str = "by_set") -> tuple[dict, str]:
    """The first cycle of the first case's wall_us ``key`` (a dict of cycle id -> value) and its id."""
    cycles = next(iter(d["cases"][0]["metrics"]["wall_us"][key].values()))
    return cycles, next(iter(cycles))


def test_every_committed_run_and_the_fixture_still_load():
    """The checks below refuse nothing a run wrote: every committed run (a quick run's comparisons have
    ci_low 0.0 and ci_high null: unbounded) and the first-run fixture load."""
    runs = sorted(d for d in (ROOT / "reports").iterdir() if d.is_dir() and results.find(d).is_file())
    assert len(runs) > 100
    for f in [*runs, ROOT / "tests" / "fixtures" / "h200-first-run-results.json"]:
        d = results.load(f)
        assert d["envs"] and d["cases"], f


def _set_min_effect(v):
    return lambda d: d["settings"].update(min_effect=v)


DAMAGE = {
    # envs: a case of no env had the report fail with StopIteration (view_model)
    "envs-empty": (lambda d: d.update(envs=[]),
                   "envs is empty, but cases holds 24 case record(s) (cases[0].env is 'a'): every run records the "
                   "envs its cases ran in; restore the file from its run"),
    "case-env": (lambda d: d["cases"][5].update(env="zz"),
                 "cases[5].env is 'zz', not the label of any of envs ('a', 'b'): restore the file from its run"),
    "env-label-null": (lambda d: d["envs"][0].update(label=None),
                       "envs[0].label is missing: restore the file from its run"),
    # settings the report and compare read as numbers
    "min-effect-str": (_set_min_effect("5%"),
                       "settings.min_effect is '5%', not a positive number (the smallest change a verdict calls "
                       "faster or slower, as a fraction: 0.05 = 5%): fix that value in the file or restore the "
                       "file from its run"),
    "min-effect-neg": (_set_min_effect(-0.05), "settings.min_effect is -0.05, not a positive number"),
    "min-effect-zero": (_set_min_effect(0), "settings.min_effect is 0, not a positive number"),
    "min-effect-bool": (_set_min_effect(True), "settings.min_effect is True, not a positive number"),
    "min-effect-list": (_set_min_effect([0.05]), "settings.min_effect is a list, not a positive number"),
    "alpha-str": (lambda d: d["settings"].update(alpha="x"),
                  "settings.alpha is 'x', not a number between 0 and 1 (the intervals' error rate: 0.05 = 95 % "
                  "intervals): fix that value in the file or restore the file from its run"),
    "alpha-big": (lambda d: d["settings"].update(alpha=5), "settings.alpha is 5, not a number between 0 and 1"),
    "planned-sets": (lambda d: d["settings"].update(planned_sets=2.5),
                     "settings.planned_sets is 2.5, not a positive whole number"),
    # a comparison's ratio, interval and medians in range
    "ratio-neg": (lambda d: d["comparisons"][0].update(ratio=-1.0),
                  "comparisons[0].ratio is -1.0: a ratio (candidate / baseline time) is a number above 0; restore "
                  "the file from its run"),
    "ratio-zero": (lambda d: d["comparisons"][3].update(ratio=0),
                   "comparisons[3].ratio is 0: a ratio (candidate / baseline time) is a number above 0"),
    "ci-low-neg": (lambda d: d["comparisons"][1].update(ci_low=-0.5),
                   "comparisons[1].ci_low is -0.5: an interval's low end is a ratio, 0 or more (0: unbounded "
                   "below); restore the file from its run"),
    "ci-high-zero": (lambda d: d["comparisons"][1].update(ci_high=0.0),
                     "comparisons[1].ci_high is 0.0: an interval's high end is a ratio above 0 (null: unbounded "
                     "above); restore the file from its run"),
    "ci-inverted": (lambda d: d["comparisons"][2].update(ci_low=1.2, ci_high=1.1),
                    "comparisons[2].ci_low 1.2 is above its ci_high 1.1: restore the file from its run"),
    "median-neg": (lambda d: d["comparisons"][0].update(base_median=-3.0),
                   "comparisons[0].base_median is -3.0: a median time (µs) is a number, 0 or more; restore the "
                   "file from its run"),
    "candidate-missing": (lambda d: d["comparisons"][4].pop("candidate"),
                          "comparisons[4].candidate is missing: restore the file from its run"),
    # a case's measured µs (summaries, samples, sets' cycles) are never negative
    "case-median-neg": (lambda d: d["cases"][0]["metrics"]["wall_us"].update(median=-1.0),
                        "cases[0].metrics.wall_us.median is -1.0: a time (µs) or a count is never negative: "
                        "restore it or set it to null (a missing sample)"),
    "sample-neg": (lambda d: d["cases"][2]["metrics"]["host_us"]["samples"][0].__setitem__(1, -5.0),
                   "cases[2].metrics.host_us.samples[0][1] is -5.0: a time (µs) or a count is never negative"),
    "cycle-neg": (lambda d: (lambda cy, k: cy.__setitem__(k, -1))(*_first_cycle(d)),
                  'cases[0].metrics.wall_us.by_set["0"]["1"] is -1: a time (µs) or a count is never negative'),
    # the stored config (--resume parses it): not blamed on the YAML file it came from
    "config-str": (lambda d: d.update(config="hello"),
                   "config is str ('hello'), not an object: it holds the run's config as read from its YAML file "
                   "(a --resume takes the cases and sampling rules from it); restore the file from its run"),
    "config-list": (lambda d: d.update(config=[1, 2]), "config is list, not an object: it holds the run's config"),
    # a decided verdict without the interval end it rests on (it showed "slower 3.71x (unbounded ...)")
    "decided-no-interval": (lambda d: d["comparisons"][0].update(ci_low=None, verdict="same"),
                            "comparisons[0].ci_low is null, but its verdict 'same' rests on it: restore the file "
                            "from its run"),
    # a verdict its numbers contradict (it rendered "faster 3.71x [3.67, 3.75]", "slower 0.50x [...]")
    "faster-above-1": (lambda d: d["comparisons"][0].update(verdict="faster", ratio=3.71, ci_low=3.67, ci_high=3.75),
                       "comparisons[0] says 'faster' with ratio 3.71 and ci_high 3.75: faster means a ratio and "
                       "ci_high below 1; restore the file from its run"),
    "slower-below-1": (lambda d: d["comparisons"][0].update(verdict="slower", ratio=0.5, ci_low=0.45, ci_high=0.55),
                       "comparisons[0] says 'slower' with ratio 0.5 and ci_low 0.45: slower means a ratio and "
                       "ci_low above 1"),
    "slower-interval-reaches-1": (lambda d: d["comparisons"][0].update(verdict="slower", ratio=1.2, ci_low=0.9,
                                                                       ci_high=1.5),
                                  "comparisons[0] says 'slower' with ratio 1.2 and ci_low 0.9"),
    # second trial: an unknown verdict (KeyError in report), "same" far from 1, a ratio outside its interval
    "verdict-unknown": (lambda d: d["comparisons"][0].update(verdict="much slower"),
                        "comparisons[0].verdict is 'much slower': a verdict is one of faster, slower, same, "
                        "ambiguous, provisional; restore the file from its run"),
    "same-far-from-1": (lambda d: d["comparisons"][0].update(verdict="same", ratio=3.74, ci_low=3.64, ci_high=3.84),
                        "comparisons[0] says 'same' with interval [3.64, 3.84]: same means the whole interval "
                        "within [0.9524, 1.05] (min_effect 0.05)"),
    "same-wide": (lambda d: d["comparisons"][0].update(verdict="same", ratio=1.0, ci_low=0.5, ci_high=2.0),
                  "comparisons[0] says 'same' with interval [0.5, 2.0]"),
    "ratio-outside": (lambda d: d["comparisons"][0].update(ratio=5.0, ci_low=3.64, ci_high=3.84, verdict="slower"),
                      "comparisons[0].ratio 5.0 lies outside its own interval [3.64, 3.84]"),
}


@pytest.mark.parametrize("name", list(DAMAGE))
def test_a_hand_edited_field_is_named_with_what_to_do(tmp_path, doc, name):
    edit, said = DAMAGE[name]
    p = _write(tmp_path, name, _edited(doc, edit))
    with pytest.raises(results.ResultsError) as ei:
        results.load(p.parent)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: "), msg
    assert said in msg, msg


@pytest.mark.parametrize("edit", [
    lambda d: d["settings"].pop("min_effect"),  # missing or null: the readers' default (0.05)
    lambda d: d["settings"].update(min_effect=None, alpha=None, planned_sets=None),
    lambda d: d["settings"].update(min_effect=1.5),  # a --resume names the bound (pipeline), the report shows it
    lambda d: d.pop("config"),
    lambda d: d["comparisons"][0].update(ci_low=0.0, ci_high=None, ratio=1.1, verdict="ambiguous"),  # unbounded
    lambda d: d["comparisons"][0].update(ratio=None, ci_low=None, ci_high=None, base_median=None,
                                         verdict="provisional"),  # nothing yet
    lambda d: d.update(envs=[], cases=[], comparisons=[]),  # nothing measured: nothing to show either
    lambda d: d["cases"][0]["metrics"]["wall_us"]["speed_by_set"]["0"].update(beta=-0.2, center=-1.5),  # signed
])
def test_what_a_run_can_hold_still_loads(tmp_path, doc, edit):
    p = _write(tmp_path, "ok", _edited(doc, edit))
    assert results.load(p)["schema"] in results.READABLE


def test_not_a_results_file_is_said_for_what_it_is(tmp_path, doc):
    """Empty, HTML (the run's index.html given by mistake), cut short, broken by an edit, gzip under a
    plain name, binary, a JSON list, a damaged archive: each said so, with what to give instead."""
    text = json.dumps(doc)
    html = gzip.decompress((SRC / "index.html.gz").read_bytes())
    cases = {
        "results.json": ("", "is empty: the run was interrupted before it wrote results, or give the run's "
                             "results.json"),
        "blank/results.json": ("\n  \n", "is empty: the run was interrupted before it wrote results"),
        "index.html": (html.decode(), "is HTML, not results.json (a run's index.html is its report, rendered from "
                                      "its results.json): give the run's results.json or its directory"),
        "cut/results.json": (text[:50000], "is truncated: its JSON stops at line 1 column 50001 before the record "
                                           "is complete (a partial copy?): restore it from its run, or run that "
                                           "run again"),
        "cut-string/results.json": (text[:text.index('"envs"') + 3], "is truncated: its JSON stops at line 1"),
        "edit/results.json": (text.replace('"schema"', "schema", 1),
                              "is not valid JSON at line 1 column 2 (Expecting property name enclosed in double "
                              "quotes; a hand edit?): restore it from its run"),
        "gz/results.json": (gzip.compress(text.encode()), "is gzip-compressed, but its name does not end in .gz: "
                                                          "name it results.json.gz"),
        "bin/results.json": (b"\x89PNG\r\n\x1a\n\xff\xfe", "is not a text file (not UTF-8), so not a run's "
                                                           "results.json: give the run's results.json or its directory"),
        "list/results.json": ("[1, 2]", f"holds a JSON list, not a run's results (an object with \"schema\": "
                                        f"\"{results.SCHEMA}\"): give the run's results.json or its directory"),
    }
    damaged = bytearray(gzip.compress(text.encode()))
    for i in range(2000, 2400):
        damaged[i] ^= 0x55
    cases["bad-gz/results.json.gz"] = (bytes(damaged), "the compressed file is damaged (")
    for rel, (content, said) in cases.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
        with pytest.raises(results.ResultsError) as ei:
            results.load(p)
        assert str(ei.value).startswith(f"{p}: {said}"), (rel, str(ei.value))


def _cli_error(cp, path: Path, *said: str) -> str:
    err = " ".join(cp.stderr.split())
    assert cp.returncode == 2, cp.stderr
    assert "Traceback" not in err and "internal error" not in err, err
    assert err.startswith(f"error: {path}: "), err
    for s in said:
        assert s in err, err
    return err


def test_report_compare_and_publish_say_the_field_and_exit_2(tmp_path, doc):
    """End to end, as the trial ran them: report of envs [] (StopIteration), report and compare of a
    min_effect "5%" (TypeError), a ratio of -1.0 (a chart warning only), an empty results.json and an
    index.html; publish --rerender skips such a run with the same words (not "TypeError: ...")."""
    good = _write(tmp_path, "good", doc)
    no_envs = _write(tmp_path, "no-envs", _edited(doc, lambda d: d.update(envs=[])))
    pct = _write(tmp_path, "pct", _edited(doc, _set_min_effect("5%")))
    neg = _write(tmp_path, "neg", _edited(doc, lambda d: d["comparisons"][0].update(ratio=-1.0)))
    empty = _write(tmp_path, "empty", "")
    html = tmp_path / "html" / "index.html"
    html.parent.mkdir()
    html.write_bytes(gzip.decompress((SRC / "index.html.gz").read_bytes()))

    _cli_error(run_cli("report", str(no_envs.parent), "-o", str(tmp_path / "out")), no_envs,
               "envs is empty, but cases holds 24 case record(s)")
    _cli_error(run_cli("report", str(pct.parent), "-o", str(tmp_path / "out")), pct,
               "settings.min_effect is '5%', not a positive number", "0.05 = 5%")
    _cli_error(run_cli("compare", str(pct), str(good)), pct, "settings.min_effect is '5%'")
    _cli_error(run_cli("compare", str(good), str(neg.parent)), neg, "comparisons[0].ratio is -1.0")
    _cli_error(run_cli("report", str(empty), "-o", str(tmp_path / "out")), empty, "is empty")
    _cli_error(run_cli("compare", str(good), str(html)), html, "is HTML, not results.json")
    assert not (tmp_path / "out").exists()  # refused before anything was written

    reports = tmp_path / "reports"
    for p in (good, pct, no_envs):
        (reports / p.parent.name).mkdir(parents=True)
        (reports / p.parent.name / "results.json").write_bytes(p.read_bytes())
    cp = run_cli("publish", str(reports), "-o", str(tmp_path / "site"), "--rerender")
    err = " ".join(cp.stderr.split())
    assert cp.returncode == 0 and "Traceback" not in err, cp.stderr
    assert f"skipped {reports / 'pct'}: {reports / 'pct' / 'results.json'}: settings.min_effect is '5%'" in err, err
    assert f"skipped {reports / 'no-envs'}: {reports / 'no-envs' / 'results.json'}: envs is empty" in err, err
    assert "TypeError" not in err and "StopIteration" not in err, err
    assert (tmp_path / "site" / "good" / "index.html").is_file()


def test_resume_names_results_json_config_not_the_yaml_file(tmp_path, doc):
    """--resume of a results.json whose config is "hello" had said "<the run's YAML>: the top level must be
    a mapping"; the value is results.json's, so results.json and its config field are named."""
    def edit(d):
        d.update(config="hello")
        d["timing"]["stop_reason"] = "interrupted"  # a run --resume takes
        d["settings"]["cwd"] = str(tmp_path)
        d["command"] = ["matrix-run", "--versions", "a=2.6.3,b=2.6.3", "--offline", "--envs-dir",
                        str(tmp_path / "envs"), "--output", str(tmp_path / "run")]
    p = _write(tmp_path, "run", _edited(doc, edit))
    err = _cli_error(run_cli("--resume", str(p.parent)), p, "config is str ('hello'), not an object")
    assert ".yaml" not in err, err
    assert not (tmp_path / "envs").exists()  # refused before anything was built
