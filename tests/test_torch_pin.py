"""--torch X.Y.Z: each env gets its own torch, installed by uv (here from the machine's local torch
wheel via --find-links), instead of inheriting the driver's."""
import glob
import json
import sys

import pytest
from conftest import load_results, run_cli

LOCAL = sorted(glob.glob(f"/opt/wheels/torch-2.13.0*-cp{sys.version_info.major}{sys.version_info.minor}-*.whl"))


@pytest.mark.skipif(not LOCAL, reason="no local torch 2.13.0 wheel for this Python in /opt/wheels")
def test_pinned_torch_env(standins, tiny_config, tmp_path):
    cp = run_cli("--versions", "2.6.3", "--torch", "2.13.0", "--find-links", "/opt/wheels",
                 "--find-links", str(standins["wheels"]), "--device", "cpu", "--quick", "--config", str(tiny_config),
                 "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"),
                 "--output", str(tmp_path / "out"))
    assert cp.returncode == 0, cp.stderr[-3000:]
    res = load_results(tmp_path / "out")
    (env,) = res["envs"]
    assert env["status"] == "ok" and env["torch"].startswith("2.13.0")
    rec = json.loads((tmp_path / "envs" / "2.6.3" / "matrix-run-env.json").read_text())
    assert rec["torch"]["mode"] == "pinned"
    # the env has its own torch, not a .pth onto the driver's site-packages
    assert not list((tmp_path / "envs" / "2.6.3").rglob("_matrix_run_inherit.pth"))
    assert list((tmp_path / "envs" / "2.6.3").rglob("site-packages/torch/__init__.py"))
