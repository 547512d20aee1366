"""Recurring-run schedules as the real KFP backend reads them: cron (robfig/cron v1) and periodic.

KFP's API server validates a recurring run's cron with ``cron.Parse`` of ``github.com/robfig/cron``
v1.2.0 and its scheduled-workflow controller fires on it. That parser takes 5 or 6 fields, **seconds
first** (``sec min hour day-of-month month [day-of-week]``; a missing day-of-week is ``*``), each a
comma list of ``*``/``?``, ``N``, ``A-B``, with an optional ``/STEP``; month and weekday names
(``jan``, ``mon``; any case); and the descriptors ``@yearly``/``@annually``, ``@monthly``,
``@weekly``, ``@daily``/``@midnight``, ``@hourly`` and ``@every <Go duration>``. Day-of-month and
day-of-week are ORed when both are restricted, ANDed when either is ``*``/``?`` (as robfig's
``dayMatches``). Times are UTC (the test bed's and the default ``CRON_SCHEDULE_TIMEZONE``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from trainflow.kfp_server.errors import invalid_argument

_MONTHS = {m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                           "nov", "dec"))}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
#: (low, high, names) per field, in robfig's order: second, minute, hour, dom, month, dow.
_BOUNDS: tuple[tuple[int, int, dict[str, int] | None], ...] = (
    (0, 59, None), (0, 59, None), (0, 23, None), (1, 31, None), (1, 12, _MONTHS), (0, 6, _DAYS),
)
_DESCRIPTORS = {
    "@yearly": "0 0 0 1 1 *", "@annually": "0 0 0 1 1 *", "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0", "@daily": "0 0 0 * * *", "@midnight": "0 0 0 * * *", "@hourly": "0 0 * * * *",
}
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class CronError(ValueError):
    """The spec is not one robfig/cron v1's ``Parse`` accepts."""


@dataclass(frozen=True)
class Cron:
    """A parsed cron spec: the allowed values per field, or ``every_s`` for ``@every``."""

    fields: tuple[frozenset[int], ...] = ()
    star: tuple[bool, ...] = ()
    every_s: int = 0

    def matches(self, when: datetime) -> bool:
        """Whether the second ``when`` (UTC) is a firing time (``@every``: never; see :func:`due`)."""
        if self.every_s:
            return False
        sec, minute, hour, dom, month, dow = self.fields
        if not (when.second in sec and when.minute in minute and when.hour in hour and when.month in month):
            return False
        dom_ok, dow_ok = when.day in dom, (when.isoweekday() % 7) in dow
        if self.star[3] or self.star[5]:
            return dom_ok and dow_ok
        return dom_ok or dow_ok


def _field(text: str, index: int) -> tuple[frozenset[int], bool]:
    low, high, names = _BOUNDS[index]
    values: set[int] = set()
    star = False

    def number(expr: str) -> int:
        if names and expr.lower() in names:
            return names[expr.lower()]
        if not re.fullmatch(r"\d+", expr):
            raise CronError(f"Failed to parse int from {expr}")
        return int(expr)

    for expr in [e for e in text.split(",") if e]:
        range_and_step = expr.split("/")
        if len(range_and_step) > 2:
            raise CronError(f"Too many slashes: {expr}")
        bounds = range_and_step[0].split("-")
        if bounds[0] in ("*", "?"):
            start, end, star = low, high, True
        else:
            if len(bounds) > 2:
                raise CronError(f"Too many hyphens: {expr}")
            start = number(bounds[0])
            end = number(bounds[1]) if len(bounds) == 2 else start
        step = 1
        if len(range_and_step) == 2:
            step = number(range_and_step[1]) if range_and_step[1].isdigit() else -1
            if step < 0:
                raise CronError(f"Failed to parse int from {range_and_step[1]}")
            if len(bounds) == 1:
                end = high
        if start < low:
            raise CronError(f"Beginning of range ({start}) below minimum ({low}): {expr}")
        if end > high:
            raise CronError(f"End of range ({end}) above maximum ({high}): {expr}")
        if start > end:
            raise CronError(f"Beginning of range ({start}) beyond end of range ({end}): {expr}")
        if step == 0:
            raise CronError(f"Step of range should be a positive number: {expr}")
        values.update(range(start, end + 1, step))
    return frozenset(values), star


def go_duration_s(text: str) -> float:
    """Seconds in a Go duration (``1h30m``, ``90s``, ``1.5h``)."""
    if not text or _DURATION_PART.sub("", text) != "":
        raise CronError(f"Failed to parse duration @every {text}: invalid duration {text}")
    return sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART.findall(text))


def parse_cron(spec: str) -> Cron:
    """Parse ``spec`` as robfig/cron v1's ``Parse`` does.

    Raises:
        CronError: with robfig's message.
    """
    if not spec:
        raise CronError("Empty spec string")
    if spec.startswith("@"):
        if spec.startswith("@every "):
            # robfig rounds the duration down to whole seconds, at least one
            return Cron(every_s=max(1, int(go_duration_s(spec[len("@every "):]))))
        if spec not in _DESCRIPTORS:
            raise CronError(f"Unrecognized descriptor: {spec}")
        spec = _DESCRIPTORS[spec]
    parts = spec.split()
    if not 5 <= len(parts) <= 6:
        raise CronError(f"Expected 5 to 6 fields, found {len(parts)}: {spec}")
    parts += ["*"] * (6 - len(parts))
    parsed = [_field(p, i) for i, p in enumerate(parts)]
    return Cron(fields=tuple(v for v, _ in parsed), star=tuple(s for _, s in parsed))


@dataclass(frozen=True)
class Schedule:
    """A recurring run's trigger: ``cron`` or a period of ``interval_s``, within [start, end]."""

    cron: Cron | None
    interval_s: int
    start: datetime | None
    end: datetime | None


def _time(value: object, name: str) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)
    except ValueError as err:
        raise invalid_argument(f"{name} is not an RFC 3339 time: {value!r}") from err


def parse_trigger(trigger: object) -> Schedule:
    """The ``trigger`` of a V2beta1RecurringRun as a :class:`Schedule`.

    Raises:
        ApiError: INVALID_ARGUMENT with the real server's wording for a bad cron or interval.
    """
    if not isinstance(trigger, dict) or not (trigger.get("cron_schedule") or trigger.get("periodic_schedule")):
        raise invalid_argument("a recurring run needs trigger.cron_schedule or trigger.periodic_schedule")
    if cron := trigger.get("cron_schedule"):
        if not isinstance(cron, dict):
            raise invalid_argument(f"trigger.cron_schedule must be an object with a cron field, got {cron!r}")
        try:
            parsed = parse_cron(str(cron.get("cron") or ""))
        except CronError as err:
            raise invalid_argument(
                f"Schedule cron is not a supported format(https://godoc.org/github.com/robfig/cron). Error: {err}"
            ) from None
        return Schedule(parsed, 0, _time(cron.get("start_time"), "start_time"), _time(cron.get("end_time"), "end_time"))
    periodic = trigger["periodic_schedule"]
    if not isinstance(periodic, dict):
        raise invalid_argument(f"trigger.periodic_schedule must be an object with interval_second, got {periodic!r}")
    try:
        interval = int(periodic.get("interval_second") or 0)
    except (TypeError, ValueError) as err:
        raise invalid_argument(f"interval_second must be an integer: {periodic.get('interval_second')!r}") from err
    if interval < 1:
        raise invalid_argument(
            f"Found invalid period schedule interval {interval}. Set at interval to least 1 second"
        )
    return Schedule(None, interval, _time(periodic.get("start_time"), "start_time"),
                    _time(periodic.get("end_time"), "end_time"))


def due(schedule: Schedule, *, since: float, now: float, last_fired: float | None, created: float) -> bool:
    """Whether a run is due now: some firing time lies in ``(since, now]`` (epoch seconds).

    A cron fires on its matching seconds; a period (or ``@every``) ``interval`` seconds after the
    last fired run, else after the start time, else after the recurring run's creation. Nothing
    fires before ``start`` or after ``end``. Missed times are not made up: at most one run per call
    (the real controller's ``no_catchup: true``).
    """
    if schedule.end is not None and now > schedule.end.timestamp():
        return False
    if schedule.start is not None:
        if now < schedule.start.timestamp():
            return False
        since = max(since, schedule.start.timestamp() - 1)
    cron = schedule.cron
    interval = schedule.interval_s or (cron.every_s if cron else 0)
    if interval:
        base = last_fired if last_fired is not None else (schedule.start.timestamp() if schedule.start else created)
        return now >= base + interval
    assert cron is not None
    first = max(int(since) + 1, int(now) - 3600)  # no catch-up: an hour back is plenty
    return any(cron.matches(datetime.fromtimestamp(s, UTC)) for s in range(first, int(now) + 1))
