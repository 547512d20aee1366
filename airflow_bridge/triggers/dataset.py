"""Notice that the data under an ``s3://`` prefix or a folder changed: :class:`DatasetChangeTrigger`.

An event trigger for an Airflow 3 ``AssetWatcher`` (data-aware scheduling: a DAG scheduled on the
dataset Asset runs once per event)::

    dataset = Asset("s3://training/mnist", name="mnist-images",
                    watchers=[AssetWatcher(name="mnist-images-listing",
                                           trigger=DatasetChangeTrigger(uri="s3://training/mnist"))])

Every ``poll_interval_s`` it lists the prefix — keys, sizes and ETags, ListObjectsV2 pages only, no
object is read — and computes the listing fingerprint (:mod:`trainflow.common.listing`, the same
rule the pipeline records with every model version). It fires one event when the fingerprint
differs from the last one it fired for, or from ``baseline_fingerprint`` (e.g. the fingerprint
recorded for the current model version) before any; the first listing becomes the baseline when
neither exists. So re-uploading identical bytes (same ETags) fires nothing.

A change must also *settle*: the new listing must be seen on two polls in a row, so an upload of
many objects that spans several polls fires one event, not one per poll.

Where the last fingerprint is kept: the Asset's state store (``asset_state_store``, Airflow 3.3;
key ``listing_fingerprint``), so a restarted triggerer does not fire again for a change already
announced; without a store (tests, older Airflow) in memory. The store is written after the event
is yielded: a triggerer killed in between fires it again (at least once, never lost).

Listing errors (no such bucket, refused credentials, an endpoint down) are logged as one line per
poll and fire nothing; the watcher keeps polling. The event payload (the asset event's
``extra["payload"]``)::

    {"uri", "listing_fingerprint", "previous_listing_fingerprint", "objects", "total_bytes",
     "change": {"added", "removed", "changed"} | None}

S3 credentials: the Airflow connection ``aws_conn_id`` if given (login = access key id, password =
secret key, extra ``endpoint_url`` / ``region_name``), else boto3's own chain (environment
variables such as ``AWS_ENDPOINT_URL_S3``, instance roles, ``~/.aws``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

# The event-trigger base class (Airflow >= 3.0); not re-exported by version_compat to keep this
# feature in its own files.
from airflow.triggers.base import BaseEventTrigger

from airflow_bridge.version_compat import BaseHook, TriggerEvent
from trainflow.common.listing import (
    ListingEntry,
    list_folder,
    list_s3,
    listing_change,
    listing_fingerprint,
    split_s3_uri,
    total_bytes,
)

CLASSPATH = "airflow_bridge.triggers.dataset.DatasetChangeTrigger"
STATE_KEY = "listing_fingerprint"


def merged_change(payloads: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """One change from the payloads of the asset events one DAG run was triggered by, oldest first
    (Airflow queues the events that arrive while the DAG is at ``max_active_runs`` for one later
    run): the newest listing (``listing_fingerprint``, ``objects``, ``total_bytes``), the oldest
    ``previous_listing_fingerprint`` (what the model being replaced was trained on), ``change`` counts
    summed over the events (None if any event had none), and ``events``, how many. None for no
    payload (a run started by hand)."""
    if not payloads:
        return None
    if len(payloads) == 1:
        return dict(payloads[0])
    changes = [p.get("change") for p in payloads]
    summed = None if any(not isinstance(c, Mapping) for c in changes) else {
        key: sum(int(c.get(key) or 0) for c in changes) for key in ("added", "removed", "changed")}  # type: ignore[union-attr]
    return {**payloads[-1], "previous_listing_fingerprint": payloads[0].get("previous_listing_fingerprint"),
            "change": summed, "events": len(payloads)}


def describe_error(err: BaseException) -> str:
    """One line for a listing failure (botocore's codes made readable)."""
    code = ""
    response = getattr(err, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
    if code in ("404", "NoSuchBucket"):
        return "the bucket does not exist"
    if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
        return f"S3 credentials rejected ({code})"
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"{code + ': ' if code and code not in text else ''}{text}"[:300]


class DatasetChangeTrigger(BaseEventTrigger):
    """Fire an event each time the listing of ``uri`` changes (see the module docstring).

    Args:
        uri: ``s3://bucket/prefix`` or a local folder (``file://`` or a path).
        poll_interval_s: seconds between listings (> 0).
        baseline_fingerprint: the fingerprint to compare the first listing with ('' = none).
        aws_conn_id: Airflow connection with S3 credentials ('' = boto3's chain).

    Raises:
        ValueError: an empty or malformed URI, a non-positive poll interval.
    """

    def __init__(self, *, uri: str, poll_interval_s: float = 60.0, baseline_fingerprint: str = "",
                 aws_conn_id: str = "") -> None:
        super().__init__()
        if not uri:
            raise ValueError("DatasetChangeTrigger needs a uri")
        if uri.startswith("s3://"):
            split_s3_uri(uri)
        elif "://" in uri and not uri.startswith("file://"):
            raise ValueError(f"DatasetChangeTrigger watches s3:// prefixes and folders, not {uri!r}")
        if poll_interval_s <= 0:
            raise ValueError(f"poll_interval_s must be > 0, got {poll_interval_s}")
        self.uri = uri
        self.poll_interval_s = float(poll_interval_s)
        self.baseline_fingerprint = baseline_fingerprint
        self.aws_conn_id = aws_conn_id
        self._memo: dict[tuple[str, int, int], str] = {}
        self._memory: str | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {"uri": self.uri, "poll_interval_s": self.poll_interval_s,
                           "baseline_fingerprint": self.baseline_fingerprint, "aws_conn_id": self.aws_conn_id}

    async def _client_kwargs(self) -> dict[str, Any]:
        if not self.aws_conn_id:
            return {}
        conn = await BaseHook.aget_connection(self.aws_conn_id)
        extra = conn.extra_dejson or {}
        out: dict[str, Any] = {"aws_access_key_id": conn.login or None, "aws_secret_access_key": conn.password or None}
        if extra.get("endpoint_url"):
            out["endpoint_url"] = extra["endpoint_url"]
        if extra.get("region_name"):
            out["region_name"] = extra["region_name"]
        return out

    def list(self, client_kwargs: dict[str, Any] | None = None) -> list[ListingEntry]:
        """One listing (blocking; ``run`` calls it in a thread). Raises what boto3 raises."""
        if not self.uri.startswith("s3://"):
            return list_folder(self.uri, self._memo)
        import boto3
        from botocore.config import Config

        # a fresh session per listing: boto3's default session resolves credentials once and keeps them
        client = boto3.session.Session().client("s3", config=Config(retries={"max_attempts": 2, "mode": "standard"},
                                                  connect_timeout=5, read_timeout=30), **(client_kwargs or {}))
        return list_s3(client, self.uri)

    async def _last(self) -> str | None:
        store = self.asset_state_store
        if store is not None:
            try:
                value = await store.aget(STATE_KEY)
                if value:
                    return str(value)
            except Exception as err:  # the store is an optimisation: fall back to memory
                self.log.warning("cannot read the asset state store: %s", err)
        return self._memory or self.baseline_fingerprint or None

    async def _remember(self, fingerprint: str) -> None:
        self._memory = fingerprint
        if self.asset_state_store is not None:
            try:
                await self.asset_state_store.aset(STATE_KEY, fingerprint)
            except Exception as err:
                self.log.warning("cannot write the asset state store: %s", err)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        last = await self._last()
        last_entries: list[ListingEntry] | None = None
        pending: str | None = None
        while True:
            try:
                entries = await asyncio.to_thread(self.list, await self._client_kwargs())
            except Exception as err:  # one line, no event; keep watching
                self.log.warning("cannot list %s: %s", self.uri, describe_error(err))
                await asyncio.sleep(self.poll_interval_s)
                continue
            fingerprint = listing_fingerprint(entries)
            if last is None:
                self.log.info("watching %s: baseline %s (%d objects)", self.uri, fingerprint[:12], len(entries))
                last, last_entries = fingerprint, entries
                await self._remember(fingerprint)
            elif fingerprint == last:
                pending, last_entries = None, entries
            elif fingerprint != pending:
                pending = fingerprint  # changed: wait one poll for it to settle
            else:
                payload = {"uri": self.uri, "listing_fingerprint": fingerprint, "previous_listing_fingerprint": last,
                           "objects": len(entries), "total_bytes": total_bytes(entries),
                           "change": listing_change(last_entries, entries).summary() if last_entries is not None else None}
                self.log.info("%s changed: %s", self.uri, payload)
                yield TriggerEvent(payload)
                last, last_entries, pending = fingerprint, entries, None
                await self._remember(fingerprint)
            await asyncio.sleep(self.poll_interval_s)
