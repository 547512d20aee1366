"""trainflow.common is the pure kernel every part imports (the Airflow bridge too): each of its
imports is a standard-library module or trainflow.common itself (stronger than the import-linter
contract, which can only list forbidden packages)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import trainflow.common

ROOT = Path(trainflow.common.__file__).parent


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
    return out


def test_every_import_is_stdlib_or_the_kernel_itself() -> None:
    files = sorted(ROOT.rglob("*.py"))
    assert {p.name for p in files} >= {"training_spec.py", "coerce.py", "listing.py"}
    bad = {f"{p.name}: {m}" for p in files for m in _imports(p)
           if m.split(".")[0] not in sys.stdlib_module_names and m != "trainflow.common"
           and not m.startswith("trainflow.common.")}
    assert not bad
