"""Config loading: the quickstart file, dotted overrides, and errors that name key, file, line."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from agentrl.config import Config, ConfigError, dump_config, load_config, schema

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return str(path)


def error(path, overrides=()) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value


def leaf_keys(model: type[BaseModel] = Config, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys += leaf_keys(ann, f"{prefix}{name}.")
        else:
            keys.append(prefix + name)
    return keys


# ------------------------------------------------------------------------------------ happy paths

def test_quickstart_loads():
    cfg = load_config(QUICKSTART)
    assert isinstance(cfg, Config)
    assert cfg.run.name == "quickstart"
    assert cfg.rollout.group_size >= 2
    assert cfg.algo.advantage in schema.KNOWN_ADVANTAGES
    assert cfg.learner.lr == pytest.approx(2e-4)  # YAML "2.0e-4" must load as a float
    assert cfg.tasks.heldout_size is None and cfg.train.max_minutes == 10


def test_no_file_means_defaults():
    assert load_config() == Config()
    assert load_config(None, []) == Config()


def test_empty_file_and_empty_section_mean_defaults(tmp_path):
    assert load_config(write(tmp_path, "# nothing here\n")) == Config()
    cfg = load_config(write(tmp_path, "rollout:\n  # group_size: 4\nlearner:\n", "s.yaml"))
    assert cfg == Config()


def test_dump_round_trips(tmp_path):
    cfg = load_config(QUICKSTART, ["learner.lr=3e-6", "tasks.heldout_size=null", "run.name=007"])
    text = dump_config(cfg)
    assert load_config(write(tmp_path, text)) == cfg


@pytest.mark.parametrize(
    "override, getter, expected",
    [
        ("rollout.group_size=4", lambda c: c.rollout.group_size, 4),  # int
        ("learner.lr=1e-4", lambda c: c.learner.lr, 1e-4),  # float, YAML 1.2 exponent form
        ("learner.lr=2.5E-3", lambda c: c.learner.lr, 2.5e-3),
        ("algo.kl_coef=0", lambda c: c.algo.kl_coef, 0.0),  # int into a float field
        ("train.eval_at_start=false", lambda c: c.train.eval_at_start, False),  # bool
        ("telemetry.progress=off", lambda c: c.telemetry.progress, False),  # YAML 1.1 bool
        ("run.name=my-run", lambda c: c.run.name, "my-run"),  # str
        ("run.name=123", lambda c: c.run.name, "123"),  # number written where text is wanted
        ("run.name=2024-05-01", lambda c: c.run.name, "2024-05-01"),  # dates stay text
        ("run.name=a=b", lambda c: c.run.name, "a=b"),  # only the first '=' splits
        ("learner.betas=[0.8, 0.95]", lambda c: c.learner.betas, (0.8, 0.95)),  # list
        ("tasks.heldout_size=null", lambda c: c.tasks.heldout_size, None),  # null
        ("train.max_minutes=2.5", lambda c: c.train.max_minutes, 2.5),  # optional float
        ("model.dtype=bfloat16", lambda c: c.model.dtype, "bfloat16"),  # literal
        ("learner.zero_stage=3", lambda c: c.learner.zero_stage, 3),
        ("runtime.weight_sync=nccl", lambda c: c.runtime.weight_sync, "nccl"),
        ("rollout.engine.kv_cache_gib=4", lambda c: c.rollout.engine.kv_cache_gib, 4.0),  # 3 deep
        ("algo.advantage=rloo", lambda c: c.algo.advantage, "rloo"),
        (" rollout.tasks_per_step = 2 ", lambda c: c.rollout.tasks_per_step, 2),  # spaces
    ],
)
def test_override_types(override, getter, expected):
    assert getter(load_config(QUICKSTART, [override])) == expected


def test_mapping_override_merges_into_section():
    cfg = load_config(QUICKSTART, ["rollout.engine={seed: 7, max_model_len: 512}"])
    assert (cfg.rollout.engine.seed, cfg.rollout.engine.max_model_len) == (7, 512)
    assert cfg.rollout.engine.kv_cache_gib == load_config(QUICKSTART).rollout.engine.kv_cache_gib


def test_later_override_wins():
    cfg = load_config(QUICKSTART, ["train.steps=3", "train.steps=5"])
    assert cfg.train.steps == 5


def test_every_estimator_is_accepted_and_a_typo_is_not():
    assert load_config(None, ["algo.advantage=gigpo"]).algo.advantage == "gigpo"
    assert load_config(None, ["algo.advantage=slca"]).algo.advantage == "slca"
    assert load_config(None, ["algo.advantage=ppo", "algo.critic.lr=1e-5"]).algo.critic.lr == 1e-5
    with pytest.raises(ConfigError, match="did you mean 'gigpo'"):
        load_config(None, ["algo.advantage=gipgo"])


@pytest.mark.parametrize(
    ("overrides", "key", "says"),
    [
        (["algo.advantage=ppo"], "algo.advantage", "needs a critic"),
        (["algo.advantage=slca", "rewards.summary=none"], "algo.advantage", "needs summary scoring"),
        (["rewards.summary=judge"], "rewards.summary", "needs rewards.judge"),
        (["algo.advantage=slca", "algo.kl_in=reward"], "algo.kl_in", "not defined for algo.advantage=slca"),
        (["algo.dual_clip=0.5"], "algo.dual_clip", "greater than 1"),
        ([f"rewards.hierr.{k}=0.0" for k in ("format", "name_f1", "key_jaccard", "value_match", "parallel")],
         "rewards.hierr", "must be > 0"),
        (["rods.enabled=true", "tasks.fresh_train=true"], "rods.enabled", "needs tasks.fresh_train=false"),
        (["rods.low=0.9"], "rods.low", "must be <= rods.high"),
        (["rods.retire_below=0.99"], "rods.retire_below", "must be <= rods.retire_above"),
        (["rods.resume_from=pool.json"], "rods.resume_from", "set rods.enabled=true"),
        (["rods.synthesizer=llm"], "rods.synthesizer", "needs rods.llm"),
        (["rods.llm.temperature=0.5"], "rods.llm.model_path", "exactly one of model_path"),
        (["train.async_rollouts=true", "buffer.max_staleness=0"], "train.async_rollouts", "must be >= 1"),
        (["algo.advantage=turn_grpo", "algo.kl_in=reward"], "algo.kl_in", "not defined for algo.advantage=turn_grpo"),
        (["algo.advantage=raft", "algo.kl_in=reward"], "algo.kl_in", "not defined for algo.advantage=raft"),
        (["rollout.top_p=0.9"], "rollout.top_p", "not supported for training yet"),
    ],
)
def test_estimator_prerequisites_name_the_key(overrides, key, says):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert err.value.key == key and says in str(err.value)


def test_tasks_train_the_run_would_not_read_is_an_error(tmp_path):
    """With tasks.fresh_train=true the run never loads tasks.train: naming one is a located error."""
    # by override, on the quickstart (which draws fresh tasks): the new user's `tasks.train=my_tasks.jsonl`
    err = error(QUICKSTART, ["tasks.train=my_tasks.jsonl"])
    assert err.key == "tasks.train" and err.file == QUICKSTART
    assert "tasks.train=my_tasks.jsonl" in str(err) and "tasks.fresh_train=true" in str(err)
    assert "set tasks.fresh_train=false" in str(err) and "set by override 'tasks.train=my_tasks.jsonl'" in str(err)
    # in the file (even the default's value, or a list): located at the tasks.train line
    path = write(tmp_path, """
        tasks:
          fresh_train: true
          train: [builtin:train, my_tasks.jsonl]
        """)
    err = error(path)
    assert (err.key, err.line) == ("tasks.train", 3) and str(err).startswith(f"{path}:3: tasks.train=[builtin:train, ")
    assert "tasks.fresh_train=true" in str(err)
    assert error(None, ["tasks.fresh_train=true", "tasks.train=builtin:train"]).key == "tasks.train"
    # fresh_train set by override on a file that names tasks.train: still refused
    assert error(write(tmp_path, "tasks:\n  train: my.jsonl\n", "t.yaml"), ["tasks.fresh_train=true"]).line == 2


def test_fresh_train_without_tasks_train_stays_valid(tmp_path):
    assert load_config(QUICKSTART).tasks.fresh_train  # the quickstart leaves tasks.train out
    assert load_config(None, ["tasks.fresh_train=true"]).tasks.fresh_train
    cfg = load_config(QUICKSTART, ["tasks.fresh_train=false", "tasks.train=my_tasks.jsonl"])
    assert (cfg.tasks.fresh_train, cfg.tasks.train) == (False, "my_tasks.jsonl")
    # a fresh_train run's saved config.yaml leaves tasks.train out, so it loads again (--resume)
    text = dump_config(load_config(QUICKSTART))
    assert "fresh_train: true" in text and "train: builtin" not in text
    assert load_config(write(tmp_path, text)) == load_config(QUICKSTART)
    assert "train: my_tasks.jsonl" in dump_config(cfg)


def test_optional_section_null_stays_off(tmp_path):
    path = write(tmp_path, """
        algo:
          critic: null
        """)
    assert load_config(path).algo.critic is None
    on = load_config(path, ["algo.critic.lr=2e-5"]).algo.critic
    assert on is not None and on.lr == 2e-5 and on.lam == 1.0


def test_assignment_is_validated():
    cfg = Config()
    with pytest.raises(ValidationError):
        cfg.rollout.group_size = 1


# ----------------------------------------------------------------------------- errors: the file

def test_unknown_key_top_level(tmp_path):
    path = write(tmp_path, """
        run:
          name: x
        rolout:
          group_size: 4
    """)
    err = error(path)
    assert str(err) == f"{path}:3: rolout: unknown key (did you mean 'rollout'?)"
    assert (err.key, err.file, err.line) == ("rolout", path, 3)


def test_unknown_key_nested(tmp_path):
    path = write(tmp_path, """
        rollout:
          temperature: 0.7
          gruop_size: 4
    """)
    err = error(path)
    assert str(err) == f"{path}:3: rollout.gruop_size: unknown key (did you mean 'group_size'?)"
    assert (err.key, err.line) == ("rollout.gruop_size", 3)


def test_unknown_key_without_close_match_lists_known_keys(tmp_path):
    err = error(write(tmp_path, "buffer:\n  zzzzzz: 1\n"))
    assert "buffer.zzzzzz: unknown key (known keys: max_staleness, capacity_groups)" in str(err)


def test_bad_type(tmp_path):
    path = write(tmp_path, """
        train:
          steps: 5
          eval_at_start: 3
    """)
    err = error(path)
    assert str(err) == f"{path}:3: train.eval_at_start: Input should be a valid boolean (got 3)"


def test_bool_is_not_a_number(tmp_path):
    path = write(tmp_path, "rollout:\n  group_size: true\n")
    assert str(error(path)) == (
        f"{path}:2: rollout.group_size: Input should be a valid integer (got true)"
    )


def test_out_of_range(tmp_path):
    path = write(tmp_path, """
        rollout:
          num_workers: 1

          group_size: 1
    """)
    err = error(path)
    assert str(err) == (
        f"{path}:4: rollout.group_size: Input should be greater than or equal to 2 (got 1)"
    )
    assert (err.key, err.file, err.line) == ("rollout.group_size", path, 4)


@pytest.mark.parametrize("key", ["clip_low", "clip_high"])
@pytest.mark.parametrize("value", [0, 1, -0.1, 1.5])
def test_clip_must_be_in_open_unit_interval(key, value):
    err = error(QUICKSTART, [f"algo.{key}={value}"])
    assert f"algo.{key}: Input should be" in str(err) and err.key == f"algo.{key}"


def test_list_item_error_names_index_and_its_line(tmp_path):
    path = write(tmp_path, """
        learner:
          betas:
            - 0.9
            - 1.5
    """)
    err = error(path)
    assert str(err) == f"{path}:4: learner.betas[1]: Input should be less than 1 (got 1.5)"


def test_unknown_advantage_suggests(tmp_path):
    path = write(tmp_path, "algo:\n  advantage: grpoo\n")
    err = error(path)
    assert str(err).startswith(f"{path}:2: algo.advantage: unknown advantage estimator 'grpoo' "
                               "(did you mean 'grpo'?")


def test_section_that_is_not_a_mapping(tmp_path):
    path = write(tmp_path, "rollout: 5\n")
    assert str(error(path)).startswith(f"{path}:1: rollout: Input should be a valid dictionary")


def test_all_errors_reported_in_file_order(tmp_path):
    path = write(tmp_path, """
        train:
          steps: 0
        rollout:
          group_size: 1
    """)
    err = error(path)
    lines = str(err).splitlines()
    assert [line.split(": ")[0] for line in lines] == [f"{path}:2", f"{path}:4"]
    assert err.key == "train.steps" and err.line == 2


def test_missing_file(tmp_path):
    path = str(tmp_path / "nope.yaml")
    err = error(path)
    assert str(err) == f"{path}: config file not found"
    assert err.file == path


def test_yaml_syntax_error_has_line(tmp_path):
    path = write(tmp_path, """
        run:
          name: x
        rollout:
          group_size: [1, 2
        train:
          steps: 3
    """)
    err = error(path)
    assert str(err).startswith(f"{path}:") and "YAML syntax error" in str(err)
    assert err.line is not None and 4 <= err.line <= 6
    assert str(err).startswith(f"{path}:{err.line}: ")


def test_tab_indentation_is_a_syntax_error(tmp_path):
    err = error(write(tmp_path, "run:\n\tname: x\n"))
    assert err.line == 2 and "YAML syntax error" in str(err)


def test_top_level_must_be_a_mapping(tmp_path):
    path = write(tmp_path, "- a\n- b\n")
    assert str(error(path)) == f'{path}:1: top level must be a mapping of sections, got ["a", "b"]'


def test_duplicate_key(tmp_path):
    path = write(tmp_path, """
        train:
          steps: 3
          steps: 4
    """)
    err = error(path)
    assert str(err) == f"{path}:3: train.steps: duplicate key"


def test_boolean_key(tmp_path):
    path = write(tmp_path, "telemetry:\n  on: true\n")
    err = error(path)
    assert str(err).startswith(f"{path}:2: telemetry.True: keys must be strings")


# -------------------------------------------------------------------------- errors: the overrides

def test_override_out_of_range_names_file_and_override():
    err = error(QUICKSTART, ["rollout.group_size=1"])
    assert str(err) == (
        f"{QUICKSTART}: rollout.group_size: Input should be greater than or equal to 2 (got 1); "
        "set by override 'rollout.group_size=1'"
    )
    assert (err.key, err.file, err.line) == ("rollout.group_size", QUICKSTART, None)


def test_override_bad_type():
    err = error(QUICKSTART, ["train.steps=many"])
    assert str(err) == (f'{QUICKSTART}: train.steps: Input should be a valid integer (got "many"); '
                        "set by override 'train.steps=many'")


def test_override_unknown_key_top_level():
    err = error(QUICKSTART, ["rolout.group_size=4"])
    assert str(err) == (f"{QUICKSTART}: rolout: unknown key (did you mean 'rollout'?); "
                        "set by override 'rolout.group_size=4'")
    assert err.key == "rolout" and err.file == QUICKSTART


def test_override_unknown_key_nested():
    err = error(QUICKSTART, ["rollout.engine.kv_cache=2"])
    assert str(err) == (f"{QUICKSTART}: rollout.engine.kv_cache: unknown key (did you mean "
                        "'kv_cache_gib'?); set by override 'rollout.engine.kv_cache=2'")
    assert err.key == "rollout.engine.kv_cache"


def test_override_unknown_key_inside_mapping_value():
    err = error(QUICKSTART, ["rollout.engine={sed: 1}"])
    assert str(err) == (f"{QUICKSTART}: rollout.engine.sed: unknown key (did you mean 'seed'?); "
                        "set by override 'rollout.engine={sed: 1}'")


@pytest.mark.parametrize("override", ["rollout.group_size", "", "=4", ".a=1", "rollout..x=1",
                                      "rollout.group_size.x=1", "run.name =[1"])
def test_bad_override_syntax(override):
    err = error(QUICKSTART, [override])
    assert str(err).startswith(f"{QUICKSTART}: ")
    assert err.file == QUICKSTART


def test_override_without_equals_names_it():
    err = error(QUICKSTART, ["rollout.group_size"])
    assert str(err) == (f"{QUICKSTART}: override 'rollout.group_size': expected KEY=VALUE, "
                        "e.g. rollout.group_size=8")
    assert err.key == "rollout.group_size"


def test_override_into_a_value_names_the_value():
    err = error(QUICKSTART, ["rollout.group_size.x=1"])
    assert "rollout.group_size: is a value, not a section" in str(err)


def test_override_value_yaml_error():
    err = error(None, ["run.name=[1"])
    assert err.key == "run.name" and "cannot parse value as YAML" in str(err)
    assert "set by override 'run.name=[1'" in str(err)


def test_file_error_still_reported_next_to_override(tmp_path):
    path = write(tmp_path, "train:\n  steps: 0\n")
    err = error(path, ["rollout.group_size=1"])
    first, second = str(err).splitlines()
    assert first.startswith(f"{path}:2: train.steps:")
    assert second.startswith(f"{path}: rollout.group_size:") and second.endswith("=1'")


def test_override_fixes_file_error(tmp_path):
    path = write(tmp_path, "rollout:\n  group_size: 1\n")
    assert load_config(path, ["rollout.group_size=2"]).rollout.group_size == 2


# --------------------------------------------------------------------------------- the contract

def test_config_package_imports_neither_torch_nor_ray():
    code = ("import sys, agentrl.config; "
            "bad = [m for m in ('torch', 'ray') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_field_has_a_comment():
    """The configuration reference (docs/configuration.md) is built from these comments."""
    for model in [Config] + [m for m in vars(schema).values()
                             if isinstance(m, type) and issubclass(m, schema.Section)]:
        if model is Config:
            continue
        source = inspect.getsource(model).splitlines()
        for name in model.model_fields:
            i = next(i for i, line in enumerate(source) if line.strip().startswith(f"{name}:"))
            assert source[i - 1].strip().startswith("#"), f"{model.__name__}.{name} has no comment"


# ---------------------------------------------------------------------------------------- fuzzing

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
yaml_values = st.one_of(
    st.text(max_size=20), st.integers(-5, 5000).map(str), st.floats(allow_nan=True).map(str),
    st.sampled_from(["true", "no", "null", "~", "[1, 2]", "[0.5, 0.9]", "{}", "{seed: 1}", "[",
                     "{a: b", "'", "!!int x", "!!float y", "&a [*a]", "@", "- x", "1e-5", ".inf",
                     "2024-01-01", "? [a]\n: b", "!!binary zz", "!!set {a}", "*x"]),
)
keys = st.one_of(st.sampled_from(leaf_keys() + ["rollout", "rollout.engine", "algo", ""]),
                 st.text(max_size=30))


def _outcome(path, overrides):
    try:
        assert isinstance(load_config(path, overrides), Config)
    except ConfigError as err:
        assert str(err)


@FUZZ
@given(st.lists(st.text(max_size=60), max_size=3))
def test_fuzz_raw_override_strings(overrides):
    _outcome(QUICKSTART, overrides)


@FUZZ
@given(st.lists(st.tuples(keys, yaml_values).map(lambda kv: f"{kv[0]}={kv[1]}"), max_size=4))
def test_fuzz_structured_overrides(overrides):
    _outcome(QUICKSTART, overrides)


@FUZZ
@given(st.text(max_size=200) | st.lists(st.tuples(keys, yaml_values), max_size=6).map(
    lambda kvs: "\n".join(f"{k}: {v}" for k, v in kvs)))
def test_fuzz_file_contents(text):
    fd, path = tempfile.mkstemp(suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogatepass") as fh:
            fh.write(text)
        _outcome(path, [])
    finally:
        os.unlink(path)


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    cfg = load_config(path)
    assert cfg.run.name and cfg.rollout.group_size >= 2
