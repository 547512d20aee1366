"""API objects kept in memory, in the v2beta1 JSON shape, mirrored to ``<data_dir>/state.json``.

Every object is a plain dict exactly as the API returns it (snake_case field names, RFC 3339
timestamps, enum names as strings). The store adds only an insertion sequence number (for stable
ordering when timestamps tie).
All methods are thread-safe; the run workers and the HTTP handlers share one store, and
:meth:`Store.batch` makes several changes one step for every other thread (the SQL transactions
of the real server's stores).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trainflow.kfp_server.errors import invalid_argument, not_found
from trainflow.kfp_server.filters import matches, parse_filter

KINDS = ("experiments", "pipelines", "versions", "runs", "recurring_runs")

#: Filterable keys per kind: filter key -> field (the real server also accepts ``name`` and ``id``).
FILTER_KEYS: dict[str, dict[str, str]] = {
    "experiments": {
        "display_name": "display_name",
        "name": "display_name",
        "experiment_id": "experiment_id",
        "id": "experiment_id",
        "created_at": "created_at",
        "namespace": "namespace",
        "storage_state": "storage_state",
        "description": "description",
    },
    "pipelines": {
        "display_name": "display_name",
        "name": "name",
        "pipeline_id": "pipeline_id",
        "id": "pipeline_id",
        "created_at": "created_at",
        "namespace": "namespace",
        "description": "description",
    },
    "versions": {
        "display_name": "display_name",
        "name": "name",
        "pipeline_version_id": "pipeline_version_id",
        "id": "pipeline_version_id",
        "created_at": "created_at",
        "description": "description",
    },
    "runs": {
        "display_name": "display_name",
        "name": "display_name",
        "run_id": "run_id",
        "id": "run_id",
        "state": "state",
        "experiment_id": "experiment_id",
        "created_at": "created_at",
        "finished_at": "finished_at",
        "scheduled_at": "scheduled_at",
        "storage_state": "storage_state",
        "description": "description",
        "pipeline_version_id": "pipeline_version_id",
        "recurring_run_id": "recurring_run_id",
    },
    "recurring_runs": {
        "display_name": "display_name",
        "name": "display_name",
        "recurring_run_id": "recurring_run_id",
        "id": "recurring_run_id",
        "created_at": "created_at",
        "updated_at": "updated_at",
        "description": "description",
    },
}


#: Page size when the request gives none, and the most one page holds (KFP's ``list.go``:
#: ``defaultPageSize``, ``maxPageSize``; a larger ``page_size`` is cut to it, not refused).
DEFAULT_PAGE_SIZE = 20
MAX_PAGE_SIZE = 200


def now_rfc3339() -> str:
    """Current UTC time as the API writes it (``2026-11-22T08:21:57Z``, second precision)."""
    return datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_id() -> str:
    return str(uuid.uuid4())


class Store:
    """Thread-safe object store.

    Args:
        state_path: JSON file the store is mirrored to after each change (``None``: memory only).
    """

    def __init__(self, state_path: Path | None = None) -> None:
        self._lock = threading.RLock()
        self._objects: dict[str, dict[str, dict[str, Any]]] = {kind: {} for kind in KINDS}
        self._seq: dict[str, int] = {}
        self._next_seq = 0
        self._batch_depth = 0  # > 0 inside batch(): the state file is written once, at its end
        self._state_path = state_path
        if state_path is not None and state_path.exists():
            self._load(state_path)

    # -- persistence -------------------------------------------------------------------------
    def _load(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text())
        except ValueError as err:
            raise ValueError(
                f"{path} is not a kfp-server state file ({err}); move it away to start empty"
            ) from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} is not a kfp-server state file (a JSON {type(data).__name__}, not an "
                             "object); move it away to start empty")
        for kind in KINDS:
            self._objects[kind] = data.get(kind, {})
        self._seq = data.get("seq", {})
        self._next_seq = int(data.get("next_seq", 0))

    def _save(self) -> None:
        if self._state_path is None or self._batch_depth:
            return
        tmp = self._state_path.with_suffix(".tmp")
        payload = {**self._objects, "seq": self._seq, "next_seq": self._next_seq}
        with tmp.open("w") as f:
            f.write(json.dumps(payload))
            f.flush()
            os.fsync(f.fileno())  # the rename must never publish an empty file after a power loss
        os.replace(tmp, self._state_path)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the store's lock across several calls: no other thread sees or makes a change in
        between, and the state file is written once, at the end (batches nest).

        It does not roll back: check what can fail (ids, states) before the first change.
        """
        with self._lock:
            self._batch_depth += 1
            try:
                yield
            finally:
                self._batch_depth -= 1
                self._save()

    # -- generic access ----------------------------------------------------------------------
    def put(self, kind: str, object_id: str, obj: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if object_id not in self._seq:
                self._seq[object_id] = self._next_seq
                self._next_seq += 1
            self._objects[kind][object_id] = obj
            self._save()
            return copy.deepcopy(obj)

    def get(self, kind: str, object_id: str, *, label: str) -> dict[str, Any]:
        """Return a copy of one object.

        Raises:
            ApiError: NOT_FOUND naming ``label`` and the id.
        """
        with self._lock:
            obj = self._objects[kind].get(object_id)
            if obj is None:
                raise not_found(label, object_id)
            return copy.deepcopy(obj)

    def update(
        self, kind: str, object_id: str, change: Callable[[dict[str, Any]], None], *, label: str
    ) -> dict[str, Any]:
        """Apply ``change`` to the stored object under the lock and return a copy."""
        with self._lock:
            obj = self._objects[kind].get(object_id)
            if obj is None:
                raise not_found(label, object_id)
            change(obj)
            self._save()
            return copy.deepcopy(obj)

    def update_all(
        self, kind: str, predicate: Callable[[dict[str, Any]], bool], change: Callable[[dict[str, Any]], None]
    ) -> list[str]:
        """Apply ``change`` to every stored object ``predicate`` selects, under the lock; return their ids."""
        with self._lock:
            changed = []
            for object_id, obj in self._objects[kind].items():
                if predicate(obj):
                    change(obj)
                    changed.append(object_id)
            if changed:
                self._save()
            return changed

    def delete(self, kind: str, object_id: str, *, label: str) -> None:
        with self._lock:
            if self._objects[kind].pop(object_id, None) is None:
                raise not_found(label, object_id)
            self._seq.pop(object_id, None)
            self._save()

    def values(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(o) for o in self._objects[kind].values()]

    def find(self, kind: str, predicate: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(o) for o in self._objects[kind].values() if predicate(o)]

    def list(
        self,
        kind: str,
        *,
        id_field: str,
        filter_text: str | None = None,
        where: Mapping[str, Any] | None = None,
        keep: Callable[[dict[str, Any]], bool] | None = None,
        sort_by: str | None = None,
        page_size: int | None = None,
        page_token: str | None = None,
    ) -> tuple[list[dict[str, Any]], int, str]:
        """List objects the way the API's List* calls do.

        Args:
            kind: one of :data:`KINDS`.
            id_field: the object's id field (for ordering ties).
            filter_text: the ``filter`` query parameter.
            where: exact field matches applied before the filter (``experiment_id``, ``namespace``);
                empty values are ignored.
            keep: an extra selection (e.g. runs of the experiments of one namespace).
            sort_by: ``"field"``, ``"field asc"`` or ``"field desc"`` (filter keys allowed); with a
                ``page_token`` the token's order is used, as KFP does.
            page_size: at most this many objects (default 20, at most 200, as the real server).
            page_token: from a previous response.

        Returns:
            (objects of this page, total matching, next page token or ``""``).

        A page token is a keyset, as KFP's (``list.go``, ``token``): the order and the last
        object's sort value, insertion number and id. The next page starts strictly after that
        object in that order, so objects created or deleted between two page reads neither repeat
        an object nor skip one that was there before (new ones appear only where the order puts them).

        Raises:
            ApiError: INVALID_ARGUMENT for a bad filter, sort key, page size or page token.
        """
        predicates = parse_filter(filter_text)
        keys = FILTER_KEYS[kind]
        if page_token:
            field, descending, after = _decode_token(page_token, keys)
        else:
            (field, descending), after = _parse_sort(sort_by, keys), None
        size = _page_size(page_size)
        with self._lock:
            selected = [
                o
                for o in self._objects[kind].values()
                if all(o.get(k) == v for k, v in (where or {}).items() if v)
                and (keep is None or keep(o))
                and matches(o, predicates, keys)
            ]
            seq = dict(self._seq)

        def key(o: dict[str, Any]) -> tuple[Any, int, str]:
            value = o.get(field)
            return (value if value is not None else "", seq.get(o[id_field], 0), str(o[id_field]))

        selected.sort(key=key, reverse=descending)
        total = len(selected)
        if after is not None:
            try:
                selected = [o for o in selected if (key(o) < after if descending else key(o) > after)]
            except TypeError as err:  # a sort value of another type than the field's
                raise invalid_argument(f"invalid page_token {page_token!r}") from err
        page = selected[:size]
        next_token = _encode_token(field, descending, key(page[-1])) if len(selected) > size else ""
        return copy.deepcopy(page), total, next_token


def _parse_sort(sort_by: str | None, keys: Mapping[str, str]) -> tuple[str, bool]:
    if not sort_by:
        return "created_at", False
    parts = sort_by.split()
    if len(parts) > 2 or (len(parts) == 2 and parts[1].lower() not in ("asc", "desc")):
        raise invalid_argument(f"sort_by must be 'field', 'field asc' or 'field desc', got {sort_by!r}")
    if parts[0] not in keys:
        raise invalid_argument(f"cannot sort on '{parts[0]}'; sortable keys: {', '.join(sorted(keys))}")
    return keys[parts[0]], len(parts) == 2 and parts[1].lower() == "desc"


def _page_size(page_size: int | None) -> int:
    """The page size KFP's ``validatePageSize`` makes of the request's: default, capped, never negative."""
    if page_size is None or page_size == 0:
        return DEFAULT_PAGE_SIZE
    if page_size < 0:
        raise invalid_argument(f"The page size should be greater than 0. Got {page_size}")
    return min(page_size, MAX_PAGE_SIZE)


def _encode_token(field: str, descending: bool, last: tuple[Any, int, str]) -> str:
    value, seq, object_id = last
    payload = {"sort_by": field, "desc": descending, "value": value, "seq": seq, "id": object_id}
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


def _decode_token(token: str, keys: Mapping[str, str]) -> tuple[str, bool, tuple[Any, int, str]]:
    """(sort field, descending, key of the last object listed) of a token :func:`_encode_token` wrote.

    Raises:
        ApiError: INVALID_ARGUMENT ("invalid page_token") for anything else, a token of another
            kind of object included.
    """
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode()))
        field, descending, value = data["sort_by"], data["desc"], data["value"]
        seq, object_id = data["seq"], data["id"]
    except (ValueError, KeyError, TypeError) as err:
        raise invalid_argument(f"invalid page_token {token!r}") from err
    if (
        field not in keys.values()
        or not isinstance(descending, bool)
        or isinstance(value, dict | list)
        or type(seq) is not int
        or not isinstance(object_id, str)
    ):
        raise invalid_argument(f"invalid page_token {token!r}")
    return field, descending, (value, seq, object_id)
