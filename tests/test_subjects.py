"""Subjects beyond flash-attn 2.x (matrix_runner/subjects.py): the --versions syntax, and FA4's
install path — uv resolves flash-attn-4==VERSION with its dependencies from --find-links, the
inherited torch excluded — with a stand-in FA4 (pure Python, flash_attn.cute.interface.flash_attn_func
returning (out, lse), depending on a stand-in nvidia-cutlass-dsl and on torch), timed by the worker."""
import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest
import standin
from conftest import load_results, run_cli

from matrix_runner import envs, subjects

FA4_INTERFACE = '''import math
import torch
import nvidia_cutlass_dsl_standin  # a dependency uv must have installed


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(None, None), softcap=0.0,
                    num_splits=1, pack_gqa=None, deterministic=False):
    """Stand-in of FA4's flash_attn_func: (batch, seqlen, heads, dim) in, (out, lse) back."""
    return attention(q, k, v, softmax_scale, causal)
''' + standin.ATTENTION


def _wheel(dest: Path, name: str, version: str, files: dict, requires: list, extras: tuple = ()) -> Path:
    """A minimal pure-Python wheel (zip with METADATA, WHEEL, RECORD)."""
    dist = name.replace("-", "_")
    di = f"{dist}-{version}.dist-info"
    meta = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Provides-Extra: {e}\n" for e in extras)
            + "".join(f"Requires-Dist: {r}\n" for r in requires))
    files = {**files, f"{di}/METADATA": meta, f"{di}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rec = []
    for n, t in files.items():
        d = base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode()
        rec.append(f"{n},sha256={d},{len(t.encode())}")
    rec.append(f"{di}/RECORD,,")
    path = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for n, t in {**files, f"{di}/RECORD": "\n".join(rec) + "\n"}.items():
            z.writestr(n, t)
    return path


@pytest.fixture(scope="module")
def fa4_links(tmp_path_factory):
    d = tmp_path_factory.mktemp("fa4-links")
    _wheel(d, "flash-attn-4", "4.0.0b36", {"flash_attn/cute/__init__.py": "", "flash_attn/cute/interface.py": FA4_INTERFACE},
           ["nvidia-cutlass-dsl>=4.6.2", "torch", 'nvidia-cutlass-dsl-libs-cu13==4.6.2; extra == "cu13"'], ("cu13",))
    _wheel(d, "nvidia-cutlass-dsl", "4.6.2", {"nvidia_cutlass_dsl_standin.py": "X = 1\n"}, [])
    _wheel(d, "nvidia-cutlass-dsl-libs-cu13", "4.6.2", {"cu13_standin.py": ""}, [])
    return d


def test_versions_syntax_names_the_package_per_env():
    got = envs.parse_versions("fa2=2.8.3,fa4=flash-attn-4==4.0.0b36,flash_attn_4==4.0.0b35,x=flash-attn==2.6.3")
    assert [(r.label, r.package, r.version, r.spec) for r in got] == [
        ("fa2", "flash-attn", "2.8.3", "2.8.3"),
        ("fa4", "flash-attn-4", "4.0.0b36", "flash-attn-4==4.0.0b36"),
        ("flash-attn-4-4.0.0b35", "flash-attn-4", "4.0.0b35", "flash-attn-4==4.0.0b35"),
        ("x", "flash-attn", "2.6.3", "2.6.3")]
    assert envs.parse_versions("fa4=flash-attn-4[cu13]==4.0.0b36")[0].spec == "flash-attn-4[cu13]==4.0.0b36"
    assert got[1].subject.module == "flash_attn.cute" and got[1].subject.jit and not got[1].subject.source_build
    for bad, why in (("fa4=flash-attn-5==1.0", "not a known subject (known: flash-attn, flash-attn-4, flash-attn-3)"),
                     ("fa4=flash-attn-4>=4.0", "not a PEP 440 version"),
                     ("fa4=flash-attn-4==>4", "give one exact version after =="),
                     ("fa4=flash-attn-4==4.0.0b36,fa4=2.8.3", "label 'fa4' appears twice")):
        with pytest.raises(envs.UsageError, match=why.replace("(", r"\(").replace(")", r"\)")):
            envs.parse_versions(bad)


def test_worker_functions_stay_inside_the_flash_attn_namespace():
    for s in subjects.SUBJECTS.values():
        mod = s.func.partition(":")[0]
        assert mod.split(".")[0] in subjects.NAMESPACES, s
    assert subjects.get("Flash_Attn_4").package == "flash-attn-4"


def test_plan_of_fa4_offline_needs_find_links(tmp_path, fa4_links):
    cp = run_cli("plan", "--versions", "fa4=flash-attn-4==4.0.0b36", "--json", "--envs-dir", str(tmp_path / "e"),
                 "--wheel-cache", str(tmp_path / "c"), "--offline")
    (item,) = json.loads(cp.stdout)
    assert cp.returncode == 3 and item["method"] == "failed" and "--find-links" in item["error"]
    cp = run_cli("plan", "--versions", "fa4=flash-attn-4==4.0.0b36", "--json", "--envs-dir", str(tmp_path / "e"),
                 "--wheel-cache", str(tmp_path / "c"), "--offline", "--find-links", str(fa4_links))
    (item,) = json.loads(cp.stdout)
    assert cp.returncode == 0 and item["method"] == "resolve" and item["key"]["package"] == "flash-attn-4"
    assert any("the inherited torch excluded" in n for n in item["notes"])


def test_fa4_gets_the_cuda_13_extra_under_a_cuda_13_torch(tmp_path):
    """FA4's cutlass-dsl ships CUDA 12 libraries unless [cu13] is asked for: under a CUDA 13 torch the
    plan adds it (and says so); extras written by the user are kept."""
    opts = envs.Options(envs_dir=tmp_path / "envs", cache_dir=tmp_path / "cache")
    dprobe = {"python": "3.12.3", "torch": {"version": "2.11.0+cu130", "cuda": "13.0", "cxx11abi": True}}
    req = envs.parse_versions("fa4=flash-attn-4==4.0.0b36")[0]
    item = envs.plan_env(req, [], opts, dprobe)
    assert item.method == "resolve" and req.spec == "flash-attn-4[cu13]==4.0.0b36" and item.key["extras"] == ["cu13"]
    assert any("is CUDA 13.0: installing flash-attn-4[cu13]==4.0.0b36" in n for n in item.notes)
    req12 = envs.parse_versions("fa4=flash-attn-4==4.0.0b36")[0]
    envs.plan_env(req12, [], opts, {**dprobe, "torch": {**dprobe["torch"], "cuda": "12.8"}})
    assert req12.extras == ()


def test_uv_resolves_fa4_with_its_dependencies_but_never_torch(tmp_path, fa4_links):
    """--dry-run of the env's install command: FA4 and its cutlass dependency, no torch (inherited)."""
    req = envs.parse_versions("fa4=flash-attn-4==4.0.0b36")[0]
    opts = envs.Options(envs_dir=tmp_path / "envs", cache_dir=tmp_path / "cache", find_links=[fa4_links], offline=True)
    tid = {"mode": "inherit", "version": "x", "site_dirs": []}
    log = tmp_path / "uv.log"
    py = envs.create_venv(tmp_path / "envs" / "fa4", __import__("sys").executable, tid, opts, log)
    envs.install_subject(py, req, tid, opts, log, dry_run=True)
    text = log.read_text()
    assert "flash-attn-4==4.0.0b36" in text and "nvidia-cutlass-dsl==4.6.2" in text, text[-2000:]
    assert "+ torch" not in text


def test_fa4_env_is_timed_by_the_worker(tmp_path, fa4_links, standins, tiny_config):
    """A --quick CPU run of flash-attn 2.6.3 (stand-in) against the FA4 stand-in: FA4's env is
    resolved by uv (its cutlass dependency installed, no torch of its own), the worker imports
    flash_attn.cute.interface.flash_attn_func and times it; both envs are ok."""
    out = tmp_path / "run"
    cp = run_cli("--versions", "2.6.3,fa4=flash-attn-4==4.0.0b36", "--device", "cpu", "--quick",
                 "--find-links", str(standins["wheels"]), "--find-links", str(fa4_links), "--offline",
                 "--config", str(tiny_config), "--envs-dir", str(tmp_path / "envs"),
                 "--wheel-cache", str(tmp_path / "cache"), "--output", str(out), timeout=900)
    doc = load_results(out)
    st = {e["label"]: e["status"] for e in doc["envs"]}
    assert st == {"2.6.3": "ok", "fa4": "ok"}, (cp.stdout[-3000:], cp.stderr[-3000:])
    fa4 = next(e for e in doc["envs"] if e["label"] == "fa4")
    assert fa4["subject"] == "flash-attn-4" and fa4["flash_attn_version"] == "4.0.0b36"
    assert fa4["flash_attn_file"].endswith("flash_attn/cute/__init__.py") and fa4["build"]["method"] == "resolve"
    assert next(e for e in doc["envs"] if e["label"] == "2.6.3")["subject"] == "flash-attn"
    marker = json.loads((tmp_path / "envs" / "fa4" / subjects.MARKER).read_text())
    assert marker["func"] == "flash_attn.cute.interface:flash_attn_func"
    assert marker["env"]["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(tmp_path / "envs" / "fa4" / "cute-dsl-cache")
    site = next((tmp_path / "envs" / "fa4" / "lib").glob("python*/site-packages"))
    assert (site / "nvidia_cutlass_dsl_standin.py").exists() and not (site / "torch").exists()
    fa4_cases = [c for c in doc["cases"] if c["env"] == "fa4"]
    assert fa4_cases and all(c["status"] == "ok" for c in fa4_cases), fa4_cases[:1]


def test_wheelhouse_collects_fa4_and_its_dependencies_but_not_torch(tmp_path, fa4_links):
    """`matrix-run wheelhouse` for a subject: uv resolves its pins (torch excluded), pip downloads
    each wheel; here both read only the stand-in find-links directory (--no-index)."""
    out = tmp_path / "house"
    cp = run_cli("wheelhouse", "--versions", "fa4=flash-attn-4==4.0.0b36", "-o", str(out), "--requirements", "",
                 "--wheel-cache", str(tmp_path / "cache"), "--python-version", "3.12", "--find-links", str(fa4_links),
                 "--no-index")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert sorted(p.name for p in out.iterdir()) == ["flash_attn_4-4.0.0b36-py3-none-any.whl",  # + every CUDA variant
                                                     "nvidia_cutlass_dsl-4.6.2-py3-none-any.whl",
                                                     "nvidia_cutlass_dsl_libs_cu13-4.6.2-py3-none-any.whl"]
    # the extras stay in the printed item (escaped, not eaten as rich markup)
    flat = " ".join(cp.stdout.split())
    assert ("nvidia-cutlass-dsl==4.6.2 wheel (for flash-attn-4==4.0.0b36)" in flat
            or "nvidia-cutlass-dsl==4.6.2 wheel (for flash-attn-4[cu13]==4.0.0b36)" in flat), flat
