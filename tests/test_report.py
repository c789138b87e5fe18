"""The report, rendered from saved results: the committed H200 run (reports/h200-2.6.3-vs-2.7.0.post2)
and small synthetic results for the edge cases (failed env, failed case, CPU only, one env, hostile
strings). Asserts the numbers and verdicts shown, that nothing is fetched from the network, that
user strings are escaped; plus `matrix-run compare` and `matrix-run publish`."""
from __future__ import annotations

import copy
import json
import math
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from matrix_runner import report, results, stats

ROOT = Path(__file__).resolve().parents[1]
H200_DIR = ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2"  # the committed run (publish tests)
#: A frozen H200 results file (the first real run, 2026-11-30) whose numbers the assertions below quote.
H200 = ROOT / "tests" / "fixtures" / "h200-first-run-results.json"
XSS = "<script>alert(1)</script>"


# --------------------------------------------------------------------------------------------
class Page(HTMLParser):
    """Every start tag with its attributes, and the text inside each element with a data-* key."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.ids: list[str] = []
        self._stack: list[list] = []  # [tag, attrs, text parts]
        self.cells: list[tuple[dict, str]] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if "id" in a:
            self.ids.append(a["id"])
        if tag in ("td", "div", "tr", "details", "figure"):
            self._stack.append([tag, a, []])

    def handle_endtag(self, tag):
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i][0] == tag:
                t, a, parts = self._stack.pop(i)
                text = " ".join("".join(parts).split())
                self.cells.append((a, text))
                if self._stack:
                    self._stack[-1][2].append(" " + text + " ")
                break

    def handle_data(self, data):
        if self._stack:
            self._stack[-1][2].append(data)

    def find(self, **attrs) -> list[tuple[dict, str]]:
        want = {k.replace("_", "-"): v for k, v in attrs.items()}
        return [(a, t) for a, t in self.cells if all(a.get(k) == v for k, v in want.items())]


def parse(html: str) -> Page:
    p = Page()
    p.feed(html)
    p.close()
    return p


URL_ATTRS = ("src", "href", "xlink:href", "action", "data", "poster", "srcset", "formaction", "background")


def assert_self_contained(html: str) -> Page:
    """No attribute that could fetch anything outside the page, no script, no CSS import/url()."""
    page = parse(html)
    for tag, attrs in page.tags:
        assert tag not in ("script", "iframe", "object", "embed", "link", "img", "image", "audio", "video", "source"), tag
        for k, v in attrs.items():
            assert not k.startswith("on"), (tag, k)  # no event handlers
            if k in URL_ATTRS and v is not None:
                assert not re.match(r"^\s*([a-z][a-z0-9+.-]*:|//)", v, re.I), (tag, k, v)
    assert "http://" not in html and "https://" not in html
    assert "@import" not in html and "@font-face" not in html
    assert re.findall(r"url\((?!#)", html) == []
    return page


@pytest.fixture(scope="module")
def h200() -> dict:
    return results.load(H200)


@pytest.fixture(scope="module")
def h200_html(h200) -> str:
    return report.render_html(h200)


# --------------------------------------------------------------------------------------------
# synthetic results
def _samples(center: float, rounds: int = 3, n: int = 40, seed: int = 0, spread: float = 0.02) -> list[list[float]]:
    rng = np.random.default_rng(seed)
    return [list(center * (1 + spread * rng.standard_normal(n))) for _ in range(rounds)]


def make_case(env: str, op: str, batch: int, seqlen: int, wall: float | None, host: float | None,
              device: float | None, status: str = "ok", error: str | None = None, seed: int = 0,
              label: str | None = None) -> dict:
    cid = f"{op}-b{batch}-sq{seqlen}-sk{seqlen}-h4-hk4-d32-fp16"
    metrics = {}
    for m, v in (("wall_us", wall), ("host_us", host), ("device_us", device)):
        if v is not None and status == "ok":
            metrics[m] = stats.summarize(_samples(v, seed=seed * 10 + len(metrics)))
    med = {m: s["median"] for m, s in metrics.items()}
    tensors = {"out": 3e-4} if op == "fwd" else {"dq": 4e-4, "dk": 3.5e-4, "dv": 3.6e-4}
    return {"op": op, "batch": batch, "seqlen_q": seqlen, "seqlen_k": seqlen, "nheads": 4, "nheads_k": 4,
            "head_dim": 32, "dtype": "fp16", "causal": False, "dropout_p": 0.0, "softmax_scale": None,
            "layout": "embed", "id": cid, "env": env, "label": label or f"B{batch} S{seqlen} H4 D32",
            "status": status, "error": error, "error_kind": "timeout" if status != "ok" else None, "notes": [],
            "seconds": 1.0, "kernels": [{"name": "void flash_fwd_kernel<Traits<32>>(Params)", "us": device}] if device else [],
            "inner": {}, "metrics": metrics,
            "tflops": {"wall": 1.0 if wall else None, "device": 2.0 if device else None},
            "host_bound": stats.host_bound(med.get("host_us"), med.get("device_us")),
            "correctness": {"tensors": {k: {"max_abs_err": v * 3, "rel_err": v, "finite": True} for k, v in tensors.items()},
                            "tolerance": 0.01, "ok": True} if status == "ok" else None}


def make_results(envs: list[dict], cases: list[dict], title: str = "synthetic", device: str = "cuda",
                 machine: dict | None = None, created: str = "2026-01-02T03:04:05+00:00") -> dict:
    ok = [e["label"] for e in envs if e["status"] == "ok"]
    return {"schema": results.SCHEMA, "run_id": "20260102-030405-synthetic", "created": created,
            "finished": created, "title": title, "command": ["matrix-run", "--versions", ",".join(e["label"] for e in envs)],
            "config": {"title": title}, "config_source": "test", "matrix_run_version": "0.1.0",
            "settings": {"device": device, "min_effect": 0.05, "no_gpu_message": None},
            "machine": machine or {"hostname": "box", "gpu": "Test GPU" if device == "cuda" else None, "driver": "1.0",
                                   "cuda": "12.4" if device == "cuda" else None, "torch": "2.5.0", "python": "3.12",
                                   "cpu_count": 4},
            "envs": envs, "cases": cases, "comparisons": results.comparisons(cases, ok, 0.05),
            "rounds": [{"round": 0, "env": e["label"], "seconds": 1.0, "status": "ok", "error": None, "restarts": 0,
                        "gpu": None} for e in envs if e["status"] == "ok"],
            "timing": {"env_phase_s": 1.0, "timing_phase_s": 2.0, "total_s": 3.0, "stop_reason": "done"}}


def env(label: str, status: str = "ok", error: str | None = None, version: str | None = None) -> dict:
    return {"label": label, "requested_version": version or label, "flash_attn_version": version or label if status == "ok" else None,
            "torch": "2.5.0", "python": "3.12", "status": status, "error": error,
            "error_tail": "Traceback ...\nRuntimeError: nvcc died" if status != "ok" else None,
            "build": {"method": "find-links", "seconds": 1.0, "reused": False}}


def gpu_run(**kw) -> dict:
    """Two envs on a 'GPU': the candidate pays 60 µs more host time per call; kernels equal."""
    cases = []
    for i, (op, b, s) in enumerate([("fwd", 2, 64), ("fwd", 2, 256), ("fwd", 64, 64), ("bwd", 2, 64)]):
        dev = 5.0 if b == 2 else 400.0
        cases.append(make_case("1.0", op, b, s, 40.0 + dev, 35.0, dev, seed=i))
        cases.append(make_case("2.0", op, b, s, 100.0 + dev if b == 2 else dev + 40.0, 95.0, dev, seed=100 + i))
    return make_results([env("1.0"), env("2.0")], cases, **kw)


# --------------------------------------------------------------------------------------------
# the H200 run
def test_h200_verdict_cells_show_the_fixture_numbers(h200, h200_html):
    page = parse(h200_html)
    wall = [c for c in h200["comparisons"] if c["metric"] == "wall_us"]
    assert len(wall) == 12
    for c in wall:
        ratio = page.find(data_case=c["case"])  # the row
        assert ratio, c["case"]
        cell = [(a, t) for a, t in page.cells if a.get("class", "").startswith("ratio") and
                a.get("data-candidate") == c["candidate"] and a.get("data-ratio") == f"{c['ratio']:.2f}"]
        assert cell, (c["case"], c["ratio"])
        verdict = [(a, t) for a, t in page.cells if "verdict" in a.get("class", "").split() and
                   a.get("data-candidate") == c["candidate"] and a.get("data-verdict") == c["verdict"] and
                   a.get("data-attribution") == (c["attribution"] or "")]
        assert verdict, (c["case"], c["verdict"], c["attribution"])
    # the row the issue talks about: B2 S300 fwd, read from the fixture
    b2 = next(c for c in wall if c["label"] == "B2 S300 H16 D16" and c["op"] == "fwd")
    assert f"{b2['ratio']:.2f}" == "2.04" and b2["verdict"] == "slower" and b2["attribution"] == "host"
    row = next(t for a, t in page.cells if a.get("data-case") == b2["case"] and not a.get("class"))
    assert "2.04x" in row and f"[{b2['ci_low']:.2f}, {b2['ci_high']:.2f}]" in row
    assert f"Δ {report.fmt_delta(b2)} µs" in row and report.fmt_delta(b2).startswith("+")  # µs per call, paired
    assert "slower" in row and "host" in row
    # every slower/faster cell is coloured by its verdict
    for a, t in page.cells:
        if a.get("data-verdict"):
            assert f"v-{a['data-verdict']}" in a["class"]


def test_h200_headline_is_computed_from_the_fixture(h200, h200_html):
    wall = [c for c in h200["comparisons"] if c["metric"] == "wall_us"]
    slower = [c for c in wall if c["verdict"] == "slower"]
    worst = max(slower, key=lambda c: c["ratio"])
    assert {c["attribution"] for c in slower} == {"host"}
    n = len({c["id"] for c in h200["cases"]})
    short = " ".join(t for t in worst["label"].split() if t not in ("H16", "D16"))
    expect = (f"2.7.0.post2 vs 2.6.3: slower in {len(slower)}/{n} cases, all host overhead; "
              f"largest {worst['ratio']:.2f}x at {short} {worst['op']}.")
    assert expect == "2.7.0.post2 vs 2.6.3: slower in 7/12 cases, all host overhead; largest 2.11x at B2 S300 bwd."
    page = parse(h200_html)
    hl = page.find(data_candidate="2.7.0.post2", data_cls="slower")
    assert hl and hl[0][1].startswith(expect)
    same = sum(1 for c in wall if c["verdict"] == "same")
    amb = sum(1 for c in wall if c["verdict"] == "ambiguous")
    assert f"Same in {same}, ambiguous in {amb}." in hl[0][1]
    dev = [c for c in h200["comparisons"] if c["metric"] == "device_us"]
    assert f"Kernel (device) time: same in {sum(c['verdict'] == 'same' for c in dev)} of {len(dev)}" in hl[0][1]
    # the headline comes before the verdict table, which comes before the charts
    assert h200_html.index(expect) < h200_html.index('class="verdict-table"') < h200_html.index("<svg")


def test_h200_first_screen_has_machine_versions_and_host_bound_markers(h200, h200_html):
    m = h200["machine"]
    head = h200_html[:h200_html.index('class="verdict-table"')]
    for s in (m["gpu"], m["driver"], m["cuda"], m["torch"], "sm_90", "2.6.3", "2.7.0.post2", "baseline"):
        assert s in head, s
    page = parse(h200_html)
    hb_cases = sum(1 for c in h200["cases"] if c["host_bound"])
    assert hb_cases == 12
    table = h200_html[h200_html.index('class="verdict-table"'):h200_html.index("</table>", h200_html.index('class="verdict-table"'))]
    assert table.count('class="tag hb"') == hb_cases
    assert "every case: H16 D16 · fp16" in h200_html
    assert len(page.ids) == len(set(page.ids)), "duplicate ids (charts must prefix theirs)"


def test_h200_is_self_contained_small_and_has_its_charts(h200_html):
    page = assert_self_contained(h200_html)
    assert len(h200_html.encode()) < 2_000_000
    svgs = [a for t, a in page.tags if t == "svg"]
    assert len(svgs) == 5  # ratio, host/device breakdown, vs seqlen, vs batch, correctness
    for needle in ("wall = device + non-overlapped host", "95% CI of the median", "device (kernel time)",
                   "host-bound", "relative error vs fp32 reference", "B2 S300 fwd"):
        assert needle in h200_html, needle
    # internal links only: verdict rows to the case details, the raw JSON next to the report
    hrefs = [a["href"] for t, a in page.tags if t == "a"]
    assert "results.json" in hrefs
    assert all(h == "results.json" or h.startswith("#") for h in hrefs), hrefs
    assert all(h[1:] in page.ids for h in hrefs if h.startswith("#"))


def test_h200_detail_has_every_clock_kernels_builds_and_the_command(h200, h200_html):
    page = parse(h200_html)
    for c in h200["cases"]:
        det = page.find(id=f"case-{c['id']}")
        assert det, c["id"]
        text = det[0][1]
        for m, v in c["metrics"].items():
            assert report.fmt_us(v["median"]) in text and report.fmt_us(v["iqr"]) in text, (c["id"], m)
            assert str(v["n"]) in text
        for k in c["kernels"]:
            assert report.fmt_us(k["us"]) in text
        assert report.fmt_tflops(c["tflops"]["wall"]) in text
    assert report.fmt_tflops(0.000812) == "0.000812" and report.fmt_tflops(38.14) == "38.1"
    assert "flash_fwd_kernel&lt;Flash_fwd_kernel_traits&lt;32, 128, 128, 4" in h200_html  # kernel names, escaped
    for e in h200["envs"]:
        assert e["build"]["wheel_sha256"] in h200_html and e["build"]["key_id"] in h200_html
    assert "matrix-run --versions 2.6.3,2.7.0.post2 --find-links" in h200_html
    assert "time budget 100 s reached" in h200_html


def test_h200_markdown_and_terminal(h200):
    md = report.markdown(h200)
    assert "- **2.7.0.post2 vs 2.6.3: slower in 7/12 cases, all host overhead; largest 2.11x at B2 S300 bwd." in md
    b2 = next(c for c in h200["comparisons"] if c["metric"] == "wall_us" and c["label"] == "B2 S300 H16 D16" and c["op"] == "fwd")
    assert f"| B2 S300 H16 D16 | fwd | 74.8 | 152 | slower {report.fmt_ratio(b2)} (host) | {report.fmt_delta(b2)} |" in md
    # the µs difference with its interval, the comparison's own numbers (fmt_us's precision, signed)
    assert report.fmt_delta(b2) == "+{} [+{}, +{}]".format(*(report.fmt_us(b2[k]) for k in
                                                           ("delta_us", "delta_ci_low", "delta_ci_high")))
    assert report.fmt_delta({"delta_us": -7.084, "delta_ci_low": -9.5, "delta_ci_high": 1234.0}) == "-7.08 [-9.50, +1,234]"
    assert report.fmt_delta({"delta_us": 3.0, "delta_ci_low": float("-inf"), "delta_ci_high": 9.0, "unbounded": True}) == "+3.00"
    assert report.fmt_delta({"delta_us": None}) == report.fmt_delta(None) == "–"
    assert "| Δ wall µs per call |" in md.splitlines()[6]
    from rich.console import Console

    con = Console(record=True, width=220, color_system=None)
    report.terminal_table(h200, con)
    out = con.export_text()
    assert f"slower {report.fmt_ratio(b2)} · host" in out
    assert "largest 2.11x at B2 S300 bwd" in out


# --------------------------------------------------------------------------------------------
# edge cases
def test_hostile_strings_are_escaped_everywhere():
    run = gpu_run(title=XSS)
    run["envs"][1]["error"] = None
    run["machine"]["gpu"] = '<img src=x onerror="alert(2)">'
    for c in run["cases"]:
        c["label"] = c["label"] + ' $\\alpha$ <b onmouseover="x()">'
    run["cases"][0]["kernels"][0]["name"] = "</td><script>alert(3)</script>"
    run["command"].append("--title=</pre><script>alert(4)</script>")
    run["envs"].append(env('"><script>alert(5)</script>', status="failed", error="<script>alert(6)</script>"))
    html = report.render_html(run)
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in html and "<b onmouseover" not in html
    page = assert_self_contained(html)
    assert [t for t, a in page.tags if t == "title"]
    assert "svg" in {t for t, a in page.tags}  # the $...$ label did not break the charts
    assert "unavailable" not in html
    md = report.markdown(run)
    assert "<script>" not in md and "&lt;script&gt;" in md


def test_failed_env_failed_case_and_cpu_only():
    cases = []
    for i, (op, b, s) in enumerate([("fwd", 1, 16), ("fwd", 1, 64), ("bwd", 1, 16)]):
        cases.append(make_case("a", op, b, s, 50.0, 45.0, None, seed=i))
        cases.append(make_case("b", op, b, s, 350.0, 345.0, None, seed=10 + i))
    cases[-1] = make_case("b", "bwd", 1, 16, None, None, None, status="failed", error="Timeout after 300 s")
    run = make_results([env("a"), env("b"), env("c", status="failed", error="no wheel for 9.9")], cases, device="cpu")
    html = report.render_html(run)
    page = assert_self_contained(html)
    assert "no wheel for 9.9" in html and "Timeout after 300 s" in html
    # CPU: no device column, no attribution, the breakdown says there is no device clock
    assert "<th>device</th>" not in html
    assert "no device clock" in html.lower()
    for a, t in page.cells:
        if a.get("data-verdict"):
            assert a["data-attribution"] == ""
    hl = page.find(data_candidate="b")[0][1]
    worst = max((c for c in run["comparisons"] if c["metric"] == "wall_us"), key=lambda c: c["ratio"])
    assert 6.5 < worst["ratio"] < 7.5
    assert hl.startswith("b vs a: slower in 2/3 cases (CPU run: no device clock, wall is all host time); "
                         f"largest {worst['ratio']:.2f}x at S{worst['label'].split()[1][1:]} fwd.")
    assert "Not compared in 1 (failed or not run)." in hl
    # the failed env "c" has no cases: it is named above the table, not given empty columns
    assert "<b>c</b> failed: no wheel for 9.9 — not in any comparison." in html
    table = html[html.index('class="verdict-table"'):html.index("</thead>")]
    assert table.count("µs per call") == 2 and table.count("b vs a") == 1
    failed_row = page.find(data_case=cases[-1]["id"])[0][1]
    assert "failed: timeout" in failed_row and "not compared" in failed_row
    assert len([a for t, a in page.tags if t == "svg"]) >= 3  # ratio, breakdown, seqlen (+ correctness)
    report.terminal_table(run, __import__("rich.console", fromlist=["Console"]).Console(record=True, width=200))


def test_one_env_and_no_env():
    one = make_results([env("x")], [make_case("x", "fwd", 2, s, 40.0, 30.0, 8.0) for s in (64, 128)])
    html = report.render_html(one)
    assert_self_contained(html)
    assert "One env (x): nothing to compare against." in html
    assert 'id="chart-ratio"' not in html
    assert "wall = device + non-overlapped host" in html  # the breakdown still draws
    none = make_results([env("x", status="failed", error="build failed")], [])
    html = report.render_html(none)
    assert_self_contained(html)
    assert "No env could be timed." in html and "build failed" in html
    assert "<svg" not in html


def test_a_chart_that_fails_does_not_sink_the_report(monkeypatch):
    from matrix_runner import charts

    def boom(*a, **k):
        raise RuntimeError("no fonts today")

    monkeypatch.setattr(charts, "breakdown_chart", boom)
    html = report.render_html(gpu_run())
    assert "chart unavailable: RuntimeError: no fonts today" in html
    assert 'id="chart-ratio"' in html


# --------------------------------------------------------------------------------------------
# compare
def _scaled(res: dict, env_label: str, factors: dict) -> dict:
    out = copy.deepcopy(res)
    for c in out["cases"]:
        if c["env"] != env_label:
            continue
        for m, f in factors.items():
            if m in c["metrics"]:
                c["metrics"][m] = stats.summarize([[x * f for x in r] for r in c["metrics"][m]["samples"]])
    out["run_id"] = res["run_id"] + "-b"
    return out


def test_compare_runs_finds_a_planted_host_slowdown(h200):
    """Between two runs the wall and host ratios are provisional (results.BETWEEN_RUNS_WHY: on the H200
    such intervals called one build faster or slower than itself in 24 % of comparisons); the planted
    1.5x is in the ratio, and kernel time, a GPU clock, keeps its verdict."""
    b = _scaled(h200, "2.7.0.post2", {"wall_us": 1.5, "host_us": 1.5})
    cmp = report.compare_runs(h200, b)
    assert cmp["pairs"] == [("2.6.3", "2.6.3"), ("2.7.0.post2", "2.7.0.post2")]
    assert len(cmp["rows"]) == 24 and not cmp["skipped"]
    for r in cmp["rows"]:
        w = r["wall"]
        assert w["verdict"] == "provisional" and w["between_runs"] and r["host"]["verdict"] == "provisional"
        assert w["attribution"] is None and "between runs" in w["attribution_why"]
        assert report.fmt_ci(w) == "(between runs: no interval)" and report.compare_wall(w) == f"{w['ratio']:.2f}x"
        assert r["device"]["ratio"] == pytest.approx(1.0) and r["device"]["verdict"] in ("same", "ambiguous")
        assert w["ratio"] == pytest.approx(1.0 if r["env"] == "2.6.3" else 1.5)
    assert sum(r["device"]["verdict"] == "same" for r in cmp["rows"]) >= 18
    s = {x["env"]: x for x in cmp["summaries"]}
    # b holds a's wheels (its data scaled): the headline says a difference between them is the machine's
    assert s["2.7.0.post2"]["text"] == (
        "2.7.0.post2 (the same build: a difference is the machine's) — B vs A: provisional ratios 1.50x-1.50x in 12 "
        "cases, no verdict (wall time between two runs decides nothing: each met the CPU at its own speeds; time "
        "both in one run for a verdict).")
    assert s["2.6.3"]["cls"] == "none"  # never slower/faster


def test_two_runs_of_one_build_get_no_wall_verdict_between_them():
    """Two consecutive H200 A/A runs of one build, minutes apart (reports/h200-aa-69, -70): the second met
    the CPU's slow state. The between-run interval (sets as independent groups, fixed-n 95 %) that
    compare printed called the build 1.60x slower than itself at batch-2 S50 forward; over 51 such pairs
    it did so in 24 % of wall comparisons (benchmarks/between_runs.py). Now the wall and host ratios
    between runs are provisional; kernel time, a GPU clock, keeps its verdicts."""
    a, b = (results.load(ROOT / "reports" / f"h200-aa-{n}") for n in (69, 70))
    cmp = report.compare_runs(a, b)
    rows = {(r["env"], r["short"], r["op"]): r for r in cmp["rows"]}
    w = rows[("a", "B2 S50", "fwd")]["wall"]
    assert w["ratio"] == pytest.approx(1.60, abs=0.01)
    assert stats.verdict(w["ratio"], *w["fixed_n_ci_without_run_spread"], 0.05) == "slower"  # what its interval says
    assert w["ci_low"] is w["ci_high"] is w["p_value"] is None and w["provisional"] is True  # no interval stored
    assert all(r["wall"]["verdict"] == r["host"]["verdict"] == "provisional" for r in cmp["rows"])
    assert all(r["device"]["verdict"] in ("same", "ambiguous") for r in cmp["rows"])
    assert sum(r["device"]["verdict"] == "same" for r in cmp["rows"]) >= 12
    assert all(s["cls"] == "none" and "provisional ratios" in s["text"] for s in cmp["summaries"])


def test_compare_pairs_by_version_when_labels_differ(h200):
    b = copy.deepcopy(h200)
    for e in b["envs"]:
        e["label"] = "new-" + e["label"]
    for c in b["cases"]:
        c["env"] = "new-" + c["env"]
    cmp = report.compare_runs(h200, b)
    assert cmp["pairs"] == [("2.6.3", "new-2.6.3"), ("2.7.0.post2", "new-2.7.0.post2")]
    assert len(cmp["rows"]) == 24
    # a version in one run only is named in the terminal, not dropped without a word (second new-user trial)
    from rich.console import Console
    other = copy.deepcopy(h200)
    for e in other["envs"]:
        if e["label"] == "2.7.0.post2":
            e.update(label="2.8.3", flash_attn_version="2.8.3", requested_version="2.8.3")
    for c in other["cases"]:
        if c["env"] == "2.7.0.post2":
            c["env"] = "2.8.3"
    cmp2 = report.compare_runs(h200, other)
    assert cmp2["pairs"] == [("2.6.3", "2.6.3")] and cmp2["unpaired"] == ["A 2.7.0.post2", "B 2.8.3"]
    con = Console(record=True, width=200)
    report.compare_terminal(cmp2, con)
    text = " ".join(con.export_text().split())
    assert ("not compared, without a partner of the same label or flash-attn version in the other run: "
            "A 2.7.0.post2, B 2.8.3; to set versions of different runs side by side, matrix-run report A B") in text
    assert "Not compared (no partner of the same label or flash-attn version in the other run): A 2.7.0.post2, B 2.8.3." \
        in report.compare_markdown(cmp2)


def test_compare_cli_writes_table_html_and_markdown(h200, tmp_path):
    b = _scaled(h200, "2.7.0.post2", {"wall_us": 2.0, "host_us": 2.0})
    b["title"] = XSS
    results.write_json(tmp_path / "b" / "results.json", b)
    cp = run_cli("compare", str(H200), str(tmp_path / "b"), "-o", str(tmp_path / "cmp"), "--markdown",
                 str(tmp_path / "cmp.md"))
    assert cp.returncode == 0, cp.stderr
    # b is a's data scaled: the same wheel, so its headline says a difference is the machine's
    assert "B / A per env and case" in cp.stdout and ("2.7.0.post2 (the same build: a difference is the machine's) — B vs A: "
                                                     "provisional ratios 2.00x-2.00x in 12 cases") in " ".join(cp.stdout.split())
    assert "warning" not in cp.stderr  # the same machine
    # runs of different machines are compared, with a warning that says so (new-user trial: an H200 run
    # against a CPU stand-in run, 14.33x, without a word)
    from matrix_runner import commands
    cpu = dict(b, settings={**b["settings"], "device": "cpu"})
    assert commands.machine_differences(h200, cpu) == ["A ran on cuda, B on cpu"]
    h100 = dict(b, machine={**b["machine"], "gpu": "NVIDIA H100"})
    assert commands.machine_differences(h200, h100) == [f"A ran on {h200['machine']['gpu']}, B on NVIDIA H100"]
    results.write_json(tmp_path / "c" / "results.json", cpu)
    cp = run_cli("compare", str(H200), str(tmp_path / "c"))
    assert "warning: A ran on cuda, B on cpu: the ratios B/A below compare machines" in cp.stderr
    # another torch or Python under the envs, and another build of one version, are named too (new-user
    # trial: tox envs on torch 2.14.1 against a run on 2.13.0, and two builds of 2.7.0.post2, without a word)
    other = copy.deepcopy(b)
    for e in other["envs"]:
        e["torch"] = "2.5.1+cu124"
    other["envs"][1]["build"] = {**(other["envs"][1].get("build") or {}), "wheel_sha256": "ab" * 32}
    torch_a = sorted({e["torch"] for e in h200["envs"]})
    assert commands.stack_differences(h200, other) == [
        f"A's envs ran on torch {', '.join(torch_a)}, B's on 2.5.1+cu124: host overhead follows torch, so the "
        "ratios between the runs compare torch builds as much as versions"]
    assert commands.stack_differences(h200, b) == []
    lab = h200["envs"][1]["label"]
    assert commands.build_differences(h200, other, report.pair_envs(h200, other)) == [
        f"{lab}: another build of {h200['envs'][1]['flash_attn_version']} on each side (wheel sha256 "
        f"{h200['envs'][1]['build']['wheel_sha256'][:12]}… in A, abababababab… in B): their ratios compare the "
        "builds, not only the machines"]
    results.write_json(tmp_path / "t" / "results.json", other)
    cp = run_cli("compare", str(H200), str(tmp_path / "t"))
    err = " ".join(cp.stderr.split())
    assert cp.returncode == 0 and "warning: A's envs ran on torch" in err and "another build of" in err, err
    html = (tmp_path / "cmp" / "index.html").read_text()
    page = assert_self_contained(html)
    assert "<script" not in html and "&lt;script&gt;" in html
    cells = [a for a, t in page.cells if a.get("data-env") == "2.7.0.post2" and a.get("data-case")]
    assert len(cells) == 12
    assert page.find(data_verdict="provisional", data_attribution="")
    assert any(a.get("data-ratio") == "2.00" for a, t in page.cells)
    assert "between runs: no interval" not in html  # the wall cell: the ratio alone
    assert "1.00x [" in html and " same</td>" in html  # the kernel cell: ratio, interval, verdict
    md = (tmp_path / "cmp.md").read_text()
    a_wall = next(c for c in h200["cases"] if c["env"] == "2.7.0.post2" and c["label"] == "B2 S300 H16 D16"
                  and c["op"] == "fwd")["metrics"]["wall_us"]["median"]
    assert (f"| 2.7.0.post2 | B2 S300 H16 D16 | fwd | {report.fmt_us(a_wall)} | {report.fmt_us(2 * a_wall)} | 2.00x | "
            "provisional | 2.00x | 1.00x [") in md
    # how the ratios and intervals were made, where a reader could take them for a run's own (new-user trial)
    assert "Two runs are not paired" in report.COMPARE_NOTE and "not anytime-valid" in report.COMPARE_NOTE
    assert "provisional: no interval, no verdict" in report.COMPARE_NOTE
    assert " ".join(report.COMPARE_NOTE.split()) in " ".join(cp.stdout.split())
    assert f"{report.COMPARE_NOTE}; above 1 B is slower." in md


def test_compare_cli_help_and_errors(tmp_path):
    cp = run_cli("compare", "-h")
    assert cp.returncode == 0
    text = " ".join(cp.stdout.split())
    assert "B/A" in text and "Above 1, B is slower than A" in text and "No timing is redone" in text
    other = make_results([env("zzz")], [make_case("zzz", "fwd", 1, 16, 10.0, 5.0, None)])
    results.write_json(tmp_path / "o" / "results.json", other)
    cp = run_cli("compare", str(H200), str(tmp_path / "o" / "results.json"))
    assert cp.returncode == 2 and "no env timed in both runs" in " ".join(cp.stderr.split())
    (tmp_path / "bad.json").write_text('{"schema": "other/1"}')
    cp = run_cli("compare", str(H200), str(tmp_path / "bad.json"))
    assert cp.returncode == 2 and "is not one of matrix-runner/results/1, matrix-runner/results/2" in cp.stderr and "Traceback" not in cp.stderr


# --------------------------------------------------------------------------------------------
# publish
def test_publish_site_of_runs(tmp_path):
    from matrix_runner import publish

    reports = tmp_path / "reports"
    shutil.copytree(H200_DIR, reports / H200_DIR.name)
    hostile = gpu_run(title=XSS, created="2027-05-06T07:08:09+00:00")
    hostile["machine"]["gpu"] = "<b>GPU</b>"
    results.write_json(reports / "x&y run" / "results.json", hostile)  # no index.html: rendered
    (reports / "other").mkdir()
    (reports / "other" / "results.json").write_text(json.dumps({"schema": "asv/1"}))
    (reports / "empty").mkdir()
    (reports / "README.md").write_text("not a run")
    site = reports / "site"  # a site inside REPORTS_DIR is not a run
    out = publish.build_site(reports, site)
    assert [r["name"] for r in out["runs"]] == ["x&y run", H200_DIR.name]  # newest first
    w = " ".join(out["warnings"])
    assert "other" in w and "is not one of matrix-runner/results/1, matrix-runner/results/2" in w and "empty: no results.json" in w
    assert (site / H200_DIR.name / "index.html").read_bytes() == (H200_DIR / "index.html").read_bytes()
    assert (site / H200_DIR.name / "results.json").read_bytes() == (H200_DIR / "results.json").read_bytes()
    rendered = (site / "x&y run" / "index.html").read_text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in rendered and "<script" not in rendered
    html = (site / "index.html").read_text()
    page = assert_self_contained(html)
    assert "<script" not in html and "&lt;b&gt;GPU&lt;/b&gt;" in html
    hrefs = [a["href"] for t, a in page.tags if t == "a"]
    assert f"{H200_DIR.name}/index.html" in hrefs and f"{H200_DIR.name}/results.json" in hrefs
    assert "x%26y%20run/index.html" in hrefs
    for h in hrefs:
        from urllib.parse import unquote

        assert (site / unquote(h)).is_file(), h
    row = page.find(data_run=H200_DIR.name)[0][1]
    committed = results.load(H200_DIR / "results.json")
    when = committed["created"][:10] + " " + committed["created"][11:16] + " UTC"
    assert "NVIDIA H200" in row and when in row and "2.6.3" in row and "2.7.0.post2" in row
    assert report.view_model(committed)["summaries"][0]["text"] in row
    # again, with the site now inside reports/: still two runs, and --rerender renders the H200 report anew
    out2 = publish.build_site(reports, site, rerender=True)
    assert [r["name"] for r in out2["runs"]] == ["x&y run", H200_DIR.name]
    assert "<svg" in (site / H200_DIR.name / "index.html").read_text()
    # cases not run (the budget ran out first) are not "failed" (second new-user trial: "6 failed"),
    # and the report says "not run" once, not "not run: not-run"
    cut = gpu_run(title="cut short", created="2027-05-07T07:08:09+00:00")
    for c in cut["cases"][:2]:
        c.update(status="not run", error_kind="not-run", error="not timed: the time budget ran out")
    results.write_json(reports / "cut" / "results.json", cut)
    out3 = publish.build_site(reports, site)
    (row3,) = [r for r in out3["runs"] if r["name"] == "cut"]
    assert (row3["n_failed"], row3["n_not_run"]) == (0, 2)
    assert "2 not run" in (site / "index.html").read_text() and "failed</span>" not in (site / "index.html").read_text()
    page3 = (site / "cut" / "index.html").read_text()
    assert "not run: not-run" not in page3 and "not-run:" not in page3 and "not run: not timed" in page3


def test_publish_finds_the_runs_tox_writes_one_folder_down(tmp_path):
    # tox -e fa-X writes reports/tox/fa-X/results.json, tox -e report reports/tox/html/: publish had
    # skipped them all ("no results.json in reports/tox")
    from urllib.parse import unquote

    from matrix_runner import publish

    reports = tmp_path / "reports"
    results.write_json(reports / "tox" / "fa-2.6.3" / "results.json", gpu_run(title="tox a", created="2027-05-01T07:00:00+00:00"))
    results.write_json(reports / "tox" / "fa-2.7.0.post2" / "results.json", gpu_run(title="tox b", created="2027-05-01T08:00:00+00:00"))
    (reports / "tox" / "logs").mkdir()  # a folder without a run beside them: not a warning of its own
    results.write_json(reports / "run1" / "results.json", gpu_run(title="own", created="2027-05-02T07:00:00+00:00"))
    (reports / "run1" / "sub").mkdir()  # a run's own folder is not searched further
    results.write_json(reports / "run1" / "sub" / "results.json", gpu_run(title="inside a run"))
    (reports / "nothing" / "deeper").mkdir(parents=True)
    out = publish.build_site(reports, tmp_path / "site")
    assert [r["name"] for r in out["runs"]] == ["run1", "tox/fa-2.7.0.post2", "tox/fa-2.6.3"]
    assert [r["title"] for r in out["runs"]] == ["own", "tox b", "tox a"]
    assert len(out["warnings"]) == 1 and "nothing: no results.json" in out["warnings"][0]
    html = (tmp_path / "site" / "index.html").read_text()
    hrefs = [a["href"] for t, a in assert_self_contained(html).tags if t == "a"]
    assert "tox/fa-2.6.3/index.html" in hrefs
    for h in hrefs:
        assert (tmp_path / "site" / unquote(h)).is_file(), h
    assert "tox a" in (tmp_path / "site" / "tox" / "fa-2.6.3" / "index.html").read_text()


def test_publish_cli_on_the_committed_reports(tmp_path):
    cp = run_cli("publish", str(ROOT / "reports"), "-o", str(tmp_path / "site"))
    assert cp.returncode == 0, cp.stderr
    html = (tmp_path / "site" / "index.html").read_text()
    assert f'href="{H200_DIR.name}/index.html"' in html and "NVIDIA H200" in html
    assert (tmp_path / "site" / H200_DIR.name / "results.json").is_file()
    # a page rendered for an archived run links results.json.gz; the site serves results.json (new-user trial)
    import gzip
    run = "h200-2.6.3-vs-2.7.0.post2-12-05-12"
    assert b'href="results.json.gz"' in gzip.decompress((ROOT / "reports" / run / "index.html.gz").read_bytes())
    page = (tmp_path / "site" / run / "index.html").read_text()
    assert 'href="results.json"' in page and 'href="results.json.gz"' not in page
    # report of a path that is not there: a usage error, with tox's order where it is reports/tox
    cp = run_cli("report", str(tmp_path / "reports" / "tox"), "-o", str(tmp_path / "h"))
    assert cp.returncode == 2 and "reports/tox: no such file or directory" in " ".join(cp.stderr.split())
    assert "run them first (`tox -e fa-2.6.3,fa-2.7.0.post2`" in " ".join(cp.stderr.split()), cp.stderr
    cp = run_cli("publish", str(tmp_path / "nope"), "-o", str(tmp_path / "s2"))
    assert cp.returncode == 2 and "not a directory" in cp.stderr


def test_markdown_rows_name_the_dtype_where_a_run_has_several_and_kvcache_words_keep_their_number(h200):
    """Second new-user trial: a shape in fp16 and bf16 gave two Markdown rows that read alike; the
    kvcache title took "cache" and left its number in the rows."""
    two = copy.deepcopy(h200)
    cid = two["cases"][0]["id"]
    for c in two["cases"]:
        if c["id"] == cid:
            c["dtype"] = "bf16"
    md = report.markdown(two)
    lab = two["cases"][0]["label"]
    assert f"| {lab} bf16 | fwd |" in md and f"| {lab} fp16 | bwd |" in md and md.count(" fp16 | ") == 11, md
    assert " fp16 | " not in report.markdown(h200).split("|---", 1)[1]  # one dtype: in the title only
    kv = [dict(c, label=f"kvcache B64 S1/8191 H16/2 D128 causal cache {n}") for c, n in
          zip(h200["cases"][:2], (8191, 4096))]
    kv[1]["id"] = "other"
    short, common = report.short_labels(kv)
    assert common.startswith("kvcache B64 S1/8191 H16/2 D128 causal") and "cache" not in common.split("causal")[1]
    assert sorted(short.values()) == ["cache 4096", "cache 8191"]


def test_a_faster_headline_gives_the_tables_ratio_too():
    """New-user trial: "faster in 2/4 cases; largest 1.08x" beside a table cell of 0.92x."""
    w = [{"case": "c1", "verdict": "faster", "ratio": 0.92, "attribution": "host"},
         {"case": "c2", "verdict": "faster", "ratio": 0.5, "attribution": "host"},
         {"case": "c3", "verdict": "slower", "ratio": 1.3, "attribution": "host"}]
    t = report.summarize(w, 3, {"c1": "B2 fwd", "c2": "B2 bwd", "c3": "B4 fwd"}, "b", "a")["text"]
    assert t == ("b vs a: slower in 1/3 cases, host overhead; largest 1.30x at B4 fwd; faster in 2/3 cases, all host "
                 "overhead; largest 2.00x faster (ratio 0.50x) at B2 bwd."), t


def test_headline_of_an_interrupted_run_is_not_called_quick():
    w = [{"case": "c1", "verdict": "slower", "ratio": 1.9, "attribution": None, "within_process_only": True,
          "attribution_why": "no device clock (CPU run)"}]
    s = report.summarize(w, 1, {"c1": "B2 fwd"}, "b", "a", quick=False, interrupted=True)["text"]
    assert "interrupted" in s and "--resume" in s and "Only one worker process per version" in s
    assert "Quick run" not in s
    # the HTML report may be read anywhere: a placeholder; the terminal knows the run's folder (new-user
    # trial: stdout said "DIR" while stderr named it), quoted for a shell
    assert "--resume DIR (DIR: the directory of this run's results.json)" in s
    here = report.summarize(w, 1, {"c1": "B2 fwd"}, "b", "a", interrupted=True, run_dir="/r/my run")["text"]
    assert "finish it with matrix-run --resume '/r/my run'." in here and "DIR" not in here
    q = report.summarize(w, 1, {"c1": "B2 fwd"}, "b", "a", quick=True)["text"]
    assert "Quick run" in q and "interrupted" not in q
    # too few sets for an interval: an interrupted run is told to resume, not to raise its budget (new-user trial)
    # how many: from the comparison's level and mixing (a fixed "about 5" had told a run whose
    # comparisons held 6 sets at level 0.0125 that 5 were needed: new-user trial)
    c = stats.lai_mixing(24, 0.05)
    amb = [{"case": "c1", "verdict": "ambiguous", "ratio": 1.01, "unbounded": True, "attribution": None,
            "alpha": 0.0125, "cs_mixing": c}]
    cut = report.summarize(amb, 1, {"c1": "B2 fwd"}, "b", "a", interrupted=True)["text"]
    assert "(1 with too few process sets for a finite interval at this level, 8 are needed: --resume adds sets)" in cut
    assert "--time-budget" not in cut
    assert stats.t_cs([0.0, 1.0] * 3 + [0.5], 0.0125, c)[2] == math.inf  # 7 sets: unbounded
    assert math.isfinite(stats.t_cs([0.0, 1.0] * 4, 0.0125, c)[2])  # 8: finite
    full = report.summarize([amb[0], {**amb[0], "case": "c2", "alpha": 0.05}], 2, {"c1": "B2 fwd", "c2": "B2 bwd"},
                            "b", "a")["text"]
    assert "(2 with too few process sets for a finite interval at this level, 6-8 are needed: raise --time-budget)" in full
    # an older record without level or mixing: no number, no guess
    old = report.summarize([{k: v for k, v in amb[0].items() if k not in ("alpha", "cs_mixing")}], 1, {"c1": "B2 fwd"},
                           "b", "a")["text"]
    assert "finite interval at this level: raise --time-budget)" in old


def test_compare_runs_is_unpaired_so_round_order_does_not_matter(h200):
    """Two separate runs are independent groups (issue #14): pairing them round by round made A vs A
    come out 24/24 "same" with zero-width CIs and A vs A-with-rounds-reversed 19/24 "ambiguous"."""
    rev = copy.deepcopy(h200)
    for c in rev["cases"]:
        for m in c["metrics"].values():
            m["samples"] = m["samples"][::-1]
    same, flipped = report.compare_runs(h200, h200), report.compare_runs(h200, rev)
    assert len(same["rows"]) == len(flipped["rows"]) == 24
    # each env is the same wheel on the same torch in both: its headline says the difference is the machine's
    assert all(s["detail"].startswith("Both are the same wheel (sha256 ") for s in same["summaries"]), same["summaries"]
    assert [s["text"].split(" — ")[0] for s in same["summaries"]] == [
        f"{e['label']} (the same build: a difference is the machine's)" for e in h200["envs"]]
    other = copy.deepcopy(h200)
    other["envs"][0]["torch"] = "2.99.0"
    assert "same wheel" not in report.compare_runs(h200, other)["summaries"][0]["detail"]
    assert report.compare_runs(h200, other)["summaries"][0]["text"].startswith(h200["envs"][0]["label"] + " — ")
    for x, y in zip(same["rows"], flipped["rows"]):
        for k in ("wall", "host", "device"):
            if x[k] is None:
                continue
            assert x[k]["ci_method"] == y[k]["ci_method"] == "independent bootstrap+Welch"
            assert not x[k]["paired"] and not y[k]["paired"]
            assert x[k]["ratio"] == y[k]["ratio"] and x[k]["verdict"] == y[k]["verdict"]
            # the bootstrap resamples rounds in list order, so the CI ends move by Monte Carlo noise only
            ci = (lambda c: c.get("fixed_n_ci_without_run_spread") or (c["ci_low"], c["ci_high"]))  # noqa: E731
            assert tuple(ci(x[k])) == pytest.approx(tuple(ci(y[k])), rel=1e-2)
        lo, hi = x["wall"]["fixed_n_ci_without_run_spread"]
        assert lo < 1 < hi and x["wall"]["verdict"] == "provisional"  # a non-zero-width interval, kept apart


def _only(run: dict, label: str) -> dict:
    """A copy of results ``run`` holding env ``label`` alone, as its own run (a tox version env's)."""
    r = copy.deepcopy(run)
    r["envs"] = [e for e in r["envs"] if e["label"] == label]
    r["cases"] = [c for c in r["cases"] if c["env"] == label]
    r["run_id"] += "-" + label
    return r


def test_merge_compares_envs_of_different_runs_unpaired(h200):
    """`matrix-run report DIR` / `tox -e report` merge separately run envs (issue #14): their rounds
    never ran back to back, so they are independent groups; envs of one run stay paired by round."""
    merged = results.merge([_only(h200, "2.6.3"), _only(h200, "2.7.0.post2")])
    wall = [c for c in merged["comparisons"] if c["metric"] == "wall_us"]
    assert len(wall) == 12
    assert {c["ci_method"] for c in merged["comparisons"]} == {"independent bootstrap+Welch"}
    assert not any(c["paired"] for c in merged["comparisons"])
    # one run's envs merged with another run: the baseline's own run stays paired, the other does not
    extra = copy.deepcopy(h200)
    extra["run_id"] += "-other"
    again = results.merge([h200, extra])
    method = {(c["baseline"], c["candidate"]): c["ci_method"] for c in again["comparisons"] if c["metric"] == "wall_us"}
    # and the later run's own pair, paired as that run compared it (new-user trial: it was left out)
    assert method == {("2.6.3", "2.7.0.post2"): "paired trimmed t", ("2.6.3", "2.6.3'"): "independent bootstrap+Welch",
                      ("2.6.3", "2.7.0.post2'"): "independent bootstrap+Welch",
                      ("2.6.3'", "2.7.0.post2'"): "paired trimmed t"}
    # the legend says so (new-user trial: a merged report called every ratio paired)
    gpu = any(c["metric"] == "device_us" for c in merged["comparisons"])  # the kernel clause only with a kernel clock
    assert gpu and report.view_model(merged)["ratio_def"] == report.MERGED_DEF + report.MERGED_KERNEL
    mixed = report.view_model(again)["ratio_def"]
    assert mixed.startswith("within a run: trimmed mean over rounds") and mixed.endswith("; " + report.MERGED_DEF
                                                                                           + report.MERGED_KERNEL)
    cpu = [c for c in merged["comparisons"] if c["metric"] in ("wall_us", "host_us")]
    assert report.merged_def(cpu) == report.MERGED_DEF and "kernel" not in report.merged_def(cpu)
    # the headline of an env from another run says so, and a copy of the same wheel on the same torch is
    # called the machine's difference (new-user trial: "2.6.3' vs 2.6.3: faster in 2/4 cases" for two runs
    # of one wheel three minutes apart)
    heads = {s["candidate"]: s for s in report.view_model(again)["summaries"] if s["baseline"] == "2.6.3"}
    assert heads["2.6.3'"]["text"].startswith("2.6.3' vs 2.6.3, between runs (unpaired; the same build: a difference "
                                              "is the machine's): ")
    assert heads["2.6.3'"]["detail"].startswith(report.BETWEEN_NOTE + report.BETWEEN_KERNEL + " Both are the same wheel (sha256 ")
    assert "every difference here is the machine's between the runs, not the code's" in heads["2.6.3'"]["detail"]
    assert heads["2.7.0.post2'"]["text"].startswith("2.7.0.post2' vs 2.6.3, between runs (unpaired): ")
    assert "same wheel" not in heads["2.7.0.post2'"]["detail"]  # another wheel than the baseline's
    assert heads["2.7.0.post2"]["text"].startswith("2.7.0.post2 vs 2.6.3: ") and report.BETWEEN_NOTE not in heads["2.7.0.post2"]["detail"]


def test_a_merged_report_of_lockstep_runs_defines_its_unpaired_ratios(tmp_path):
    """Two runs of one env each (tox's version envs, --backend here) merged: the terminal legend and the
    HTML say the ratio is between runs, unpaired and fixed-n, and claim no ' mark or probe-share rule."""
    from rich.console import Console
    aa = results.load(ROOT / "reports" / "h200-aa-68")
    merged = results.merge([_only(aa, "a"), _only(aa, "b")])
    con = Console(record=True, width=200)
    report.terminal_table(merged, con)
    text = " ".join(con.export_text().split())
    assert "paired cycle by cycle" not in text and "marked '" not in text
    assert "merged runs: ratio between runs (an env from another run than the baseline's): the ratio of the two " \
           "runs' medians of per-set medians, not paired" in text
    assert "provisional on the wall and host clocks" in text and "no set came after" not in text
    assert "kernel and CUDA-graph time get a fixed-n 95 % interval" in text
    # each between-run cell gives its case's kernel verdict, the comparison such a cell can decide
    # (it had been counts in the headline alone): the stored device comparison's ratio, interval, verdict
    dev = {c["case"]: c for c in merged["comparisons"] if c["metric"] == "device_us"}
    wall = {c["case"]: c for c in merged["comparisons"] if c["metric"] == "wall_us"}
    md = report.markdown(merged)
    html = report.render_html(merged)
    for cid, d in dev.items():
        k = f"kernel {d['ratio']:.2f}x {report.fmt_ci(d)} {d['verdict']}"
        assert report.fmt_ci(d).startswith(f"[{d['ci_low']:.2f}") or report.ci_digits(d) > 2
        assert f"provisional {wall[cid]['ratio']:.2f}x · {k}" in text, k
        assert f"; {k} |" in md and f'<span class="ci kernel">{k}</span>' in html
    assert len(dev) == 12 and {d["verdict"] for d in dev.values()} >= {"same"}
    within = report.markdown(aa)  # a run's own (paired) cells carry no such note
    assert "; kernel " not in within and 'class="ci kernel"' not in report.render_html(aa)
    assert "candidate / baseline wall time, between runs (an env from another run than the baseline&#39;s)" in html
    # its identity: the runs it holds, not the first run's id; re-rendered at another --min-effect (or
    # merged again), each env keeps the run it was timed in, so nothing is paired across runs
    assert merged["run_id"] == f"merge of {aa['run_id']}-a, {aa['run_id']}-b"
    assert merged["merged_from"] == [f"{aa['run_id']}-a", f"{aa['run_id']}-b"]
    again = results.merge([merged], min_effect=0.01)
    assert {c["ci_method"] for c in again["comparisons"]} == {"independent bootstrap+Welch"}
    assert not any(c["paired"] for c in again["comparisons"]) and again["merged_from"] == merged["merged_from"]


def test_a_full_run_is_never_called_quick(h200):
    """Issue #14: summarize defaulted to quick=True, so compare summaries of full runs that were timed in
    one worker process per version (e.g. stopped after round 1) said "Quick run ... rerun without --quick"."""
    w = [{"case": "c1", "verdict": "slower", "ratio": 1.9, "attribution": None, "within_process_only": True,
          "attribution_why": "no device clock (CPU run)"}]
    assert "Quick run" not in report.summarize(w, 1, {"c1": "B2 fwd"}, "b", "a")["text"]
    one = copy.deepcopy(h200)  # a full run (settings.quick false) that got one round only
    assert one["settings"]["quick"] is False
    for c in one["cases"]:
        for m in c["metrics"].values():
            m["samples"] = m["samples"][:1]
    texts = [s["text"] for s in report.compare_runs(h200, one)["summaries"]]
    # one side timed in one process (the other in many; new-user trial: "per side" was wrong):
    # provisional ratios, no verdict, and never called a quick run
    assert texts and all("a side timed in one process set decides nothing" in t and "quick" not in t.lower()
                         for t in texts), texts
    quick = copy.deepcopy(one)
    quick["settings"]["quick"] = True
    assert all("a --quick run decides nothing" in s["text"] for s in report.compare_runs(h200, quick)["summaries"])


# --------------------------------------------------------------------------------------------
# axes: the heat map of ratios grouped by axis
def axes_run() -> dict:
    """2 dtypes x 2 causal x 4 shapes, fwd: the candidate 1.5x slower in bf16, equal in fp16."""
    cases = []
    for dt in ("fp16", "bf16"):
        for causal in (False, True):
            for i, (b, s) in enumerate([(2, 64), (2, 256), (64, 64), (64, 256)]):
                for lab, wall in (("1.0", 100.0), ("2.0", 150.0 if dt == "bf16" else 100.0)):
                    c = make_case(lab, "fwd", b, s, wall, 50.0, 40.0, seed=i + (7 if lab == "2.0" else 0))
                    c.update(dtype=dt, causal=causal, id=c["id"].replace("fp16", dt) + ("-causal" if causal else ""),
                             label=c["label"] + (" causal" if causal else ""))
                    cases.append(c)
    return make_results([env("1.0"), env("2.0")], cases)


def test_many_cases_get_a_heat_map_grouped_by_axis():
    res = axes_run()
    hm = report.view_model(res)["heatmap"]
    assert hm["axes"] == ["dtype", "causal"]
    assert hm["columns"] == [("2.0", "fwd")] and hm["common"] == "H4 D32"
    assert [g["name"] for g in hm["groups"]] == ["fp16 · non-causal", "fp16 · causal", "bf16 · non-causal", "bf16 · causal"]
    assert [r["shape"] for r in hm["groups"][0]["rows"]] == ["B2 S64", "B2 S256", "B64 S64", "B64 S256"]
    bf16 = [r["cells"][0] for g in hm["groups"][2:] for r in g["rows"]]
    assert all(c["ratio"] == pytest.approx(1.5, rel=0.03) and c["verdict"] == "slower" for c in bf16)
    assert bf16[0]["bg"] == report.ratio_color(bf16[0]["ratio"]) and bf16[0]["bg"].startswith("rgba(214, 39, 40, 0.")
    fp16 = [r["cells"][0] for g in hm["groups"][:2] for r in g["rows"]]
    assert all(c["ratio"] == pytest.approx(1.0, rel=0.03) for c in fp16)
    assert report.ratio_color(0.5) == "rgba(44, 160, 44, 0.80)" and report.ratio_color(1.0).endswith("0.08)")
    page = assert_self_contained(report.render_html(res, with_charts=False))
    assert "heatmap" in page.ids
    cells = [(a, t) for a, t in page.cells if a.get("class") == "hm"]
    assert len(cells) == 16
    assert [float(a["data-ratio"]) for a, _ in cells[8:]] == pytest.approx([1.5] * 8, rel=0.03)
    assert cells[8][1].startswith("1.5") and cells[8][1].endswith("x ▲")
    groups = [t for a, t in page.cells if a.get("class") == "group"]
    assert groups == ["fp16 · non-causal", "fp16 · causal", "bf16 · non-causal", "bf16 · causal"]
    # a run of few cases has no heat map (the verdict table is the overview)
    assert report.view_model(gpu_run())["heatmap"] is None
    assert 'id="heatmap"' not in report.render_html(gpu_run(), with_charts=False)


# --------------------------------------------------------------------------------------------
# the terminal table in 80 columns (a narrow terminal, a pipe, a CI log)
def _terminal(res: dict, width: int) -> list[str]:
    from rich.console import Console

    con = Console(record=True, width=width, color_system=None)
    report.terminal_table(res, con)
    return con.export_text().splitlines()


def _row(lines: list[str], start: str) -> str:
    """The table row of a case (``B2 S300 bwd``), whitespace collapsed (not a headline naming it)."""
    (hit,) = [" ".join(ln.split()) for ln in lines if re.match(re.escape(start) + r" (\d|wall)", " ".join(ln.split()))]
    return hit


def test_terminal_table_fits_80_columns_with_one_line_per_case(h200):
    lines = _terminal(h200, 80)
    assert max(map(len, lines)) <= 80
    # the µs difference (new-user trial: only the HTML details had it): its point where the interval
    # does not fit 80 columns, the fixture's own delta_us
    b2 = next(c for c in h200["comparisons"] if c["metric"] == "wall_us" and c["label"] == "B2 S300 H16 D16"
              and c["op"] == "bwd")
    assert 194.5 < b2["delta_us"] < 195.5
    assert _row(lines, "B2 S300 bwd") == "B2 S300 bwd 175 371 slower 2.11x [1.13, 2.56] · host +195"
    assert _row(lines, "B512 S150 fwd") == "B512 S150 fwd 557 550 same 0.99x [0.97, 1.02] -7.08"
    assert _row(lines, "case op") == "case op wall µs wall µs wall ratio [95% CI] µs"
    assert any(ln.startswith("Δ wall µs: candidate minus baseline wall time, µs per call, paired like the") for ln in lines)
    assert any("every case: H16 D16 · fp16" in ln for ln in lines[:3])
    # wide: every clock per env, still one line per case
    wide = _terminal(h200, 200)
    assert _row(wide, "B2 S300 bwd") == ("B2 S300 bwd 175 / 174 / 18.0 HB 371 / 215 / 18.0 HB slower 2.11x [1.13, 2.56] · host "
                                         f"{report.fmt_delta(b2)}")
    assert report.fmt_delta(b2).startswith("+195 [+")
    assert any(ln.startswith("HB: host-bound") for ln in wide)


def test_terminal_table_of_three_versions_is_one_block_per_candidate():
    cases = []
    for i, (op, b, s) in enumerate([("fwd", 2, 64), ("fwd", 64, 256), ("bwd", 2, 64)]):
        for lab, extra in (("2.6.3", 0.0), ("2.7.0.post2", 60.0), ("2.8.3", 0.0)):
            cases.append(make_case(lab, op, b, s, 45.0 + extra, 35.0 + extra, 5.0, seed=i * 10 + len(lab)))
    run = make_results([env("2.6.3"), env("2.7.0.post2"), env("2.8.3")], cases)
    lines = _terminal(run, 80)
    assert max(map(len, lines)) <= 80
    heads = [" ".join(ln.split()) for ln in lines if " ".join(ln.split()).endswith("vs 2.6.3 Δ wall")]
    assert heads == ["2.6.3 2.7.0.post2 2.7.0.post2 vs 2.6.3 Δ wall", "2.6.3 2.8.3 2.8.3 vs 2.6.3 Δ wall"]
    rows = [" ".join(ln.split()) for ln in lines if " ".join(ln.split()).startswith("B2 S64 fwd 4")]
    # each case on one line: both envs' wall µs, the verdict, ratio and interval
    # and the µs difference (+60 planted; 0 for the one like the baseline)
    assert [r.rsplit(" ", 1)[0] for r in rows] == ["B2 S64 fwd 44.9 105 slower 2.34x [2.31, 2.36] · host",
                                                  "B2 S64 fwd 44.9 44.9 same 1.00x [1.00, 1.00]"]
    assert 59 < float(rows[0].rsplit(" ", 1)[1]) < 61 and abs(float(rows[1].rsplit(" ", 1)[1])) < 1


def test_report_cli_output_fits_80_columns_when_not_a_tty(tmp_path):
    import os
    import subprocess
    import sys

    e = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    cp = subprocess.run([sys.executable, "-m", "matrix_runner", "report", str(H200), "-o", str(tmp_path / "r")],
                        capture_output=True, text=True, env=e, cwd=ROOT, timeout=300)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    assert max(map(len, lines)) <= 80
    assert _row(lines, "B2 S50 fwd") == "B2 S50 fwd 73.0 86.4 slower 1.18x [1.01, 3.11] · host +13.4"


def test_a_long_case_label_wraps_at_80_columns_and_the_numbers_stay_whole(h200):
    """Second new-user trial: with varlen / paged kvcache labels of ~60 characters, the case column
    kept its width at 80 columns and every number and verdict folded a character a line."""
    from rich.console import Console

    long = copy.deepcopy(h200)
    for i, c in enumerate(long["cases"]):
        n = i // 2  # (both envs' records of a case: one label)
        c["label"] = f"kvcache {c['label']} causal cache {8000 + n} +append paged {256 * (n + 1)} L{n}-48 (sum {64 + n})"
    con = Console(record=True, width=80, color_system=None)
    report.terminal_table(long, con)
    lines = con.export_text().splitlines()
    assert max(map(len, lines)) <= 80
    # each case's row holds its op, both µs and its verdict with the ratio, unbroken (the label wraps)
    rows = [ln for ln in lines if re.search(r" (fwd|bwd) ", ln)]
    assert len(rows) == 12, lines
    assert all(re.search(r" (fwd|bwd)\s+[\d,.]+\s+[\d,.]+\s+(slower|ambiguous|same|faster) \d\.\d\dx \[", ln) for ln in rows), lines


def test_compare_table_fits_80_columns_one_block_per_env(h200):
    from rich.console import Console

    b = _scaled(h200, "2.7.0.post2", {"wall_us": 2.0, "host_us": 2.0})
    cmp = report.compare_runs(h200, b)
    con = Console(record=True, width=80, color_system=None)
    report.compare_terminal(cmp, con)
    lines = con.export_text().splitlines()
    assert max(map(len, lines)) <= 80
    blocks = [ln.strip() for ln in lines if ln.strip() in ("2.6.3", "2.7.0.post2")]
    assert blocks == ["2.6.3", "2.7.0.post2"]
    rows = [" ".join(ln.split()) for ln in lines if " ".join(ln.split()).startswith("B512 S150 fwd ")]
    assert rows == ["B512 S150 fwd 557 557 1.00x provisional; kernel 1.00x same",
                    "B512 S150 fwd 550 1,100 2.00x provisional; kernel 1.00x same"]
    wide = Console(record=True, width=250, color_system=None)
    report.compare_terminal(cmp, wide)
    assert any(" ".join(ln.split()) == "2.7.0.post2 B512 S150 fwd 550 1,100 2.00x provisional 2.00x 1.00x [1.00, "
               "1.00] same" for ln in wide.export_text().splitlines()), wide.export_text()


def test_sweep_groups_keep_axes_apart_and_say_which_is_which():
    from matrix_runner import charts

    rows = []
    for impl in ("flash_attn", "sdpa"):
        for dt in ("fp16", "bf16"):
            for s in (64, 128, 256):
                rows.append({"label": f"B2 S{s} H4 D32", "case": {
                    "op": "fwd", "batch": 2, "seqlen_q": s, "seqlen_k": s, "nheads": 4, "nheads_k": 4, "head_dim": 32,
                    "dtype": dt, "causal": False, "dropout_p": 0.0, "impl": impl}})
    groups = charts.sweep_groups(rows, "seqlen")
    assert [(g["title"], g["x"]) for g in groups] == [
        ("fwd · B2 · fp16", [64, 128, 256]), ("fwd · B2 · bf16", [64, 128, 256]),
        ("fwd · B2 [sdpa] · fp16", [64, 128, 256]), ("fwd · B2 [sdpa] · bf16", [64, 128, 256])]
    assert all(len({r["case"]["impl"] for r in g["rows"]}) == 1 for g in groups)


def test_ratio_definition_names_the_results_method_even_before_anything_was_compared():
    """A lockstep run interrupted in its first set has no comparison yet: its report must still
    describe the lockstep method (new-user trial: it described results/1's bootstrap)."""
    from matrix_runner.report import ratio_definition
    text = ratio_definition([], "lockstep-sets/anytime-t-cs/1")
    assert "anytime-valid confidence sequence" in text and "bootstrap" not in text
    assert "all the wall-time verdicts" in text
    assert "bootstrap" in ratio_definition([], None)  # results/1 without a method: as before
    text = ratio_definition([], "lockstep-sets/anytime-t-cs/2")
    assert "anytime-valid confidence sequence" in text and "e-BY" in text and "1 - 5%·k/m" in text


def test_ratio_definition_states_the_levels_each_kind_of_verdict_was_shown_at():
    """results/2 method "/2": the report names the e-BY levels the run's wall comparisons carry (9
    slower at 1 - 0.05·9/12, 1 same and 2 ambiguous at 1 - 0.05/12); a "/1" run keeps Bonferroni's text."""
    from matrix_runner.report import ratio_definition
    base = {"metric": "wall_us", "ci_method": stats.SET_METHOD, "family_size": 12, "family_alpha": 0.05}
    wall = ([dict(base, selection="faster/slower", alpha=0.05 * 9 / 12)] * 9 + [dict(base, selection=None, alpha=0.05 / 12)] * 3)
    wall[9] = dict(base, selection="same", alpha=0.05 / 12)
    text = ratio_definition(wall, "lockstep-sets/anytime-t-cs/2")
    assert "the 9 called faster or slower at 96.25%, the one called the same and the other 2 at 99.58%" in text
    assert "12 wall-time comparisons" in text
    old = ratio_definition([dict(base, alpha=0.05 / 12)] * 12, "lockstep-sets/anytime-t-cs/1")
    assert "at 99.58% per comparison" in old and "e-BY" not in old
    # the column label and the note under the table (new-user trial: every interval was labelled 95% CI)
    assert report.ci_head(wall) == "[CI, levels below]" and report.ci_head(wall, quick=True) == "(provisional)"
    # one "same" is at Bonferroni's level, as the ambiguous ones are: said once (new-user trial:
    # "the one called the same at 98.75%, the other one at 98.75%")
    assert report.level_note(wall).endswith("the 9 called faster or slower at 96.25%, the one called the same "
                                            "and the other 2 at 99.58%")
    alike = [dict(base, selection="faster/slower", alpha=0.05)] * 12
    assert report.ci_head(alike) == "[95% CI]" and report.level_note(alike) == ""
    assert report.ci_head([dict(base, alpha=0.05 / 12)] * 12) == "[99.58% CI]"
    # an alpha of 2.5 % is written as such (it was rounded to "2%"), levels to 0.01 %
    quarter = [dict(c, family_alpha=0.025, alpha=c["alpha"] / 2) for c in wall]
    text = ratio_definition(quarter, "lockstep-sets/anytime-t-cs/2")
    assert "1 - 2.5%·k/12" in text and "at <= 2.5%" in text and "at 98.12%" in text
    # a --quick run (one set): no level is described, the ratios are provisional
    prov = [dict(base, verdict="provisional", selection=None, alpha=0.05 / 12)] * 12
    text = ratio_definition(prov, "lockstep-sets/anytime-t-cs/2")
    assert "provisional" in text and "e-BY" not in text and "%" not in text
    # method /4 says what the glitch guard left out (wall and host turns); /1-/3 had no guard
    guarded = [dict(c, dropped_cycles=1) for c in wall] + [dict(base, metric="host_us", dropped_cycles=2)]
    text = ratio_definition(guarded, "lockstep-sets/anytime-t-cs/4")
    assert "left out as a stall" in text and "14 of the run's wall and host turns" in text
    assert "a turn whose ratio" in text
    # method /5: only in pinned sets (an unpinned set's turns spread too widely for the guard)
    assert "a turn of a pinned set whose ratio" in ratio_definition(guarded, "lockstep-sets/anytime-t-cs/5")
    assert "stall" not in ratio_definition(guarded, "lockstep-sets/anytime-t-cs/3")


def test_short_labels_keep_a_parenthesized_group_whole():
    """New-user trial: varlen labels lost half of "(sum 9128)" to the shared title ("(sum · bf16")."""
    from matrix_runner.report import short_labels
    cs = [{"id": "a", "label": "varlen B8 S4096 H16 D128 L64-4096 (sum 9128)", "dtype": "bf16", "op": "fwd"},
          {"id": "b", "label": "varlen B8 S2877 H28/4 D128 L1141-2877 (sum 16424)", "dtype": "bf16", "op": "fwd"}]
    short, common = short_labels(cs)
    assert short == {"a": "S4096 H16 L64-4096 (sum 9128)", "b": "S2877 H28/4 L1141-2877 (sum 16424)"}
    assert common == "varlen B8 D128 · bf16"


# --------------------------------------------------------------------------------------------
# the SDPA control: the same torch in every env, so a verdict on it is a measurement problem
SDPA_WARNING = "the SDPA control differs between envs that run the same torch: treat this run's verdicts with care"


def _sdpa_run() -> dict:
    """flash_attn cases equal in both envs; the SDPA control case 2x slower in the candidate."""
    cases = []
    for i, (impl, s) in enumerate([("flash_attn", 64), ("flash_attn", 256), ("sdpa", 64)]):
        for lab, wall in (("1.0", 100.0), ("2.0", 200.0 if impl == "sdpa" else 100.0)):
            c = make_case(lab, "fwd", 2, s, wall, 50.0, 40.0, seed=i * 7 + (lab == "2.0"))
            c["impl"] = impl
            if impl == "sdpa":
                c["id"] += "-sdpa"
                c["label"] += " sdpa"
            cases.append(c)
    return make_results([env("1.0"), env("2.0")], cases)


def test_sdpa_control_verdict_is_not_a_finding_and_warns_everywhere(tmp_path):
    from html import unescape

    from rich.console import Console

    res = _sdpa_run()
    sdpa = [c for c in res["comparisons"] if c["metric"] == "wall_us" and c["impl"] == "sdpa"]
    assert sdpa and sdpa[0]["verdict"] == "slower"  # the planted control difference is found...
    (s,) = report.view_model(res)["summaries"]
    assert s["counts"]["slower"] == 0 and s["counts"]["faster"] == 0  # ...but never counted as a finding
    assert "slower in" not in s["text"] and s["cls"] != "slower", s["text"]
    assert SDPA_WARNING in s["text"], s["text"]
    con = Console(record=True, width=200, color_system=None)
    report.terminal_table(res, con)
    assert SDPA_WARNING in " ".join(con.export_text().split())
    html = report.write_html(res, tmp_path, None).read_text()
    assert SDPA_WARNING in " ".join(unescape(html).split())
    assert SDPA_WARNING in " ".join(unescape(report.markdown(res)).split())
    # matrix-run compare A B: the same
    cmp = report.compare_runs(_sdpa_run() | {"cases": [c for c in res["cases"] if c["env"] == "1.0"]},
                              {**res, "cases": [dict(c, env="1.0") for c in res["cases"] if c["env"] == "2.0"],
                               "envs": [env("1.0")]})
    (cs,) = cmp["summaries"]
    # between runs the wall ratios, the control's too, are provisional: no verdict to warn of
    assert cs["counts"]["slower"] == 0 and SDPA_WARNING not in cs["text"], cs["text"]
    assert {r["wall"]["verdict"] for r in cmp["rows"]} == {"provisional"}


def test_sdpa_control_that_agrees_gives_no_warning():
    res = _sdpa_run()
    for c in res["cases"]:
        if c["env"] == "2.0" and c["impl"] == "sdpa":
            c["metrics"] = next(x for x in res["cases"] if x["env"] == "1.0" and x["id"] == c["id"])["metrics"]
    res["comparisons"] = results.comparisons(res["cases"], ["1.0", "2.0"], 0.05)
    (s,) = report.view_model(res)["summaries"]
    assert SDPA_WARNING not in s["text"]


def test_a_version_by_torch_matrix_is_compared_within_each_torch_and_each_version():
    # 2 versions x 2 torches; version 2.0 pays +60 µs on every torch, torch 2.5.1 adds +30 µs to both
    wall = {("1.0", "inherit"): 100.0, ("2.0", "inherit"): 160.0, ("1.0", "2.5.1"): 130.0, ("2.0", "2.5.1"): 190.0}
    envs, cases = [], []
    for (v, t), us in wall.items():
        lab = f"{v}+torch{'-inherit' if t == 'inherit' else t}"
        envs.append({**env(lab, version=v), "axis": {"version": v, "torch": t}})
    envs.sort(key=lambda e: (e["axis"]["version"], e["axis"]["torch"] != "inherit"))
    for i, e in enumerate(envs):
        us = wall[(e["axis"]["version"], e["axis"]["torch"])]
        cases.append(make_case(e["label"], "fwd", 2, 64, us, us - 5, None, seed=i))
    run = make_results(envs, cases, device="cpu")
    run["comparisons"] = results.comparisons(cases, [e["label"] for e in envs], 0.05, pairs=results.env_pairs(envs))
    got = {(c["baseline"], c["candidate"]): c for c in run["comparisons"] if c["metric"] == "wall_us"}
    # versions within each torch, torches within each version; never a version and a torch at once
    assert list(got) == [("1.0+torch-inherit", "2.0+torch-inherit"), ("1.0+torch2.5.1", "2.0+torch2.5.1"),
                         ("1.0+torch-inherit", "1.0+torch2.5.1"), ("2.0+torch-inherit", "2.0+torch2.5.1")]
    assert got[("1.0+torch-inherit", "2.0+torch-inherit")]["ratio"] == pytest.approx(1.6, rel=0.03)
    assert got[("1.0+torch2.5.1", "2.0+torch2.5.1")]["ratio"] == pytest.approx(190 / 130, rel=0.03)
    assert got[("2.0+torch-inherit", "2.0+torch2.5.1")]["ratio"] == pytest.approx(190 / 160, rel=0.03)
    vm = report.view_model(run)
    assert vm["one_base"] is False and vm["candidates"] == [f"{k} vs {b}" for b, k in got]
    (row,) = vm["rows"]
    assert [(c["baseline"], c["candidate"]) for c in row["comps"]] == list(got)
    assert [s["text"].split(":")[0] for s in vm["summaries"]] == [f"{k} vs {b}" for b, k in got]
    html = report.render_html(run)
    page = assert_self_contained(html)
    table = html[html.index('class="verdict-table"'):html.index("</thead>")]
    for b, k in got:
        assert f"{k} vs {b}" in table
    assert "1.0+torch2.5.1 vs 1.0+torch-inherit" in report.markdown(run)
    from rich.console import Console

    for width in (200, 80):  # the full table, or one block per comparison in 80 columns
        con = Console(record=True, width=width)
        report.terminal_table(run, con)
        text = con.export_text()
        assert all(f"{k} vs {b}" in " ".join(text.split()) for b, k in got), text
    assert page.find(data_candidate="2.0+torch2.5.1")


def test_an_archived_run_is_read_published_and_compared_like_a_plain_one(tmp_path):
    """Superseded committed runs are kept as results.json.gz + index.html.gz (reports/README.md):
    load, compare, report and publish take them as they take results.json; a cut-short archive is a
    one-line error naming the file."""
    import gzip

    from matrix_runner import publish

    plain = results.load(H200_DIR)  # a directory: its results.json
    arch = tmp_path / "reports" / "archived"
    arch.mkdir(parents=True)
    raw = (H200_DIR / "results.json").read_bytes()
    (arch / "results.json.gz").write_bytes(gzip.compress(raw))
    (arch / "index.html.gz").write_bytes(gzip.compress((H200_DIR / "index.html").read_bytes()))
    assert results.find(arch) == arch / "results.json.gz"
    assert results.load(arch) == plain and results.load(arch / "results.json.gz") == plain
    # a path written before the run was archived (RUN/results.json) reads the archive beside it
    assert results.find(arch / "results.json") == arch / "results.json.gz"
    assert json.loads(results.read_text(arch / "results.json")) == plain
    out = publish.build_site(tmp_path / "reports", tmp_path / "site")
    assert [r["name"] for r in out["runs"]] == ["archived"] and not out["warnings"]
    assert (tmp_path / "site" / "archived" / "results.json").read_bytes() == raw
    assert (tmp_path / "site" / "archived" / "index.html").read_bytes() == (H200_DIR / "index.html").read_bytes()
    cp = run_cli("compare", str(H200_DIR), str(arch))
    assert cp.returncode == 0, cp.stderr
    assert "2.7.0.post2" in cp.stdout
    # re-rendered in its own directory: the report links the archive, no plain copy is written
    # (before, `report RUN -o RUN` found no run at all: IndexError)
    cp = run_cli("report", str(arch), "-o", str(arch))
    assert cp.returncode == 0, cp.stderr
    # ... and its report stays archived: index.html.gz rewritten, no plain index.html beside it
    # (new-user trial: a plain one appeared beside the older .gz)
    html = gzip.decompress((arch / "index.html.gz").read_bytes()).decode()
    assert 'href="results.json.gz"' in html and not (arch / "results.json").exists()
    assert not (arch / "index.html").exists()
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "results.json.gz").write_bytes(gzip.compress(raw)[:5000])
    with pytest.raises(results.ResultsError) as ei:
        results.load(tmp_path / "cut")
    # a user's own run is in no git: "restore it from git" was the wrong advice (new-user trial 2026-12-04)
    assert str(ei.value) == (f"{tmp_path / 'cut' / 'results.json.gz'}: the compressed file is cut short (damaged): "
                             "run that run again, or restore the file from a copy (from git if it is a committed run)")


def test_a_provisional_ratio_of_one_process_set_shows_no_interval_and_the_terminal_keeps_the_text():
    """One process set per side (--quick, or compare of one-set runs): an interval from that process's
    own samples would ignore the process-to-process spread, so none is shown; the note is not rich
    markup (a bracketed "[unbounded: ...]" was swallowed as a style tag)."""
    import io

    from rich.console import Console

    one = {"ratio": 0.93, "ci_low": 0.85, "ci_high": 1.08, "verdict": "provisional", "within_process_only": True}
    assert report.fmt_ratio(one) == "0.93x (no interval: one process set)"
    assert report.fmt_ci({"ratio": 1.1, "ci_low": 0.0, "ci_high": float("inf"), "verdict": "ambiguous"}) == \
        "(unbounded: too few sets)"
    assert report.fmt_ci({"ratio": 1.1, "ci_low": 1.02, "ci_high": 1.2, "verdict": "slower"}) == "[1.02, 1.20]"
    a, b = results.load(ROOT / "reports/h200-aa-quick-2"), results.load(ROOT / "reports/h200-aa-quick-3")
    buf = io.StringIO()
    report.compare_terminal(report.compare_runs(a, b), Console(file=buf, width=80))
    out = buf.getvalue()
    assert "(no interval: one process set)" in out and "provisional" in out, out


def test_compare_pairs_a_plain_run_with_the_same_torch_env_of_a_torch_axis_run():
    """A plain run (2.6.3 on the driver's torch) against a version x torch run: the version names two
    envs in B, so the pair is found by (version, torch); an A/A run still pairs nothing by version."""
    def env(label, version, torch):
        return {"label": label, "status": "ok", "flash_attn_version": version, "torch": torch}

    a = {"envs": [env("2.6.3", "2.6.3", "2.11.0+cu130"), env("2.7.0.post2", "2.7.0.post2", "2.11.0+cu130")]}
    b = {"envs": [env("2.6.3+torch-inherit", "2.6.3", "2.11.0+cu130"), env("2.6.3+torch2.5.1", "2.6.3", "2.5.1+cu124"),
                  env("2.7.0.post2+torch-inherit", "2.7.0.post2", "2.11.0+cu130"),
                  env("2.7.0.post2+torch2.5.1", "2.7.0.post2", "2.5.1+cu124")]}
    assert report.pair_envs(a, b) == [("2.6.3", "2.6.3+torch-inherit"), ("2.7.0.post2", "2.7.0.post2+torch-inherit")]
    assert report.pair_envs(b, a) == [("2.6.3+torch-inherit", "2.6.3"), ("2.7.0.post2+torch-inherit", "2.7.0.post2")]
    aa = {"envs": [env("a", "2.6.3", "2.11.0+cu130"), env("b", "2.6.3", "2.11.0+cu130")]}
    assert report.pair_envs(aa, a) == []
    # a label match comes first; version alone where it names one env on each side
    assert report.pair_envs(a, {"envs": [env("2.6.3", "2.6.3", "2.5.1"), env("x", "2.7.0.post2", "2.5.1")]}) == \
        [("2.6.3", "2.6.3"), ("2.7.0.post2", "x")]


def test_version_by_torch_labels_wrap_at_their_axis_in_80_columns():
    """80-column terminal: "2.7.0.post2+torch-inherit" wrapped mid-word ("…torch-i" / "nherit")."""
    import io

    from rich.console import Console

    doc = results.load(ROOT / "reports/h200-2.6.3-vs-2.7.0.post2-w1")
    doc = json.loads(json.dumps(doc).replace('"2.7.0.post2"', '"2.7.0.post2+torch-inherit"')
                     .replace('"2.6.3"', '"2.6.3+torch-inherit"'))
    buf = io.StringIO()
    report.terminal_table(doc, Console(file=buf, width=80))
    out = buf.getvalue()
    assert out.count("+torch-inherit") >= 3 and "torch-i\n" not in out.replace(" ", ""), out[:1200]


def test_first_call_ms_is_summarized_and_survives_a_resume():
    """results.first_call_record: first set's median (a JIT subject compiles there), later sets'
    median (warm cost), processes; a resumed run reads it back per set (runner.case_data_from_record)."""
    from matrix_runner import runner
    from matrix_runner.config import parse_config

    case = parse_config({}).cases[0]
    cd = runner.CaseData("fa4", case)
    cd.first_call = {0: [28000.0, 15000.0, 9000.0], 1: [310.0, 290.0], 2: [300.0]}
    rec = json.loads(json.dumps(results.case_record(cd, case)))
    fc = rec["first_call_ms"]
    assert (fc["first_set_median"], fc["later_median"], fc["n"]) == (15000.0, 300.0, 6)
    assert fc["by_set"] == {"0": [28000.0, 15000.0, 9000.0], "1": [310.0, 290.0], "2": [300.0]}
    assert runner.case_data_from_record(rec, case).first_call == cd.first_call
    assert results.first_call_record({}) is None


def test_compare_of_a_run_with_itself_warns_that_its_ratios_are_1_by_construction(tmp_path):
    cp = run_cli("compare", str(H200), str(H200), "-o", str(tmp_path / "c"), "--markdown", str(tmp_path / "c.md"))
    assert cp.returncode == 0, cp.stderr
    assert "warning: A and B are the same run" in cp.stderr and "not a measured A/A" in cp.stderr
    # the warnings are in the HTML and the Markdown too (new-user trial: the terminal only)
    assert "A and B are the same run" in (tmp_path / "c" / "index.html").read_text()
    md = (tmp_path / "c.md").read_text()
    assert "> **warning:** A and B are the same run" in md and "&#x27;" not in md


def test_compare_of_a_copy_resumed_apart_says_which_sets_they_share():
    """Same run id, different sets (a copy of an interrupted run resumed beside the original): not "1 by
    construction" (new-user trial: each side had 7 sets of its own)."""
    from matrix_runner import commands
    a = results.load(ROOT / "reports" / "h200-aa-96")
    b = {**a, "sets": a["sets"][:3] + [{**s, "cycles": (s.get("cycles") or 0) + 1} for s in a["sets"][3:]]}
    (why, *_) = commands.compare_warnings(a, b, "A/results.json", "B/results.json")
    assert why.startswith(f"A and B share a run id ({a['run_id']}: A/results.json and B/results.json): one is a copy")
    assert "their first 3 process set(s) are the same measurements" in why
    c = {**a, "sets": [{**s, "cycles": (s.get("cycles") or 0) + 1} for s in a["sets"]]}
    assert commands.compare_warnings(a, c, "A", "B")[0].endswith("resumed or edited apart; they share no process set")
    d = {**a, "sets": [{**a["sets"][0], "cycles": -1}] + a["sets"][1:]}  # the first differs: none shared, from the start
    assert "they share no process set" in commands.compare_warnings(a, d, "A", "B")[0]
    assert commands.compare_warnings(a, a, "x", "x")[0].startswith("A and B are the same run")


def test_a_one_set_run_says_one_process_set(tmp_path):
    doc = results.load(ROOT / "reports/h200-aa-quick-3")
    assert len(doc["sets"]) == 1
    html = report.write_html(doc, tmp_path).read_text()
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    w = doc["settings"]["workers_per_env"]
    assert f"(1 process set of {w} worker(s) per version;" in text and "1 process sets" not in text
    # its Markdown legend speaks of no interval: a --quick ratio has none (new-user trial)
    md = report.markdown(doc)
    assert "provisional" in md and "the interval at the ratio's level" not in md
    assert "the interval at the ratio's level" in report.markdown(results.load(ROOT / "reports/h200-aa-117"))


def test_terminal_cells_of_cases_not_timed_or_failed_are_not_cut_mid_word(h200):
    """A case the run did not time says so in a short phrase (the stop reason follows the table);
    a long error is cut at a word and marked (new-user trial: every cell ended '(sampling stopped
    first: the')."""
    import io

    from rich.console import Console

    res = copy.deepcopy(h200)
    a, b = [c for c in res["cases"] if c["label"] == "B2 S300 H16 D16" and c["op"] == "fwd"]
    a.update(status="not run", error_kind="not-run", error="not timed: no process set timed this case (sampling "
             "stopped first: the time budget or max_sets ran out, or a fault ended the set)")
    b.update(status="error", error_kind="crash", error="set 0: the worker exited with signal SIGSEGV while "
             "timing the backward pass of this case in its second burst")
    for c in res["cases"]:  # a case neither env timed: the run stopped first
        if c["label"] == "B2 S150 H16 D16" and c["op"] == "fwd":
            c.update(status="not run", error_kind="not-run", error=a["error"])
    out = io.StringIO()
    report.terminal_table(res, Console(file=out, width=200))
    text = out.getvalue()
    assert "not timed: the run stopped first" in text and "(sampling stopped first: the" not in text
    # where the other env failed the case, that is why (new-user trial: "the run stopped first" there too)
    assert f"not timed: it failed in {b['env']}" in text
    assert "not-run" not in text  # the kind said once, in words (new-user trial: "not-run: not timed: ...")
    assert "crash: the worker exited with signal SIGSEGV while timing the…" in text


def test_kvcache_gbps_is_in_the_terminal_and_markdown_tables(tmp_path):
    """New-user trial: the decode figure (GB/s of KV read) was only in the HTML's case detail."""
    import io

    from rich.console import Console

    res = results.load(ROOT / "reports/h200-kvcache-decode-2.6.3-2.7.0.post2-2.8.3")
    paged = next(c for c in res["cases"] if c.get("page_block_size") and c["env"] == "2.8.3")
    g = paged["gbps"]["device"]
    assert 3900 < g < 4100  # 2.8.3's paged decode on the H200: ~3,977 GB/s of KV read
    out = io.StringIO()
    report.terminal_table(res, Console(file=out, width=220))
    text = out.getvalue()
    assert f"· {g:,.0f} GB/s" in text and "GB/s: KV cache read per second at the kernel (device) time" in text
    md = report.markdown(res)
    assert f"{report.fmt_us(paged['metrics']['wall_us']['median'])} ({g:,.0f} GB/s)" in md
    assert "GB/s" not in report.markdown(results.load(H200_DIR))  # not for the other entry points


def test_cpu_steal_is_shown_per_set_and_warned_about_from_five_percent():
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-02-eby-5")  # archived: .gz
    assert report.steal_note(res["sets"]) == ""  # recorded before steal was: no column values, no warning
    html = report.render_html(res)
    assert "CPU steal:" not in html and html.count('<td class="">–</td>') == len(res["sets"])
    for r, v in zip(res["sets"], [0.0, 0.012, 0.31, 0.07] + [0.0] * 20):
        r["steal"] = v
    note = report.steal_note(res["sets"])
    assert note.startswith("CPU steal: the hypervisor took up to 31% of the time on a set core (≥ 5% in 2 of 11 sets")
    html = report.render_html(res)
    assert f'<p class="small err">{note}.</p>' in html
    assert '<td class="err">31%</td>' in html and '<td class="">1%</td>' in html
    assert f"**Warning:** {note}." in report.markdown(res)


def test_the_readme_headline_table_is_what_the_tool_prints_for_the_run_it_names():
    """README's first table quotes a committed H200 run: its µs (report.fmt_us of each case's wall
    median, as the terminal table prints them) and its verdicts must be that run's (a new-user
    trial found four rows' µs from an older way of pooling)."""
    from matrix_runner import report as rp
    text = (ROOT / "README.md").read_text()
    run = re.search(r"the newest run(?: at that budget)?, `(reports/[^`]+)/`", text).group(1)
    res = results.load(ROOT / run)
    labels = [e["label"] for e in res["envs"]]
    by = {(c["label"], c["op"], c["env"]): c for c in res["cases"]}
    cmp = {(c["case"], c["metric"]): c for c in res["comparisons"]}
    rows = re.findall(r"^\| (B\d+ S\d+ H\d+ D\d+) \| (fwd|bwd) \| ([\d.,]+) \| ([\d.,]+) \| (\w+) ([\d.]+)x "
                      r"\[([\d.]+), ([\d.]+)\]", text, re.M)
    assert len(rows) == 12, rows
    for label, op, base_us, cand_us, verdict, ratio, lo, hi in rows:
        b, k = by[(label, op, labels[0])], by[(label, op, labels[1])]
        assert (rp.fmt_us(b["metrics"]["wall_us"]["median"]), rp.fmt_us(k["metrics"]["wall_us"]["median"])) == \
            (base_us, cand_us), (label, op)
        c = cmp[(b["id"], "wall_us")]
        assert (c["verdict"], f"{c['ratio']:.2f}", f"{c['ci_low']:.2f}", f"{c['ci_high']:.2f}") == (verdict, ratio, lo, hi)


def test_compare_warns_when_the_two_runs_saw_the_cpu_at_different_speeds():
    """Two runs of the same versions on the H200, seven minutes apart (new-user trial: `compare` called
    2.6.3 'faster, all host overhead' between them): the speed probe's medians tell the CPU's state."""
    from matrix_runner import commands
    slow = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-03-m3-4")
    fast = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-03-m3-5")
    aa = results.load(ROOT / "reports" / "h200-aa-53")
    assert round(report.probe_median_us(slow), 2) == 6.53 and round(report.probe_median_us(fast), 2) == 3.46
    (why,) = commands.machine_differences(slow, fast)
    assert why.startswith("the CPU ran at another speed") and "6.53 µs in A and 3.46 µs in B (89% apart)" in why
    assert commands.machine_differences(aa, fast) == []  # 3.55 vs 3.46 µs: the same state
    assert report.probe_median_us({"cases": []}) is None


def test_the_report_says_what_cpu_speed_the_run_met():
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-03-m3-5")
    note = report.probe_note(res)
    assert note.startswith("CPU speed: the speed probe") and "median of 3.46 µs in this run" in note
    assert note + "." in report.markdown(res)
    assert f'<p class="small muted">{note}.</p>' in report.render_html(res)
    assert report.probe_note({"cases": []}) == ""


def test_a_merged_report_gives_each_envs_probe_reading_not_one_for_this_run():
    """A merged report (results.merge, e.g. tox envs) holds runs that met different CPU states: one
    median over them all means nothing (new-user trial: it said "in this run")."""
    slow = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-03-m3-4")
    fast = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-03-m3-5")
    note = report.probe_note(results.merge([slow, fast]))
    assert "in this run" not in note
    assert ("read medians of 6.47 µs (2.6.3), 6.58 µs (2.7.0.post2), 3.44 µs (2.6.3'), 3.48 µs (2.7.0.post2') "
            "in the 2 merged runs;") in note
    assert round(report.probe_median_us(slow, "2.7.0.post2"), 2) == 6.58 and report.probe_median_us(slow, "x") is None


def test_a_cpu_hop_run_says_its_sets_followed_the_fast_cpu_and_compare_warns():
    """sampling.cpu_hop (lockstep.Hopper): a committed H200 run whose sets moved between CPUs says
    so beside its probe reading, and compare names the difference from a run that stayed."""
    from matrix_runner import commands
    hop = results.load(ROOT / "reports" / "h200-variant-cpu-hop-aa-1")
    stay = results.load(ROOT / "reports" / "h200-aa-88")
    moves = sum(s["hops"] for s in hop["sets"])
    assert moves == 267 and hop["settings"]["cpu_hop"] is True
    note = report.probe_note(hop)
    moved = sum(1 for s in hop["sets"] if s["hops"])
    assert f"; {moved} of {len(hop['sets'])} process sets moved between CPUs to follow the fast speed " \
           f"(sampling.cpu_hop: {moves} moves between cycles)" in note
    assert "cpu_hop" not in report.probe_note(stay)
    still = results.load(ROOT / "reports" / "h200-variant-cpu-hop-2.6.3-vs-2.7.0.post2-5")  # on, no move
    assert "sampling.cpu_hop was on, but none of its 25 process sets moved" in report.probe_note(still)
    assert commands.setting_differences(still, stay) == []  # both stayed on one CPU per set
    (why,) = commands.setting_differences(hop, stay)
    assert why.startswith("A's process sets moved between CPUs") and "B's stayed on one CPU each" in why
    (why,) = commands.setting_differences(stay, hop)
    assert why.startswith("B's process sets moved")
    assert commands.setting_differences(stay, stay) == []


def test_the_report_says_what_share_of_the_probe_difference_the_adjustment_counted():
    """sampling.probe_share: estimated: the sets record the share used (runner.apply_probe_share)."""
    doc = {"cases": [{"metrics": {"wall_us": {"ref_by_set": {"0": {"1": 3.8}}}}}], "settings": {"probe_share": "estimated"},
           "sets": [{"set": i} for i in range(8)] + [{"set": 8 + i, "probe_share": v} for i, v in enumerate((0.31, 0.12))]}
    note = report.probe_note(doc)
    assert "; in 2 process sets the speed adjustment counted 0.12-0.31 of each set's between-worker probe " \
           "difference, the share the earlier pinned sets' calls followed (sampling.probe_share: estimated; " \
           "the first 8 pinned sets counted all of it)" in note
    one = report.probe_note({**doc, "sets": [{"set": 8, "probe_share": 0.83}]})
    assert "; in 1 process set the speed adjustment counted 0.83 of each set's" in one  # (new-user trial: "1 process sets ... 0.83-0.83")
    two = [{"label": "a", "status": "ok"}, {"label": "b", "status": "ok"}]
    few = report.probe_note({**doc, "envs": two, "sets": [{"set": 0, "pinned": True}]})
    assert "sampling.probe_share: estimated, but no set came after 8 earlier pinned sets" in few
    # where no share could come, that reason would be false: one env, only unpinned sets, --quick (review)
    for odd in ({"envs": two[:1], "sets": [{"set": i, "pinned": True} for i in range(20)]},
                {"envs": two, "sets": [{"set": 0, "pinned": False}]},
                {"envs": two, "sets": [{"set": 0, "pinned": True}], "settings": {"probe_share": "estimated", "quick": True}}):
        assert "probe_share" not in report.probe_note({**doc, **odd}), odd
    assert "between-worker" not in report.probe_note({**doc, "settings": {}, "sets": [{"set": 0}]})
    # runs from the late evening of 2026-12-04 on record how many pinned sets came before the share (stats.PROBE_SHARE_MIN_SETS)
    now = report.probe_note({**doc, "settings": {"probe_share": "estimated", "probe_share_min_sets": 3}})
    assert "(sampling.probe_share: estimated; the first 3 pinned sets counted all of it)" in now
    capped = report.probe_note({**doc, "settings": {"probe_share": "estimated", "probe_share_min_sets": 3,
                                                    "probe_first_reach": 0.1}})
    assert "(sampling.probe_share: estimated; the first 3 pinned sets counted all of it, up to a set-wide 0.1 " \
           "in log from the workers' mean)" in capped
    assert "differed by more than" not in now
    # a set whose probe difference lay beyond stats.PROBE_SHARE_REACH times the earlier sets' largest
    held = report.probe_note({**doc, "settings": {"probe_share": "estimated", "probe_share_reach": 3.0},
                              "sets": doc["sets"] + [{"set": 10, "probe_share": 0.2, "probe_held": 1}]})
    assert "; in 1 process set the workers' probes differed by more than the adjustment counts (before a share " \
           "is estimated: 0.1 in log from their mean; after: 3x the earlier sets' largest difference), and only " \
           "that much counted (a share is not carried beyond the differences it was estimated on)" in held
    # a first set (no share yet) held too: said even where no set got a share
    first = report.probe_note({**doc, "envs": two, "sets": [{"set": 0, "pinned": True, "probe_held": 2},
                                                            {"set": 1, "pinned": True, "probe_held": 1}]})
    assert "; in 2 process sets the workers' probes differed by more than the adjustment counts" in first


def test_compare_warns_when_one_run_counted_only_part_of_its_probe_differences():
    from matrix_runner import commands
    share = results.load(ROOT / "reports" / "h200-variant-probe-share-2.6.3-vs-2.7.0.post2-1")
    full = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-04-36")
    assert min(s["probe_share"] for s in share["sets"] if "probe_share" in s) < 1
    assert "probe_share" not in full["settings"]  # made before the setting: full
    (why,) = commands.setting_differences(share, full)
    assert why.startswith("A's speed adjustment counted the share of its sets' between-worker probe differences "
                          "that earlier sets' calls followed (sampling.probe_share: estimated), B's all of them (full)")
    assert commands.setting_differences(full, full) == [] and commands.setting_differences(share, share) == []
    # the setting, not the shares: two estimated runs whose data gave different shares (even none) are alike
    ones = {**share, "sets": [{**s, "probe_share": 1.0} if "probe_share" in s else s for s in share["sets"]]}
    assert commands.setting_differences(share, ones) == []
    none = {**share, "sets": [{k: v for k, v in s.items() if k != "probe_share"} for s in share["sets"]]}
    assert commands.setting_differences(share, none) == []
    (why,) = commands.setting_differences(full, ones)
    assert why.startswith("B's speed adjustment counted the share")


def test_the_config_block_says_what_the_command_line_changed():
    """The report shows the config as read; a run with ``--time-budget 30`` over the default's 60 s
    must say so beside it (new-user trial: the block read 60 s for a 30 s run), and only for flags
    on the run's command (second trial: today's defaults had made a 3 s set of its day an "override")."""
    res = results.load(ROOT / "reports" / "h200-aa-98")
    assert report.config_overrides(res) == []  # the default config, no option: nothing changed
    assert "the command line set" not in report.render_html(res, with_charts=False)
    cut = {**res, "command": [*res["command"], "--time-budget", "30", "--min-effect=0.02"],
           "settings": {**res["settings"], "time_budget_s": 30.0, "min_effect": 0.02}}
    assert report.config_overrides(cut) == ["--min-effect 0.02 (the config: 0.05)", "--time-budget 30 (the config: 60)"]
    assert "the command line set --min-effect 0.02 (the config: 0.05), --time-budget 30 (the config: 60))" in \
        report.render_html(cut, with_charts=False)
    # a key the config does not give: the flag and the run's value alone
    bare = {**cut, "config": {k: v for k, v in res["config"].items() if k != "sampling"}}
    assert report.config_overrides(bare) == ["--min-effect 0.02", "--time-budget 30"]
    # settings unlike today's defaults but no flag on the command: nothing credited to it
    old = results.load(ROOT / "reports" / "h200-fa4-vs-2.8.3-bf16")
    assert report.config_overrides(old) == [] and "--set-seconds" not in old["command"]


def test_a_merged_reports_process_sets_name_their_run_not_the_first_runs_timing():
    """A merged report's "Process sets" had given the first run's time and stop reason for all of
    them, and set ids that restart in each run without saying whose (known since 2026-12-05)."""
    a = results.load(ROOT / "reports" / "h200-aa-97")
    b = results.load(ROOT / "reports" / "h200-aa-98")
    m = results.merge([a, b])
    assert len(m["sets"]) == len(a["sets"]) + len(b["sets"])
    assert {s["run_id"] for s in m["sets"][:len(a["sets"])]} == {a["run_id"]}
    assert {s["run_id"] for s in m["sets"][len(a["sets"]):]} == {b["run_id"]}
    assert "run_id" not in a["sets"][0]  # the runs themselves are left as they were
    html = report.render_html(m, with_charts=False)
    assert f"Merged from 2 runs ({a['run_id']}, {b['run_id']}): {len(m['sets'])} process sets in all" in html
    assert f"<td>{b['run_id']}:0</td>" in html and f"<td>{a['run_id']}:0</td>" in html
    assert "stopped: time budget" not in html.split('id="processes"')[1].split("<table>")[0]
    # a merge of that merge keeps each set's own run
    m2 = results.merge([m, results.load(ROOT / "reports" / "h200-aa-99")])
    assert [s["run_id"] for s in m2["sets"][:len(m["sets"])]] == [s["run_id"] for s in m["sets"]]
    # one run: as before
    one = report.render_html(a, with_charts=False)
    assert "Merged from" not in one and "stopped: time budget" in one


def test_the_reproduce_command_leaves_out_the_runs_own_output_and_a_resume_is_said():
    """The "Reproduce" command, copied, was refused: its --output holds the run (new-user trial); and
    a resumed run's report never said it pooled sets of several sessions."""
    res = results.load(ROOT / "reports" / "h200-aa-98")
    assert "--output" in res["command"]
    html = report.render_html(res, with_charts=False)
    repro = html.split('id="reproduce"')[1].split("</pre>")[0]
    assert "--output" not in repro and "/tmp/lk/aa-a2" not in repro and "--versions a=2.6.3,b=2.6.3" in repro
    assert "its output directory, which holds this run, and its Markdown summary" in html.replace("&#39;", "'")
    assert report.reproduce_argv(["matrix-run", "-o", "D", "--versions", "x", "--output=E", "-oF", "--quick",
                                  "--markdown", "D/s.md", "--markdown=t.md"]) == ["matrix-run", "--versions", "x", "--quick"]
    assert "Resumed (" not in html
    again = {**res, "resumed": ["2026-12-05T04:13:40+00:00"]}
    assert ("Resumed (--resume) at 2026-12-05T04:13:40+00:00: the sets of 2 sessions are pooled"
            in report.render_html(again, with_charts=False))
    # an extended run says so, in the HTML, the terminal and the Markdown (new-user trial: HTML only)
    ext = {**again, "extended": [{"at": "2026-12-05T04:13:40+00:00", "time_budget_s": [60.0, 120.0]}]}
    said = "At 2026-12-05T04:13:40+00:00 it was extended (time budget 60 → 120 s): its intervals are anytime-valid"
    assert said in report.render_html(ext, with_charts=False) and said in report.markdown(ext)
    from rich.console import Console
    con = Console(record=True, width=400, color_system=None)
    report.terminal_table(ext, con)
    text = con.export_text()
    assert said in text and "Resumed (--resume) at" in text
    assert report.resumed_note(res) == "" and "Resumed" not in report.markdown(res)


def test_delta_keeps_its_column_before_the_host_and_device_clocks_and_is_said_when_left_out():
    """The Δ column came and went as the width changed (new-user trial: at 100 columns the table
    kept host/dev and dropped Δ with no word); a console too narrow for it says where it is."""
    from rich.console import Console
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-4")
    b2 = next(c for c in res["comparisons"] if c["metric"] == "wall_us" and c["label"] == "B2 S150 H16 D16"
              and c["op"] == "fwd")
    for width in range(80, 201, 10):
        con = Console(record=True, width=width, color_system=None)
        report.terminal_table(res, con)
        text = con.export_text()
        assert max(map(len, text.splitlines())) <= width
        (row,) = [" ".join(ln.split()) for ln in text.splitlines() if " ".join(ln.split()).startswith("B2 S150 fwd ")]
        # at every width the Δ (with its interval where the layout fits it)
        assert row.endswith((report.fmt_delta(b2), " " + report.fmt_delta(b2, False))), (width, row)
        assert width < 100 or row.endswith(report.fmt_delta(b2)) or "/ 7.40 HB" in row, (width, row)
        assert "Δ wall µs: candidate minus baseline wall time" in " ".join(text.split())
    con = Console(record=True, width=60, color_system=None)
    report.terminal_table(res, con)
    assert "Δ wall µs (the difference in µs per call) does not fit this console's width" in " ".join(
        con.export_text().split())


def test_us_and_delta_formats_follow_the_rounded_value():
    """fmt_us(999.6) read "1000" beside "1,000"; fmt_delta of a tiny negative read "-0.00" (new-user trial)."""
    assert [report.fmt_us(v) for v in (999.6, 1000.4, 99.96, 9.996, 9.99, 0.001)] == \
        ["1,000", "1,000", "100", "10.0", "9.99", "0.00"]
    assert report.fmt_delta({"delta_us": -0.001}) == "0.00"
    assert report.fmt_delta({"delta_us": -0.01, "delta_ci_low": -0.2, "delta_ci_high": 0.001}) == "-0.01 [-0.20, 0.00]"


def test_one_interval_level_above_95_says_why():
    """A 2-comparison run's column head read "[97.5% CI]" with no word of why (new-user trial)."""
    cmps = [{"metric": "wall_us", "alpha": 0.025, "family_alpha": 0.05, "verdict": v} for v in ("slower", "same")]
    assert report.ci_head(cmps) == "[97.5% CI]"
    assert report.level_note(cmps) == ("every wall interval at 97.5%: e-BY holds the run's 2 wall-time verdicts "
                                       "together at 95%, so each alone is at a higher level")
    assert report.level_note([{**c, "alpha": 0.05} for c in cmps]) == ""  # at the family's level: nothing to say
    assert report.level_note([{**c, "verdict": "provisional"} for c in cmps]) == ""
    # a merge of two such runs: each run's family is its own 2 (new-user trial: "the run's 4")
    merged = [{**c, "run_id": r, "family_size": 2} for r in ("r1", "r2") for c in cmps]
    assert report.level_note(merged) == ("every wall interval at 97.5%: e-BY holds each run's wall-time verdicts "
                                         "together at 95% (runs of 2 comparisons), so each alone is at a higher level")


def test_compare_warns_when_the_runs_bursts_held_different_minimum_samples():
    from matrix_runner import commands
    a = results.load(ROOT / "reports" / "h200-aa-98")
    assert commands.setting_differences(a, a) == []
    b = {**a, "settings": {**a["settings"], "min_burst_samples": 5}}
    (why,) = commands.setting_differences(a, b)
    assert why.startswith("A's bursts held at least 1 timed sample(s), B's 5 (sampling.min_burst_samples)")
    assert commands.setting_differences(b, {**b}) == []


def test_compare_and_merge_warn_of_other_sampling_settings_in_one_line():
    """Runs differing in set_seconds, preimport, cuda_at_start (...) were merged and compared without a
    word (new-user trial); a setting one run does not record is not compared."""
    from matrix_runner import commands
    a = results.load(ROOT / "reports" / "h200-aa-98")
    st = a["settings"]
    assert st["set_seconds"] == 1.0 and st["preimport"] is True and "cuda_at_start" not in st
    b = {**a, "settings": {**st, "set_seconds": 0.5, "preimport": False, "cuda_at_start": True, "burst_ms": 5.0}}
    (why,) = commands.setting_differences(a, b)
    assert why == ("A and B were sampled differently (set_seconds A 1, B 0.5; preimport A on, B off): their ratios "
                   "and µs are not measured alike, so a difference between them may come from that as much as "
                   "from the versions")
    c = {**a, "settings": {**st, "cuda_at_start": False, "method": "lockstep-sets/anytime-t-cs/4"}}
    (why,) = commands.setting_differences(b, c)
    assert "(method A lockstep-sets/anytime-t-cs/5, B lockstep-sets/anytime-t-cs/4; set_seconds A 0.5, B 1; " \
           "preimport A off, B on; cuda_at_start A on, B off)" in why


def test_the_terminal_legend_gives_this_runs_gap_between_ratio_and_shown_medians():
    """The legend said "on the H200 by up to ~10 %" on every machine, CPU runs too (new-user trial).
    It now gives the run's own largest gap between a wall ratio (paired, at one CPU speed) and the ratio
    of the two plain medians shown beside it — recomputed here from the results."""
    from rich.console import Console
    run = results.load(ROOT / "reports" / "h200-aa-103")
    med = {(c["env"], c["id"]): c["metrics"]["wall_us"]["median"] for c in run["cases"]}
    want = max(abs(c["ratio"] / (med[(c["candidate"], c["case"])] / med[(c["baseline"], c["case"])]) - 1) * 100
               for c in run["comparisons"] if c["metric"] == "wall_us")
    assert 4.3 < want < 4.5  # B2 S300 fwd: ratio 1.01x, medians 54.5 and 52.6 µs
    con = Console(record=True, width=400, color_system=None)
    report.terminal_table(run, con)
    out = con.export_text()
    assert f"so it can differ from the ratio of the µs shown (in this run by up to {want:.1f} %)" in out
    assert "H200" not in out.split("µs: the bursts")[1].split("\n")[0]
    # no comparison with a ratio and both medians: no figure, and no stale one
    assert report.shown_gap([{"comps": [{"wall": None, "baseline": "a", "candidate": "b"}], "by_env": {}}]) is None


def test_a_rerendered_run_of_four_versions_keeps_its_family_and_verdicts():
    """``report RUN --min-effect`` at the run's own min_effect, and a merge, re-judged a run of several
    versions one candidate at a time: each a family of 12 wall comparisons instead of the run's 36, so
    e-BY's levels were lower and the four-version H200 run read 28 "slower" where it had said 26. Now a
    run's own envs are judged together, in the run's pairs, and the re-rendered run is the run."""
    run = results.load(ROOT / "reports" / "h200-four-versions-2.6.3-to-2.8.3")
    again = results.merge([run], min_effect=run["settings"]["min_effect"])

    def key(c):
        return c["baseline"], c["candidate"], c["case"], c["metric"]

    def what(c):
        return c["verdict"], c["ratio"], c["ci_low"], c["ci_high"], c.get("family_size"), c.get("alpha")

    assert [key(c) for c in again["comparisons"]] == [key(c) for c in run["comparisons"]]
    assert [what(c) for c in again["comparisons"]] == [what(c) for c in run["comparisons"]]
    wall = [c for c in again["comparisons"] if c["metric"] == "wall_us"]
    assert {c["family_size"] for c in wall} == {36} and sum(c["verdict"] == "slower" for c in wall) == 26
    # merged with another run: each run's own comparisons as that run made them, and between them the
    # other run's envs against the baseline, unpaired
    other = copy.deepcopy(run)
    other["run_id"] += "-other"
    merged = results.merge([run, other])
    n = len(run["comparisons"])
    assert [what(c) for c in merged["comparisons"][:n]] == [what(c) for c in run["comparisons"]]
    assert [what(c) for c in merged["comparisons"][-n:]] == [what(c) for c in run["comparisons"]]
    assert {c["candidate"][-1] for c in merged["comparisons"][-n:]} == {"'"}
    between = merged["comparisons"][n:-n]
    assert len(between) == 4 * 12 * 4 and all(c["paired"] is False and c["baseline"] == "2.6.3" for c in between)


def test_a_merged_reports_column_head_and_levels_cover_its_between_run_intervals():
    """New-user trial: a merged report whose runs' own intervals were all at 97.5 % headed every ratio
    column "[97.5% CI]" beside its comparisons between runs. Those are now provisional ratios without an
    interval (results.BETWEEN_RUNS_WHY), so the head and the note speak of the run's own intervals, and
    the rows between runs say they have none."""
    from rich.console import Console
    aa = results.load(ROOT / "reports" / "h200-aa-103")
    other = copy.deepcopy(aa)
    other["run_id"] += "-other"
    merged = results.merge([aa, other])
    wall = [c for c in merged["comparisons"] if c["metric"] == "wall_us"]
    within = {round(c["alpha"], 9) for c in wall if c.get("alpha") is not None}
    between = [c for c in wall if c.get("paired") is False]
    assert within and len(between) == 24  # a' and b' (the other run) against a; b against a is paired (12)
    assert all(c["verdict"] == "provisional" and c["between_runs"] and c.get("alpha") is None for c in between)
    assert report.ci_head(merged["comparisons"]) == report.ci_head(aa["comparisons"]) == "[CI, levels below]"
    note = report.level_note(merged["comparisons"])
    # both runs' own comparisons, each run one e-BY family with its own levels (second new-user trial:
    # their counts were pooled at the first run's level)
    assert note == ("interval levels (e-BY over the wall-time comparisons of each run): b vs a: the 10 called the same "
                    "at 95.83%, the other 2 at 99.58%; b' vs a': the 10 called the same at 95.83%, the other 2 at 99.58%")
    assert report.level_note(aa["comparisons"]) == ("interval levels (e-BY over the wall-time comparisons of the run): "
                                                    "the 10 called the same at 95.83%, the other 2 at 99.58%")
    con = Console(record=True, width=250)
    report.terminal_table(merged, con)
    text = " ".join(con.export_text().split())
    assert "provisional 1.00x" in text and "[95% CI]" not in text


def test_the_set_chart_shows_each_sets_ratio_so_a_machine_mode_is_visible():
    """The H200 run of 2026-12-05 18:25 UTC met a mode in which its batch-2 forward set ratios ran
    ~2.0x in some sets and ~2.9x in others (benchmarks/heavy_mode.py): the report draws every set's
    ratio per wall comparison, titled with the sets' range, so the reader sees what a ±12 % interval
    is made of."""
    from matrix_runner import charts
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-12")
    wall = [c for c in res["comparisons"] if c["metric"] == "wall_us"]
    svg = charts.set_ratio_chart(res["comparisons"])
    for c in wall:
        ys = [math.exp(v) for v in c["set_log_ratios"]]
        assert f"sets {min(ys):.2f}-{max(ys):.2f}x" in svg, c["label"]
    fwd = next(c for c in wall if c["label"] == "B2 S150 H16 D16" and c["op"] == "fwd")
    ys = sorted(math.exp(v) for v in fwd["set_log_ratios"])
    assert (round(ys[0], 2), round(ys[-1], 2)) == (1.89, 3.05)  # the two levels, 2.0x and 2.9x
    assert svg.count("process set") == 4  # the x label under the bottom row of the 3 x 4 panels
    html = report.render_html(res)
    assert 'id="chart-sets"' in html and "Sets that jump between levels" in html
    # nothing to draw: a results/1 run (no set ratios), fewer than 3 sets, a merge's unpaired rows
    assert charts.set_ratio_chart([{**fwd, "set_log_ratios": fwd["set_log_ratios"][:2], "sets": fwd["sets"][:2]}]) is None
    assert charts.set_ratio_chart([{**fwd, "paired": False}]) is None
    assert charts.set_ratio_chart([{k: v for k, v in fwd.items() if k != "set_log_ratios"}]) is None
    assert 'id="chart-sets"' not in report.render_html(results.load(H200_DIR))


def test_the_set_chart_says_when_it_leaves_comparisons_out():
    from matrix_runner import charts
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-12")
    wall = [c for c in res["comparisons"] if c["metric"] == "wall_us"]
    many = [{**c, "label": f"{c['label']} #{i}"} for i in range(3) for c in wall]  # 36 comparisons
    svg = charts.set_ratio_chart(many)
    assert "the first 24 of 36 wall comparisons" in svg and "#1" in svg and "#2" not in svg
    assert "the first" not in charts.set_ratio_chart(wall)


def test_the_set_chart_titles_carry_the_dtype_and_the_pair_where_they_differ():
    """New-user trial: a run of fp16 and bf16 had two panels titled alike; a run of several
    candidates ran its titles into each other (the pair now has a line of its own)."""
    from matrix_runner import charts
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-12")
    two = copy.deepcopy(res)
    for c in res["cases"]:
        two["cases"].append({**copy.deepcopy(c), "id": c["id"] + "-bf16", "dtype": "bf16"})
    for c in res["comparisons"]:
        two["comparisons"].append({**copy.deepcopy(c), "case": c["case"] + "-bf16"})
    svg = report.build_charts(report.view_model(two))["sets"]["svg"]
    assert svg.count("B2 S150 fp16 fwd") == 1 and svg.count("B2 S150 bf16 fwd") == 1
    wall = [c for c in res["comparisons"] if c["metric"] == "wall_us"]
    other = [{**c, "candidate": "2.8.3"} for c in wall]
    svg2 = charts.set_ratio_chart(wall[:2] + other[:2], titles={wall[0]["case"]: "B512 S50 fwd"})
    assert svg2.count("2.7.0.post2 / 2.6.3") == 2 and svg2.count("2.8.3 / 2.6.3") == 2
    assert "B512 S50 fwd" in svg2  # the report's short title where given, else the comparison's label
    assert "B512 S50 H16 D16 bwd" in svg2


def test_the_terminal_names_the_widest_intervals_and_their_sets_range():
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-12")
    vm = report.view_model(res)
    note = report.wide_note(res["comparisons"], vm["case_names"], 0.05)
    assert note.startswith("widest intervals: B2 S50 fwd ±12.0% (its 26 sets 1.87-3.13x), B2 S150 fwd ±11.9% "
                           "(its 26 sets 1.89-3.05x), B2 S300 fwd ±11.3% (its 26 sets 1.94-3.01x): the HTML")
    assert "few sets" not in note  # the sets spread wider than the interval: their own scatter
    # only intervals wider than twice min_effect: at 0.01 those over ±2 % (batch-2 backward, ...) join in
    n = sum(1 for c in res["comparisons"] if c["metric"] == "wall_us" and (report.half_width_pct(c) > 2.0 or (
        c["verdict"] == "ambiguous" and report.half_width_pct(c) > 1.0)))
    assert n > 4 and f"and {n - 3} more" in report.wide_note(res["comparisons"], vm["case_names"], 0.01)
    # FA4's seed run: 5 sets that agree, intervals to ±53 %: the width is their fewness (second new-user trial)
    fa4 = results.load(ROOT / "reports" / "h200-fa4-vs-2.8.3-seed")
    note4 = report.wide_note(fa4["comparisons"], report.view_model(fa4)["case_names"], 0.05, 5)
    assert note4.startswith("widest intervals: B2 S150 fwd ±53.3% (its 5 sets 1.35-1.48x, few sets)")
    assert note4.endswith("the sets agree but are few, so a longer --time-budget narrows the interval")
    # stopped on its max_sets, a longer budget adds nothing: the note says what does (second new-user trial)
    note5 = report.wide_note(fa4["comparisons"], report.view_model(fa4)["case_names"], 0.05, 5,
                             stopped="max_sets 5 reached", run_dir="runs/r 4")
    assert note5.endswith("the sets agree but are few: the run stopped on its max_sets, so more sets narrow the "
                          "interval: matrix-run --resume 'runs/r 4' --max-sets N")
    # an ambiguous interval wider than ±min_effect is listed, though under twice it
    amb = [{**c, "verdict": "ambiguous", "ci_low": c["ratio"] / 1.07, "ci_high": c["ratio"] * 1.07}
           for c in res["comparisons"] if c["metric"] == "wall_us" and c["op"] == "bwd"][:1]
    assert "±7.0% (its" in report.wide_note(amb, vm["case_names"], 0.05, 26)
    assert report.wide_note([{**amb[0], "verdict": "slower"}], vm["case_names"], 0.05) == ""
    hop = results.load(ROOT / "reports" / "h100-variant-hop-usual-2.6.3-vs-2.7.0.post2-1")  # cpu_state: usual
    assert "(its 11 of 25 sets 1.98-2.66x)" in report.wide_note(hop["comparisons"], report.view_model(hop)["case_names"], 0.05, 25)
    aa = results.load(ROOT / "reports" / "h200-aa-118")  # A/A, every wall interval within ±3.9 %
    assert report.wide_note(aa["comparisons"], report.view_model(aa)["case_names"], 0.05) == ""
    assert report.half_width_pct({"ratio": 2.0, "ci_low": 1.8, "ci_high": 2.1}) == pytest.approx(100 * (2 / 1.8 - 1))
    assert report.half_width_pct({"ratio": 2.0, "ci_low": 0.0, "ci_high": float("inf")}) is None


def test_report_of_a_run_where_every_env_failed_says_nothing_was_timed():
    """Second new-user trial: the terminal printed an empty table, its title wrapped a word a line."""
    import io

    from rich.console import Console
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-12")
    for e in res["envs"]:
        e["status"], e["error"] = "failed", "import failed: flash_attn_2_cuda"
    res["cases"], res["comparisons"], res["sets"] = [], [], []
    res["timing"]["stop_reason"] = "no env could be timed"
    buf = io.StringIO()
    report.terminal_table(res, Console(file=buf, width=200))
    out = buf.getvalue().splitlines()
    assert len(out) == 2 and out[0].startswith("flash-attn: small-batch host overhead")
    assert out[-1].startswith("nothing was timed in this run: 2.6.3: import failed: flash_attn_2_cuda; 2.7.0.post2:")
    assert "case" not in buf.getvalue()


def test_report_min_effect_says_the_verdicts_were_recomputed(tmp_path):
    """Second new-user trial: `report --min-effect 0.02` showed verdicts at ±2 % beside the run's own
    config and command at 0.05, with no word that they had been recomputed."""
    res = results.merge([results.load(ROOT / "reports" / "h200-aa-118")], 0.02)
    assert res["rejudged"] == {"min_effect": 0.02, "run_min_effect": 0.05}
    note = report.rejudged_note(res)
    assert note == ("Verdicts recomputed by `matrix-run report --min-effect 0.02`: \"same\" means within ±2% here, "
                    "where the run itself used ±5% (its config and command show that).")
    assert note in report.markdown(res) and "Verdicts recomputed by" in report.render_html(res)
    assert report.rejudged_note(results.load(ROOT / "reports" / "h200-aa-118")) == ""


def test_widest_intervals_of_a_merged_report_do_not_count_every_runs_sets():
    """A merge holds both runs' sets (21 + 26): "its 21 of 47 sets" had set one run's sets against both."""
    import io

    from rich.console import Console
    runs = [results.load(ROOT / "reports" / f"h200-2.6.3-vs-2.7.0.post2-12-05-{i}") for i in (11, 12)]
    buf = io.StringIO()
    report.terminal_table(results.merge(runs), Console(file=buf, width=400))
    line = next(x for x in buf.getvalue().splitlines() if x.startswith("widest intervals:"))
    assert "(its 21 sets 1.94-3.16x)" in line and " of 47" not in line


def test_the_report_names_a_machine_mode_and_the_ratios_that_moved_with_it():
    """The H200 seed run of 2026-12-05 18:25 UTC: in 16 of its 26 sets every call ran ~1.19x slower,
    which the speed probe did not read; its batch-2 forward ratios were ~2.0x in the other sets and
    ~2.7-2.8x in those (benchmarks/heavy_mode.py found the same sets from the backward µs alone)."""
    import io

    from rich.console import Console

    from matrix_runner import charts
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-12")
    vm = report.view_model(res)
    m = vm["modes"]
    assert (len(m["slow"]), len(m["usual"]), round(m["factor"], 2)) == (16, 10, 1.19)
    assert sorted(m["usual"], key=int) == ["2", "3", "4", "7", "11", "13", "20", "21", "22", "25"]
    moved = {x["name"]: (round(x["usual"], 2), round(x["slow"], 2)) for x in m["moved"]}
    assert moved == {"B512 S50 fwd": (1.19, 1.26), "B2 S50 fwd": (2.0, 2.72), "B2 S150 fwd": (1.97, 2.81),
                     "B2 S300 fwd": (2.05, 2.8)}
    # what slowed: the Python-heavy batch-2 calls most (2.7.0.post2's forward 1.78x, 2.6.3's 1.23x),
    # the kernel-bound batch-512 S300 backward hardly (1.02x)
    slowed = {(x["name"], x["env"]): round(x["factor"], 2) for x in m["per_case"]}
    assert len(slowed) == 24 and slowed[("B2 S150 fwd", "2.7.0.post2")] == 1.78
    assert slowed[("B2 S150 fwd", "2.6.3")] == 1.23 and slowed[("B512 S300 bwd", "2.6.3")] == 1.02
    buf = io.StringIO()
    report.terminal_table(res, Console(file=buf, width=2000))
    line = next(x for x in buf.getvalue().splitlines() if x.startswith("Machine mode:"))
    assert line.startswith("Machine mode: the run's 26 process sets fell into two groups; in 16 of them the median "
                           "call ran ~1.19x slower than in the other 10 (by case and version 1.02-1.78x), at one "
                           "reference CPU speed (after the speed adjustment); the speed probe read 7.57 µs in the "
                           "other sets and 7.77 µs in the slower ones (within 1.3x): a state of the machine it does "
                           "not read; ratios that moved with it")
    assert "B2 S50 fwd 2.00x / 2.72x" in line and line.endswith("(the HTML report's set chart rings the slower group)")
    # the run's interval is a mean over its sets: it lies between the two levels, covering neither
    # (new-user trial: "such an interval covers both levels" was false for every named ratio)
    assert "Each of these intervals lies between its two levels: it holds the mix of sets this run met" in line
    assert all(min(x["usual"], x["slow"]) <= x["ci_low"] and x["ci_high"] <= max(x["usual"], x["slow"]) for x in m["moved"])
    assert m["probe_us"] == pytest.approx((7.57, 7.77), abs=0.005) and m["probe_read"] is False
    html = report.render_html(res)
    assert 'id="machine-mode"' in html and "hollow violet rings" in html
    assert "<td>113</td><td>201</td><td>1.78x</td>" in html  # B2 S150 fwd, 2.7.0.post2 (µs as the table's)
    # the verdict table marks each ratio that moved, where users read it (third new-user trial)
    assert html.count('<span class="tag mode" title="moved with the machine mode: ') == 4
    assert 'title="moved with the machine mode: 2.00x in the other sets, 2.72x in the slower ones' in html
    # the Markdown's notes are paragraphs of their own, the interval levels said once
    md = report.markdown(res)
    assert "\n\nMachine mode: the run's 26 process sets" in md and md.count("called faster or slower at 95.83%") == 1
    assert "B2 S50 fwd 2.00x / 2.72x" in report.markdown(res)
    # the set chart draws the slow sets as rings of their own colour, the others as dots
    plain, ringed = charts.set_ratio_chart(res["comparisons"]), charts.set_ratio_chart(res["comparisons"], slow_sets=m["slow"])
    assert charts.SLOW_MODE_COLOR not in plain and charts.SLOW_MODE_COLOR in ringed
    # an A/A run in which the machine met a mode as well: both labels met it alike, no ratio moved,
    # so the terminal stays quiet and the HTML and Markdown say the pairing held; its decided cases
    # were not timed in the later sets: the range says over how many, the table marks them
    aa = results.load(ROOT / "reports" / "h200-aa-112")
    vma = report.view_model(aa)
    assert vma["modes"] and vma["modes"]["moved"] == [] and len(vma["modes"]["slow"]) == 6
    assert "(by case and version 1.02-1.33x, over the 22 timed in both groups)" in vma["mode_note"]
    assert "no ratio differed between the two groups" in vma["mode_note"]
    assert report.mode_note(vma["modes"], terse=True) == ""
    assert "no ratio differed between the two groups" in report.markdown(aa) and "&lt;" not in report.markdown(aa)
    assert "not timed in that group" in report.render_html(aa)
    # where the speed probe read the two groups apart, the note says it is the CPU's speed state
    slow_cpu = report.view_model(results.load(ROOT / "reports" / "h200-aa-57"))
    assert slow_cpu["modes"]["probe_read"] is True
    assert ("the speed probe read 3.62 µs in the other sets and 6.61 µs in the slower ones: the CPU's slow speed "
            "state, which the adjustment did not fully take out") in slow_cpu["mode_note"]
    assert "does not read" not in slow_cpu["mode_note"]
    # each set's values are taken to one reference speed for the run: the adjustment's centre drifted
    # from 4.1 to 6.6 µs over aa-89's sets, and its later sets had read ~1.4x slower (new-user trial)
    assert report.view_model(results.load(ROOT / "reports" / "h200-aa-89"))["modes"] is None
    assert report.view_model(results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-04-3"))["modes"] is None
    # -12-05-11: B2 S50 fwd moved 2.01x -> 2.49x at p 0.001 (at the old cut of 0.001 it went unnamed:
    # third new-user trial); where an interval reaches past a level, the note does not say "between"
    vm11 = report.view_model(results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-11"))
    named = {x["name"]: (round(x["usual"], 2), round(x["slow"], 2)) for x in vm11["modes"]["moved"]}
    assert named["B2 S50 fwd"] == (2.01, 2.49) and len(named) == 4
    assert "Such a ratio is a mean over the mix of sets this run met" in vm11["mode_note"]
    assert "lies between its two levels" not in vm11["mode_note"]
    # a run with one level (A/A of the same hour), and a merged report: nothing said
    assert report.view_model(results.load(ROOT / "reports" / "h200-aa-117"))["modes"] is None
    runs = [results.load(ROOT / "reports" / f"h200-2.6.3-vs-2.7.0.post2-12-05-{i}") for i in (11, 12)]
    assert report.view_model(results.merge(runs))["modes"] is None


def test_publish_says_what_a_run_that_timed_nothing_was_to_time(tmp_path):
    """Second new-user trial: the site index said "0 cases" and "nothing compared" for a run whose
    every env failed, with a config of 12 cases."""
    from matrix_runner import publish
    res = results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-12")
    for e in res["envs"]:
        e["status"], e["error"] = "failed", "import failed: flash_attn_2_cuda"
    res["cases"], res["comparisons"], res["sets"] = [], [], []
    entry = publish.run_entry("failed", res)
    assert (entry["n_cases"], entry["n_configured"], entry["all_failed"]) == (0, 12, True)
    (tmp_path / "reports" / "failed").mkdir(parents=True)
    (tmp_path / "reports" / "failed" / "results.json").write_text(json.dumps(res))
    out = publish.build_site(tmp_path / "reports", tmp_path / "site")
    html = Path(out["index"]).read_text()
    assert "12 cases configured, none timed" in html and "nothing timed: every env failed" in html
    assert "0 cases" not in html
    ok = publish.run_entry("ok", results.load(ROOT / "reports" / "h200-2.6.3-vs-2.7.0.post2-12-05-12"))
    assert (ok["n_cases"], ok["n_configured"], ok["all_failed"]) == (12, None, False)


def test_a_quick_runs_ratio_definition_does_not_describe_the_stall_guard():
    """A --quick run has one process set: the stall guard (from the fourth set on) never acts there, and
    its Markdown legend had described it all the same (third new-user trial, 2026-12-05)."""
    from pathlib import Path

    from matrix_runner import results
    reports = Path(__file__).resolve().parents[1] / "reports"
    quick = results.load(reports / "h200-aa-quick-10")
    d = report.ratio_definition(quick["comparisons"], (quick.get("settings") or {}).get("method"),
                                (quick.get("settings") or {}).get("speed_adjust"))
    assert d.endswith("with one process set there is no interval yet: the ratios are provisional, no verdict"), d
    assert "stall" not in d and "fourth set" not in d
    md = report.markdown(quick)  # nor the (host)/(device) labels no row of it carries
    assert "(host) / (device)" not in md and "with one process set there is no interval yet" in md
    assert "(host) / (device): the difference is host overhead" in report.markdown(
        results.load(reports / "h200-2.6.3-vs-2.7.0.post2-12-05-12"))
    full = results.load(reports / "h200-aa-116")
    d = report.ratio_definition(full["comparisons"], full["settings"]["method"], full["settings"]["speed_adjust"])
    assert "from the fourth set on, a turn of a pinned set whose ratio is twice or half" in d


def test_an_interval_is_never_shown_rounded_across_the_line_its_verdict_is_drawn_at():
    """"ambiguous 1.05x [1.04, 1.05]" for [1.0407, 1.053] read as inside ±5 % (new-user trial, the
    committed 240 s seed run): an interval's shown bounds give its verdict back, on every committed
    run's decided or ambiguous wall comparisons."""
    assert report.fmt_ci({"ci_low": 1.0407, "ci_high": 1.053, "verdict": "ambiguous"}) == "[1.041, 1.053]"
    assert report.fmt_ci({"ci_low": 0.981, "ci_high": 1.023, "verdict": "same"}) == "[0.98, 1.02]"  # as before
    assert report.fmt_ci({"ci_low": 1.003, "ci_high": 1.12, "verdict": "slower"}) == "[1.003, 1.120]"  # not "1.00"
    assert report.fmt_ci({"ci_low": 0.9526, "ci_high": 1.02, "verdict": "same", "min_effect": 0.05}) == "[0.953, 1.020]"
    assert report.fmt_ci({"ci_low": 1.0407, "ci_high": 1.053, "verdict": "slower", "min_effect": 0.02}) == "[1.04, 1.05]"
    # the lower line, 1/1.05 = 0.95238, reads "0.95" at two decimals: a bound just outside it is not shown so
    # (second new-user trial: an ambiguous [0.95224, ...] as "[0.95, 1.04]" under a same "[0.953, 1.042]")
    assert report.fmt_ci({"ci_low": 0.95224, "ci_high": 1.042, "verdict": "ambiguous"}) == "[0.9522, 1.0420]"
    checked = 0
    for f in sorted((ROOT / "reports").glob("*/results.json.gz")):
        doc = results.load(f)
        eff = (doc.get("settings") or {}).get("min_effect") or 0.05
        for c in doc.get("comparisons") or []:
            if c.get("metric") != "wall_us" or c.get("verdict") not in ("faster", "slower", "same", "ambiguous"):
                continue
            if c.get("ci_low") is None or c.get("ci_high") in (None, float("inf")) or not c.get("ci_low"):
                continue
            shown = report.fmt_ci({**c, "min_effect": c.get("min_effect") or eff})
            lo, hi = (float(x) for x in shown.strip("[]").split(", "))
            if stats.verdict(c["ratio"], c["ci_low"], c["ci_high"], eff) != c["verdict"]:
                continue  # a verdict of an older method's rule (e.g. results/1), not this band's
            assert stats.verdict(c["ratio"], lo, hi, eff) == c["verdict"], (f.parent.name, c["case"], shown)
            bounds = shown.strip("[]").split(", ")
            dg = len(bounds[0].split(".")[1])
            marks = [f"{m:.{dg}f}" for m in (1 + eff, 1 / (1 + eff))]
            if c["verdict"] == "ambiguous" and dg < 4:  # nor shown as the band's own ends are (read as on them)
                assert not any(x in marks for x in bounds), (f.parent.name, c["case"], shown)
            checked += 1
    assert checked > 3000


def test_a_merged_reports_markdown_names_every_gpu_it_pools():
    """second new-user trial: a merge of an H200 and an H100 run named the H200 alone in its header."""
    m = results.merge([results.load(ROOT / "reports" / "h200-aa-119"), results.load(ROOT / "reports" / "h100-aa-12-06-3")])
    head = report.markdown(m).splitlines()[2]
    assert head.startswith("NVIDIA H200 + NVIDIA H100 80GB HBM3 (merged runs) · driver "), head
    one = report.markdown(results.load(ROOT / "reports" / "h100-aa-12-06-3")).splitlines()[2]
    assert one.startswith("NVIDIA H100 80GB HBM3 · driver ") and "merged" not in one
