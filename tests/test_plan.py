"""`matrix-run plan`: the resolution order and the kernel sets, asserted exactly; the wheel key
keeps a wheel built against one torch from being installed under another."""
import json

from conftest import run_cli


def plan(tmp_path, config_text, *extra):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(config_text)
    cp = run_cli("plan", "--versions", "2.6.3", "--config", str(cfg), "--json", "--envs-dir", str(tmp_path / "envs"),
                 "--wheel-cache", str(tmp_path / "cache"), "--offline", *extra)
    return cp, (json.loads(cp.stdout) if cp.stdout.strip().startswith("[") else None)


def test_slim_kernel_sets_for_known_configs(tmp_path, standins):
    cases = [
        ("ops: [fwd, bwd]\nshapes: [{batch: 2, seqlen: 50, nheads: 16, embed_dim: 256}]\n",
         ["bwd_hdim32_fp16", "fwd_hdim32_fp16", "fwd_split_hdim32_fp16"]),           # head_dim 16 -> 32
        ("ops: [fwd]\nshapes: [{batch: 2, seqlen: 50, nheads: 4, head_dim: 60}]\n",
         ["fwd_hdim64_fp16", "fwd_split_hdim64_fp16"]),                                # head_dim 60 -> 64
        ("ops: [fwd]\ndtype: bf16\ncausal: true\nshapes: [{batch: 2, seqlen: 50, nheads: 4, head_dim: 128}]\n",
         ["fwd_hdim128_bf16_causal", "fwd_split_hdim128_bf16_causal"]),
        ("ops: [bwd]\nshapes: [{batch: 1, seqlen: 8, nheads: 2, head_dim: 16}, {batch: 1, seqlen: 8, nheads: 2, head_dim: 200}]\n",
         ["bwd_hdim256_fp16", "bwd_hdim32_fp16", "fwd_hdim256_fp16", "fwd_hdim32_fp16",
          "fwd_split_hdim256_fp16", "fwd_split_hdim32_fp16"]),                        # 200 -> 256, not 224
    ]
    for text, kernels in cases:
        cp, p = plan(tmp_path, text, "--build", "slim", "--archs", "90", "--find-links", str(standins["sdists"]))
        assert cp.returncode == 0, cp.stderr
        (item,) = p
        assert item["method"] == "source-slim"
        assert item["kernels"] == kernels
        assert item["archs"] == ["90"] and item["key"]["archs"] == ["90"] and item["key"]["kernels"] == kernels
        assert item["jobs"]["max_jobs"] >= 1 and item["estimate_s"] > 0
        assert item["sdist"].endswith("flash_attn-2.6.3.tar.gz")


def test_offline_without_any_source_fails_fast_with_the_reason(tmp_path):
    cp, p = plan(tmp_path, "ops: [fwd]\n")
    assert cp.returncode == 3
    assert p[0]["method"] == "failed"
    assert "no flash_attn-2.6.3.tar.gz sdist in --find-links" in p[0]["error"] and "--offline" in p[0]["error"]


def test_cached_wheel_for_another_torch_is_never_used(tmp_path, standins):
    """A cache entry whose key names another torch is skipped (with the reason); the one for this
    torch is used."""
    cp, p = plan(tmp_path, "ops: [fwd]\n", "--find-links", str(standins["sdists"]))
    want = p[0]["key"]
    assert p[0]["method"] == "source-nocuda"
    wheel = next(standins["wheels"].glob("flash_attn-2.6.3-*.whl"))
    from matrix_runner import wheels
    other = dict(want, torch="2.12.0+cpu")
    wheels.cache_store(tmp_path / "cache", wheel, other, {"method": "test"})
    cp, p = plan(tmp_path, "ops: [fwd]\n", "--find-links", str(standins["sdists"]))
    assert p[0]["method"] == "source-nocuda"
    assert any("torch '2.12.0+cpu' != wanted" in n for n in p[0]["notes"])
    wheels.cache_store(tmp_path / "cache", wheel, want, {"method": "test"})
    cp, p = plan(tmp_path, "ops: [fwd]\n", "--find-links", str(standins["sdists"]))
    assert p[0]["method"] == "cache" and wheels.key_id(want) in p[0]["wheel"]


def test_check_probe_rules(tmp_path):
    from matrix_runner.envs import check_probe
    env = tmp_path / "envs" / "a"
    site = env / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    ok = {"error": None, "flash_attn": {"version": "2.6.3", "file": str(site / "flash_attn" / "__init__.py"),
                                        "ext_file": str(site / "flash_attn_2_cuda.so")}}
    assert check_probe(ok, env, "2.6.3") is None
    assert check_probe(ok, env, None) is None and check_probe(ok, env, "local") is None
    assert check_probe({**ok, "error": "import flash_attn failed: X"}, env, "2.6.3") == "import flash_attn failed: X"
    outside = {**ok, "flash_attn": {**ok["flash_attn"], "file": "/usr/lib/python3/site-packages/flash_attn/__init__.py"}}
    assert "not from the env" in check_probe(outside, env, "2.6.3")
    no_ext = {**ok, "flash_attn": {**ok["flash_attn"], "ext_file": None}}
    assert "flash_attn_2_cuda is not installed in the env: flash-attn was built without CUDA" in check_probe(no_ext, env, "2.6.3")
    other_ext = {**ok, "flash_attn": {**ok["flash_attn"], "ext_file": "/usr/lib/flash_attn_2_cuda.so"}}
    assert "flash_attn_2_cuda was imported from /usr/lib" in check_probe(other_ext, env, "2.6.3")
    assert check_probe(ok, env, "2.7.0.post2") == "the env imports flash_attn 2.6.3, not the requested 2.7.0.post2"
    # a sibling env whose name starts with this one's is not "inside" it
    sib = {**ok, "flash_attn": {**ok["flash_attn"], "file": str(tmp_path / "envs" / "a2" / "x.py")}}
    assert check_probe(sib, env, "2.6.3") is not None
