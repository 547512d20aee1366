"""The task API (trainflow.task): load_task, its one-line errors, model_signature and the defaults."""

from __future__ import annotations

import collections
import math
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from tests.trainflow import example_tasks
from trainflow.task import Task, TaskError, load_task, model_signature, move_to_device

EX = "tests.trainflow.example_tasks"


# ----------------------------------------------------------------------------------- load_task
def test_import_path_builds_the_task_with_task_args_as_keyword_arguments() -> None:
    task = load_task(f"{EX}:Regression", {"num_samples": 10, "num_features": 3})
    assert type(task) is example_tasks.Regression
    assert (task.num_samples, task.num_features) == (10, 3)
    assert len(task.train_dataset()) == 10


def test_task_args_as_json_text_and_as_dict_build_the_same_task() -> None:
    from_text = load_task(f"{EX}:Regression", '{"num_samples": 12, "hidden": 5, "seed": 3}')
    from_dict = load_task(f"{EX}:Regression", {"num_samples": 12, "hidden": 5, "seed": 3})
    assert (from_text.num_samples, from_text.hidden) == (12, 5)
    assert torch.equal(from_text.x, from_dict.x) and torch.equal(from_text.y, from_dict.y)


@pytest.mark.parametrize("empty", [None, "", "  ", {}])
def test_no_task_args_means_the_defaults(empty) -> None:
    task = load_task(f"{EX}:Regression", empty)
    assert (task.num_samples, task.num_features, task.hidden) == (64, 4, 0)


def test_dict_task_args_arrive_as_json_would_carry_them() -> None:
    task = load_task(f"{EX}:Counting", {"num_samples": 8})
    assert task.num_samples == 8 and task.calls == 0


def test_a_factory_function_and_a_nested_class_are_task_specs() -> None:
    made = load_task(f"{EX}:make_regression", {"num_features": 2})
    assert type(made) is example_tasks.Regression and made.num_features == 2
    nested = load_task(f"{EX}:Outer.Inner")
    assert type(nested) is example_tasks.Regression


@pytest.mark.parametrize(("spec", "task_args", "message"), [
    ("", None, "task '': not a built-in task (image_classification, language_model, tabular_regression) nor an import path 'package.module:Name'"),
    ("no_such_task", None,
     "task 'no_such_task': not a built-in task (image_classification, language_model, tabular_regression) nor an import path 'package.module:Name'"),
    ("pkg.mod", None, "task 'pkg.mod': not a built-in task (image_classification, language_model, tabular_regression) nor an import path 'package.module:Name'"),
    ("pkg.mod:", None, "task 'pkg.mod:': not a built-in task (image_classification, language_model, tabular_regression) nor an import path 'package.module:Name'"),
    ("pkg/mod:Task", None,
     "task 'pkg/mod:Task': not a built-in task (image_classification, language_model, tabular_regression) nor an import path 'package.module:Name'"),
    ("a:b:c", None, "task 'a:b:c': not a built-in task (image_classification, language_model, tabular_regression) nor an import path 'package.module:Name'"),
    ("no_such_pkg.tasks:Task", None,
     "task 'no_such_pkg.tasks:Task': cannot import module 'no_such_pkg.tasks': No module named 'no_such_pkg' (the "
     "package must be installed where the task runs: in a cluster, in the workers' image; docs/task-api.md)"),
    (f"{EX}:Missing", None, f"task '{EX}:Missing': module '{EX}' has no attribute 'Missing'"),
    (f"{EX}:Outer.Missing", None, f"task '{EX}:Outer.Missing': module '{EX}' has no attribute 'Outer.Missing'"),
    (f"{EX}:NotATask", None, f"task '{EX}:NotATask': NotATask is a class but not a subclass of trainflow.task.Task"),
    (f"{EX}:NOT_CALLABLE", None,
     f"task '{EX}:NOT_CALLABLE': NOT_CALLABLE is an object of type int, not a Task subclass or a "
     "function returning a Task"),
    (f"{EX}:returns_a_dict", None, f"task '{EX}:returns_a_dict': returns_a_dict is declared to return dict, not a "
     "Task (a function that builds a task is declared '-> Task'; nothing else is called)"),
    (f"{EX}:says_task_returns_a_dict", None, f"task '{EX}:says_task_returns_a_dict': says_task_returns_a_dict(**task_args) "
     "returned an object of type dict, not a Task"),
    (f"{EX}:unannotated_factory", None, f"task '{EX}:unannotated_factory': unannotated_factory is not a Task subclass "
     "and has no return annotation: a function that builds a task is declared '-> Task' (nothing else is called)"),
    (f"{EX}:unresolvable_annotation", None, f"task '{EX}:unresolvable_annotation': the return annotation of "
     "unresolvable_annotation does not resolve (NameError: name 'NoSuchTask' is not defined); a function that "
     "builds a task is declared '-> Task'"),
    (f"{EX}:Incomplete", None, f"task '{EX}:Incomplete': Incomplete does not implement loss, train_dataset"),
    (f"{EX}:FailsToBuild", None,
     f"task '{EX}:FailsToBuild': FailsToBuild(**task_args) failed: RuntimeError: no GPU here second line"),
    (f"{EX}:Regression", "{not json",
     f"task '{EX}:Regression': task_args is not valid JSON: Expecting property name enclosed in double quotes: "
     "line 1 column 2 (char 1)"),
    (f"{EX}:Regression", "[1, 2]", f"task '{EX}:Regression': task_args must be a JSON object, got an array"),
    (f"{EX}:Regression", "3", f"task '{EX}:Regression': task_args must be a JSON object, got a number"),
    (f"{EX}:Regression", "null", f"task '{EX}:Regression': task_args must be a JSON object, got null"),
    (f"{EX}:Regression", ["num_samples"],
     f"task '{EX}:Regression': task_args must be a JSON object (a dict or its text), got list"),
    (f"{EX}:Regression", {1: 2}, f"task '{EX}:Regression': task_args keys must be strings, got 1"),
    (f"{EX}:Regression", {"seed": {3}},
     f"task '{EX}:Regression': task_args must hold JSON values only: Object of type set is not JSON serializable"),
    (f"{EX}:Regression", {"seed": math.nan},
     f"task '{EX}:Regression': task_args must hold JSON values only: Out of range float values are not JSON "
     "compliant"),
    (f"{EX}:Regression", {"num_sample": 3},
     f"task '{EX}:Regression': task_args do not fit Regression: got an unexpected keyword argument 'num_sample'"),
    (f"{EX}:Regression", '{"num_samples": 3, "extra": 1}',
     f"task '{EX}:Regression': task_args do not fit Regression: got an unexpected keyword argument 'extra'"),
    (f"{EX}:make_regression", {"bogus": 1},
     f"task '{EX}:make_regression': make_regression(**task_args) failed: TypeError: Regression.__init__() got "
     "an unexpected keyword argument 'bogus'"),
])
def test_bad_input_is_one_task_error_line_naming_the_spec(spec, task_args, message) -> None:
    with pytest.raises(TaskError) as e:
        load_task(spec, task_args)
    assert str(e.value) == message
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(("spec", "task_args"), [
    ("builtins:print", {"end": "CALLED\n"}),
    ("builtins:exec", {"source": "print('CALLED')"}),
    ("subprocess:run", {"args": ["echo", "CALLED"]}),
    ("os:system", {"command": "echo CALLED"}),
    (f"{EX}:unannotated_factory", None),
    (f"{EX}:unresolvable_annotation", None),
])
def test_a_callable_not_declared_to_return_a_task_is_refused_before_it_is_called(
    spec, task_args, capfd: pytest.CaptureFixture[str]
) -> None:
    """A task's name can come from a pipeline parameter or an Airflow trigger form: naming any other
    callable (with its arguments in task_args) must not run it."""
    from tests.trainflow import example_tasks

    example_tasks.CALLS.clear()
    with pytest.raises(TaskError, match=r"(no return annotation|does not resolve|declared to return)"):
        load_task(spec, task_args)
    out, err = capfd.readouterr()
    assert "CALLED" not in out + err
    assert example_tasks.CALLS == []


def test_a_spec_that_is_not_a_string_is_a_task_error() -> None:
    with pytest.raises(TaskError, match=r"^task 3: a task is named by a string, got int$"):
        load_task(3)  # type: ignore[arg-type]


def test_a_module_that_fails_on_import_is_one_line(tmp_path, monkeypatch, forget_modules) -> None:
    (tmp_path / "broken_task_mod.py").write_text("raise RuntimeError('needs CUDA\\nat import')\n")
    (tmp_path / "syntax_task_mod.py").write_text("def f(:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TaskError) as e:
        load_task("broken_task_mod:Task")
    assert str(e.value) == ("task 'broken_task_mod:Task': importing module 'broken_task_mod' failed: "
                            "RuntimeError: needs CUDA at import")
    assert isinstance(e.value.__cause__, RuntimeError)
    with pytest.raises(TaskError) as e:
        load_task("syntax_task_mod:Task")
    assert str(e.value).startswith("task 'syntax_task_mod:Task': importing module 'syntax_task_mod' failed: "
                                   "SyntaxError: ")
    assert "\n" not in str(e.value)


@pytest.fixture
def forget_modules():
    """Drop modules a test imported from its tmp_path, so another test may reuse their names."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_a_task_in_a_package_outside_the_repository(tmp_path, monkeypatch, forget_modules) -> None:
    pkg = tmp_path / "outside_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn
        from trainflow.task import Task

        class Constant(Task):
            def __init__(self, value: float = 1.0):
                self.value = value
            def build_model(self):
                return nn.Linear(1, 1)
            def train_dataset(self):
                return [torch.tensor([self.value])] * 4
            def loss(self, model, batch):
                return model(batch).pow(2).mean()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    task = load_task("outside_pkg.tasks:Constant", '{"value": 2.5}')
    assert type(task).__module__ == "outside_pkg.tasks" and task.value == 2.5


# ----------------------------------------------------------------------------- model_signature
def test_model_signature_is_stable_across_builds_and_seeds() -> None:
    task = example_tasks.Regression(hidden=8)
    torch.manual_seed(0)
    first = task.build_model()
    torch.manual_seed(0)
    second = task.build_model()
    torch.manual_seed(1)
    other_seed = task.build_model()
    sig = model_signature(first)
    assert len(sig) == 16 and all(c in "0123456789abcdef" for c in sig)
    assert model_signature(second) == sig
    assert model_signature(other_seed) == sig  # structure, not values
    assert not torch.equal(first[0].weight, other_seed[0].weight)


def test_model_signature_changes_with_a_layer_its_shape_or_dtype() -> None:
    base = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    sig = model_signature(base)
    assert model_signature(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))) != sig  # resized
    assert model_signature(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1), nn.Linear(1, 1))) != sig
    assert model_signature(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))) != sig  # renamed ("1." → "2.")
    assert model_signature(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1, bias=False))) != sig
    assert model_signature(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).double()) != sig
    bn = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8))  # buffers count too
    assert model_signature(bn) != model_signature(nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8)))


def test_model_signature_looks_through_ddp() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        wrapped = nn.parallel.DistributedDataParallel(model)
        assert model_signature(wrapped) == model_signature(model)
    finally:
        dist.destroy_process_group()


# -------------------------------------------------------------------------------- the defaults
def test_default_evaluate_is_the_sample_weighted_mean_loss() -> None:
    task = example_tasks.Regression(num_samples=10)
    torch.manual_seed(0)
    model = task.build_model().eval()
    loader = DataLoader(task.train_dataset(), batch_size=4, collate_fn=task.collate)  # batches of 4, 4, 2
    with torch.no_grad():
        metrics = task.evaluate(model, loader)
        expected = float(nn.functional.mse_loss(model(task.x).squeeze(1), task.y))
    assert set(metrics) == {"loss"}
    assert metrics["loss"] == pytest.approx(expected, rel=1e-6)
    assert math.isnan(task.evaluate(model, []).get("loss"))


def test_default_collate_optimizer_scheduler_state_and_fingerprint() -> None:
    task = example_tasks.Regression(num_samples=4)
    dataset = task.train_dataset()
    x, y = task.collate([dataset[i] for i in (2, 0)])
    assert torch.equal(x, task.x[[2, 0]]) and torch.equal(y, task.y[[2, 0]])
    model = task.build_model()
    assert task.configure_optimizer(model, learning_rate=0.1) is None
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert task.configure_lr_scheduler(optimizer, total_steps=10) is None
    assert task.eval_dataset() is None
    assert task.data_fingerprint() is None
    assert task.state_dict() == {}
    task.load_state_dict({})
    with pytest.raises(TaskError, match=r"^Regression got task state \['calls'\] but does not override "
                                        r"load_state_dict$"):
        task.load_state_dict({"calls": 3})


def test_task_state_round_trips_through_its_own_methods() -> None:
    task = example_tasks.Counting()
    task.calls = 7
    fresh = example_tasks.Counting()
    fresh.load_state_dict(task.state_dict())
    assert fresh.calls == 7


def test_a_task_must_implement_the_three_required_methods() -> None:
    with pytest.raises(TypeError):
        example_tasks.Incomplete()  # type: ignore[abstract]
    assert set(Task.__abstractmethods__) == {"build_model", "train_dataset", "loss"}


def test_move_to_device_walks_tuples_lists_dicts_and_named_tuples() -> None:
    Pair = collections.namedtuple("Pair", "x y")
    batch = {"a": (torch.ones(2), [torch.zeros(1, dtype=torch.int64)]), "b": Pair(torch.ones(1), 3), "c": "id"}
    moved = move_to_device(batch, torch.device("meta"))
    assert moved["a"][0].device.type == "meta" and moved["a"][1][0].device.type == "meta"
    assert moved["a"][1][0].dtype == torch.int64
    assert isinstance(moved["b"], Pair) and moved["b"].x.device.type == "meta" and moved["b"].y == 3
    assert moved["c"] == "id"
    assert batch["a"][0].device.type == "cpu"  # the input is left alone
    dd = collections.defaultdict(list, {"x": torch.ones(1)})
    assert move_to_device(dd, "meta")["x"].device.type == "meta"
