"""The one config loader (whale_train.config_io): nesting, coercion, nearest-key errors, --set."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from whale_train.config_io import (
    Config,
    ConfigError,
    at_least,
    describe,
    merge,
    option,
    parse_sets,
    read_yaml,
)


@dataclass
class Inner(Config):
    rate: float = option(1e-4, "a learning rate")
    steps: int = option(3, "how many")
    flag: bool = option(False, "on or off")
    modules: list[str] | str | None = option(None, "names")

    def validate(self) -> None:
        if not 0 < self.rate < 1:
            raise ValueError(f"rate must be in (0, 1), got {self.rate}")


@dataclass
class Outer(Config):
    name: str = option("run", "the run's name")
    seed: int | None = option(None, "a seed")
    inner: Inner = option(factory=Inner, help="the inner part")
    extra: dict = option(factory=dict, help="free-form")


def test_yaml_strings_become_the_field_type_and_nesting_is_built(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: 2024\ninner:\n  rate: 5e-5\n  steps: '8'\n  flag: 'yes'\n  modules: [q, v]\n")
    config = Outer.load(path)
    assert config == Outer(name="2024", inner=Inner(rate=5e-5, steps=8, flag=True, modules=["q", "v"]))
    assert isinstance(config.inner.rate, float) and Outer.from_dict(config.to_dict()) == config


def test_set_overrides_apply_last_and_nest_dotted_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("inner: {steps: 2, rate: 0.5}\n")
    config = Outer.load(path, ["inner.rate=5e-5", "seed=3", "extra={a: 1}"])
    assert (config.inner.steps, config.inner.rate, config.seed, config.extra) == (2, 5e-5, 3, {"a": 1})
    assert parse_sets(["a.b=1", "a.c=[x]", "d=true"]) == {"a": {"b": 1, "c": ["x"]}, "d": True}
    with pytest.raises(ConfigError, match="--set expects key=value, got 'seed'"):
        parse_sets(["seed"])


def test_unknown_keys_name_the_file_the_dotted_field_and_the_nearest_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("inner:\n  rat: 0.1\n")
    with pytest.raises(ConfigError) as exc:
        Outer.load(path)
    assert str(exc.value) == f"{path}: inner.rat: unknown field; did you mean inner.rate?"
    with pytest.raises(
        ConfigError, match=r"^--set inner\.stepz: unknown field; did you mean inner\.steps\?$"
    ):
        Outer.load(None, ["inner.stepz=1"])
    with pytest.raises(ConfigError, match="^zzz: unknown field; known: extra, inner, name, seed$"):
        Outer.from_dict({"zzz": 1})


def test_bad_values_and_validate_errors_are_one_line_with_the_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("inner: {steps: many}\n")
    with pytest.raises(ConfigError, match=rf"^{path}: inner\.steps: expected an integer, got 'many'$"):
        Outer.load(path)
    with pytest.raises(ConfigError, match=r"^--set inner\.flag: expected true or false, got 'maybe'$"):
        Outer.load(None, ["inner.flag=maybe"])
    with pytest.raises(ConfigError, match=r"^--set inner: rate must be in \(0, 1\), got 2\.0$"):
        Outer.load(None, ["inner.rate=2"])  # validate() of the nested config, named by its section
    with pytest.raises(ConfigError, match=r"inner: expected a mapping of Inner fields"):
        Outer.from_dict({"inner": 3})


def test_base_files_merge_key_by_key_and_yaml_errors_name_the_line(tmp_path):
    (tmp_path / "base.yaml").write_text("name: a\ninner: {steps: 2, rate: 0.5}\n")
    (tmp_path / "c.yaml").write_text("base: base.yaml\ninner: {steps: 5}\n")
    assert read_yaml(tmp_path / "c.yaml") == {"name": "a", "inner": {"steps": 5, "rate": 0.5}}
    assert merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}
    (tmp_path / "bad.yaml").write_text("a: [1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml line \d+: not valid YAML"):
        read_yaml(tmp_path / "bad.yaml")
    with pytest.raises(FileNotFoundError, match="no config file"):
        read_yaml(tmp_path / "missing.yaml")


def test_describe_lists_every_field_with_its_help():
    lines = describe(Outer)
    assert "inner.rate (float, 0.0001): a learning rate" in lines
    assert len(lines) == 7


def test_at_least_names_the_first_field_below_the_minimum():
    at_least(Inner(steps=1), 1, "steps")
    with pytest.raises(ValueError, match=r"^Inner\.steps must be >= 1, got 0$"):
        at_least(Inner(steps=0), 1, "steps")
