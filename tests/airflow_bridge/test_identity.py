"""identity: the try-independent key of a task instance and the run display name (pure)."""

from __future__ import annotations

import re
from types import SimpleNamespace

from airflow_bridge.identity import MAX_DISPLAY_NAME_CHARS, TaskIdentity


def test_key_is_stable_and_a_dns_label() -> None:
    a = TaskIdentity("trainflow_training", "manual__2026-11-22", "train")
    assert a.key == TaskIdentity("trainflow_training", "manual__2026-11-22", "train").key
    assert re.fullmatch(r"af-[0-9a-f]{16}", a.key)


def test_every_identity_field_changes_the_key() -> None:
    base = TaskIdentity("d", "r", "t", -1)
    others = [
        TaskIdentity("d2", "r", "t"),
        TaskIdentity("d", "r2", "t"),
        TaskIdentity("d", "r", "t2"),
        TaskIdentity("d", "r", "t", 0),
    ]
    assert len({base.key, *(o.key for o in others)}) == 5


def test_from_context_ignores_the_try_number() -> None:
    ti1 = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1)
    ti2 = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=3)
    assert TaskIdentity.from_context({"ti": ti1}).key == TaskIdentity.from_context({"ti": ti2}).key


def test_display_name_ends_with_the_marker_and_is_bounded() -> None:
    ident = TaskIdentity("d", "r", "t", 2)
    assert ident.run_display_name() == f"d.t[2] r {ident.marker}"
    assert ident.run_display_name("nightly") == f"nightly {ident.marker}"
    long = ident.run_display_name("x" * 1000)
    assert len(long) == MAX_DISPLAY_NAME_CHARS and long.endswith(ident.marker)
    assert MAX_DISPLAY_NAME_CHARS <= 255  # KFP's run_details.DisplayName is a varchar(255) on MySQL


def test_the_job_key_gets_a_generation_after_each_success() -> None:
    ident = TaskIdentity("d", "r", "t")
    assert ident.job_key() == ident.job_key(0) == ident.key
    assert ident.job_key(2) == f"{ident.key}-2"
