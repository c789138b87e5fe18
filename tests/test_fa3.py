"""FlashAttention 3 from a source tree (matrix_runner/fa3.py): reading a checkout or an archive, the
DISABLE switches a config allows (the same kernels a full build would run), the kernel files they
leave (checked against the real tree's instantiation names, commit 0251105a), the plan, and a CPU run
end to end with a stand-in tree whose setup.py reads the real switch names and whose
flash_attn_func refuses what its build left out -- so a wrong switch fails the run here."""
import json
import tarfile
import zipfile
from pathlib import Path

import pytest
import standin
from conftest import load_results, run_cli

from matrix_runner import envs, fa3, subjects, worker
from matrix_runner.config import Case

FIXTURE = Path(__file__).parent / "fixtures" / "fa3-0251105a"


def case(op="fwd", head_dim=64, dtype="fp16", causal=False, nheads=16, nheads_k=16, **kw):
    return Case(op=op, batch=2, seqlen_q=128, seqlen_k=128, nheads=nheads, nheads_k=nheads_k, head_dim=head_dim,
                dtype=dtype, causal=causal, **kw)


def test_tree_is_read_from_a_checkout_its_hopper_dir_or_an_archive(tmp_path):
    root = standin.make_fa3_tree(tmp_path / "co")
    a = fa3.open_tree(root)
    assert (a.version, a.path, len(a.tree_id)) == ("3.0.0", root.resolve(), 16)
    assert "hopper/setup.py" in a.files and "csrc/cutlass/include/cutlass/cutlass.h" in a.files
    assert fa3.open_tree(root / "hopper").tree_id == a.tree_id
    tgz = tmp_path / "fa.tar.gz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(root, arcname="flash-attention-0251105a")
    zp = tmp_path / "fa.zip"
    with zipfile.ZipFile(zp, "w") as z:
        for f in root.rglob("*"):
            if f.is_file():
                z.write(f, f.relative_to(root).as_posix())
    t, z = fa3.open_tree(tgz), fa3.open_tree(zp)
    assert (t.tree_id, t.prefix, z.tree_id, z.prefix) == (a.tree_id, "flash-attention-0251105a/", a.tree_id, "")
    # build outputs in the checkout do not change its identity; a source edit does
    (root / "hopper" / "build").mkdir()
    (root / "hopper" / "build" / "x.o").write_text("obj")
    (root / "hopper" / "flash_attn_config.py").write_text("CONFIG = {}")
    assert fa3.open_tree(root).tree_id == a.tree_id
    (root / "hopper" / "flash_attn_interface.py").write_text("# edited\n")
    assert fa3.open_tree(root).tree_id != a.tree_id
    # materialize writes only the build files, the same from either form
    m1, m2 = fa3.materialize(a, tmp_path / "m1"), fa3.materialize(t, tmp_path / "m2")
    files = sorted(p.relative_to(m1).as_posix() for p in m1.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(m2).as_posix() for p in m2.rglob("*") if p.is_file()) == a.files


def test_tree_errors_say_what_is_missing(tmp_path):
    with pytest.raises(fa3.TreeError, match="no hopper/setup.py"):
        fa3.open_tree(tmp_path)
    root = standin.make_fa3_tree(tmp_path / "nocutlass", cutlass=False)
    with pytest.raises(fa3.TreeError, match="git submodule update --init csrc/cutlass"):
        fa3.open_tree(root)
    root = standin.make_fa3_tree(tmp_path / "nover")
    (root / "hopper" / "__init__.py").write_text("")
    with pytest.raises(fa3.TreeError, match="no __version__"):
        fa3.open_tree(root)
    bad = tmp_path / "x.tar.gz"
    bad.write_bytes(b"not a tar")
    with pytest.raises(fa3.TreeError, match="cannot read the archive"):
        fa3.open_tree(bad)
    with pytest.raises(fa3.TreeError, match="no such file"):
        fa3.open_tree(tmp_path / "absent")
    two = tmp_path / "two.tar.gz"  # an archive of two trees: which one would be built is not guessed
    good = standin.make_fa3_tree(tmp_path / "good")
    with tarfile.open(two, "w:gz") as tf:
        tf.add(good, arcname="x")
        tf.add(good, arcname="y")
    with pytest.raises(fa3.TreeError, match=r"holds 2 flash-attention trees \(x, y\)"):
        fa3.open_tree(two)


def test_versions_syntax_for_a_tree(tmp_path):
    root = standin.make_fa3_tree(tmp_path)
    got = envs.parse_versions(f"fa2=2.8.3,fa3=flash-attn-3@{root},flash-attn-3@{root / 'hopper'}".replace(
        "flash-attn-3@" + str(root / "hopper"), "b=flash-attn-3@" + str(root / "hopper")))
    assert [(r.label, r.package, r.version) for r in got] == [
        ("fa2", "flash-attn", "2.8.3"), ("fa3", "flash-attn-3", str(root.resolve())), ("b", "flash-attn-3", str(root.resolve()))]
    assert got[1].spec == f"flash-attn-3@{root.resolve()}" and got[1].subject.tree
    assert envs.parse_versions(f"flash-attn-3@{root}")[0].label == "fa3"
    for bad, why in ((f"fa3=flash-attn-3@{tmp_path / 'nope'}", "no such file"),
                     ("fa3=flash-attn-3@", "give the path of a flash-attention checkout"),
                     (f"x=flash-attn-4@{root}", "not built from a source tree"),
                     (f"flash-attn-3@{root},flash-attn-3@{root}", "label 'fa3' appears twice"),
                     (f"a={root}", f"a=flash-attn-3@{root}")):
        with pytest.raises(envs.UsageError, match=why.replace("(", r"\(").replace(")", r"\)")):
            envs.parse_versions(bad)


def test_switches_keep_what_a_full_build_would_run():
    seed = [case("fwd", 16), case("bwd", 16)]  # the seed config: fp16, head_dim 16
    off, notes = fa3.switches(seed)
    assert sorted(set(fa3.SWITCHES) - set(off)) == ["BACKWARD", "FP16", "HDIM64"]
    assert "head dims 64 kept" in notes[0]
    # bf16, fwd only: no fp16, no backward; head_dim 128 non-causal: the cluster launch is kept
    off, _ = fa3.switches([case("fwd", 128, "bf16"), case("fwd", 80, "bf16", causal=True)])
    assert sorted(set(fa3.SWITCHES) - set(off)) == ["CLUSTER", "HDIM128", "HDIM96"]
    off, _ = fa3.switches([case("fwd", 128, "bf16", causal=True)])
    assert "CLUSTER" in off  # causal never clusters (flash_fwd_launch_template.h)
    off, _ = fa3.switches([case("fwd", 64, "bf16", nheads_k=2)])
    assert "PACKGQA" not in off  # GQA: the PackGQA heuristic may pick it
    off, _ = fa3.switches([case("fwd", 128, "bf16", func="kvcache", page_block_size=256, append_kv=True)])
    assert not {"SPLIT", "PAGEDKV", "APPENDKV", "PACKGQA"} & set(off) and "CLUSTER" in off
    off, _ = fa3.switches([case("fwd", 64, "bf16", func="varlen", seqlens=(5, 7))])
    assert "VARLEN" not in off
    with pytest.raises(ValueError, match="head_dim <= 256"):
        fa3.switches([case("fwd", 320)])


def test_switch_names_and_kernel_files_match_the_real_tree():
    """The real hopper/ (commit 0251105a): the switches matrix-run sets are exactly those its setup.py
    reads, and every kernel file predicted for a range of configs is one of its instantiations."""
    assert sorted(fa3.SWITCHES) == (FIXTURE / "switches.txt").read_text().split()
    tree = fa3.SourceTree(Path("/x"), "3.0.0", "", (FIXTURE / "instantiations.txt").read_text().split(), [], "0" * 16)
    for cases in ([case("fwd", 16), case("bwd", 16)], [case("fwd", 128, "bf16")], [case("bwd", 256, "bf16", nheads_k=4)],
                  [case("fwd", 96, "fp16", func="kvcache", page_block_size=256, append_kv=True)],
                  [case(op, d, dt) for op in ("fwd", "bwd") for d in (64, 128, 192) for dt in ("fp16", "bf16")]):
        off, _ = fa3.switches(cases)
        files, missing = fa3.kernel_files(tree, off)
        assert files and missing == [], (cases, missing)
    files, _ = fa3.kernel_files(tree, fa3.switches([case("fwd", 16), case("bwd", 16)])[0])
    assert files == ["flash_fwd_hdim64_bf16_sm90.cu", "flash_fwd_hdim64_fp16_sm90.cu",
                     "flash_bwd_hdim64_bf16_sm90.cu", "flash_bwd_hdim64_fp16_sm90.cu"]
    files, _ = fa3.kernel_files(tree, fa3.switches([case("fwd", 64, "bf16", func="kvcache")])[0])
    assert files == ["flash_fwd_hdim64_bf16_sm90.cu", "flash_fwd_hdim64_bf16_packgqa_sm90.cu",
                     "flash_fwd_hdim64_bf16_split_sm90.cu"]


def test_worker_namespaces_match_the_subjects():
    assert worker.NAMESPACES == subjects.NAMESPACES
    for s in subjects.SUBJECTS.values():
        assert s.func.partition(":")[0].split(".")[0] in subjects.NAMESPACES, s
        assert s.ops_module.split(".")[0] in subjects.NAMESPACES


def _opts(tmp_path, **kw):
    return envs.Options(envs_dir=tmp_path / "envs", cache_dir=tmp_path / "cache", **kw)


def test_plan_of_a_tree(tmp_path):
    root = standin.make_fa3_tree(tmp_path)
    req = envs.parse_versions(f"fa3=flash-attn-3@{root}")[0]
    gpu = {"python": "3.12.3", "torch": {"version": "2.11.0+cu130", "cuda": "13.0", "cxx11abi": True,
                                          "gpu": {"capability": "9.0"}}}
    item = envs.plan_env(req, [case("fwd", 16), case("bwd", 16)], _opts(tmp_path), gpu)
    assert item.method == "source-slim" and item.version == "3.0.0" and item.archs == ["90a"]
    assert item.kernels == ["flash_fwd_hdim64_bf16_sm90.cu", "flash_fwd_hdim64_fp16_sm90.cu",
                            "flash_bwd_hdim64_bf16_sm90.cu", "flash_bwd_hdim64_fp16_sm90.cu"]
    assert item.key["tree"] == fa3.open_tree(root).tree_id and "BACKWARD" not in item.key["disabled"]
    sw = next(n for n in item.notes if n.startswith("switches: FLASH_ATTENTION_DISABLE_<X>=TRUE for X in "))
    assert "SPLIT," in sw and "HDIM128," in sw and "HDIM64," not in sw and "FP16," not in sw, sw
    assert item.estimate_s and item.estimate_s > 0
    # another config, another key; --build full: no switch
    other = envs.plan_env(req, [case("fwd", 128, "bf16")], _opts(tmp_path), gpu)
    assert other.key_id != item.key_id and other.kernels == ["flash_fwd_hdim128_bf16_sm90.cu"]
    full = envs.plan_env(req, [case("fwd", 16)], _opts(tmp_path, build="full"), gpu)
    assert full.method == "source-full" and full.key["disabled"] == []
    assert sum("DISABLE" in n or "every kernel file" in n for n in full.notes) == 2, full.notes  # said once each
    # an Ampere GPU: FA3 is Hopper-only, said in the plan
    a100 = {**gpu, "torch": {**gpu["torch"], "gpu": {"capability": "8.0"}}}
    bad = envs.plan_env(req, [case("fwd", 16)], _opts(tmp_path), a100)
    assert bad.method == "failed" and "Hopper GPUs (sm_90) only" in bad.error and "sm_80" in bad.error
    # a case FA3 cannot run fails the plan, not the build
    bad = envs.plan_env(req, [case("fwd", 512)], _opts(tmp_path), gpu)
    assert bad.method == "failed" and "head_dim <= 256" in bad.error


def test_fa3_tree_is_built_with_its_switches_and_timed_on_cpu(tmp_path, standins, tiny_config):
    """A --quick CPU run: stand-in 2.6.3 against two envs of one stand-in FA3 tree (A/A labels).
    The tree is built once (the second env takes the cached wheel), with the switches of the tiny
    config (fp16, head_dim 16 and 32 -> 64, fwd+bwd, GQA); the stand-in's flash_attn_func refuses any
    head dim, fp16 or backward its switches left out, so every case ok means the switches were right.
    A second plan reuses both envs."""
    root = standin.make_fa3_tree(tmp_path / "tree")
    out = tmp_path / "run"
    common = ["--find-links", str(standins["wheels"]), "--offline", "--config", str(tiny_config),
              "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache")]
    versions = f"2.6.3,fa3=flash-attn-3@{root},fa3b=flash-attn-3@{root}"
    cp = run_cli("--versions", versions, "--device", "cpu", "--quick", "--output", str(out), *common, timeout=900)
    doc = load_results(out)
    st = {e["label"]: e["status"] for e in doc["envs"]}
    assert st == {"2.6.3": "ok", "fa3": "ok", "fa3b": "ok"}, (cp.stdout[-3000:], cp.stderr[-3000:])
    by = {e["label"]: e for e in doc["envs"]}
    assert by["fa3"]["subject"] == "flash-attn-3" and by["fa3"]["flash_attn_version"] == "3.0.0"
    assert by["fa3"]["flash_attn_file"].endswith("flash_attn_interface.py")
    # planned together, both say "build"; the second to take the key's build lock finds the wheel
    reused = [x for x in ("fa3", "fa3b") if by[x]["build"].get("built_by_other_process")]
    assert len(reused) == 1 and "source_build" not in by[reused[0]]["build"], [by[x]["build"] for x in ("fa3", "fa3b")]
    built = by["fa3b" if reused == ["fa3"] else "fa3"]
    assert built["build"]["source_build"]["seconds"] > 0
    sw = built["build"]["switches"]
    assert sw["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE" and sw["FLASH_ATTENTION_OFFLINE_BUILD"] == "TRUE"
    assert sw["FLASH_ATTENTION_DISABLE_HDIM128"] == "TRUE" and "FLASH_ATTENTION_DISABLE_HDIM64" not in sw
    assert "FLASH_ATTENTION_DISABLE_BACKWARD" not in sw and "FLASH_ATTENTION_DISABLE_PACKGQA" not in sw
    site = next((tmp_path / "envs" / "fa3" / "lib").glob("python*/site-packages"))
    cfg = (site / "flash_attn_config.py").read_text()
    assert "'FLASHATTENTION_DISABLE_HDIM96': True" in cfg and "'FLASHATTENTION_DISABLE_FP16': False" in cfg
    marker = json.loads((tmp_path / "envs" / "fa3" / subjects.MARKER).read_text())
    assert marker["func"] == "flash_attn_interface:flash_attn_func" and marker["ext"] == "flash_attn_3._C"
    for lab in ("fa3", "fa3b"):
        cs = [c for c in doc["cases"] if c["env"] == lab]
        assert len(cs) == 4 and all(c["status"] == "ok" for c in cs), [c.get("error") for c in cs]
    cp = run_cli("plan", "--versions", versions, "--json", *common)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert [i["method"] for i in json.loads(cp.stdout)] == ["reuse", "reuse", "reuse"]


def test_the_fa3_stand_in_refuses_what_its_switches_left_out(tmp_path, monkeypatch):
    """So that the CPU run above can fail: the stand-in's flash_attn_func, under a config whose
    switches left out fp16, head dim 64 or the backward, raises naming the switch (a real slim
    build without the kernel fails too). matrix-run passes no FLASH_ATTENTION_* variable of the
    user's environment to a build (proc.clean_env), so only its own switches decide."""
    import importlib
    import sys

    import torch

    root = standin.make_fa3_tree(tmp_path / "tree")
    hop = root / "hopper"
    monkeypatch.syspath_prepend(str(hop))
    q = torch.randn(1, 8, 2, 16, dtype=torch.float16)
    for off, grad, want in (("FP16", False, "DISABLE_FP16"), ("HDIM64 HDIM96 HDIM128 HDIM192 HDIM256", False, "DISABLE_HDIM256"),
                            ("BACKWARD", True, "DISABLE_BACKWARD"), ("", True, None)):
        flags = {f"FLASHATTENTION_DISABLE_{n}": n in off.split() for n in fa3.SWITCHES}
        (hop / "flash_attn_config.py").write_text(f"CONFIG = {{'build_flags': {flags!r}}}\n")
        for m in ("flash_attn_config", "flash_attn_interface"):
            sys.modules.pop(m, None)
        fi = importlib.import_module("flash_attn_interface")
        x = q.clone().requires_grad_(grad)

        def call(fi=fi, x=x, grad=grad):
            o = fi.flash_attn_func(x, x, x)
            if grad:
                o.sum().backward()
        if want is None:
            call()
        else:
            with pytest.raises(RuntimeError, match=want):
                call()
    for m in ("flash_attn_config", "flash_attn_interface", "flash_attn_3", "flash_attn_3._C"):
        sys.modules.pop(m, None)


def test_wheelhouse_packs_the_tree_for_an_air_gapped_node(tmp_path):
    """`matrix-run wheelhouse --versions fa3=flash-attn-3@PATH`: the tree's build files as one archive
    with the same tree id (so the node's plan finds wheels built from it), and the cached FA3 wheels
    built from this tree (not those of another tree)."""
    from matrix_runner import wheelhouse, wheels

    root = standin.make_fa3_tree(tmp_path / "tree")
    (root / "csrc" / "composable_kernel").mkdir(parents=True)
    (root / "csrc" / "composable_kernel" / "big.txt").write_text("x" * 100000)  # not a build file: left out
    tree = fa3.open_tree(root)
    cache = tmp_path / "cache"
    for tid, kid in ((tree.tree_id, "k1"), ("f" * 16, "k2")):
        d = cache / "wheels" / kid
        d.mkdir(parents=True)
        (d / f"flash_attn_3-3.0.0-{kid}-py3-none-any.whl").write_text("wheel")
        (d / f"flash_attn_3-3.0.0-{kid}-py3-none-any.whl{wheels.SIDECAR_SUFFIX}").write_text(
            json.dumps({"key": {"package": "flash-attn-3", "tree": tid}}))
    req = envs.parse_versions(f"fa3=flash-attn-3@{root}")[0]
    rows = wheelhouse.collect([req], tmp_path / "house", python_version="3.12", cache=cache,
                              index_url="https://pypi.org/simple", requirements=())
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    arch = tmp_path / "house" / f"flash-attention-fa3-{tree.tree_id}.tar.gz"
    assert rows[0]["file"] == arch.name and f"fa3=flash-attn-3@DIR/{arch.name}" in rows[0]["detail"]
    packed = fa3.open_tree(arch)
    assert packed.tree_id == tree.tree_id and packed.prefix == f"flash-attention-fa3-{tree.tree_id}/"
    with tarfile.open(arch) as tf:
        assert not any("composable_kernel" in n for n in tf.getnames())
    assert rows[1]["file"] == "flash_attn_3-3.0.0-k1-py3-none-any.whl"
    assert sorted(p.name for p in (tmp_path / "house").glob("*.whl")) == ["flash_attn_3-3.0.0-k1-py3-none-any.whl"]


def test_plan_command_shows_the_tree_and_not_flash_attn_2_kernels(tmp_path):
    """`matrix-run plan` for an FA3 tree only: its version, tree id and switches; the flash-attn 2
    kernel-file table is left out (it lists flash-attn 2's files, which FA3 does not have)."""
    root = standin.make_fa3_tree(tmp_path / "tree")
    cp = run_cli("plan", "--versions", f"fa3=flash-attn-3@{root}", "--envs-dir", str(tmp_path / "e"),
                 "--wheel-cache", str(tmp_path / "c"))
    text = cp.stdout.replace("\n", " ")
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert fa3.open_tree(root).tree_id in text and "version 3.0.0" in text and "FLASH_ATTENTION_DISABLE_" in text
    assert "kernel files per case" not in text
    # no CUDA here: the files a CUDA torch would compile are still listed, said to be left out
    assert "flash_fwd_hdim64_fp16_sm90.cu" in text and "none of the kernel files above" in text


def test_explain_with_fa3_says_once_that_its_layers_are_not_split(tmp_path, standins):
    """--explain beside an FA3 env: flash-attn 2's layer split does not apply to FA3 (its wrappers are
    others), which the run says once per case, not once per round; the rest of the pass goes on."""
    root = standin.make_fa3_tree(tmp_path / "tree")
    cfg = tmp_path / "one.yaml"
    cfg.write_text("ops: [fwd]\nshapes:\n  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}\n"
                   "sampling: {time_budget_s: 60, set_seconds: 1.0, max_sets: 2}\n"
                   "explain: {rounds: 4, profile_s: 2, sampler_cycles: 5}\n")
    out = tmp_path / "run"
    cp = run_cli("--versions", f"2.6.3,fa3=flash-attn-3@{root}", "--device", "cpu", "--quick", "--explain", "--offline",
                 "--find-links", str(standins["wheels"]), "--config", str(cfg), "--envs-dir", str(tmp_path / "envs"),
                 "--wheel-cache", str(tmp_path / "cache"), "--output", str(out), timeout=900)
    assert cp.returncode == 0, (cp.stdout[-2000:], cp.stderr[-2000:])
    ex = load_results(out)["explain"]
    notes = [n for n in ex.get("notes") or [] if n.startswith("fa3: layers of")]
    assert len(notes) == 1 and "flash-attn-3 has others: not split into layers" in notes[0], ex.get("notes")
    assert "No module named" not in " ".join(ex.get("notes") or [])
    assert ex["settings"]["rounds"] == 4 and ex["settings"]["profile_s"] == 2.0  # the config's explain: section
