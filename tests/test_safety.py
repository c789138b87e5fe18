"""Nothing of the user's is deleted or overwritten: foreign dirs in --envs-dir, an existing run in
--output; and inputs that cannot work are refused up front."""
from pathlib import Path

from conftest import load_results, run_cli


def test_envs_clean_leaves_foreign_dirs_alone(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "a.jpg").write_text("x")
    cp = run_cli("envs", "clean", "--all", "--envs-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stderr
    assert (tmp_path / "photos" / "a.jpg").read_text() == "x"
    assert "left" in cp.stderr and "not a matrix-run env" in " ".join(cp.stderr.split())
    # named: refused (exit 2), nothing removed (it had exited 0 with "left ... alone": new-user trial)
    cp = run_cli("envs", "clean", "photos", "--envs-dir", str(tmp_path))
    assert cp.returncode == 2 and (tmp_path / "photos" / "a.jpg").read_text() == "x"
    assert f"envs clean: {tmp_path / 'photos'}: not a matrix-run env" in " ".join(cp.stderr.split()), cp.stderr


def test_a_user_folder_named_like_a_label_is_never_wiped(standins, tiny_config, tmp_path):
    envs = tmp_path / "envs"
    (envs / "2.6.3").mkdir(parents=True)
    (envs / "2.6.3" / "important.txt").write_text("keep me")
    cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--quick", "--config", str(tiny_config),
                 "--find-links", str(standins["wheels"]), "--envs-dir", str(envs),
                 "--wheel-cache", str(tmp_path / "cache"), "--output", str(tmp_path / "out"))
    assert cp.returncode == 3
    assert (envs / "2.6.3" / "important.txt").read_text() == "keep me"
    (e,) = load_results(tmp_path / "out")["envs"]
    assert e["status"] == "failed" and "is not a matrix-run env" in e["error"] and "left untouched" in e["error"]


def test_an_existing_run_is_not_overwritten(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")
    cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--output", str(out), "--envs-dir", str(tmp_path / "e"))
    assert cp.returncode == 2
    assert "already holds a run" in " ".join(cp.stderr.split()) and "--resume" in cp.stderr
    assert (out / "results.json").read_text() == "{}"
    # an archived run (results.json.gz) too: a new results.json beside it hid it from every reader
    # (new-user trial, `-o reports/h200-aa-66`)
    arch = tmp_path / "archived"
    arch.mkdir()
    (arch / "results.json.gz").write_bytes(b"x")
    cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--output", str(arch), "--envs-dir", str(tmp_path / "e"))
    assert cp.returncode == 2 and "already holds a run (results.json.gz)" in " ".join(cp.stderr.split())
    assert sorted(p.name for p in arch.iterdir()) == ["results.json.gz"]
    # a finished run is not to be "finished with --resume" (which then said "nothing to resume":
    # new-user trial): one that stopped on its budget can be extended, one decided says nothing more
    import gzip
    import json
    doc = json.loads(gzip.decompress((Path(__file__).resolve().parents[1] / "reports" / "h200-aa-103" /
                                      "results.json.gz").read_bytes()))
    for stop, hint in (("time budget 60 s: another process set would overrun it",
                        "or time more sets for that run with --resume {} --time-budget S"),
                       ("all wall-time verdicts decided", None), ("interrupted", "or finish that run with --resume {}")):
        done = tmp_path / f"done-{len(stop)}"
        done.mkdir()
        (done / "results.json").write_text(json.dumps({**doc, "timing": {**doc["timing"], "stop_reason": stop}}))
        cp = run_cli("--versions", "2.6.3", "--device", "cpu", "--output", str(done), "--envs-dir", str(tmp_path / "e"))
        err = " ".join(cp.stderr.split())
        assert cp.returncode == 2 and f"--output {done} already holds a run (results.json); give another --output" in err
        assert (hint.format(done) in err) if hint else ("--resume" not in err), err


def test_device_cuda_without_a_gpu_is_refused_up_front(tmp_path):
    cp = run_cli("--versions", "2.6.3", "--device", "cuda", "--output", str(tmp_path / "o"),
                 "--envs-dir", str(tmp_path / "e"), "--offline")
    assert cp.returncode == 2
    assert "--device cuda: no CUDA device is visible here" in " ".join(cp.stderr.split())
    assert not (tmp_path / "e" / "2.6.3").exists()


def test_non_finite_softmax_scale_is_refused(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("softmax_scale: .nan\n")
    cp = run_cli("plan", "--versions", "2.6.3", "--config", str(cfg), "--envs-dir", str(tmp_path / "e"), "--offline")
    assert cp.returncode == 2 and "softmax_scale = nan" in cp.stderr


def test_resume_refuses_to_pool_two_builds_under_one_label(standins, tiny_config, tmp_path):
    import json
    import shutil

    import standin
    wheels = tmp_path / "wheels"
    shutil.copytree(standins["wheels"], wheels)
    out = tmp_path / "out"
    args = ["--versions", "2.6.3,2.7.0.post2", "--device", "cpu", "--quick", "--config", str(tiny_config),
            "--find-links", str(wheels), "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "c")]
    cp = run_cli(*args, "--output", str(out))
    assert cp.returncode == 0, cp.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    res["timing"]["stop_reason"] = "interrupted"  # as if Ctrl-C had stopped it after the first round
    res["sets"] = res["sets"][:1]
    (out / "results.json").write_text(json.dumps(res))
    for w in wheels.glob("flash_attn-2.7.0.post2-*"):
        w.unlink()
    standin.build_wheel(standin.make_source(tmp_path / "src", "2.7.0.post2", 0.0), wheels)  # another build
    cp = run_cli("--resume", str(out))
    assert cp.returncode == 2, cp.stderr[-2000:]
    assert "env 2.7.0.post2 now has another flash-attn wheel" in " ".join(cp.stderr.split())


def test_an_interrupt_during_env_preparation_is_reported_as_such(standins, tmp_path):
    # Ctrl-C cuts a step short; it must not be reported in that step's own words (e.g. "a source
    # build needs setuptools" after the import check of setuptools was killed)
    import sys

    from matrix_runner import envs, proc
    from matrix_runner.config import Case
    opts = envs.Options(envs_dir=tmp_path / "envs", cache_dir=tmp_path / "cache", find_links=[standins["wheels"]])
    opts.envs_dir.mkdir()
    cases = [Case(op="fwd", batch=1, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16)]
    dprobe = envs.probe(sys.executable)
    req = envs.parse_versions("2.6.3")[0]
    item = envs.plan_env(req, cases, opts, dprobe)
    assert item.method == "find-links"
    proc._stopping.set()
    try:
        res = envs.prepare_env(req, item, opts, dprobe, cases)
    finally:
        proc._stopping.clear()
    assert res.status == "failed" and res.error == "interrupted while creating venv (uv)", res.error


def test_envs_clean_without_labels_asks_for_all_and_removes_nothing(tmp_path):
    """A bare ``envs clean`` used to remove every env; now it names them and wants --all (exit 2)."""
    import json

    env = tmp_path / "2.6.3"
    (env / "bin").mkdir(parents=True)
    (env / "matrix-run-env.json").write_text(json.dumps({"label": "2.6.3", "status": "ok"}))
    cp = run_cli("envs", "clean", "--envs-dir", str(tmp_path))
    err = " ".join(cp.stderr.split())
    assert cp.returncode == 2 and "give --all to remove every env" in err and "2.6.3" in err, err
    assert env.is_dir()
    cp = run_cli("envs", "clean", "2.6.3", "--all", "--envs-dir", str(tmp_path))
    assert cp.returncode == 2 and "not both" in cp.stderr and env.is_dir()
    cp = run_cli("envs", "clean", "--all", "--envs-dir", str(tmp_path))
    assert cp.returncode == 0, cp.stderr
    assert not env.exists()


def test_a_failed_rebuild_puts_the_working_env_back(standins, tmp_path, monkeypatch):
    """New-user trial: ``--torch 1.0`` (no wheel for this Python) re-created a run's working envs and
    uv then failed: both were gone. The old env now waits aside until the new one is whole."""
    import sys

    from matrix_runner import envs
    from matrix_runner.config import Case
    from matrix_runner.envs import prepare
    opts = envs.Options(envs_dir=tmp_path / "envs", cache_dir=tmp_path / "cache", find_links=[standins["wheels"]])
    opts.envs_dir.mkdir()
    cases = [Case(op="fwd", batch=1, seqlen_q=16, seqlen_k=16, nheads=2, nheads_k=2, head_dim=16)]
    dprobe = envs.probe(sys.executable)
    req = envs.parse_versions("2.6.3")[0]
    first = envs.prepare_env(req, envs.plan_env(req, cases, opts, dprobe), opts, dprobe, cases)
    assert first.status == "ok", first.error
    env_dir = opts.envs_dir / "2.6.3"
    (env_dir / "mine.txt").write_text("the working env")
    record = (env_dir / envs.RECORD).read_text()
    from dataclasses import replace
    rebuild = envs.plan_env(req, cases, replace(opts, rebuild=True), dprobe)
    assert rebuild.method != "reuse"

    def fails(*a, **k):
        assert not (env_dir / "mine.txt").exists()  # a new venv is being made at the env's path
        raise envs.EnvError("planted: no solution found when resolving dependencies")
    monkeypatch.setattr(prepare, "_prepare_flash_attn", fails)
    res = envs.prepare_env(req, rebuild, replace(opts, rebuild=True), dprobe, cases)
    assert res.status == "failed" and "planted" in res.error
    assert res.error.endswith(f"; the env that was in {env_dir} before is kept as it was"), res.error
    assert (env_dir / "mine.txt").read_text() == "the working env" and (env_dir / envs.RECORD).read_text() == record
    assert sorted(p.name for p in opts.envs_dir.iterdir() if p.name.endswith(".previous")) == []
    monkeypatch.undo()
    again = envs.prepare_env(req, rebuild, replace(opts, rebuild=True), dprobe, cases)  # a rebuild that works
    assert again.status == "ok" and not (env_dir / "mine.txt").exists() and (env_dir / envs.RECORD).is_file()
    assert sorted(p.name for p in opts.envs_dir.iterdir() if p.name.endswith(".previous")) == []
