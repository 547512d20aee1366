"""docs/task-api.md: its example task is complete, under 40 lines, loads by import path and trains."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from trainflow.task import load_task, model_signature

DOC = Path(__file__).resolve().parents[2] / "docs" / "task-api.md"


def example_blocks() -> list[str]:
    text = DOC.read_text()
    section = text.split("## Example: a user's own task", 1)[1]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.fixture
def fresh_my_pkg(monkeypatch):
    """No ``my_pkg`` imported before this test, none left after it."""
    for name in ("my_pkg", "my_pkg.tasks"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("my_pkg", "my_pkg.tasks"):
        sys.modules.pop(name, None)


def test_the_example_task_is_under_40_lines_and_trains_to_the_noise_floor(tmp_path, monkeypatch,
                                                                          fresh_my_pkg) -> None:
    task_code, usage = example_blocks()[:2]
    assert task_code.startswith("# my_pkg/tasks.py\n")
    assert len(task_code.strip().splitlines()) < 40
    pkg = tmp_path / "my_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(task_code)
    monkeypatch.syspath_prepend(str(tmp_path))

    scope: dict = {}
    exec(usage, scope)  # the page's own load_task call
    task = scope["task"]
    assert type(task).__name__ == "LinearRegression" and len(task.train_dataset()) == 1792
    assert len(task.eval_dataset()) == 256

    # The harness's part, by hand: seed, build, pick indices, collate, mean loss, step.
    torch.manual_seed(0)
    model = task.build_model()
    assert model_signature(model) == model_signature(load_task("my_pkg.tasks:LinearRegression").build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train = task.train_dataset()
    with torch.no_grad():
        before = task.evaluate(model.eval(), DataLoader(task.eval_dataset(), batch_size=100,
                                                        collate_fn=task.collate))["mse"]
    model.train()
    g = torch.Generator().manual_seed(0)
    for _epoch in range(3):
        perm = torch.randperm(len(train), generator=g)
        for start in range(0, len(perm), 64):
            batch = task.collate([train[i] for i in perm[start : start + 64].tolist()])
            loss = task.loss(model, batch)
            assert loss.dtype == torch.float32 and loss.dim() == 0
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        after = task.evaluate(model.eval(), DataLoader(task.eval_dataset(), batch_size=100,
                                                       collate_fn=task.collate))
    assert set(after) == {"mse"}
    assert before > 1.0  # an untrained model is far off: y has variance ~num_features
    assert after["mse"] < 0.02  # the noise's variance is 0.01


def test_the_readme_shows_the_same_example_task() -> None:
    """The README's copy of the example is the page's, character for character (one home: the page)."""
    readme = (DOC.parents[1] / "README.md").read_text()
    section = readme.split("### Your own model (the task API)", 1)[1]
    assert re.findall(r"```python\n(.*?)```", section, flags=re.S)[0] == example_blocks()[0]
