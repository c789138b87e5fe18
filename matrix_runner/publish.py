"""``matrix-run publish``: a static site of saved runs, like asv's published pages but needing no server.

Layout of SITE::

    SITE/index.html              the runs, newest first: date, machine, versions, headline verdict, links
    SITE/<run>/index.html        each run's own report (copied, or unpacked from an archived run's
                                 index.html.gz; rendered when missing or with --rerender)
    SITE/<run>/results.json      each run's raw data (copied; an archived run's results.json.gz unpacked)
    SITE/.matrix-run-site        marker: a site inside REPORTS_DIR is never taken for a run

``<run>`` is the run's directory name under REPORTS_DIR. Runs are found as REPORTS_DIR/*/results.json
(or results.json.gz, results.NAMES), and as REPORTS_DIR/*/*/results.json inside a folder that holds no
run itself (``<run>`` is then ``group/run``: the tox envs' ``reports/tox/<env>/``) of a schema ``results.load`` reads (``matrix-runner/results/1`` or ``/2``); anything else is skipped with a warning. Every page is
self-contained (inline CSS, no script, nothing fetched) and every string from a results file is
escaped.
"""
from __future__ import annotations

import gzip
import shutil
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

from . import __version__, report, results

MARKER = ".matrix-run-site"
#: A run's rendered report in its directory: as written, or gzipped in an archived run (reports/README.md).
HTML_NAMES = ("index.html", "index.html.gz")


def find_runs(reports_dir: Path, site_dir: Path | None = None) -> tuple[list[dict], list[str]]:
    """Runs under ``reports_dir`` as ``[{name, dir, res}]`` and warnings for the directories skipped.

    A run is a directory one level down holding results.json (or .gz), or two levels down inside one
    that holds none itself, named ``group/run``: ``tox -e fa-2.6.3`` writes ``reports/tox/fa-2.6.3/``
    and ``tox -e report`` ``reports/tox/html/`` (a new-user trial found them all skipped: "no
    results.json in reports/tox")."""
    reports_dir = Path(reports_dir)
    if not reports_dir.is_dir():
        raise results.ResultsError(f"{reports_dir}: not a directory")
    site = site_dir.resolve() if site_dir else None
    runs, warnings = [], []

    def subdirs(p: Path) -> list[Path]:
        return [d for d in sorted(p.iterdir()) if d.is_dir() and not d.name.startswith(".")
                and not (d / MARKER).exists() and not (site and d.resolve() == site)]

    def take(d: Path, name: str, f: Path) -> None:
        try:
            runs.append({"name": name, "dir": d, "res": results.load(f)})
        except results.ResultsError as e:
            warnings.append(f"skipped {d}: {e}")

    for d in subdirs(reports_dir):
        f = results.find(d)
        if f.is_file():
            take(d, d.name, f)
            continue
        inner = [(s, results.find(s)) for s in subdirs(d)]
        inner = [(s, g) for s, g in inner if g.is_file()]
        if not inner:
            warnings.append(f"skipped {d}: no results.json (or results.json.gz) in it or in a folder inside it")
        for s, g in inner:
            take(s, f"{d.name}/{s.name}", g)
    return runs, warnings


def run_entry(name: str, res: dict) -> dict:
    """What the index shows of one run."""
    vm = report.view_model(res)
    m = res.get("machine") or {}
    created = res.get("created") or ""
    try:
        when = datetime.fromisoformat(created)
        date = when.strftime("%Y-%m-%d %H:%M") + (" UTC" if when.utcoffset() is not None and not when.utcoffset() else "")
    except ValueError:
        when, date = None, created or "–"
    stop = (res.get("timing") or {}).get("stop_reason")
    return {
        "name": name, "href": quote(name) + "/index.html", "json_href": quote(name) + "/results.json",
        "run_id": res.get("run_id"), "title": res.get("title"), "date": date, "sort": created,
        "gpu": m.get("gpu") or "no GPU", "driver": m.get("driver"), "cuda": m.get("cuda"), "torch": m.get("torch"),
        "hostname": m.get("hostname"), "device": (res.get("settings") or {}).get("device"),
        "envs": [{"label": e.get("label"), "version": e.get("flash_attn_version") or e.get("requested_version"),
                  "status": e.get("status"), "color": vm["env_color"].get(e.get("label"))} for e in res.get("envs", [])],
        "base": vm["base"], "summaries": vm["summaries"], "n_cases": len(vm["rows"]),
        # failed and not run apart (second new-user trial: a run stopped by its budget before three
        # cases was listed "6 failed")
        "n_failed": sum(1 for c in vm["failed_cases"] if c["status"] != "not run"),
        "n_not_run": sum(1 for c in vm["failed_cases"] if c["status"] == "not run"), "incomplete": not res.get("finished") or stop == "running",
        "no_gpu": (res.get("settings") or {}).get("no_gpu_message"),
        # a run where nothing was timed says what it was to time (second new-user trial: "0 cases"
        # for a run whose every env failed, with a config of 12)
        "n_configured": _configured_cases(res) if not vm["rows"] else None,
        "all_failed": bool(res.get("envs")) and all(e.get("status") != "ok" for e in res.get("envs") or []),
    }


def _configured_cases(res: dict) -> int | None:
    """How many cases the run's stored config expands to (None when it cannot be read)."""
    from .config import ConfigError, parse_config

    try:
        return len(parse_config(res.get("config") or {}, "results.json config", max_cases=None).cases)
    except (ConfigError, TypeError, ValueError, AttributeError):
        return None


def build_site(reports_dir: Path, site_dir: Path, rerender: bool = False) -> dict:
    """Write the site (see module doc). Returns ``{index, runs: [entry], warnings: [str]}``."""
    reports_dir, site_dir = Path(reports_dir), Path(site_dir)
    runs, warnings = find_runs(reports_dir, site_dir)
    site_dir.mkdir(parents=True, exist_ok=True)
    (site_dir / MARKER).write_text(f"matrix-run {__version__} site of {reports_dir}\n")
    entries = []
    for r in runs:
        dest = site_dir / r["name"]
        try:
            entry = run_entry(r["name"], r["res"])
            dest.mkdir(parents=True, exist_ok=True)
            src = results.find(r["dir"])
            if src.suffix == ".gz":  # an archived run: the site serves the plain JSON
                (dest / "results.json").write_text(results.read_text(src), encoding="utf-8")
            else:
                shutil.copyfile(src, dest / "results.json")
            src_html = next((r["dir"] / n for n in HTML_NAMES if (r["dir"] / n).is_file()), None)
            if src_html is not None and not rerender:
                page = src_html.read_bytes()
                if src_html.suffix == ".gz":
                    page = gzip.decompress(page)
                # its raw-data link, to the plain JSON the site serves (new-user trial: a page rendered for an
                # archived run linked results.json.gz, which the site does not have)
                (dest / "index.html").write_bytes(page.replace(b'href="results.json.gz"', b'href="results.json"'))
            else:
                report.write_html(r["res"], dest, "results.json")
                entry["rendered"] = True
        except Exception as e:  # noqa: BLE001 - one odd run never sinks the site
            warnings.append(f"skipped {r['dir']}: {type(e).__name__}: {e}")
            continue
        entries.append(entry)
    entries.sort(key=lambda e: e["sort"] or "", reverse=True)
    page = report._env().get_template("site_index.html.j2").render(
        runs=entries, warnings=warnings, source=str(reports_dir), version=__version__,
        generated=datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    index = site_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    (site_dir / ".nojekyll").write_text("")  # GitHub Pages: serve the files as they are
    return {"index": index, "runs": entries, "warnings": warnings}
