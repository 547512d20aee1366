"""TrainConfig: validation names the field in one line; JSON and flags round-trip; unknown keys fail."""

from __future__ import annotations

import argparse

import pytest

from components.training import config as c


def _cfg(**kw) -> c.TrainConfig:
    data = {"data": {"path": "/d"}, "checkpoint": {"uri": "/c", "job_key": "k"}, **kw}
    return c.TrainConfig.from_dict(data)


def test_json_round_trip() -> None:
    cfg = _cfg(
        epochs=4,
        optim={"lr": 0.1, "amp": "bf16"},
        checkpoint={"uri": "s3://b/p", "job_key": "a/b", "interval_steps": 5},
    )
    again = c.TrainConfig.from_json(cfg.to_json())
    assert again == cfg and again.optim.lr == 0.1 and again.checkpoint.interval_steps == 5


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"epochs": 0}, "epochs must be >= 1, got 0"),
        ({"optim": {"lr": -1}}, "lr must be a positive number, got -1"),
        ({"optim": {"lr": "fast"}}, "lr must be a float, got 'fast'"),
        ({"optim": {"momentum": 1.5}}, "momentum must be in [0, 1), got 1.5"),
        ({"optim": {"optimizer": "lion"}}, "optimizer must be sgd or adamw"),
        ({"model": {"name": "vgg"}}, "model must be one of"),
        ({"data": {"path": "/d", "global_batch_size": 0}}, "global_batch_size must be >= 1"),
        ({"checkpoint": {"uri": "/c", "job_key": "../x"}}, "job_key '../x' must be a relative key"),
        ({"checkpoint": {"uri": "/c", "job_key": "k", "keep_last_k": 0}}, "keep_last_k must be >= 1"),
        ({"checkpoint": {"uri": "/c", "job_key": "k", "interval_s": 0}}, "interval_s must be > 0"),
        ({"learning_rate": 1}, "unknown training option(s) learning_rate"),
        ({"optim": {"beta": 1}}, "unknown training option(s) optim.beta"),
        ({"epochs": 2.5}, "epochs must be a int, got 2.5"),
    ],
)
def test_invalid_values_are_one_line_errors(override, message) -> None:
    with pytest.raises(c.ConfigError) as info:
        _cfg(**override)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_flags_override_config_file(tmp_path) -> None:
    f = tmp_path / "c.json"
    f.write_text(_cfg(epochs=9).to_json())
    parser = argparse.ArgumentParser()
    c.add_arguments(parser)
    cfg = c.from_args(
        parser.parse_args(
            [
                "--config",
                str(f),
                "--lr",
                "0.2",
                "--checkpoint-interval-steps",
                "7",
                "--deterministic",
                "false",
            ]
        )
    )
    assert (cfg.epochs, cfg.optim.lr, cfg.checkpoint.interval_steps, cfg.deterministic) == (9, 0.2, 7, False)


def test_missing_required_field() -> None:
    with pytest.raises(c.ConfigError, match="checkpoint"):
        c.TrainConfig.from_dict({"data": {"path": "/d"}})


def test_model_names_have_one_home() -> None:
    from typing import get_args

    from components.training.model import MODEL_NAMES

    assert get_args(c.ModelName) == MODEL_NAMES
