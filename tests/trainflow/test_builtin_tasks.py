"""The built-in ``language_model`` and ``tabular_regression`` tasks (issue 11): their data, model and
loss on the task API (fast), and each trained by the real harness (``python -m components.training``
under torchrun agents, 2 ranks, gloo on CPU) to a stated quality (slow).

The quality tests evaluate the exported model with ``evaluate_task``, what the pipeline's evaluate
step does for a task's model.
"""

from __future__ import annotations

import math
import sysconfig
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from components.training.evaluation import evaluate_task
from tests.support.training import Job
from trainflow.task import BUILTIN_TASKS, TaskError, load_task, model_signature
from trainflow.tasks.language_model import CORPUS_FILES, LanguageModel, read_corpus
from trainflow.tasks.tabular import TabularRegression

SMALL_LM = {"context_length": 16, "d_model": 16, "n_layers": 1, "n_heads": 2, "corpus_bytes": 8192}


def test_both_tasks_are_built_in_by_short_name() -> None:
    assert BUILTIN_TASKS["language_model"] == "trainflow.tasks.language_model:LanguageModel"
    assert BUILTIN_TASKS["tabular_regression"] == "trainflow.tasks.tabular:TabularRegression"
    assert isinstance(load_task("language_model", SMALL_LM), LanguageModel)
    assert isinstance(load_task("tabular_regression", '{"hidden": [8]}'), TabularRegression)


# ---------------------------------------------------------------------------------- language model
def test_the_corpus_is_the_listed_stdlib_files_cut_to_the_limit() -> None:
    corpus = read_corpus(1 << 30)
    assert len(corpus) > 524288  # the default limit is reached: every run uses the same 512 KiB
    assert read_corpus(524288) == corpus[:524288]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    first = (stdlib / CORPUS_FILES[0]).read_bytes()
    assert corpus.startswith(first + b"\n\n" + (stdlib / CORPUS_FILES[1]).read_bytes())


def test_language_model_windows_are_pure_and_split_by_position() -> None:
    task = load_task("language_model", SMALL_LM)
    train, held_out = task.train_dataset(), task.eval_dataset()
    corpus = task.corpus()
    assert len(corpus) == 8192
    cut = int(8192 * 0.9)
    assert (len(train), len(held_out)) == (cut // 17, (8192 - cut) // 17)
    sample = train[5]
    assert sample.dtype == torch.int64 and sample.shape == (17,)
    assert bytes(sample.tolist()) == corpus[5 * 17:6 * 17]
    assert bytes(held_out[0].tolist()) == corpus[cut:cut + 17]
    again = load_task("language_model", SMALL_LM)
    assert all(torch.equal(again.train_dataset()[i], train[i]) for i in (len(train) - 1, 0, 7))
    assert again.data_fingerprint() == task.data_fingerprint()
    assert load_task("language_model", {**SMALL_LM, "corpus_bytes": 4096}).data_fingerprint() != task.data_fingerprint()
    with pytest.raises(IndexError):
        train[len(train)]


def test_language_model_loss_is_a_float32_scalar_and_the_model_is_causal() -> None:
    task = load_task("language_model", SMALL_LM)
    torch.manual_seed(0)
    model = task.build_model()
    batch = task.collate([task.train_dataset()[i] for i in range(4)])
    assert batch.shape == (4, 17)
    loss = task.loss(model, batch)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert abs(float(loss.detach()) - math.log(256)) < 0.1  # small initial weights: about uniform over bytes
    loss.backward()
    # Changing a later byte changes no earlier position's logits.
    model.eval()
    x = batch[:, :-1].clone()
    before = model(x)
    x[:, 10] = (x[:, 10] + 1) % 256
    after = model(x)
    assert torch.equal(before[:, :10], after[:, :10]) and not torch.equal(before[:, 10:], after[:, 10:])
    torch.manual_seed(0)
    assert model_signature(task.build_model()) == model_signature(model)


def test_language_model_evaluate_gives_perplexity_of_the_mean_token_nll() -> None:
    task = load_task("language_model", SMALL_LM)
    torch.manual_seed(0)
    model = task.build_model().eval()
    held_out = task.eval_dataset()
    with torch.no_grad():
        metrics = task.evaluate(model, DataLoader(held_out, batch_size=7, collate_fn=task.collate))
        whole = task.loss(model, task.collate([held_out[i] for i in range(len(held_out))]))
    assert set(metrics) == {"loss", "perplexity"}
    assert metrics["loss"] == pytest.approx(float(whole), rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"]), rel=1e-12)


@pytest.mark.parametrize(("args", "message"), [
    ({"d_model": 30, "n_heads": 4}, "d_model (30) must be a multiple of n_heads (4)"),
    ({"context_length": 0}, "context_length must be an integer >= 1, got 0"),
    ({"val_fraction": 1.5}, "val_fraction must be in (0, 1), got 1.5"),
    ({"layers": 2}, "task_args do not fit LanguageModel: got an unexpected keyword argument 'layers'"),
])
def test_language_model_bad_args_are_one_line(args, message) -> None:
    with pytest.raises(TaskError) as e:
        load_task("language_model", args)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("task 'language_model': ")


# ---------------------------------------------------------------------------------- tabular
def test_tabular_rows_are_standardised_with_training_statistics() -> None:
    task = load_task("tabular_regression", {"seed": 3})
    train, held_out = task.train_dataset(), task.eval_dataset()
    assert (len(train), len(held_out)) == (354, 88)  # 442 rows, 20 % held out
    x, y = train.tensors
    assert x.dtype == y.dtype == torch.float32 and x.shape == (354, 10) and y.shape == (354,)
    assert torch.allclose(x.mean(0), torch.zeros(10), atol=1e-5) and torch.allclose(x.std(0), torch.ones(10), atol=1e-5)
    assert abs(float(y.mean())) < 1e-5 and abs(float(y.std()) - 1) < 1e-5
    assert not torch.allclose(held_out.tensors[0].mean(0), torch.zeros(10), atol=1e-3)  # its own stats unused
    sample = train[4]
    assert sample[0].shape == (10,) and sample[1].shape == ()
    again = load_task("tabular_regression", {"seed": 3})
    assert torch.equal(again.train_dataset()[4][0], sample[0]) and again.data_fingerprint() == task.data_fingerprint()
    assert load_task("tabular_regression", {"seed": 4}).data_fingerprint() != task.data_fingerprint()


def test_tabular_loss_and_metrics() -> None:
    task = load_task("tabular_regression", {"hidden": [8, 4]})
    torch.manual_seed(0)
    model = task.build_model()
    assert [m.out_features for m in model if isinstance(m, torch.nn.Linear)] == [8, 4, 1]
    batch = task.collate([task.train_dataset()[i] for i in range(5)])
    loss = task.loss(model, batch)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    # A model predicting the training mean (0 standardised) scores r2 just below 0 on held-out rows.
    zero = torch.nn.Linear(10, 1)
    torch.nn.init.zeros_(zero.weight), torch.nn.init.zeros_(zero.bias)
    with torch.no_grad():
        metrics = task.evaluate(zero, DataLoader(task.eval_dataset(), batch_size=16, collate_fn=task.collate))
    assert set(metrics) == {"mse", "rmse", "r2"}
    assert -0.1 < metrics["r2"] <= 0 and metrics["rmse"] == pytest.approx(math.sqrt(metrics["mse"]))
    assert 60 < metrics["rmse"] < 90  # the target's spread (std about 77)


@pytest.mark.parametrize(("args", "message"), [
    ({"hidden": [0]}, "hidden must be a list of positive integers, got [0]"),
    ({"hidden": 32}, "hidden must be a list of positive integers, got 32"),
    ({"test_fraction": 0}, "test_fraction must be in (0, 1), got 0"),
    ({"seed": "x"}, "seed must be an integer, got 'x'"),
])
def test_tabular_bad_args_are_one_line(args, message) -> None:
    with pytest.raises(TaskError) as e:
        load_task("tabular_regression", args)
    assert message in str(e.value) and "\n" not in str(e.value)


# ---------------------------------------------------------------------------------- trained by the harness
def run_job(tmp_path: Path, task: str, task_args: str, *flags: str) -> Path:
    """Train ``task`` with ``python -m components.training`` under one torchrun agent of 2 ranks;
    return the exported model's folder."""
    root = tmp_path / task
    root.mkdir()
    args = ["--task", task, "--task-args", task_args, "--checkpoint-uri", str(tmp_path / "ckpt"),
            "--job-key", task, "--metrics-path", str(root / "metrics.jsonl"), "--model-output", str(root / "model"),
            "--threads-per-rank", "1", "--log-every-steps", "50", "--seed", "0", *flags]
    job = Job(root=root, job_key=task, args=args)
    assert job.agent({"nproc_per_node": 2}).wait(600) == 0, (root / "agent.log").read_text()[-3000:]
    return root / "model"


def unigram_perplexity(task: LanguageModel) -> float:
    """Perplexity on the held-out bytes of the byte frequencies of the training bytes (add-one):
    the best a model that ignores context can do, up to the train/held-out shift."""
    train = task.split_tokens()[0]
    counts = torch.bincount(train.long(), minlength=256).double() + 1
    log_p = (counts / counts.sum()).log()
    targets = torch.cat([w[1:] for w in task.eval_dataset()])
    return math.exp(-float(log_p[targets].mean()))


@pytest.mark.slow
def test_the_language_model_trains_well_below_the_unigram_perplexity(tmp_path) -> None:
    """Default task_args (64-byte context, 2 blocks of width 64 and 4 heads, 137k parameters; 512 KiB
    corpus: 7259 training and 806 held-out windows), 3 epochs at global batch 32 (681 steps), AdamW.

    Measured on the 2-core dev machine (CPython 3.11.7's standard library): held-out perplexity 6.61
    (1.89 nats per byte) against 22.75 for the unigram byte frequencies of the training bytes, in 30 s
    of training (the test takes about a minute). A model that learnt nothing past byte frequencies
    would score the unigram's; the threshold, 8.0, is about a third of it and 1.4 above the measured
    figure, room for other CPUs' rounding and other Python versions' corpus.
    """
    model_dir = run_job(tmp_path, "language_model", "{}", "--epochs", "3", "--global-batch-size", "32",
                        "--optimizer", "adamw", "--learning-rate", "3e-3", "--weight-decay", "0.01",
                        "--warmup-steps", "50", "--grad-clip-norm", "1.0")
    metrics = evaluate_task(model_dir)
    baseline = unigram_perplexity(load_task("language_model"))
    assert 20 < baseline < 26
    assert metrics["perplexity"] < 8.0, (metrics, baseline)


@pytest.mark.slow
def test_the_tabular_regression_trains_to_r2_above_0_4(tmp_path) -> None:
    """Default task_args (one hidden layer of 32; seed-0 split: 354 training rows, 88 held out), 30
    epochs at global batch 32 (360 steps), SGD with lr 0.02 and weight decay 0.05.

    Measured on the 2-core dev machine: held-out R² 0.461 (RMSE 56.9), against 0.482 for ordinary
    least squares on the same split, in 2 s of training (the test takes about 15 s, mostly torchrun
    start-up). With 88 held-out rows R² moves by a few hundredths with the initial weights (0.45-0.46
    over three in-process seeds), so the threshold is 0.4.
    """
    model_dir = run_job(tmp_path, "tabular_regression", "{}", "--epochs", "30", "--global-batch-size", "32",
                        "--learning-rate", "0.02", "--weight-decay", "0.05")
    metrics = evaluate_task(model_dir)
    assert metrics["r2"] > 0.4, metrics
