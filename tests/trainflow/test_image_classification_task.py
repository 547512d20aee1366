"""The built-in image_classification task: the trainer's own numbers, through the public task API."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from components.training import data as datamod
from components.training import rng
from components.training.distributed import DistEnv
from components.training.evaluation import evaluate as evaluate_exported
from components.training.sources import prepare
from components.training.trainer import Trainer
from trainflow.common.training_spec import TrainConfig
from trainflow.task import TaskError, load_task, model_signature
from trainflow.tasks.image_classification import ImageClassification, SplitDataset


@pytest.fixture(scope="module")
def synthetic_dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("datasets") / "synthetic"
    prepare("synthetic-cifar:40", out)
    return out


def todays_trainer(dataset, tmp_path, *, seed: int) -> Trainer:
    cfg = TrainConfig.from_flat({
        "dataset": str(dataset), "checkpoint_uri": str(tmp_path / "ckpt"), "job_key": "task-equality",
        "model_name": "small_cnn", "seed": seed, "global_batch_size": 8, "threads_per_rank": 1,
        "learning_rate": 0.1, "save_final": False,
    })
    return Trainer(cfg, DistEnv.from_env({}))


# The digits dataset is stored as uint8 tensors (normalised on access), the synthetic one is generated
# from (seed, index): both of today's in-memory sample paths.
@pytest.mark.parametrize("which", ["digits", "synthetic"])
def test_model_batch_and_loss_equal_todays_trainer(which, request, tmp_path, torch_globals) -> None:
    dataset = request.getfixturevalue(f"{which}_dataset")
    seed = 7
    trainer = todays_trainer(dataset, tmp_path, seed=seed)
    try:
        task = load_task("image_classification", {"dataset": str(dataset), "model_name": "small_cnn"})
        # 1. The same initial weights: the harness seeds, then builds (trainer: rng.seed_all(seed); build_model).
        rng.seed_all(seed)
        model = task.build_model()
        theirs = trainer.model.state_dict()
        assert list(model.state_dict()) == list(theirs)
        for name, value in model.state_dict().items():
            assert torch.equal(value, theirs[name]), name
        assert model_signature(model) == model_signature(trainer.model)

        # 2. The same batch for the first step of epoch 0 as the split's own batched read (what the
        # trainer read before it trained tasks): per-sample reads + collate, and the batched read.
        ids = datamod.global_batch(datamod.epoch_permutation(trainer.num_samples, seed, 0), 0, 8)
        x, y = datamod.PreparedDataset(dataset).split("train").fetch(ids)
        samples = task.train_dataset()
        assert len(samples) == trainer.num_samples
        for batch in (task.collate([samples[i] for i in ids.tolist()]), task.collate(samples.__getitems__(ids.tolist()))):
            assert batch[0].dtype == torch.float32 and batch[1].dtype == torch.int64
            assert torch.equal(batch[0], x) and torch.equal(batch[1], y)

        # 3. The same loss and gradients, dropout masks included (the same generator state for all),
        # as the pre-task trainer's formula (sum of per-sample cross-entropies x W / n_global) and as
        # the trainer's step now (the task's mean x n_local x W / n_global).
        old = copy.deepcopy(model)
        model.train()
        old.train()
        torch.manual_seed(123)
        loss = task.loss(model, (x, y))
        loss.backward()
        torch.manual_seed(123)
        old_sum = F.cross_entropy(old(x).float(), y, reduction="none").sum()
        (old_sum * (1 / 8)).backward()
        torch.manual_seed(123)
        loss_sum = trainer._step((x, y), 8, 8)  # the trainer's step: returns mean x n_local, float64
        assert loss.dtype == torch.float32 and loss.dim() == 0
        assert loss.item() == (old_sum / 8).item()  # bit-exact: the mean is the sum / 8
        assert float(loss_sum) == pytest.approx(float(old_sum.detach()), rel=1e-6)  # what the step record reports
        old_grads = dict(old.named_parameters())
        grads = {n: p.grad for n, p in trainer.model.named_parameters()}
        for name, p in model.named_parameters():
            # sum * (1/8) and sum / 8 are exact for a power of two, so the same bits everywhere
            assert torch.equal(p.grad, old_grads[name].grad), name
            assert torch.equal(p.grad, grads[name]), name
    finally:
        trainer.ckpt.close()


def test_evaluate_equals_the_evaluate_step_on_an_exported_model(digits_dataset, tmp_path) -> None:
    task = load_task("image_classification", json.dumps({"dataset": str(digits_dataset)}))
    rng.seed_all(0)
    model = task.build_model()
    # A few steps of plain SGD through the task API, so the accuracy is far from chance.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train = task.train_dataset()
    perm = datamod.epoch_permutation(len(train), 0, 0)
    model.train()
    for step in range(40):
        ids = perm[(step * 32) % 1408 : (step * 32) % 1408 + 32].tolist()
        optimizer.zero_grad()
        task.loss(model, task.collate(train.__getitems__(ids))).backward()
        optimizer.step()
    model.eval()
    eval_set = task.eval_dataset()
    loader = DataLoader(eval_set, batch_size=512, collate_fn=task.collate)
    with torch.no_grad():
        metrics = task.evaluate(model, loader)
    assert set(metrics) == {"accuracy", "loss"}
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert metrics["accuracy"] > 0.6  # 10 classes: chance is 0.1
    assert 0.0 < metrics["loss"] < 2.0

    # The evaluate pipeline step on the same weights (model.pt + model.json) gives the same numbers.
    out = tmp_path / "model"
    out.mkdir()
    info = task.prepared.info
    torch.save(model.state_dict(), out / "model.pt")
    (out / "model.json").write_text(json.dumps({
        "format": "trainflow-model/1", "model": "small_cnn", "channels": info.channels,
        "num_classes": info.num_classes, "image_size": list(info.image_size)}))
    result = evaluate_exported(out, digits_dataset, split="test", batch_size=512)
    assert result.num_samples == len(eval_set)
    assert metrics["accuracy"] == result.accuracy
    assert metrics["loss"] == pytest.approx(result.loss, rel=1e-12)


def test_identity_and_structure(digits_dataset, synthetic_dataset) -> None:
    digits = ImageClassification(str(digits_dataset))
    assert digits.data_fingerprint() == digits.prepared.info.fingerprint
    assert digits.data_fingerprint() != ImageClassification(str(synthetic_dataset)).data_fingerprint()
    small = model_signature(digits.build_model())
    assert small == model_signature(ImageClassification(str(digits_dataset)).build_model())
    assert small != model_signature(ImageClassification(str(digits_dataset), model_name="resnet18").build_model())
    assert small != model_signature(ImageClassification(str(synthetic_dataset)).build_model())  # 3 channels


def test_samples_are_pure_functions_of_the_index(synthetic_dataset) -> None:
    samples = ImageClassification(str(synthetic_dataset)).train_dataset()
    assert isinstance(samples, SplitDataset) and len(samples) == 32
    x0, y0 = samples[5]
    assert x0.shape == (3, 32, 32) and x0.dtype == torch.float32 and y0.dtype == torch.int64 and y0.dim() == 0
    _ = samples[0], samples[31]
    again = samples[5]
    assert torch.equal(again[0], x0) and torch.equal(again[1], y0)
    assert samples.__getitems__([]) == []
    with pytest.raises(IndexError, match="sample 32 is out of range for a split of 32 samples"):
        samples[32]
    with pytest.raises(IndexError, match="sample -1 is out of range"):
        samples.__getitems__([0, -1])


def test_the_constructor_is_cheap_and_checks_its_arguments(tmp_path) -> None:
    task = load_task("image_classification", {"dataset": str(tmp_path / "not-yet-prepared")})  # not opened
    assert task.model_name == "small_cnn" and task.eval_split == "test"
    with pytest.raises(ValueError, match="does not exist"):
        task.train_dataset()
    with pytest.raises(TaskError) as e:
        load_task("image_classification", {"dataset": "mnist", "model_name": "vgg"})
    assert str(e.value) == ("task 'image_classification': ImageClassification(**task_args) failed: ValueError: "
                            "unknown model_name 'vgg'; choose one of small_cnn, resnet18, wide_resnet101_2")
    with pytest.raises(TaskError) as e:
        load_task("image_classification", None)
    assert str(e.value) == ("task 'image_classification': task_args do not fit ImageClassification: missing a "
                            "required argument: 'dataset'")
    with pytest.raises(TaskError) as e:
        load_task("image_classification", '{"dataset": ""}')
    assert str(e.value) == ("task 'image_classification': ImageClassification(**task_args) failed: ValueError: "
                            "dataset must not be empty")


def test_the_built_in_name_and_its_import_path_are_the_same_task(digits_dataset) -> None:
    by_name = load_task("image_classification", {"dataset": str(digits_dataset)})
    by_path = load_task("trainflow.tasks.image_classification:ImageClassification", {"dataset": str(digits_dataset)})
    assert type(by_name) is type(by_path) is ImageClassification


def test_evaluate_feeds_the_model_its_own_normalization_and_refuses_another_shape(digits_dataset, tmp_path) -> None:
    """Review 2026-11-30: ``evaluate`` normalized with the dataset's mean/std, not those the model was
    trained with (model.json), which skews the current model's score on new data in the promotion
    check; a model of another channel count or size ended in a RuntimeError traceback."""
    import shutil

    from components.training.data import DatasetError, PreparedDataset

    task = load_task("image_classification", json.dumps({"dataset": str(digits_dataset)}))
    rng.seed_all(0)
    model = task.build_model()
    info = PreparedDataset(digits_dataset).info
    out = tmp_path / "model"
    out.mkdir()
    torch.save(model.state_dict(), out / "model.pt")
    meta = {"format": "trainflow-model/1", "model": "small_cnn", "channels": info.channels,
            "num_classes": info.num_classes, "image_size": list(info.image_size), "mean": info.mean, "std": info.std}
    (out / "model.json").write_text(json.dumps(meta))
    base = evaluate_exported(out, digits_dataset)

    # The same images described by other statistics: the model must still see its own normalization.
    other = tmp_path / "other"
    shutil.copytree(digits_dataset, other)
    described = json.loads((other / "dataset.json").read_text())
    described["mean"] = [m + 0.25 for m in described["mean"]]
    described["std"] = [s * 2 for s in described["std"]]
    (other / "dataset.json").write_text(json.dumps(described))
    moved = evaluate_exported(out, other)
    assert moved.confusion == base.confusion
    assert moved.loss == pytest.approx(base.loss, rel=1e-5)

    from components.training.model import build_model

    rgb = build_model("small_cnn", in_channels=3, num_classes=info.num_classes,
                                 image_size=tuple(info.image_size))
    torch.save(rgb.state_dict(), out / "model.pt")
    (out / "model.json").write_text(json.dumps({**meta, "channels": 3}))
    with pytest.raises(DatasetError) as refused:
        evaluate_exported(out, digits_dataset)
    h, w = info.image_size
    assert str(refused.value) == (f"model takes 3x{h}x{w} images (channels x height x width), dataset "
                                  f"{digits_dataset} has 1x{h}x{w}; prepare it at the model's size and channels")
