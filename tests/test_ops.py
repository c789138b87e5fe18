"""Entry points other than flash_attn_func (issue #13): config fields and their validation, kernel
files per op, the worker's builder table against the stand-in (fwd and bwd, fp32 reference, "not in
this version"), GB/s of KV read, built-in configs by name, and every op end to end through
matrix-run with the planted host cost found per op."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import standin
from conftest import PLANTED_US, load_results, run_cli

from matrix_runner import build, results, stats, worker
from matrix_runner.config import (
    ConfigError,
    builtin_config,
    builtin_configs,
    load_config,
    parse_config,
)

ROOT = Path(__file__).resolve().parent.parent

#: One small shape per entry point (fwd only: kvcache has no backward).
ALL_OPS = """
title: every entry point
ops: [fwd]
input: heads
shapes:
  - {batch: 2, seqlen: 16, nheads: 2, head_dim: 16}
  - {func: varlen, seqlens: [5, 16, 9], nheads: 2, head_dim: 16}
  - {func: qkvpacked, batch: 2, seqlen: 16, nheads: 2, head_dim: 16}
  - {func: kvpacked, batch: 2, seqlen_q: 8, seqlen_k: 16, nheads: 4, nheads_k: 2, head_dim: 16}
  - {func: varlen_qkvpacked, seqlens: {n: 3, min: 4, max: 16, seed: 1}, nheads: 2, head_dim: 16}
  - {func: varlen_kvpacked, seqlens: [7, 12], nheads: 4, nheads_k: 2, head_dim: 16, causal: true}
  - {func: kvcache, batch: 2, seqlen_q: 1, seqlen_k: 64, nheads: 4, nheads_k: 2, head_dim: 16, cache_seqlens: [20, 64]}
  - {func: kvcache, batch: 1, seqlen_q: 2, seqlen_k: 256, nheads: 2, head_dim: 16, cache_seqlens: 100,
     append_kv: true, page_block_size: 256}
sampling: {time_budget_s: 30, set_seconds: 4.0, max_sets: 1}
"""


# -- config ----------------------------------------------------------------------------------------
def test_func_defaults_keep_existing_case_ids():
    c = parse_config({"shapes": [{"batch": 2, "seqlen": 50, "nheads": 16, "embed_dim": 256}]})
    assert [x.id for x in c.cases] == ["fwd-b2-sq50-sk50-h16-hk16-d16-fp16", "bwd-b2-sq50-sk50-h16-hk16-d16-fp16"]
    assert all(x.func == "func" and x.kv_read_bytes() is None for x in c.cases)
    assert [x.id for x in load_config("default").cases] == [x.id for x in load_config(None).cases]


def test_varlen_seqlens_list_and_seeded_distribution():
    c = parse_config({"shapes": [{"func": "varlen", "seqlens": [3, 5, 9], "nheads": 2, "head_dim": 32}]})
    f = c.cases[0]
    assert (f.batch, f.seqlen_q, f.seqlen_k, f.seqlens, f.layout) == (3, 9, 9, (3, 5, 9), "heads")
    assert f.id == "fwd-varlen-b3-sq9-sk9-h2-hk2-d32-fp16-L3.5.9"
    assert f.flops() == 4 * (9 + 25 + 81) * 2 * 32 and c.cases[1].flops() == 2.5 * f.flops()
    dist = {"func": "varlen", "seqlens": {"n": 20, "min": 4, "max": 400, "seed": 7}, "nheads": 2, "head_dim": 32}
    a, b = (parse_config({"shapes": [dist]}).cases[0] for _ in range(2))
    assert a.seqlens == b.seqlens and len(a.seqlens) == 20 and all(4 <= n <= 400 for n in a.seqlens)
    assert a.id == b.id and "-Ln20-" in a.id  # more than 8 lengths: count + CRC in the id
    other = parse_config({"shapes": [{**dist, "seqlens": {**dist["seqlens"], "seed": 8}}]}).cases[0]
    assert other.seqlens != a.seqlens


@pytest.mark.parametrize("cfg, msg", [
    ({"shapes": [{"func": "kvcache", "batch": 1, "seqlen": 4, "nheads": 1, "head_dim": 8}]}, "has no backward"),
    ({"ops": ["fwd"], "dropout_p": 0.1, "shapes": [{"func": "kvcache", "batch": 1, "seqlen": 4, "nheads": 1,
                                                  "head_dim": 8}]}, "no dropout"),
    ({"shapes": [{"func": "varlen", "batch": 2, "seqlens": [1], "nheads": 1, "head_dim": 8}]}, "remove 'batch'"),
    ({"shapes": [{"func": "varlen", "nheads": 1, "head_dim": 8}]}, "needs seqlens"),
    ({"shapes": [{"func": "varlen", "seqlens": {"n": 2, "min": 9, "max": 3}, "nheads": 1, "head_dim": 8}]}, "<= max"),
    ({"shapes": [{"func": "qkvpacked", "batch": 1, "seqlen": 4, "nheads": 4, "nheads_k": 2, "head_dim": 8}]},
     "nheads_k = nheads"),
    ({"shapes": [{"func": "warp", "batch": 1, "seqlen": 4, "nheads": 1, "head_dim": 8}]}, "must be one of func"),
    ({"shapes": [{"batch": 1, "seqlen": 4, "nheads": 1, "head_dim": 8, "cache_seqlens": 2}]}, "for func kvcache"),
    ({"ops": ["fwd"], "shapes": [{"func": "kvcache", "batch": 2, "seqlen": 4, "nheads": 1, "head_dim": 8,
                                  "cache_seqlens": [1]}]}, r"list of 2 \(batch\)"),
    ({"ops": ["fwd"], "shapes": [{"func": "kvcache", "batch": 1, "seqlen_q": 2, "seqlen_k": 4, "nheads": 1,
                                  "head_dim": 8, "cache_seqlens": 3, "append_kv": True}]}, "must fit"),
    ({"ops": ["fwd"], "shapes": [{"func": "kvcache", "batch": 1, "seqlen": 4, "nheads": 1, "head_dim": 8,
                                  "page_block_size": 100}]}, "multiple of 256"),
    ({"impls": ["flash_attn", "sdpa"], "shapes": [{"func": "varlen", "seqlens": [2], "nheads": 1, "head_dim": 8}]},
     "A/A control of func only"),
])
def test_op_config_errors_name_the_rule(cfg, msg):
    with pytest.raises(ConfigError, match=msg):
        parse_config(cfg)


def test_kvcache_fields_flops_and_kv_bytes():
    c = parse_config({"ops": ["fwd"], "shapes": [
        {"func": "kvcache", "batch": 2, "seqlen_q": 4, "seqlen_k": 1024, "nheads": 4, "nheads_k": 2,
         "head_dim": 64, "cache_seqlens": [100, 1000], "append_kv": True, "page_block_size": 256, "causal": True}]})
    k = c.cases[0]
    assert k.id.endswith("-causal-c100.1000-append-page256") and k.id.startswith("fwd-kvcache-")
    assert k.keys_attended() == [104, 1004]
    # the label gives the cache as configured and what is appended (was "cache 104-1004 +append")
    assert k.label.endswith(" cache 100-1000+4 append paged 256"), k.label
    # bytes of k and v read: keys attended x nheads_k x head_dim x 2 (k, v) x 2 bytes
    assert k.kv_read_bytes() == (104 + 1004) * 2 * 64 * 2 * 2
    # causal, bottom-right aligned: query row r sees K - Sq + r + 1 keys
    assert k.flops() == 4 * 4 * 64 * sum(4 * n - 6 for n in (104, 1004))
    assert stats.gbps(1e9, 1e6) == pytest.approx(1.0)  # 1e9 bytes in 1 s (1e6 µs): 1 GB/s
    assert stats.gbps(None, 10.0) is None and stats.gbps(100, 0) is None


def test_builtin_configs_by_name():
    assert {"default", "kvcache-decode", "varlen"} <= set(builtin_configs())
    assert builtin_config("varlen") == builtin_config("varlen.yaml") != None
    kv = load_config("kvcache-decode")
    c = kv.cases[0]
    assert (c.func, c.batch, c.seqlen_q, c.seqlen_k, c.nheads, c.nheads_k, c.head_dim, c.dtype) == \
        ("kvcache", 64, 1, 8191, 16, 2, 128, "bf16")
    assert all(x.op == "fwd" for x in kv.cases)
    vl = load_config("varlen")
    assert {x.op for x in vl.cases} == {"fwd", "bwd"} and all(len(x.seqlens) == 8 for x in vl.cases)
    assert len(set(vl.cases[0].seqlens)) > 4  # mixed lengths
    # one slim build (hdim128 bf16 fwd, fwd_split, bwd) serves both GPU configs
    assert set(build.kernel_set(kv.cases)) <= set(build.kernel_set(vl.cases)) == \
        {"fwd_hdim128_bf16", "fwd_split_hdim128_bf16", "bwd_hdim128_bf16"}
    with pytest.raises(ConfigError, match="built-in configs by name: default"):
        load_config("no-such-config")


def test_kernel_files_per_op():
    def ks(shape, ops=("fwd",)):
        return build.case_kernels(parse_config({"ops": list(ops), "shapes": [shape]}).cases[-1])

    base = {"nheads": 4, "nheads_k": 2, "head_dim": 64, "dtype": "bf16"}
    # decode: seqlen_q 1 drops causal; the split heuristic may pick either kernel
    assert ks({"func": "kvcache", "batch": 2, "seqlen_q": 1, "seqlen_k": 99, "causal": True, **base}) == \
        ["fwd_hdim64_bf16", "fwd_split_hdim64_bf16"]
    # appending or paging forces the split-KV kernel (flash_api.cpp: force_split_kernel)
    assert ks({"func": "kvcache", "batch": 2, "seqlen_q": 2, "seqlen_k": 512, "causal": True, "append_kv": True,
               **base}) == ["fwd_split_hdim64_bf16_causal"]
    assert ks({"func": "kvcache", "batch": 2, "seqlen_q": 1, "seqlen_k": 512, "page_block_size": 256, **base}) == \
        ["fwd_split_hdim64_bf16"]
    assert ks({"func": "varlen", "seqlens": [3, 9], "causal": True, **base}, ("fwd", "bwd")) == \
        ["fwd_hdim64_bf16_causal", "fwd_split_hdim64_bf16_causal", "bwd_hdim64_bf16_causal"]


def test_plan_lists_kernel_files_per_case(tmp_path):
    cp = run_cli("plan", "--versions", "2.6.3", "--config", "kvcache-decode", "--offline", "--archs", "90",
                 "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"))
    assert "kernel files per case" in cp.stdout, cp.stdout + cp.stderr
    assert "(flash_attn_with_kvcache): fwd_hdim128_bf16, fwd_split_hdim128_bf16" in " ".join(cp.stdout.split())
    cp = run_cli("plan", "--versions", "2.6.3", "--config", "varlen", "--offline", "--archs", "90", "--json",
                 "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"))
    per = json.loads(cp.stdout)[0]["case_kernels"]
    assert all(v[-1] == "bwd_hdim128_bf16" for k, v in per.items() if k.startswith("bwd-varlen-")), per


def test_results_record_gbps_for_kvcache_only():
    from matrix_runner.runner import CaseData

    cfg = parse_config({"ops": ["fwd"], "shapes": [
        {"func": "kvcache", "batch": 2, "seqlen_q": 1, "seqlen_k": 1000, "nheads": 4, "nheads_k": 2, "head_dim": 64},
        {"batch": 2, "seqlen": 8, "nheads": 2, "head_dim": 16}]})
    kv, dense = cfg.cases
    for case, has in ((kv, True), (dense, False)):
        cd = CaseData(env="a", case=case)
        cd.sets = {"wall_us": {0: {0: 10.0, 1: 10.0}}, "device_us": {0: [5.0, 5.0]}}
        rec = results.case_record(cd, case)
        assert rec["func"] == case.func and set(rec["tflops"]) == {"wall", "device", "graph"}
        if has:
            assert rec["kv_read_bytes"] == 2 * 1000 * 2 * 64 * 2 * 2
            assert rec["gbps"]["wall"] == pytest.approx(rec["kv_read_bytes"] / 10e-6 / 1e9)
            assert rec["gbps"]["device"] == pytest.approx(2 * rec["gbps"]["wall"]) and rec["gbps"]["graph"] is None
        else:
            assert rec["gbps"] is None and rec["kv_read_bytes"] is None


def test_the_causal_reference_gives_zero_for_rows_with_no_key_and_a_nan_error_never_passes():
    """seqlen_q > seqlen_k, causal: the first sq - sk query rows see no key. The fp32 reference had
    NaN there (softmax of a -inf row) and results kept max(0.0, nan) = 0.0: "error 0.0, ok" for any
    output (new-user trial). flash-attn gives 0 for such rows, and so does torch's SDPA."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    q, k, v = torch.randn(64, 2, 32, requires_grad=True), torch.randn(16, 2, 32), torch.randn(16, 2, 32)
    ref = worker._ref_attn(q, k, v, 32 ** -0.5, True)
    assert torch.isfinite(ref).all() and (ref[:48] == 0).all() and (ref[48:] != 0).any()
    i, j = torch.arange(64)[:, None], torch.arange(16)[None, :]
    sdpa = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)), attn_mask=j <= i - 48).transpose(0, 1)
    assert (ref - sdpa).abs().max() < 1e-5
    ref.sum().backward()  # and its gradients are finite (the bwd check compares them)
    assert torch.isfinite(q.grad).all() and (q.grad[:48] == 0).all()
    # an error that is NaN or inf fails the check, whatever the other checks of the case said
    good = {"out": {"max_abs_err": 1e-3, "rel_err": 1e-3, "finite": True}}
    bad = {"out": {"max_abs_err": float("nan"), "rel_err": float("nan"), "finite": True}}
    assert results._worst_correctness([good], "fp16")["ok"] is True
    w = results._worst_correctness([good, bad], "fp16")
    assert w["ok"] is False and w["tensors"]["out"]["finite"] is False and w["tensors"]["out"]["rel_err"] == float("inf")


def test_graph_capture_broken_by_a_sync_is_a_finding_note():
    class B:
        op = worker.OPS["varlen"]

    note = worker._graph_note(B(), RuntimeError("CUDA error: operation not permitted when stream is capturing"))
    assert note.startswith("graph capture impossible in this version: flash_attn_varlen_func") and "#1664" in note
    assert worker._graph_note(B(), ValueError("boom")).startswith("graph_us unavailable: ValueError: boom")
    assert worker._classify(worker.NotInVersion("x")) == "not-in-version"


# -- the worker's builder table against the stand-in (one subprocess: flash_attn stays out of here) --
WORKER_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import worker
from matrix_runner.config import parse_config
cfg = json.loads(sys.argv[2])
out = []
srv = worker.Server(lambda r: None)
srv.handle({"cmd": "config", "device": "cpu", "seed": 0})
if len(sys.argv) > 3:  # a version whose flash_attn_with_kvcache has no block_table / cache_seqlens
    import flash_attn
    def flash_attn_with_kvcache(q, k_cache, v_cache, softmax_scale=None, causal=False):
        raise AssertionError("not called")
    flash_attn.flash_attn_with_kvcache = flash_attn_with_kvcache
for c in parse_config(cfg).cases:
    rep = srv.handle({"cmd": "setup", "case": c.id, "spec": c.to_dict(), "warmup_s": 0.0})
    if rep["status"] == "ok":
        rep = srv.handle({"cmd": "finish", "case": c.id})
    out.append({"id": c.id, "func": c.func, "op": c.op, **{k: rep.get(k) for k in ("status", "error_kind", "error", "correctness")}})
print(json.dumps(out))
"""


def _worker_cases(src: Path, cfg: dict, *extra: str) -> list[dict]:
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
    cp = subprocess.run([sys.executable, "-c", WORKER_SCRIPT, str(ROOT / "matrix_runner"), json.dumps(cfg), *extra],
                        check=False, capture_output=True, text=True, env=env, timeout=300)
    assert cp.returncode == 0, cp.stderr[-3000:]
    return json.loads(cp.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def standin_src(tmp_path_factory):
    import standin

    root = tmp_path_factory.mktemp("ops-src")
    return {"full": standin.make_source(root / "a", "2.6.3"),
            "old": standin.make_source(root / "b", "2.4.2", omit=("flash_attn_with_kvcache", "flash_attn_varlen_func"))}


def test_every_op_fwd_and_bwd_matches_the_fp32_reference(standin_src):
    import yaml

    cfg = yaml.safe_load(ALL_OPS)
    bwd = {**cfg, "ops": ["bwd"], "shapes": [s for s in cfg["shapes"] if s.get("func") != "kvcache"]}
    got = _worker_cases(standin_src["full"], cfg) + _worker_cases(standin_src["full"], bwd)
    assert {(g["func"], g["op"]) for g in got} == {(f, o) for f in worker.OPS for o in ("fwd", "bwd")} - {("kvcache", "bwd")}
    for g in got:
        assert g["status"] == "ok", g
        names = set(g["correctness"])
        assert names == ({"out"} if g["op"] == "fwd" else {"d" + n for n in worker.OPS[g["func"]].leaves}), g
        for v in g["correctness"].values():
            assert v["finite"] and v["rel_err"] < 1e-2, g


def test_an_op_or_argument_the_version_lacks_is_not_in_this_version(standin_src):
    import yaml

    cfg = yaml.safe_load(ALL_OPS)
    got = {g["id"]: g for g in _worker_cases(standin_src["old"], cfg)}
    for g in got.values():
        if g["func"] in ("kvcache", "varlen"):
            assert (g["status"], g["error_kind"]) == ("error", "not-in-version"), g
            assert "not in this version" in g["error"] and "2.4.2" in g["error"]
        else:
            assert g["status"] == "ok", g
    # the entry point exists but lacks arguments the case needs: named, per case
    kv = {**cfg, "shapes": [s for s in cfg["shapes"] if s.get("func") == "kvcache"]}
    for g in _worker_cases(standin_src["full"], kv, "strip-args"):
        assert g["error_kind"] == "not-in-version", g
        assert "cache_seqlens" in g["error"]
    assert "block_table" in g["error"] and "k, v" in g["error"]


# -- end to end: every op through matrix-run, planted host cost found per op --------------------------
# timing on the shared 2-core CI machine: a failure is measured once more, from scratch (CI 2026-12-02:
# the kvpacked delta once fell outside its bounds and passed alone)
@pytest.mark.flaky(reruns=1)
def test_every_op_end_to_end_finds_the_planted_host_cost(standins, tmp_path):
    cfg = tmp_path / "ops.yaml"
    cfg.write_text(ALL_OPS)
    before = standin.in_context_us(standins["planted_src"], PLANTED_US, 1, 16, 2, 16, blocks=200)
    cp = run_cli("--versions", "2.6.3,2.7.0.post2", "--config", str(cfg), "--device", "cpu",
                 "--find-links", str(standins["wheels"]), "--envs-dir", str(tmp_path / "envs"),
                 "--wheel-cache", str(tmp_path / "cache"), "--output", str(tmp_path / "out"))
    assert cp.returncode == 0, cp.stderr[-3000:]
    res = load_results(tmp_path / "out")
    assert {c["func"] for c in res["cases"]} == set(worker.OPS)
    for c in res["cases"]:
        assert c["status"] == "ok" and c["correctness"]["ok"] is True, c
        assert (c["gbps"] is not None) == (c["func"] == "kvcache")
    wall = [c for c in res["comparisons"] if c["metric"] == "wall_us"]
    assert len(wall) == 8
    # One set (max_sets 1: ratios without verdicts). The planted 300 µs per forward call must show in
    # each op as the difference of the envs' medians over all bursts. (Not the paired delta: one set
    # of ~50 cycles on a shared 2-core machine at load average 7 gave paired deltas of -2400..1350 µs
    # while these medians differed by 296-334 µs; under such load a 500-700 µs call's median moved
    # up to 440 µs, hence 4 s of cycles and calls kept small.)
    assert len(res["sets"]) == 1
    # read against what the planted busy-wait costs inside a forward call now (standin.in_context_us:
    # 330-390 µs for the nominal 300 on the 2-core CI machine, by the speed it runs at; one dense
    # measurement for all ops: the planted code is the same in each)
    # measured before and after the run; on 2026-12-02 the runs read the planted cost 22-31 % above
    # it on this machine (tests/test_pipeline.py says more; not understood), hence 45 % above the larger
    after = standin.in_context_us(standins["planted_src"], PLANTED_US, 1, 16, 2, 16, blocks=200)
    truth = sorted((before, after))
    for c in wall:
        assert 0.7 * truth[0] <= c["cand_median"] - c["base_median"] <= 1.45 * truth[1], (truth, c)
    html = (tmp_path / "out" / "index.html").read_text()
    assert "GB/s KV read" in html and "kvcache" in html and "varlen" in html


def test_seqlens_and_cache_seqlens_are_values_not_axes_unless_a_list_of_lists():
    """A varlen shape's ``seqlens`` list is one case (its sequences), not an axis of four cases; a list
    of such lists is the axis (config.LIST_VALUED), and it multiplies with the other axes."""
    from matrix_runner.config import parse_config
    one = parse_config({"ops": ["fwd"], "input": "heads",
                        "shapes": [{"func": "varlen", "seqlens": [64, 128, 32, 16], "nheads": 2, "head_dim": 16}]})
    assert [c.seqlens for c in one.cases] == [(64, 128, 32, 16)]
    two = parse_config({"ops": ["fwd"], "input": "heads", "dtype": ["fp16", "bf16"],
                        "shapes": [{"func": "varlen", "seqlens": [[10, 20], [30, 40, 50]], "nheads": 2, "head_dim": 16}]})
    assert [(c.seqlens, c.dtype) for c in two.cases] == [((10, 20), "fp16"), ((10, 20), "bf16"),
                                                         ((30, 40, 50), "fp16"), ((30, 40, 50), "bf16")]
    kv = parse_config({"ops": ["fwd"], "input": "heads",
                       "shapes": [{"func": "kvcache", "batch": 2, "seqlen_q": 1, "seqlen_k": 64, "nheads": 2,
                                   "head_dim": 16, "cache_seqlens": [10, 20]}]})
    assert [c.cache_seqlens for c in kv.cases] == [(10, 20)]


def test_plan_lists_at_most_50_cases_and_names_the_dtype_where_cases_differ_in_it(tmp_path):
    """A 12,800-case plan had printed 22,893 lines, and fp16 and bf16 cases read alike (new-user trial)."""
    cfg = tmp_path / "many.yaml"
    cfg.write_text("ops: [fwd]\ndtype: [fp16, bf16]\nshapes:\n  - {batch: [" + ", ".join(map(str, range(1, 31)))
                   + "], seqlen: 64, nheads: 4, head_dim: 64}\n")
    cp = run_cli("plan", "--versions", "2.6.3", "--config", str(cfg), "--offline", "--archs", "90",
                 "--envs-dir", str(tmp_path / "envs"), "--wheel-cache", str(tmp_path / "cache"))
    out = " ".join(cp.stdout.split())  # the kernel lists are a column: shorter labels are padded
    assert "B1 S64 H4 D64 fp16 fwd (flash_attn_func): fwd_hdim64_fp16" in out
    assert "B1 S64 H4 D64 bf16 fwd (flash_attn_func): fwd_hdim64_bf16" in out
    assert "… and 10 more cases (matrix-run plan --json lists every case's kernel files)" in out
    assert out.count("(flash_attn_func):") == 50
    narrow = run_cli("plan", "--versions", "2.6.3", "--offline", "--archs", "90", "--envs-dir", str(tmp_path / "envs"),
                     "--wheel-cache", str(tmp_path / "cache"), env={"COLUMNS": "70"}).stdout
    lines = narrow.splitlines()  # the default config's bwd cases need 3 kernel files: too long for 70 columns
    first = next(i for i, ln in enumerate(lines) if ln.startswith("  B512 S50 H16 D16 bwd (flash_attn_func):"))
    assert "fwd_hdim32_fp16," in lines[first] and lines[first + 1].lstrip().startswith("fwd_split_hdim32_fp16")
    col = lines[first].index("fwd_hdim32_fp16")  # a wrapped kernel list goes on in its column (new-user trial)
    assert lines[first + 1][:col].strip() == "" and lines[first + 1][col:].startswith("fwd_split"), narrow
