import math
import re

import pytest
import yaml

from matrix_runner.config import ConfigError, load_config, parse_config


def test_default_config_is_the_seed_workload():
    cfg = load_config(None)
    assert len(cfg.cases) == 12
    shapes = [(c.batch, c.seqlen_q, c.seqlen_k, c.nheads, c.head_dim) for c in cfg.cases if c.op == "fwd"]
    assert shapes == [(512, 50, 50, 16, 16), (512, 150, 150, 16, 16), (512, 300, 300, 16, 16),
                      (2, 50, 50, 16, 16), (2, 150, 150, 16, 16), (2, 300, 300, 16, 16)]
    c = cfg.cases[0]
    assert (c.dtype, c.causal, c.dropout_p, c.layout) == ("fp16", False, 0.0, "embed")
    assert c.scale == pytest.approx(1 / math.sqrt(16))
    assert c.kernel_head_dim == 32
    assert [c.op for c in cfg.cases[:2]] == ["fwd", "bwd"]


def test_flops_convention():
    """4·H·D per (query, key) pair attended; causal: the pairs a bottom-right aligned mask lets through
    (n(n+1)/2 for n = seqlen_q = seqlen_k), the same count for every entry point."""
    cfg = parse_config({"shapes": [{"batch": 2, "seqlen": 100, "nheads": 4, "head_dim": 64, "causal": True}]})
    fwd, bwd = cfg.cases
    assert fwd.flops() == 4 * 2 * (100 * 101 / 2) * 4 * 64
    assert bwd.flops() == 2.5 * fwd.flops()
    plain = parse_config({"shapes": [{"batch": 2, "seqlen": 100, "nheads": 4, "head_dim": 64}]}).cases[0]
    assert plain.flops() == 4 * 2 * 100 * 100 * 4 * 64
    # decode-like: seqlen_q 1 of 512 keys attends 512 pairs, through flash_attn_func as through kvcache
    # (new-user trial: the halving gave the func call 2x fewer FLOPs for the same work)
    shape = {"batch": 2, "seqlen_q": 1, "seqlen_k": 512, "nheads": 4, "head_dim": 32}
    func = parse_config({"ops": ["fwd"], "causal": True, "shapes": [shape]}).cases[0]
    kv = parse_config({"ops": ["fwd"], "causal": True, "shapes": [{**shape, "func": "kvcache"}]}).cases[0]
    assert func.flops() == kv.flops() == 4 * 2 * 512 * 4 * 32
    # more queries than keys: the first seqlen_q - seqlen_k rows see no key
    wide = parse_config({"ops": ["fwd"], "causal": True,
                         "shapes": [{"batch": 1, "seqlen_q": 16, "seqlen_k": 4, "nheads": 1, "head_dim": 8}]}).cases[0]
    assert wide.flops() == 4 * 8 * (1 + 2 + 3 + 4)


def test_yaml_syntax_error_names_file_line_column(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("title: x\nshapes:\n  - {batch: 2, seqlen: 50\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value).startswith(f"{p}:4:1: YAML syntax error: expected ',' or '}}'")


@pytest.mark.parametrize("shape,needle", [
    ({"batch": 0, "seqlen": 5, "nheads": 2, "head_dim": 8}, "shapes[0].batch = 0: must be a positive integer"),
    ({"batch": 1, "seqlen": 5, "nheads": 2, "head_dim": 300}, "shapes[0].head_dim = 300: must be <= 256"),
    ({"batch": 1, "seqlen": 5, "nheads": 1, "embed_dim": 512},  # the key written, not head_dim (new-user trial)
     "shapes[0].embed_dim = 512: with nheads 1 gives head_dim 512 = embed_dim / nheads, above 256"),
    ({"batch": 1, "seqlen": 5, "nheads": 6, "nheads_k": 4, "head_dim": 8}, "nheads (6) must be divisible by nheads_k"),
    ({"batch": 1, "seqlen": 5, "nheads": 3, "embed_dim": 64}, "must be divisible by nheads (3)"),
    ({"batch": 1, "seqlen": 5, "nheads": 2}, "give exactly one of head_dim or embed_dim"),
    ({"batch": 1, "nheads": 2, "head_dim": 8}, "missing key 'seqlen'"),
    ({"batch": 1, "seqlen": 5, "nheads": 2, "head_dim": 8, "dtype": "fp32"}, "shapes[0].dtype = 'fp32': must be one of fp16, bf16"),
    ({"batch": 1, "seqlen": 5, "nheads": 2, "head_dim": 8, "heads": 3}, "unknown key 'heads'"),
])
def test_shape_rules(shape, needle):
    with pytest.raises(ConfigError) as e:
        parse_config({"shapes": [shape]})
    assert needle in str(e.value)


def test_top_level_rules():
    with pytest.raises(ConfigError, match="dropout_p = 1.5: must be a number with 0 <= dropout_p < 1"):
        parse_config({"dropout_p": 1.5})
    with pytest.raises(ConfigError, match="ops = .*must be a non-empty list of fwd, bwd"):
        parse_config({"ops": ["fwd", "sideways"]})
    with pytest.raises(ConfigError, match="sampling.min_rounds = 3: is no longer used"):
        parse_config({"sampling": {"min_rounds": 3}})
    with pytest.raises(ConfigError, match="sampling.max_rounds = 9: is no longer used: use max_sets"):
        parse_config({"sampling": {"max_rounds": 9}})
    with pytest.raises(ConfigError, match="sampling.alpha = 0.7: must be between 0 and 0.5"):
        parse_config({"sampling": {"alpha": 0.7}})
    with pytest.raises(ConfigError, match="sampling.burst_ms = 0: must be a positive number"):
        parse_config({"sampling": {"burst_ms": 0}})
    assert parse_config({"sampling": {"workers_per_env": "auto"}}).sampling.workers_per_env is None
    assert parse_config({"sampling": {"workers_per_env": 3}}).sampling.workers_per_env == 3
    samp = parse_config({"sampling": {"host_every": 2, "max_repeats": 3}}).sampling
    assert (samp.host_every, samp.max_repeats) == (2, 3)
    assert (parse_config({}).sampling.host_every, parse_config({}).sampling.max_repeats) == (2, 4)
    assert parse_config({}).sampling.host_precision == 0.05
    assert parse_config({"sampling": {"host_precision": 1}}).sampling.host_precision == 1.0
    with pytest.raises(ConfigError, match="sampling.host_precision = 0: must be a positive number"):
        parse_config({"sampling": {"host_precision": 0}})
    with pytest.raises(ConfigError, match="sampling.host_every = 0: must be a positive integer"):
        parse_config({"sampling": {"host_every": 0}})
    # upper bounds, with why: a case's wall clock at most 8 times a sweep; two sets in the budget
    with pytest.raises(ConfigError, match="sampling.max_repeats = 1000: must be at most 8"):
        parse_config({"sampling": {"max_repeats": 1000}})
    # a share of the ratio (1: dropped once decided) and workers that share one core (new-user trial)
    with pytest.raises(ConfigError, match="sampling.host_precision = 5.0: must be a fraction at most 1"):
        parse_config({"sampling": {"host_precision": 5}})
    with pytest.raises(ConfigError, match="sampling.workers_per_env = 9: must be at most 8 or auto"):
        parse_config({"sampling": {"workers_per_env": 9}})
    assert parse_config({"sampling": {"workers_per_env": 8}}).sampling.workers_per_env == 8
    with pytest.raises(ConfigError, match=r"sampling.set_seconds = 40.0: must be at most half of sampling.time_budget_s \(60 s\)"):
        parse_config({"sampling": {"set_seconds": 40}})
    assert parse_config({"sampling": {"set_seconds": 40, "time_budget_s": 120}}).sampling.set_seconds == 40
    d = parse_config({}).sampling
    assert (d.speed_adjust, d.prefetch_spawn) == (True, "cycles")
    d = parse_config({"sampling": {"speed_adjust": False, "prefetch_spawn": "after"}}).sampling
    assert (d.speed_adjust, d.prefetch_spawn) == (False, "after")
    with pytest.raises(ConfigError, match="sampling.prefetch_spawn = 'later': must be cycles or after"):
        parse_config({"sampling": {"prefetch_spawn": "later"}})
    with pytest.raises(ConfigError, match="sampling.speed_adjust"):
        parse_config({"sampling": {"speed_adjust": "yes"}})
    # wrong types are config errors (exit 2), not internal errors (new-user trial, 2026-12-01)
    for k, v in (("min_effect", "abc"), ("min_effect", "0.05"), ("alpha", None), ("alpha", [0.05])):
        with pytest.raises(ConfigError, match=f"sampling.{k} = .*: must be a positive number"):
            parse_config({"sampling": {k: v}})
    # the hint names a form PyYAML reads as a number (1.0e9 and 1e-9 stay strings; new-user trial)
    for v in ("1e9", "1.0e9", "1e-9"):
        with pytest.raises(ConfigError, match=r"write it with a dot and a signed exponent, 1.0e\+9 or 1.0e-9"):
            parse_config({"sampling": {"burst_ms": v}})
    assert isinstance(yaml.safe_load("1.0e+9"), float) and isinstance(yaml.safe_load("1.0e-9"), float)
    # every number setting gives it, an integer one the digits to write (1.0e+9 is a float there)
    with pytest.raises(ConfigError, match=r"sampling.host_precision = '1e9': .*1.0e\+9 or 1.0e-9"):
        parse_config({"sampling": {"host_precision": "1e9"}})
    with pytest.raises(ConfigError, match=r"shapes\[0\].batch = '1e3': must be a positive integer .*write the integer "
                                          r"out, 1000\)"):
        parse_config(yaml.safe_load("shapes: [{batch: 1e3, seqlen: 64, nheads: 4, head_dim: 32}]"))
    with pytest.raises(ConfigError, match=r"explain.sampler_cycles = '1e2': .*write the integer out, 100\)"):
        parse_config({"explain": {"sampler_cycles": "1e2"}})
    # lower bounds: a set holds at least a cycle; a burst fits twice in a set's cycles
    with pytest.raises(ConfigError, match="sampling.set_seconds = 1e-09: must be at least 0.1"):
        parse_config({"sampling": {"set_seconds": 1e-9}})
    with pytest.raises(ConfigError, match="sampling.burst_ms = 100000.0: must be at most 500"):
        parse_config({"sampling": {"burst_ms": 100000}})
    with pytest.raises(ConfigError, match="must be a positive integer or auto"):
        parse_config({"sampling": {"workers_per_env": "lots"}})
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        parse_config(["a"])


def test_seqlen_q_k_and_gqa():
    cfg = parse_config({"ops": ["fwd"], "shapes": [{"batch": 1, "seqlen_q": 8, "seqlen_k": 32, "nheads": 8,
                                                     "nheads_k": 2, "head_dim": 60}]})
    (c,) = cfg.cases
    assert (c.seqlen_q, c.seqlen_k, c.nheads_k, c.kernel_head_dim) == (8, 32, 2, 64)
    assert c.id == "fwd-b1-sq8-sk32-h8-hk2-d60-fp16"


def test_empty_config_file_and_duplicate_keys_are_errors(tmp_path):
    from matrix_runner.config import ConfigError, load_config
    f = tmp_path / "c.yaml"
    f.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="the file is empty"):
        load_config(f)
    f.write_text("title: x\nops: [fwd]\ntitle: y\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: key 'title' appears twice"):
        load_config(f)
    f.write_text("shapes:\n  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16, batch: 2}\n")
    with pytest.raises(ConfigError, match="key 'batch' appears twice"):
        load_config(f)
    f.write_text("ops: [fwd]\nshapes:\n  - {batch: 1, seqlen: 16, nheads: 2, head_dim: 16}\n")
    assert [c.batch for c in load_config(f).cases] == [1]


# -- axes: list values expand as a cartesian product ----------------------------------------------
def test_axes_expand_in_a_stable_order():
    cfg = parse_config({"dtype": ["fp16", "bf16"], "causal": [False, True], "ops": ["fwd"],
                        "shapes": [{"batch": [2, 512], "seqlen": [50, 150, 300], "nheads": 16, "embed_dim": 256}]})
    assert len(cfg.cases) == 2 * 3 * 2 * 2
    # the entry's keys in the order written (first slowest), then the top-level axes dtype, causal
    assert [c.id for c in cfg.cases[:6]] == [
        "fwd-b2-sq50-sk50-h16-hk16-d16-fp16", "fwd-b2-sq50-sk50-h16-hk16-d16-fp16-causal",
        "fwd-b2-sq50-sk50-h16-hk16-d16-bf16", "fwd-b2-sq50-sk50-h16-hk16-d16-bf16-causal",
        "fwd-b2-sq150-sk150-h16-hk16-d16-fp16", "fwd-b2-sq150-sk150-h16-hk16-d16-fp16-causal"]
    assert [(c.batch, c.seqlen_q) for c in cfg.cases[::4]] == [(2, 50), (2, 150), (2, 300),
                                                               (512, 50), (512, 150), (512, 300)]
    assert len({c.id for c in cfg.cases}) == 24
    again = parse_config({"dtype": ["fp16", "bf16"], "causal": [False, True], "ops": ["fwd"],
                          "shapes": [{"batch": [2, 512], "seqlen": [50, 150, 300], "nheads": 16, "embed_dim": 256}]})
    assert [c.id for c in again.cases] == [c.id for c in cfg.cases]


def test_seed_parametrization_as_axes_matches_the_flat_default():
    """6 shapes x [fwd, bwd] written with axes are the default's 12 cases, ids and all."""
    flat = load_config(None)
    axes = parse_config({"shapes": [{"batch": [512, 2], "seqlen": [50, 150, 300], "nheads": 16, "embed_dim": 256}]})
    assert [c.id for c in axes.cases] == [c.id for c in flat.cases]
    assert [c.id for c in flat.cases][:2] == ["fwd-b512-sq50-sk50-h16-hk16-d16-fp16",
                                              "bwd-b512-sq50-sk50-h16-hk16-d16-fp16"]
    seed = parse_config({"dtype": ["float16", "bfloat16"],
                         "shapes": [{"batch": [512, 2], "seqlen": [50, 150, 300], "nheads": 16, "embed_dim": 256}]})
    assert len(seed.cases) == 24 and {c.dtype for c in seed.cases} == {"fp16", "bf16"}


@pytest.mark.parametrize("name,short", [("float16", "fp16"), ("torch.float16", "fp16"), ("half", "fp16"),
                                        ("bfloat16", "bf16"), ("torch.bfloat16", "bf16"), ("bf16", "bf16")])
def test_torch_dtype_names_are_accepted(name, short):
    cfg = parse_config({"dtype": name, "ops": ["fwd"], "shapes": [{"batch": 1, "seqlen": 8, "nheads": 2, "head_dim": 16}]})
    assert cfg.cases[0].dtype == short
    assert cfg.cases[0].id == f"fwd-b1-sq8-sk8-h2-hk2-d16-{short}"
    cfg = parse_config({"ops": ["fwd"], "shapes": [{"batch": 1, "seqlen": 8, "nheads": 2, "head_dim": 16,
                                                    "dtype": [name, "fp16" if short == "bf16" else "bf16"]}]})
    assert sorted(c.dtype for c in cfg.cases) == ["bf16", "fp16"]


def test_an_entrys_own_value_wins_over_a_top_level_axis():
    cfg = parse_config({"dtype": ["fp16", "bf16"], "ops": ["fwd"],
                        "shapes": [{"batch": 1, "seqlen": 8, "nheads": 2, "head_dim": 16, "dtype": "bf16"},
                                   {"batch": 2, "seqlen": 8, "nheads": 2, "head_dim": 16}]})
    assert [(c.batch, c.dtype) for c in cfg.cases] == [(1, "bf16"), (2, "fp16"), (2, "bf16")]


def test_axis_errors_name_the_key_and_the_value():
    shape = {"batch": 1, "seqlen": 8, "nheads": 2, "head_dim": 16}
    with pytest.raises(ConfigError, match=r"shapes\[0\].batch = \[\]: an axis \(list\) needs at least one value"):
        parse_config({"shapes": [{**shape, "batch": []}]})
    with pytest.raises(ConfigError, match=r"shapes\[0\].batch = 0: must be a positive integer"):
        parse_config({"shapes": [{**shape, "batch": [2, 0]}]})
    with pytest.raises(ConfigError, match=r"^dtype = 'fp32': must be one of fp16, bf16 \(or torch's float16"):
        parse_config({"dtype": ["fp16", "fp32"], "shapes": [shape]})
    with pytest.raises(ConfigError, match=r"^causal = 'yes': must be true or false"):
        parse_config({"causal": [False, "yes"], "shapes": [shape]})
    with pytest.raises(ConfigError, match=r"shapes\[1\]: duplicate of an earlier shape \(B2 S8 H2 D16 fp16\)"):
        parse_config({"shapes": [{**shape, "batch": [1, 2]}, {**shape, "batch": 2}]})
    # one value twice in a list: the message names the lists, not only the shapes (new-user trial)
    with pytest.raises(ConfigError, match=r"a list naming one value twice \(ops, impls, or dtype fp16 and float16\)"):
        parse_config({"impls": ["flash_attn", "flash_attn"], "shapes": [shape]})


def test_too_large_a_product_is_refused_unless_allowed():
    big = {"dtype": ["fp16", "bf16"], "causal": [False, True],
           "shapes": [{"batch": [1, 2, 4, 8], "seqlen": list(range(16, 16 * 17, 16)), "nheads": 2, "head_dim": 16}]}
    with pytest.raises(ConfigError) as e:
        parse_config(big)
    msg = str(e.value)
    assert msg.startswith("the config expands to 512 cases (axes: dtype 2; causal 2; shapes[0]: batch 4 x seqlen 16; "
                          "ops 2, impls 1), more than 500: pass --yes")
    assert "ops: [fwd]" in msg and "fewer values in a list" in msg
    assert len(parse_config(big, max_cases=None).cases) == 512
    assert len(parse_config({**big, "ops": ["fwd"]}).cases) == 256
    # an astronomically large product is refused without being expanded
    huge = {"shapes": [{"batch": list(range(1, 1001)), "seqlen": list(range(1, 1001)), "nheads": list(range(1, 101)),
                        "head_dim": 16}]}
    with pytest.raises(ConfigError, match="expands to 200,000,000 cases"):
        parse_config(huge)


def test_planned_sets_follow_the_machines_pace_not_just_the_settings():
    from matrix_runner.config import Sampling

    s = Sampling()  # 60 s, 1.0 s sets, nothing known of the machine: 1 + (60 - 2.1) / 2.1
    assert s.planned_sets == 29
    # H200-like: workers start in 2.3 s on spare cores three sets ahead, 2.3 s of probe before
    # timing: sets of 2.1 s (the H200 runs of 2026-12-03 afternoon had 26-30)
    s = Sampling(start_s=2.3, before_s=2.3, prefetch_depth=3)
    assert s.planned_sets == 26  # 1 + (60 - 2.3 - 2.1 - 2.3) / 2.1 = 26.4
    # two sets ahead a 2 s start fits in two sets' 1.0 s of cycles; one set ahead it outlasts them: sets of 3.1 s
    assert Sampling(start_s=2.0, before_s=2.0, prefetch_depth=2).planned_sets == 27  # 1 + (60 - 2 - 2.1 - 2) / 2.1
    assert Sampling(start_s=2.0, before_s=2.0, prefetch_depth=1).planned_sets == 18  # 1 + (60 - 2 - 5.1) / 3.1
    # 2-core CPU machine: two workers import 3 s each on the one spare core, set_seconds 2: a set lasts
    # as long as that import (the cycles go on meanwhile), the first one waits for it too
    s = Sampling(set_seconds=2.0, start_s=6.0, before_s=3.0)
    assert s.planned_sets == 7  # 1 + (60 - 3 - 7.1 - 6) / 7.1 = 7.2
    # the pace a set after the cold first one should keep (the runner's budget projection after
    # one set takes it where the first set was slower)
    assert s.set_estimate_s == pytest.approx(7.1) and Sampling().set_estimate_s == pytest.approx(2.1)
    # no spare core: the next set starts after this one: 1 + (60 - 3 - 9.1) / 9.1
    assert Sampling(set_seconds=2.0, start_s=6.0, before_s=3.0, prefetch=False).planned_sets == 6
    # at most EXTEND_FACTOR x set_seconds of waiting counts; never fewer than 4, never over max_sets
    assert Sampling(set_seconds=1.0, start_s=100.0).planned_sets == 4
    assert Sampling(time_budget_s=600, set_seconds=1.0, max_sets=20).planned_sets == 20
    # --resume keeps the first part's number
    assert Sampling(start_s=6.0, planned=9).planned_sets == 9
    # workers started two sets ahead have two sets' cycles to import in: 1.5 s sets on a machine
    # whose workers take 4 s to start last 4 + 1.1 s with depth 1, 2 + 1.1 s with depth 2
    assert Sampling(set_seconds=1.5, start_s=4.0, prefetch_depth=1).planned_sets == 11  # 1 + (60 - 9.1) / 5.1
    assert Sampling(set_seconds=1.5, start_s=4.0, prefetch_depth=2).planned_sets == 18  # 1 + (60 - 7.1) / 3.1
    # auto depth: 1 where the spare cores hold fewer than two sets' workers; else as many sets ahead
    # as a worker's start needs (at least 2, at most 4 and what the spare cores hold)
    assert [Sampling.depth_for(spare, 2) for spare in (0, 3, 4, 12)] == [1, 1, 2, 2]
    assert Sampling.depth_for(12, 8) == 1
    assert Sampling.depth_for(12, 2, start_s=2.3, set_seconds=1.0) == 3  # the H200: 2.3 s start, 1.0 s sets
    assert Sampling.depth_for(12, 2, start_s=2.3, set_seconds=1.5) == 2
    assert Sampling.depth_for(12, 2, start_s=7.2, set_seconds=1.0) == 4  # a cold machine's slow first import
    assert Sampling.depth_for(5, 2, start_s=7.2, set_seconds=1.0) == 2  # no room for more


@pytest.mark.parametrize("value, ok", [("auto", None), (2, 2), (0, False), (5, False), ("two", False)])
def test_prefetch_depth_from_yaml(value, ok):
    cfg = {"shapes": [{"batch": 2, "seqlen": 50, "nheads": 16, "head_dim": 16}],
           "sampling": {"prefetch_depth": value}}
    if ok is False:
        with pytest.raises(ConfigError, match="sampling.prefetch_depth"):
            parse_config(cfg)
    else:
        assert parse_config(cfg).sampling.prefetch_depth == ok


def test_explain_settings_from_the_config():
    """`explain:` sets the explain pass's settings (explain.DEFAULTS names every key); whole numbers
    where they count something; unknown keys and other types are config errors naming the key."""
    from matrix_runner import config, explain

    assert set(config._EXPLAIN_KEYS) == set(explain.DEFAULTS)
    assert parse_config({}).explain == {} == parse_config({"explain": None}).explain
    assert parse_config({"explain": {"warmup_s": 0}}).explain == {"warmup_s": 0.0}
    cfg = parse_config({"explain": {"profile_s": 24, "sampler_cycles": 160, "sampler_loop_s": 0.01}})
    assert cfg.explain == {"profile_s": 24.0, "sampler_cycles": 160, "sampler_loop_s": 0.01}
    assert isinstance(cfg.explain["sampler_cycles"], int)
    for bad, why in (({"explain": {"sampler_cycles": 1.5}}, "explain.sampler_cycles = 1.5: must be a positive whole"),
                     ({"explain": {"sampler_cycles": 0}}, "positive whole number"),
                     ({"explain": {"profile_s": -1}}, "explain.profile_s = -1: must be a positive number"),
                     ({"explain": {"profile_s": 0}}, "explain.profile_s = 0: must be a positive number"),
                     ({"explain": {"warmup_s": -0.1}}, "explain.warmup_s = -0.1: must be a number >= 0"),
                     ({"explain": {"rate": 100000}}, "explain.rate = 100000: must be at most 10000"),
                     ({"explain": False}, "the pass itself is turned on by --explain"),
                     ({"explain": {"profile_s": True}}, "explain.profile_s"),
                     ({"explain": {"cycles": 3}}, "explain: unknown key 'cycles' \\(did you mean 'sampler_cycles'\\?\\); allowed keys: burst_ms"),
                     ({"explain": [1]}, "explain = \\[1\\]: must be a mapping"),
                     ({"explain": 0}, "explain = 0: must be a mapping")):
        with pytest.raises(ConfigError, match=why):
            parse_config(bad)


def test_cpu_state_setting():
    """sampling.cpu_state: all (default) or usual; anything else is named with what it may be."""
    assert parse_config({}).sampling.cpu_state == "all"
    assert parse_config({"sampling": {"cpu_state": "usual"}}).sampling.cpu_state == "usual"
    with pytest.raises(ConfigError, match=r"sampling.cpu_state = 'fast': must be all \(every turn counts, the default\) or usual"):
        parse_config({"sampling": {"cpu_state": "fast"}})
    # usual judges turns by the speed probe's readings, which only speed_adjust takes
    with pytest.raises(ConfigError, match="sampling.cpu_state: usual needs sampling.speed_adjust: true"):
        parse_config({"sampling": {"cpu_state": "usual", "speed_adjust": False}})
    assert parse_config({"sampling": {"cpu_state": "all", "speed_adjust": False}}).sampling.cpu_state == "all"


def test_cpu_hop_setting():
    """sampling.cpu_hop: off by default; a boolean; it judges CPUs by the speed probe's readings,
    which only speed_adjust takes."""
    assert parse_config({}).sampling.cpu_hop is False
    assert parse_config({"sampling": {"cpu_hop": True}}).sampling.cpu_hop is True
    with pytest.raises(ConfigError, match="sampling.cpu_hop"):
        parse_config({"sampling": {"cpu_hop": "often"}})
    with pytest.raises(ConfigError, match="sampling.cpu_hop: true needs sampling.speed_adjust: true"):
        parse_config({"sampling": {"cpu_hop": True, "speed_adjust": False}})


def test_probe_share_setting():
    """sampling.probe_share: estimated by default (full without the speed adjustment, which it
    shares out); full or estimated; an explicit estimated needs the adjustment."""
    assert parse_config({}).sampling.probe_share == "estimated"
    assert parse_config({"sampling": {"speed_adjust": False}}).sampling.probe_share == "full"
    assert parse_config({"sampling": {"probe_share": "full"}}).sampling.probe_share == "full"
    assert parse_config({"sampling": {"probe_share": "estimated"}}).sampling.probe_share == "estimated"
    with pytest.raises(ConfigError, match="sampling.probe_share = 'half': must be estimated"):
        parse_config({"sampling": {"probe_share": "half"}})
    with pytest.raises(ConfigError, match="sampling.probe_share: estimated needs sampling.speed_adjust: true"):
        parse_config({"sampling": {"probe_share": "estimated", "speed_adjust": False}})


def test_min_burst_samples_setting():
    """sampling.min_burst_samples: 1 by default (every run so far); a positive integer up to 32."""
    assert parse_config({}).sampling.min_burst_samples == 1
    assert parse_config({"sampling": {"min_burst_samples": 5}}).sampling.min_burst_samples == 5
    for bad in (0, -1, 2.5, "five", True, 33):
        with pytest.raises(ConfigError, match="sampling.min_burst_samples"):
            parse_config({"sampling": {"min_burst_samples": bad}})


def test_every_unknown_key_is_named_at_once_with_the_key_it_likely_means():
    """Second new-user trial: `time_budget` and `min_efect` took two runs to find, with no hint."""
    with pytest.raises(ConfigError) as e:
        parse_config({"sampling": {"time_budget": 30, "min_efect": 0.02}})
    assert str(e.value).startswith("sampling: unknown keys 'min_efect' (did you mean 'min_effect'?), "
                                   "'time_budget' (did you mean 'time_budget_s'?); allowed keys: alpha, ")
    with pytest.raises(ConfigError) as e:
        parse_config({"sampling": {"zzz": 1}})
    assert str(e.value).startswith("sampling: unknown key 'zzz'; allowed keys:")


def test_max_sets_auto_follows_the_time_budget():
    """``max_sets: auto`` (the default): 40 process sets per minute of the budget, at least 40, so that a
    longer budget is not cut short by the cap (a 240 s run would stop at its 40th set, ~75-90 s in); a
    number given is kept whatever the budget."""
    s = load_config(None).sampling
    assert (s.max_sets, s.max_sets_auto) == (40, True) and s.planned_sets <= 40
    for budget, want in ((240, 160), (90, 60), (30, 40), (61, 41)):
        s = parse_config({"sampling": {"time_budget_s": budget}}).sampling
        assert (s.max_sets, s.max_sets_auto) == (want, True), budget
    for samp, want in (({"set_seconds": 0.5}, 80), ({"set_seconds": 0.5, "time_budget_s": 30}, 40),
                       ({"set_seconds": 2.0, "time_budget_s": 120}, 80)):
        # shorter sets, more of them a minute (the H200 held 35-48 of 0.5 s sets a minute)
        assert parse_config({"sampling": samp}).sampling.max_sets == want, samp
    s = parse_config({"sampling": {"time_budget_s": 240, "max_sets": 50}}).sampling
    assert (s.max_sets, s.max_sets_auto) == (50, False)
    s = parse_config({"sampling": {"time_budget_s": 240}}).sampling
    assert s.planned_sets > 40  # the sequence is tuned for the budget's sets, not the old cap
    with pytest.raises(ConfigError, match=re.escape("sampling.max_sets = 'lots': must be a positive integer or auto")):
        parse_config({"sampling": {"max_sets": "lots"}})
