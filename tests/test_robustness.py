"""Bad input, unknown versions, safe YAML, no shell, allow-listed environments, envs that stay in
--envs-dir, atomic results and two matrix-run processes sharing envs/ and the wheel cache.

Most checks call ``cli.main`` in-process (the same code path as the command, without the seconds of
interpreter start-up); the concurrency test runs two real ``matrix-run`` processes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import load_results, local_http, run_cli

from matrix_runner import cli, envs as envmod, proc, results


def main(capsys, *args: str) -> tuple[int, str]:
    """``matrix-run ARGS`` in-process: (exit code, stderr with whitespace collapsed)."""
    code = cli.main(list(args))
    return code, " ".join(capsys.readouterr().err.split())


# ---------------------------------------------------------------------------------------------
# bad input: exit 2, a message naming the problem, nothing built
BAD_VERSIONS = [
    ("2.6.3;rm -rf ~", "is not a PEP 440 version"),
    ("2.6.3 && touch pwned", "is not a PEP 440 version"),
    ("`id`", "is not a PEP 440 version"),
    ("$(touch /tmp/matrix-run-pwned)", "looks like a path but does not exist"),
    ("../../no-such-matrix-run-path", "looks like a path but does not exist"),  # (/tmp/x existed once)
    ("../../x=2.6.3", "label '../../x' may only use"),
    ("..=2.6.3", "label '..' may only use"),
    (".hidden=2.6.3", "label '.hidden' may only use"),
    ("a/b=2.6.3", "label 'a/b' may only use"),
    ("-rf=2.6.3", "label '-rf' may only use"),
    ("a=", "names no version"),
    ("a=2.6.3\nb=2.7.0", "control characters are not allowed"),
    ("2.6.3,2.6.3", "label '2.6.3' appears twice"),
    ("a=here", "use it with --backend here"),
    ("", "give at least one flash-attn version"),
    ("/etc/passwd", "is not a flash-attn sdist (.tar.gz) or wheel (.whl) file"),
    ("TMPDIR", "is not a flash-attn sdist (.tar.gz) or wheel (.whl) file"),
]


@pytest.mark.parametrize("versions,needle", BAD_VERSIONS)
def test_bad_versions_exit_2(capsys, tmp_path, versions, needle):
    if versions == "TMPDIR":
        versions = str(tmp_path)  # an existing directory, not an sdist or wheel
    for sub in ("run", "plan"):
        code, err = main(capsys, sub, f"--versions={versions}", "--envs-dir", str(tmp_path / "envs"), "--offline",
                         *(["--output", str(tmp_path / "o")] if sub == "run" else []))
        assert code == 2, (sub, err)
        assert needle in err, (sub, err)
        assert not (tmp_path / "o").exists()
        assert not [p for p in (tmp_path / "envs").glob("*") if not p.name.startswith(".")]
    assert not Path("/tmp/matrix-run-pwned").exists() and not Path("pwned").exists()


@pytest.mark.parametrize("args,needle", [
    (["--case-timeout", "0"], "--case-timeout 0: give a positive number"),
    (["--case-timeout", "-5"], "--case-timeout -5: give a positive number"),
    (["--max-sets", "0"], "--max-sets 0: give a positive number"),
    (["--time-budget", "-1"], "--time-budget -1: give a positive number"),
    (["--burst-ms", "0"], "--burst-ms 0: give a positive number"),
    (["--burst-ms", "inf"], "--burst-ms inf: give a positive number, a finite one"),
    (["--set-seconds", "inf"], "--set-seconds inf: give a positive number, a finite one"),
    (["--workers-per-env", "0"], "--workers-per-env 0: give a positive number"),
    (["--cpus", "fast"], "--cpus 'fast': give auto, unpinned or a comma list of CPU ids"),
    (["--cpus", "99999"], "--cpus '99999': CPU(s) [99999] not allowed to this process"),
    (["--min-effect", "2"], "--min-effect 2.0: give a fraction"),
    (["--find-links", "/nonexistent-dir"], "--find-links /nonexistent-dir: not a directory"),
    (["--torch", "latest"], "--torch 'latest'"),
    (["--archs", "hopper"], "--archs 'hopper'"),
    (["--backend", "here", "--versions", "a=here,b=here"], "give exactly one --versions entry"),
    # new-user trial: an item lost to a typo was silently left out; a 1e9 s set overran the budget
    (["--versions", "2.6.3,,2.7.0.post2"], "--versions '2.6.3,,2.7.0.post2': item 2 is empty"),
    (["--set-seconds", "1e9"], "--set-seconds 1e+09 with a 60 s budget: give at most half the budget"),
    (["--set-seconds", "0.01"], "--set-seconds 0.01: give at least 0.1"),
    (["--versions", "2.6.3,fa4=flash-attn-4"], "for flash-attn-4 write fa4=flash-attn-4==VERSION"),
    # new-user trial: a tiny budget alone blamed --set-seconds, which was not given
    (["--time-budget", "1e-9"], "--time-budget 1e-09: give at least 2 s (two process sets of 1 s of cycles"),
    (["--burst-ms", "1e9"], "--burst-ms 1e+09: give at most 500"),
])
def test_bad_options_exit_2(capsys, tmp_path, args, needle):
    if "--versions" not in args:
        args = ["--versions", "2.6.3", *args]
    code, err = main(capsys, "run", *args, "--offline", "--envs-dir", str(tmp_path / "envs"),
                     "--output", str(tmp_path / "o"))
    assert code == 2 and needle in err, err
    assert not [p for p in (tmp_path / "envs").glob("*") if not p.name.startswith(".")]


SHAPES_BAD = [
    ("shapes: [{batch: 1, seqlen: 16, nheads: 2, head_dim: 300}]", "head_dim = 300: must be <= 256"),
    ("shapes: [{batch: 1, seqlen: 16, nheads: 6, nheads_k: 4, head_dim: 64}]", "nheads (6) must be divisible by nheads_k"),
    ("dtype: fp32", "dtype = 'fp32': must be one of fp16, bf16"),
    ("shapes: [{batch: 0, seqlen: 16, nheads: 2, head_dim: 64}]", "shapes[0].batch = 0: must be a positive integer"),
    ("shapes: [{batch: 1, seqlen: -16, nheads: 2, head_dim: 64}]", "shapes[0].seqlen = -16: must be a positive"),
    ("shapes: [{batch: 1, seqlen: 16, nheads: 3, embed_dim: 256}]", "must be divisible by nheads (3)"),
    ("shapes: [{batch: 1, seqlen: 16, nheads: 2, head_dim: 64, heads: 2}]", "unknown key 'heads'"),
    ("dropout_p: 1.5", "dropout_p = 1.5"),
    ("- just\n- a list\n", "the top level must be a mapping"),
    ("title: x\nshapes: [{batch: 1,\n  seqlen 16}]\nops: [fwd", "c.yaml:"),  # YAML syntax error
]


@pytest.mark.parametrize("yaml_text,needle", SHAPES_BAD)
def test_bad_config_exits_2_before_any_env_is_built(capsys, tmp_path, yaml_text, needle):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    for sub in ("run", "plan"):
        code, err = main(capsys, sub, "--versions", "2.6.3", "--config", str(cfg), "--envs-dir", str(tmp_path / "envs"),
                         *(["--output", str(tmp_path / "o")] if sub == "run" else []))
        assert code == 2 and needle in err, err
    assert not (tmp_path / "envs").exists() and not (tmp_path / "o").exists()


def test_yaml_syntax_error_names_file_line_and_column(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("title: x\nops: [fwd, bwd\nshapes: []\n")
    cp = run_cli("--versions", "2.6.3", "--config", str(cfg), "--envs-dir", str(tmp_path / "envs"), "--offline",
                 "--output", str(tmp_path / "o"))
    assert cp.returncode == 2
    err = " ".join(cp.stderr.split())
    assert f"{cfg}:3:" in err and "YAML syntax error" in err and "Traceback" not in err


def test_yaml_python_tags_are_refused_and_never_run(capsys, tmp_path):
    marker = tmp_path / "pwned"
    cfg = tmp_path / "evil.yaml"
    cfg.write_text(f"title: !!python/object/apply:os.system ['touch {marker}']\n")
    code, err = main(capsys, "run", "--versions", "2.6.3", "--config", str(cfg), "--envs-dir", str(tmp_path / "envs"),
                     "--output", str(tmp_path / "o"))
    assert code == 2 and "python/object/apply:os.system" in err and f"{cfg}:1:" in err, err
    cfg.write_text("title: !!python/object:matrix_runner.config.Sampling {max_sets: 1}\n")
    code, err = main(capsys, "plan", "--versions", "2.6.3", "--config", str(cfg), "--envs-dir", str(tmp_path / "envs"))
    assert code == 2 and "python/object:matrix_runner.config.Sampling" in err, err
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# a version the index does not have
INDEX_VERSIONS = ("2.5.9", "2.6.0", "2.6.1", "2.6.2", "2.6.3", "2.7.0.post2")


@pytest.fixture
def index(monkeypatch):
    """A PEP 691 (JSON simple API) index on 127.0.0.1 listing flash-attn sdists; /html/ answers HTML."""
    seen: list[tuple[str, str]] = []
    from packaging.tags import sys_tags
    t = next(iter(sys_tags()))  # wheels for this interpreter (a pin with none for it is refused up front)
    here = f"{t.interpreter}-{t.abi}-{t.platform}"

    def respond(path, port, headers):
        seen.append((path, headers.get("Accept", "")))
        if path == "/simple/flash-attn/":
            return json.dumps({"meta": {"api-version": "1.0"}, "name": "flash-attn", "files": [
                {"filename": f"flash_attn-{v}.tar.gz", "url": f"http://127.0.0.1/f/flash_attn-{v}.tar.gz",
                 "hashes": {}} for v in INDEX_VERSIONS] + [
                {"filename": "flash_attn-2.6.4.tar.gz", "url": "x", "hashes": {}, "yanked": "broken"}]}).encode(), \
                "application/vnd.pypi.simple.v1+json"
        if path == "/html/flash-attn/":
            return b"<html><body><a href='x'>flash_attn-2.6.3.tar.gz</a></body></html>", "text/html"
        if path == "/simple/torch/":
            return json.dumps({"meta": {"api-version": "1.0"}, "name": "torch", "files": [
                {"filename": f"torch-{v}-{here}.whl", "url": "x", "hashes": {}}
                for v in ("2.5.1", "2.6.0", "2.7.0")] + [
                {"filename": "torch-1.0.0-cp27-cp27mu-manylinux1_x86_64.whl", "url": "x", "hashes": {}}]}).encode(), \
                "application/vnd.pypi.simple.v1+json"
        if path == "/simple/flash-attn-4/":
            return json.dumps({"meta": {"api-version": "1.0"}, "name": "flash-attn-4", "files": [
                {"filename": f"flash_attn_4-{v}-py3-none-any.whl", "url": "x", "hashes": {}}
                for v in ("4.0.0b35", "4.0.0b36")]}).encode(), "application/vnd.pypi.simple.v1+json"
        if path == "/whl/cu130/torch/":  # PyTorch's own index answers PEP 503 HTML, local labels in the names
            page = (f"<html><body><a href='x'>torch-2.9.1+cu130-{here}.whl</a>"
                    f"<a href='y' data-yanked=''>torch-2.9.0+cu130-{here}.whl</a></body></html>").encode()
            return page, "text/html"
        return None

    for k in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(k, "127.0.0.1,localhost")
    with local_http(respond) as root:
        yield {"url": f"{root}/simple", "root": root, "seen": seen}


def test_unknown_version_is_named_with_the_nearest_ones(capsys, tmp_path, index):
    code, err = main(capsys, "plan", "--versions", "2.6.4", "--index-url", index["url"],
                     "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"))
    assert code == 2, err
    assert f"flash-attn 2.6.4 is not on {index['url']}; nearest: 2.6.3, 2.6.2, 2.6.1" in err  # yanked 2.6.4 is not offered
    assert index["seen"] == [("/simple/flash-attn/", "application/vnd.pypi.simple.v1+json")]
    code, err = main(capsys, "run", "--versions", "2.6.3,new=2.8.9", "--device", "cpu", "--index-url", index["url"],
                     "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"),
                     "--output", str(tmp_path / "o"))
    assert code == 2 and "flash-attn 2.8.9 is not on" in err and "nearest: 2.7.0.post2" in err, err
    assert not (tmp_path / "o").exists() and not (tmp_path / "envs" / "2.6.3").exists()


def test_known_version_passes_and_an_unusable_index_only_warns(capsys, tmp_path, index, standins):
    base = ["--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"), "--json"]
    code, err = main(capsys, "plan", "--versions", "2.6.3", "--index-url", index["url"], *base)
    assert code == 0 and "warning" not in err, err
    assert len(index["seen"]) == 1
    for url in ("http://127.0.0.1:1/simple", index["root"] + "/html", index["root"] + "/missing"):
        code, err = main(capsys, "plan", "--versions", "2.6.4", "--index-url", url, *base)
        assert code == 0, err
        assert f"warning: could not check that flash-attn 2.6.4 exist(s) on {url}" in err and "going on" in err
    # found in --find-links: the index is not asked at all
    n = len(index["seen"])
    code, err = main(capsys, "plan", "--versions", "2.7.0.post2", "--index-url", index["url"],
                     "--find-links", str(standins["wheels"]), *base)
    assert code == 0 and len(index["seen"]) == n


def test_another_subjects_pin_is_checked_on_the_index_before_anything_is_built(capsys, tmp_path, index, standins):
    """fa4=flash-attn-4==99 (a new-user trial): refused before any env is built, naming the nearest
    releases; a listed one passes; an index that cannot be asked warns; a wheel in --find-links
    needs no index."""
    base = ["--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"),
            "--find-links", str(standins["wheels"])]
    code, err = main(capsys, "run", "--versions", "2.6.3,fa4=flash-attn-4==99", "--device", "cpu",
                     "--index-url", index["url"], "--output", str(tmp_path / "o"), *base)
    assert code == 2 and f"--versions: flash-attn-4 99 (fa4) is not on {index['url']}; nearest: 4.0.0b36, 4.0.0b35" in err, err
    assert not (tmp_path / "o").exists() and not (tmp_path / "envs" / "2.6.3").exists()
    code, err = main(capsys, "plan", "--versions", "2.6.3,fa4=flash-attn-4==4.0.0b36", "--json",
                     "--index-url", index["url"], *base)
    assert code == 0 and "warning" not in err, err
    code, err = main(capsys, "plan", "--versions", "2.6.3,flash-attn-4==4.0.0b1", "--json",
                     "--index-url", "http://127.0.0.1:1/simple", *base)
    assert code == 0 and "warning: could not check that flash-attn-4 4.0.0b1 exist(s)" in err, err
    links = tmp_path / "links"
    links.mkdir()
    (links / "flash_attn_4-4.0.0b1-py3-none-any.whl").write_bytes(b"")
    n = len(index["seen"])
    code, err = main(capsys, "plan", "--versions", "2.6.3,flash-attn-4==4.0.0b1", "--json", "--index-url", index["url"],
                     "--find-links", str(links), *base)
    assert code == 0 and not [p for p, _ in index["seen"][n:] if "flash-attn-4" in p], (err, index["seen"][n:])


def test_offline_a_version_with_nothing_to_build_from_says_so_not_archs(capsys, tmp_path, standins):
    """--offline, no GPU, a version neither in --find-links nor cached: the plan names the missing
    wheel/sdist (what --archs cannot mend), not the missing GPU's archs (new-user trial; a pinned torch
    stands in for a CUDA one: either makes the plan refuse a full build without --archs)."""
    code = cli.main(["plan", "--versions", "2.6.3,2.6.99", "--torch", "2.13.0", "--offline", "--json", "--find-links",
                     str(standins["wheels"]), "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache")])
    cap = capsys.readouterr()
    items = {i["label"]: i for i in json.loads(cap.out)}
    assert items["2.6.3"]["method"] != "failed", (code, cap.err)
    assert items["2.6.99"]["method"] == "failed"
    assert "no flash_attn-2.6.99.tar.gz sdist in --find-links" in items["2.6.99"]["error"]
    assert "--archs" not in items["2.6.99"]["error"]


def test_pinned_torch_is_checked_on_its_index_before_anything_is_built(capsys, tmp_path, index, standins):
    """--torch X.Y.Z: a release its index does not list is a usage error naming the nearest ones
    (PyPI's JSON and PyTorch's HTML index with CUDA-labelled wheels alike; a yanked one does not
    count); an index that cannot be asked only warns; a torch wheel in --find-links needs no index."""
    base = ["--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"), "--json",
            "--find-links", str(standins["wheels"])]
    code, err = main(capsys, "plan", "--versions", "2.6.3", "--torch", "2.6.1", "--index-url", index["url"], *base)
    assert code == 2 and f"--torch 2.6.1: torch 2.6.1 is not on {index['url']}; nearest: 2.6.0, 2.5.1, 2.7.0" in err, err
    assert "--torch-index, e.g. https://download.pytorch.org/whl/cu130" in err
    code, err = main(capsys, "plan", "--versions", "2.6.3", "--torch", "2.6.0", "--index-url", index["url"], *base)
    assert code == 0 and "warning" not in err, err
    # listed, but its only wheel is for another Python: refused before anything is built (new-user trial)
    code, err = main(capsys, "plan", "--versions", "2.6.3", "--torch", "1.0.0", "--index-url", index["url"], *base)
    assert code == 2 and f"--torch 1.0.0: torch 1.0.0 on {index['url']} has no wheel for this Python" in err, err
    assert "(its wheels are for cp27)" in err and "nearest with one: 2.5.1, 2.6.0, 2.7.0" in err, err
    cu = index["root"] + "/whl/cu130"
    code, err = main(capsys, "plan", "--versions", "2.6.3", "--torch", "2.9.1", "--torch-index", cu, *base)
    assert code == 0 and "warning" not in err, err
    code, err = main(capsys, "plan", "--versions", "2.6.3", "--torch", "2.9.0", "--torch-index", cu, *base)
    assert code == 2 and f"torch 2.9.0 is not on {cu}; nearest: 2.9.1" in err, err
    code, err = main(capsys, "plan", "--versions", "2.6.3", "--torch", "2.9.0", "--torch-index", "http://127.0.0.1:1/x", *base)
    assert code == 0 and "warning: could not check that torch 2.9.0 exist(s) on http://127.0.0.1:1/x" in err, err
    links = tmp_path / "links"
    links.mkdir()
    (links / "torch-2.6.1+cpu-cp312-cp312-linux_x86_64.whl").write_bytes(b"")
    n = len(index["seen"])
    code, err = main(capsys, "plan", "--versions", "2.6.3", "--torch", "2.6.1", "--index-url", index["url"],
                     "--find-links", str(links), *base)
    assert code == 0 and not [p for p, _ in index["seen"][n:] if "torch" in p], (err, index["seen"][n:])


# ---------------------------------------------------------------------------------------------
# no shell, allow-listed environment, envs stay in --envs-dir, atomic writes
def test_commands_are_argument_lists_never_a_shell(tmp_path):
    cp = proc.capture(["echo", "a;b", "$HOME", "`id`", "$(id)"])
    assert cp.stdout == "a;b $HOME `id` $(id)\n"
    for bad in ("echo hi", "ls; rm -rf ~"):
        with pytest.raises(TypeError):
            proc.capture(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            proc.spawn(bad, log=tmp_path / "l")  # type: ignore[arg-type]


def test_children_get_only_the_allow_listed_environment(monkeypatch, tmp_path):
    for k, v in {"MATRIX_RUN_TEST_SECRET": "s1", "AWS_SECRET_ACCESS_KEY": "s2", "GITHUB_TOKEN": "s3",
                 "HF_TOKEN": "s4", "PYTHONPATH": "/evil", "CUDA_VISIBLE_DEVICES": "0"}.items():
        monkeypatch.setenv(k, v)
    code = "import json, os; print(json.dumps(dict(os.environ)))"
    seen = json.loads(proc.capture([sys.executable, "-c", code], env_extra={"EXTRA": "1"}).stdout)
    p = proc.spawn([sys.executable, "-c", code], log=tmp_path / "spawn.log")
    p.wait()
    spawned = json.loads((tmp_path / "spawn.log").read_text())
    for env in (seen, spawned):
        assert not {"MATRIX_RUN_TEST_SECRET", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "HF_TOKEN", "PYTHONPATH"} & set(env)
        assert env["PATH"] == os.environ["PATH"] and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert seen["EXTRA"] == "1"
    # the probe runs the same way
    monkeypatch.setenv("MATRIX_RUN_TEST_SECRET", "hunter2")
    assert "hunter2" not in json.dumps(proc.clean_env())


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_stopping_kills_whole_process_groups(tmp_path):
    pidfile = tmp_path / "child.pid"
    p = proc.spawn(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; wait"], log=tmp_path / "l")
    t0 = time.monotonic()
    while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    child = int(pidfile.read_text())
    try:
        proc.kill_all(grace=2.0)
        with pytest.raises(proc.Stopped):
            proc.capture(["true"])
    finally:
        proc.reset()
    assert p.returncode is not None
    t0 = time.monotonic()
    while _alive(child) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert not _alive(child)
    assert proc.capture(["true"]).returncode == 0  # usable again after reset


def test_env_dirs_never_leave_envs_dir(capsys, tmp_path, standins):
    envs = tmp_path / "envs"
    envs.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (envs / "x").symlink_to(tmp_path / "elsewhere")
    code, err = main(capsys, "plan", "--versions", "x=2.6.3", "--find-links", str(standins["wheels"]),
                     "--envs-dir", str(envs), "--wheel-cache", str(tmp_path / "cache"))
    assert code == 2 and "would leave --envs-dir" in err, err
    opts = envmod.Options(envs_dir=envs.resolve(), cache_dir=tmp_path / "cache")
    for label in ("..", "../x", "/etc", "a/../../b"):
        with pytest.raises(envmod.UsageError):
            envmod.env_dir_for(opts, label)
    assert envmod.env_dir_for(opts, "ok-1.2").parent == envs.resolve()


def test_results_are_written_atomically(tmp_path):
    p = tmp_path / "results.json"
    results.write_json(p, {"a": 1})
    with pytest.raises(TypeError):
        results.write_json(p, {"a": object()})  # fails half-way through serializing
    assert json.loads(p.read_text()) == {"a": 1}
    assert sorted(f.name for f in tmp_path.iterdir()) == ["results.json"]  # no temp file left


# ---------------------------------------------------------------------------------------------
# two matrix-run processes sharing envs/ and the wheel cache
ONE_SHAPE = """
ops: [fwd]
shapes:
  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}
"""


def test_two_processes_share_envs_and_cache_without_rebuilding(standins, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(ONE_SHAPE)
    common = ["--config", str(cfg), "--device", "cpu", "--quick", "--offline", "--find-links", str(standins["sdists"]),
              "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache")]
    e = dict(os.environ, COLUMNS="200")
    procs = []
    for label in ("a", "b"):
        with open(tmp_path / f"{label}.err", "w") as err:
            procs.append(subprocess.Popen([sys.executable, "-m", "matrix_runner", "--versions", f"{label}=2.6.3",
                                           *common, "--output", str(tmp_path / f"out-{label}")],
                                          stdout=subprocess.DEVNULL, stderr=err, env=e))
    for p in procs:
        p.wait(timeout=400)
    for label, p in zip(("a", "b"), procs):
        assert p.returncode == 0, (tmp_path / f"{label}.err").read_text()[-3000:]
    # one source build for the one wheel key, the other process used its wheel
    logs = "".join(f.read_text() for f in (tmp_path / "envs" / ".logs").glob("*.log"))
    assert logs.count("_build_shim.py") == 1, logs[-3000:]
    cached = list((tmp_path / "cache" / "wheels").glob("*/flash_attn-2.6.3-*.whl"))
    assert len(cached) == 1
    assert not list((tmp_path / "cache" / "wheels").rglob(".tmp-*"))
    res = [load_results(tmp_path / f"out-{lab}") for lab in ("a", "b")]
    for r in res:
        (env,) = r["envs"]
        assert env["status"] == "ok" and Path(env["build"]["wheel"]) == cached[0]
        (case,) = r["cases"]
        assert case["status"] == "ok" and case["metrics"]["wall_us"]["n"] >= 5
    assert sorted(bool(r["envs"][0]["build"].get("built_by_other_process")) or r["envs"][0]["build"]["method"] == "cache"
                  for r in res) == [False, True]
    for lab in ("a", "b"):  # env records are complete JSON
        rec = json.loads((tmp_path / "envs" / lab / "matrix-run-env.json").read_text())
        assert rec["status"] == "ok" and rec["label"] == lab


def test_a_broken_env_is_planned_listed_and_reported_as_rebuilt(standins, tmp_path):
    """New-user trial: with an env's python deleted, `plan` said "reuse", `envs list` "ok", and the run
    (which found it broken and rebuilt it) printed "(reuse, 0.2 s)"."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(ONE_SHAPE)
    common = ["--versions", "a=2.6.3", "--config", str(cfg), "--offline", "--find-links",
              str(standins["wheels"]), "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache")]
    cp = run_cli(*common, "--device", "cpu", "--quick", "--output", str(tmp_path / "o1"))
    assert cp.returncode == 0, cp.stderr[-3000:]
    flat = lambda t: " ".join(t.split())  # noqa: E731
    # intact: planned as a reuse with no note, listed plain "ok"
    cp = run_cli("plan", *common)
    assert cp.returncode == 0 and "reuse" in cp.stdout + cp.stderr and "existing env" not in flat(cp.stdout + cp.stderr)
    for name in ("python", "python3"):
        (tmp_path / "envs" / "a" / "bin" / name).unlink(missing_ok=True)
    cp = run_cli("plan", *common)
    assert "existing env broken: its python is missing (the next run rebuilds it)" in flat(cp.stdout + cp.stderr), cp.stdout
    cp = run_cli("envs", "list", "--envs-dir", str(tmp_path / "envs"))
    assert "broken: its python is missing" in flat(cp.stdout), cp.stdout
    cp = run_cli(*common, "--device", "cpu", "--quick", "--output", str(tmp_path / "o2"))
    assert cp.returncode == 0, cp.stderr[-3000:]
    assert "a: flash_attn 2.6.3 (rebuilt by find-links: the existing env was broken," in flat(cp.stderr), cp.stderr[-3000:]
    (env,) = load_results(tmp_path / "o2")["envs"]
    assert env["build"]["method"] == "find-links" and "python" in env["build"]["rebuilt_because"], env["build"]
    cp = run_cli("envs", "list", "--envs-dir", str(tmp_path / "envs"))
    assert "its python is missing" not in flat(cp.stdout) and "changed since" not in flat(cp.stdout), cp.stdout


# ---------------------------------------------------------------------------------------------
# a results.json with an edited sample: a one-line error naming the file and field (exit 2), or the
# sample skipped with a note; never a traceback
REAL = results.find(Path(__file__).resolve().parent.parent / "reports" / "h200-aa-4")  # archived: results.json.gz


def _edited(tmp_path: Path, value: str, where: str = "samples") -> Path:
    """A copy of a committed run (marked interrupted, so --resume takes it) with one wall sample of its
    first case replaced by the JSON text ``value``; its stored command builds nothing outside tmp_path."""
    d = json.loads(results.read_text(REAL))
    w = d["cases"][0]["metrics"]["wall_us"]
    if where == "samples":
        w["samples"][0][0] = "__X__"
    else:
        w["by_set"]["0"][next(iter(w["by_set"]["0"]))] = "__X__"
    d["timing"]["stop_reason"] = "interrupted"
    d["settings"]["cwd"] = str(tmp_path)
    d["command"] = ["matrix-run", "--versions", "a=2.6.3,b=2.6.3", "--offline", "--envs-dir",
                    str(tmp_path / "envs"), "--output", str(tmp_path / "run")]
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    p = run / "results.json"
    p.write_text(json.dumps(d).replace('"__X__"', value))
    return p


@pytest.mark.parametrize("where", ["samples", "by_set"])
@pytest.mark.parametrize("cmd", ["compare", "resume"])
def test_edited_sample_string_is_a_one_line_error_naming_file_and_field(capsys, tmp_path, cmd, where):
    p = _edited(tmp_path, '"abc"', where)
    args = ["compare", str(p), str(REAL)] if cmd == "compare" else ["--resume", str(p.parent)]
    code, err = main(capsys, *args)
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err
    field = ("cases[0].metrics.wall_us.samples[0][0]" if where == "samples"
             else "cases[0].metrics.wall_us.by_set[\"0\"]")
    assert str(p) in err and field in err and "'abc'" in err, err
    assert not (tmp_path / "envs").exists()  # refused before anything was built


@pytest.mark.parametrize("value", ["null", "NaN", "Infinity"])
def test_edited_sample_null_or_nan_is_skipped_with_a_note(capsys, tmp_path, value):
    from matrix_runner import config, runner

    p = _edited(tmp_path, value)
    code, err = main(capsys, "compare", str(p), str(REAL))
    assert code == 0 and "Traceback" not in err, err
    doc = results.load(p)
    err = " ".join(capsys.readouterr().err.split())
    if value != "null":  # null is how results.json stores a missing (non-finite) sample: no note
        assert "cases[0].metrics.wall_us.samples[0][0]" in err and "skipped" in err, err
    first = doc["cases"][0]["metrics"]["wall_us"]["samples"][0]
    assert first[0] is None and all(isinstance(x, float) for x in first[1:])
    cfg = config.parse_config(doc["config"], "results.json", max_cases=None)
    data = runner.data_from_results(doc, cfg.cases)  # what --resume keeps: every other sample
    assert len(data) == len(doc["cases"])


# ---------------------------------------------------------------------------------------------
# envs clean while a run uses the envs: the env a running matrix-run holds is left alone, and named
def _fake_env(envs: Path, label: str) -> Path:
    d = envs / label
    d.mkdir(parents=True)
    (d / envmod.RECORD).write_text(json.dumps({"label": label, "status": "ok"}))
    return d


def test_envs_clean_leaves_an_env_a_running_matrix_run_holds(capsys, tmp_path):
    from filelock import FileLock

    envs = tmp_path / "envs"
    a, b = _fake_env(envs, "a"), _fake_env(envs, "b")
    with FileLock(str(envs / ".a.use.lock")):  # stands in for a run timing env a
        code, err = main(capsys, "envs", "clean", "--all", "--envs-dir", str(envs))
        assert code == 3, err
        assert a.is_dir() and not b.exists()
        assert f"left {a} alone: a running matrix-run uses it" in err, err
        code, err = main(capsys, "envs", "clean", "a", "--envs-dir", str(envs))
        assert code == 3 and a.is_dir() and f"left {a} alone" in err, err
    code, err = main(capsys, "envs", "clean", "a", "--envs-dir", str(envs))  # that run ended
    assert code == 0 and not a.exists(), err
    # labels after --envs-dir too (new-user trial: "unrecognized arguments: c")
    c = _fake_env(envs, "c")
    code, err = main(capsys, "envs", "clean", "--envs-dir", str(envs), "c")
    assert code == 0 and not c.exists(), err


def test_a_run_holds_its_envs_shared_until_it_ends(capsys, tmp_path):
    """Two runs may use one env together; envs clean waits for neither, and removes it after both."""
    from contextlib import ExitStack

    envs = tmp_path / "envs"
    a = _fake_env(envs, "a")
    with ExitStack() as run1, ExitStack() as run2:
        envmod.hold_envs(envs, ["a"], run1)
        envmod.hold_envs(envs, ["a"], run2)  # a second run shares the env: not blocked
        run1.close()
        code, err = main(capsys, "envs", "clean", "--all", "--envs-dir", str(envs))
        assert code == 3 and a.is_dir() and f"left {a} alone" in err, err
    code, err = main(capsys, "envs", "clean", "--all", "--envs-dir", str(envs))
    assert code == 0 and not a.exists(), err


def test_envs_clean_during_a_run_leaves_its_envs_and_the_run_completes(capsys, monkeypatch, standins, tmp_path):
    """``envs clean`` while a real run times its envs (called from inside the timing phase): refused for
    both envs, named; the run's cases then time fine (before: FileNotFoundError in every case)."""
    from matrix_runner import runner

    cfg = tmp_path / "c.yaml"
    cfg.write_text(ONE_SHAPE)
    envs = tmp_path / "envs"
    real, seen = runner.run_all, {}

    def run_all(*a, **kw):
        seen["clean"] = main(capsys, "envs", "clean", "--all", "--envs-dir", str(envs))
        return real(*a, **kw)

    monkeypatch.setattr(runner, "run_all", run_all)
    code = cli.main(["--versions", "a=2.6.3,b=2.7.0.post2", "--config", str(cfg), "--device", "cpu", "--quick",
                     "--offline", "--find-links", str(standins["wheels"]), "--envs-dir", str(envs),
                     "--wheel-cache", str(tmp_path / "cache"), "--output", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err[-3000:]
    ccode, err = seen["clean"]
    assert ccode == 3, err
    for lab in ("a", "b"):
        assert f"left {envs / lab} alone: a running matrix-run uses it" in err, err
    res = load_results(tmp_path / "out")
    assert [c["status"] for c in res["cases"]] == ["ok", "ok"]
    code, err = main(capsys, "envs", "clean", "--all", "--envs-dir", str(envs))  # the run has ended: its locks are gone
    assert code == 0 and not (envs / "a").exists() and not (envs / "b").exists(), err


def test_a_run_in_a_python_without_torch_says_to_install_it(tmp_path, capsys, monkeypatch):
    """--device cpu (or a GPU run) from an interpreter that cannot import torch, with --torch inherit:
    the usage error `plan` gives (exit 2), not an internal IndexError (new-user trial, 2026-12-01)."""
    real = envmod.probe

    def no_torch(python, *a, **kw):
        p = real(python, *a, **kw)
        return {**p, "torch": None, "error": "ModuleNotFoundError: No module named 'torch'"}

    monkeypatch.setattr(envmod, "probe", no_torch)
    code, err = main(capsys, "--versions", "2.6.3,2.7.0.post2", "--device", "cpu", "--quick", "--offline",
                     "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"),
                     "--output", str(tmp_path / "out"))
    assert code == 2, err
    assert "cannot import torch" in err and "internal error" not in err, err


def test_an_interrupt_that_kills_the_torch_probe_is_an_interrupt_not_a_torch_error(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the driver's torch probe runs: the probe dies (exit -15) and reads as "cannot import
    torch"; the run says it was interrupted (exit 130), not that torch is broken (new-user trial, 2026-12-02)."""
    import signal

    real = envmod.probe

    def killed(python, *a, **kw):
        p = real(python, *a, **kw)
        os.kill(os.getpid(), signal.SIGINT)  # the run's handler sets its stop event
        return {**p, "torch": None, "error": "probe failed (exit -15): "}

    monkeypatch.setattr(envmod, "probe", killed)
    code, err = main(capsys, "--versions", "2.6.3,2.7.0.post2", "--device", "cpu", "--quick", "--offline",
                     "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"),
                     "--output", str(tmp_path / "out"))
    assert code == 130, err
    assert "interrupted before anything was measured" in err and "cannot import torch" not in err, err


def test_compare_with_an_aa_run_says_why_versions_do_not_match(capsys):
    """A seed run against an A/A run: no label matches, and the A/A run's version names two envs."""
    root = Path(__file__).resolve().parents[1] / "reports"
    code, err = main(capsys, "compare", str(root / "h200-2.6.3-vs-2.7.0.post2-prefetch"), str(root / "h200-aa-4"))
    assert code == 2, err
    assert "B has 2.6.3 under several labels (an A/A run)" in err, err


@pytest.mark.parametrize("edit, named", [
    ({"cpu_hop": True, "speed_adjust": False}, "settings.cpu_hop: true needs settings.speed_adjust: true"),
    ({"cpu_state": "sometimes"}, "settings.cpu_state = 'sometimes'"),
    ({"max_repeats": 0}, "settings.max_repeats"),
    ({"host_precision": 7}, "settings.host_precision = 7"),
    # the numbers resume_args puts back as if typed on the command line (a string had raised TypeError
    # with a traceback; -1 was blamed on --set-seconds, which nobody typed: new-user trial)
    ({"time_budget_s": "40"}, "settings.time_budget_s = '40': must be a positive number"),
    ({"set_seconds": -1}, "settings.set_seconds = -1: must be a positive number"),
    ({"max_sets": 2.5}, "settings.max_sets = 2.5: must be a positive whole number"),
    ({"quick": "no"}, "settings.quick = 'no': must be true or false"),
    ({"cpus_request": "99"}, "the run was pinned with --cpus 99, and CPU(s) [99] not allowed to this process"),
    ({"cpus_request": "x,y"}, "settings.cpus_request = 'x,y': give auto, unpinned or a comma list"),
    # numbers the config's rules accept but the run's checks do not: named in results.json, not as flags
    ({"set_seconds": 0.05}, "the run's stored settings: settings.set_seconds 0.05: give at least 0.1"),
    ({"min_effect": 1.5}, "the run's stored settings: settings.min_effect 1.5: give a fraction between 0 and 1"),
    ({"workers_per_env": 99}, "the run's stored settings: settings.workers_per_env 99: give at most 8"),
    # a device the run cannot have timed on had been ignored (the resume ran on the command's device)
    ({"device": "gpu"}, "settings.device = 'gpu': must be cuda or cpu"),
    ({"probe_share": "half"}, "settings.probe_share = 'half': must be estimated"),
])
def test_resume_checks_the_stored_sampling_rules_as_a_config_file_is_checked(capsys, tmp_path, edit, named):
    """--resume puts the sampling rules the run ran under back from results.json's settings; they went in
    unchecked (a settings block with cpu_hop and no speed_adjust resumed a run that hopped on no readings).
    Now each is checked by the config's own rules: exit 2, the file and the setting named, nothing built."""
    p = _edited(tmp_path, "1.0")
    d = json.loads(p.read_text())
    d["settings"].update(edit)
    p.write_text(json.dumps(d))
    code, err = main(capsys, "--resume", str(p.parent))
    err = " ".join(err.split())
    assert code == 2, err
    assert "Traceback" not in err and named in err and str(p) in err, err
    assert "original command" in err or "resume it on the machine it ran on" in err, err
    assert not (tmp_path / "envs").exists()


def test_resume_keeps_the_stored_sampling_rules(tmp_path):
    """The rules a resumed run keeps come from its settings, over the stored config's, checked (above)."""
    from matrix_runner import pipeline
    d = json.loads(results.read_text(REAL))
    d["settings"].update({"max_repeats": 3, "cpu_state": "usual", "speed_adjust": True})
    cfg = pipeline.resumed_config(d, "x/results.json")
    assert (cfg.sampling.max_repeats, cfg.sampling.cpu_state, cfg.sampling.speed_adjust) == (3, "usual", True)
    d["settings"].pop("host_precision", None)  # a run from before that setting: 1 %
    assert pipeline.resumed_config(d, "x/results.json").sampling.host_precision == 0.01
    # probe_share: a run from before the setting counted the whole probe difference (full), whatever the
    # default is now; one that stored it keeps what it stored
    d["settings"].pop("probe_share", None)
    assert pipeline.resumed_config(d, "x/results.json").sampling.probe_share == "full"
    d["settings"]["probe_share"] = "estimated"
    samp = pipeline.resumed_config(d, "x/results.json").sampling
    assert (samp.probe_share, samp.probe_share_min_sets) == ("estimated", 8)  # started before the threshold was stored
    d["settings"]["probe_share_min_sets"] = 3
    assert pipeline.resumed_config(d, "x/results.json").sampling.probe_share_min_sets == 3
    assert pipeline.resumed_config({**d, "settings": {}}, "x/results.json").sampling.probe_share == "full"  # none stored


def test_an_interrupt_early_in_a_resume_says_the_earlier_sets_are_kept(capsys, tmp_path, monkeypatch):
    """Ctrl-C 1.5 s into a --resume of a run with 10 sets had printed "interrupted before anything was
    measured" and no --resume hint (new-user trial): the earlier part's sets are kept and named."""
    from matrix_runner import pipeline
    p = _edited(tmp_path, "1.0")

    def interrupted(self, args, argv, stop, prior):  # the interrupt lands while the run sets up
        stop.set()
        raise RuntimeError("the torch probe was killed")
    monkeypatch.setattr(pipeline.Run, "__init__", interrupted)
    code, err = main(capsys, "--resume", str(p.parent))
    err = " ".join(err.split())
    assert code == 130, err
    assert "interrupted before this part measured anything; the 10 process sets measured before are kept" in err
    assert f"matrix-run --resume {p.parent}" in err and "before anything was measured" not in err


@pytest.mark.skipif(bool(__import__("shutil").which("nvidia-smi")), reason="needs a machine without a GPU")
def test_resume_of_a_cuda_run_without_a_gpu_names_the_stored_device_not_a_flag(capsys, tmp_path, monkeypatch):
    """--resume refuses every other option, so "--device cuda: ... or use --device cpu" sent the user
    to a flag they could not give (new-user trial); it names settings.device. It says so before the
    command's --find-links are read (a committed H200 run resumed on a CPU machine failed on
    "--find-links /work/main/.carry/built: not a directory", new-user trial). And a run whose settings
    have no probe_share resumes with full, and says so."""
    p = _edited(tmp_path, "1.0")
    d = json.loads(p.read_text())
    assert d["settings"]["device"] == "cuda"
    d["settings"].pop("probe_share", None)
    d["settings"]["cwd"] = str(tmp_path)  # exists: a resume would work there
    d["command"] += ["--find-links", str(tmp_path / "no-such-dir")]
    p.write_text(json.dumps(d))
    code = cli.main(["--resume", str(p.parent)])
    cap = capsys.readouterr()
    out, err = " ".join(cap.out.split()), " ".join(cap.err.split())
    assert code == 2, err
    assert err.endswith(f"error: {p.parent}: the run timed its calls on cuda (settings.device in its results.json), "
                        "and no CUDA device is visible here (no nvidia-smi, no /dev/nvidiactl): resume it on a "
                        "machine with an NVIDIA GPU"), err
    assert "no-such-dir" not in err  # refused before the command's --find-links are read
    assert "its settings have no probe_share" in out + err and "sampling.probe_share: full" in out + err
    # where nvidia-smi is found but torch sees no GPU: the driver's probe decides, after the settings
    d["command"] = d["command"][:-2]
    p.write_text(json.dumps(d))
    from matrix_runner import pipeline
    monkeypatch.setattr(pipeline.shutil, "which", lambda name: "/usr/bin/" + name)
    code = cli.main(["--resume", str(p.parent)])
    cap = capsys.readouterr()
    out, err = " ".join(cap.out.split()), " ".join(cap.err.split())
    if code == 0:
        pytest.skip("this machine's torch sees a GPU")
    assert code == 2, err
    assert "the run timed its calls on cuda (settings.device in its results.json), and no CUDA device is visible" in err
    assert "resume it on a machine with an NVIDIA GPU" in err and "--device cpu" not in err
    assert "its settings have no probe_share" in out + err and "sampling.probe_share: full" in out + err


def test_resume_says_where_it_reads_the_commands_relative_paths(capsys, tmp_path):
    """--resume works in the directory the run was started in; where that is missing here it refuses
    (a new-user trial: it had built envs wherever the resume ran)."""
    p = _edited(tmp_path, "1.0")
    d = json.loads(p.read_text())
    d["settings"]["cwd"] = str(tmp_path / "gone")
    p.write_text(json.dumps(d))
    code, err = main(capsys, "--resume", str(p.parent))
    err = " ".join(err.split())
    assert code == 2 and f"the run was started in {tmp_path / 'gone'}, which is not here" in err, err
    assert "set settings.cwd in that results.json" in err and not (tmp_path / "envs").exists()  # refused, nothing built


def test_resume_keeps_the_config_source_the_run_recorded(tmp_path):
    """A resume had recorded results.json's own path as the config's source (new-user trial)."""
    from matrix_runner import pipeline
    d = json.loads(results.read_text(REAL))
    d["config_source"] = "/somewhere/est.yaml"
    assert pipeline.resumed_config(d, "x/results.json").source == "/somewhere/est.yaml"


def test_a_full_disk_at_the_end_keeps_every_set_and_says_how_to_go_on(capsys, standins, tiny_config, tmp_path,
                                                                      monkeypatch):
    """New-user trial (-o on a 300 KB tmpfs): "error: No space left on device", exit 2 (a usage error),
    with 3 of the 6 sets measured in the last partial write. Now the results go to a rescue folder
    and the error names both places, --resume and exit 3; a report that cannot be written is a warning."""
    import errno

    out = tmp_path / "out"
    real = results.write_json

    def full(path, data):
        if Path(path).parent == out:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)
    monkeypatch.setattr(results, "write_json", full)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    code, err = main(capsys, "--versions", "2.6.3,2.7.0.post2", "--device", "cpu", "--config", str(tiny_config),
                     "--max-sets", "2", "--set-seconds", "0.3", "--find-links", str(standins["wheels"]),
                     "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"), "--output", str(out))
    assert code == 3, err
    assert f"results not written to {out / 'results.json'} (No space left on device)" in err, err
    assert "partial results not written to" in err and "the run goes on" in err
    (rescue,) = (tmp_path / "tmp").glob("matrix-run-rescue-*")
    assert f"every set measured (2) was written to {rescue / 'results.json'} instead" in err, err
    assert f"`matrix-run --resume {out}` then adds sets" in err
    assert len(json.loads((rescue / "results.json").read_text())["sets"]) == 2
    # new-user trial: --resume from an older partial save (1 set, "running") while the rescue held
    # more went on, and its own rescue overwrote the first: now it is refused, naming the rescue
    doc = json.loads((rescue / "results.json").read_text())
    out.mkdir(exist_ok=True)
    real(out / "results.json", {**doc, "sets": doc["sets"][:1], "timing": {**doc["timing"], "stop_reason": "running"}})
    code, err = main(capsys, "--resume", str(out))
    assert code == 2, err
    assert (f"--resume {out}: its results.json holds 1 process set (stopped: running), but a rescue of this run "
            f"with 2 is at {rescue / 'results.json'} (written when results.json could not be): make room, move "
            f"that file to {out / 'results.json'}, then resume") in " ".join(err.split()), err
    # moved (copied) as told, extended, and the disk still full: a second rescue beside the first
    real(out / "results.json", doc)
    code, err = main(capsys, "--resume", str(out), "--max-sets", "3")
    assert code == 3, err
    second = [d for d in (tmp_path / "tmp").glob("matrix-run-rescue-*") if d != rescue]
    assert len(second) == 1 and f"was written to {second[0] / 'results.json'}" in " ".join(err.split()), err
    assert len(json.loads((rescue / "results.json").read_text())["sets"]) == 2  # the first one as it was
    assert len(json.loads((second[0] / "results.json").read_text())["sets"]) == 3
    monkeypatch.setattr(results, "write_json", real)  # the rescued run's report
    code, err = main(capsys, "report", str(rescue), "-o", str(tmp_path / "rep"))
    assert code == 0 and (tmp_path / "rep" / "index.html").is_file(), err


def test_an_unreachable_index_fails_the_env_naming_the_step_the_url_and_the_way_around(tmp_path):
    """new-user trial: an unreachable --index-url failed the env with "<urlopen error [Errno 111]
    Connection refused>" alone."""
    cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--index-url", "http://127.0.0.1:9/simple",
                 "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"),
                 "--output", str(tmp_path / "out"), timeout=300)
    err = " ".join((cp.stdout + cp.stderr).split())
    assert cp.returncode == 3, err[-2000:]
    (e,) = load_results(tmp_path / "out")["envs"]
    assert e["status"] == "failed" and e["error"].startswith("downloading the sdist: could not reach the network: ")
    assert "--index-url http://127.0.0.1:9/simple" in e["error"] and "--find-links DIR --offline" in e["error"]
    assert "<urlopen error" not in e["error"] and e["error"][:60] in err
