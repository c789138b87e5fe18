"""The command line: no-GPU behaviour, exit codes, bad input."""
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


@pytest.mark.parametrize("args,needle", [
    (["--versions", "2.6.3;rm -rf ~"], "is not a PEP 440 version"),
    (["--versions", "../../x=2.6.3"], "label '../../x' may only use"),
    (["--versions", "a=2.6.3,a=2.7.0"], "label 'a' appears twice"),
    (["--versions", ""], "give at least one flash-attn version"),
    (["--versions", "2.6.3", "--torch", "latest"], "--torch 'latest'"),
    (["--versions", "2.6.3", "--archs", "hopper"], "--archs 'hopper'"),
    (["--versions", "2.6.3", "--config", "/nonexistent.yaml"], "cannot read the file"),
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
