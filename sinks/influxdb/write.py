"""The InfluxDB package's only I/O: prepared line protocol written to InfluxDB 2.x, errors sorted for the runner.

    HTTP 400, 413, 422, other 4xx       PermanentWriteError: the data itself was refused (the sink splits the
                                        request until only the refused lines are left, and dead-letters them)
    HTTP 401, 403, 404, 408             TransientWriteError: a token, a permission or a bucket to fix (or a
                                        slow client): nothing is wrong with the data, so it waits, stalled
    HTTP 429, 503 with Retry-After      SinkBackpressure: wait that long, then retry the same lines
    any other HTTP error, no answer     TransientWriteError: retry with backoff

422 is InfluxDB's "partial write" (points outside the bucket's retention dropped, the others stored): permanent,
never retried as it stands (it would be refused for as long as the sink runs).

Each request gets a timeout proportional to its size (``timeout_s`` is the timeout of a full request of
``request_lines`` lines, never less than :data:`MIN_TIMEOUT_S`), so a small request to a stalled server is given up
early and a full one is given the time it needs, instead of one fixed timeout for both. A request that timed out
may still be written by a server that is only slow, and resending it with the same timeout can time out again and
again, each try costing the server the write once more (seen under a loaded influxd: 20 attempts in 3 minutes, with
requests of 50,000 lines given 10 s). So after a timeout the writer gives every request twice the time (never more
than ``timeout_s``, a full request's, so a hung server holds a stopping sink no longer than before), and halves
that again after a request that took less than a quarter of the time it was given (:class:`TimeoutStretch`).

Reads go through the query layer (:class:`sinks.query.store.Store`), never through here.
"""

from __future__ import annotations

import time
from typing import Any, Final, cast

import urllib3
from influxdb_client.client.influxdb_client import InfluxDBClient
from influxdb_client.domain.bucket_retention_rules import BucketRetentionRules
from influxdb_client.domain.write_precision import WritePrecision
from influxdb_client.rest import ApiException
from influxdb_client.service.write_service import WriteService

from pipeline.config import InfluxSettings
from pipeline.errors import PermanentWriteError, SinkBackpressure, TransientWriteError

_MS: Final = cast(WritePrecision, WritePrecision.MS)
#: no request is given less than this (connection set-up, a busy server's queue)
MIN_TIMEOUT_S: Final = 1.0
#: after timeouts, a request is given at most this many times its own timeout (and never more than a full one's)
MAX_STRETCH: Final = 16.0
#: client errors that say nothing against the data: the operator fixes the token, the permission or the bucket
#: (or the request was too slow) and the same lines are written
_FIXABLE: Final = frozenset({401, 403, 404, 408})


def refuses_data(status: int) -> bool:
    """Is an HTTP answer a refusal of the lines themselves (permanent: sending them again changes nothing)?"""
    return 400 <= status < 500 and status not in _FIXABLE and status != 429


class TimeoutStretch:
    """How many times its own timeout a request is given now: doubled by each timeout (up to
    :data:`MAX_STRETCH`), halved (down to 1) by each request that took less than a quarter of what it was given.
    The back-off of a retransmission timer (RFC 6298, 5.5), undone as the server's answers come back fast."""

    def __init__(self) -> None:
        self.factor = 1.0

    def timed_out(self) -> None:
        self.factor = min(MAX_STRETCH, self.factor * 2)

    def answered(self, took_s: float, timeout_s: float) -> None:
        if took_s < timeout_s / 4:
            self.factor = max(1.0, self.factor / 2)


def _retry_after_s(exc: ApiException) -> float | None:
    """The server's Retry-After in seconds (the delta form), if it sent one."""
    headers: Any = exc.headers
    value = headers.get("Retry-After") if headers else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare; the backoff handles it


class InfluxWriter:
    """Synchronous writes of prepared lines (timestamps in ms) to one bucket; building one connects to nothing.

    ``timeout_s`` is the timeout of a request of ``request_lines`` lines; each request's own is proportional to
    its line count (see the module docstring)."""

    def __init__(
        self, url: str, token: str, org: str, bucket: str, timeout_s: float = 10.0, request_lines: int = 5000
    ) -> None:
        self.bucket, self.org = bucket, org
        self.timeout_s, self.request_lines = timeout_s, request_lines
        self.stretch = TimeoutStretch()
        self.client = InfluxDBClient(url=url, token=token, org=org, timeout=int(timeout_s * 1000), retries=False)
        # the generated service, not write_api: only it takes a timeout per request
        self._service = WriteService(self.client.api_client)  # type: ignore[no-untyped-call]

    @classmethod
    def from_settings(cls, settings: InfluxSettings) -> InfluxWriter:
        """For resolved settings (URL and token known)."""
        assert settings.url and settings.token, "resolve settings first"
        token = settings.token.get_secret_value()
        return cls(settings.url, token, settings.org, settings.bucket, settings.timeout_s, settings.batch_size)

    def timeout_for(self, lines: int) -> float:
        """The timeout of a request of ``lines`` lines now (stretched after timeouts, see the module docstring)."""
        own = max(MIN_TIMEOUT_S, self.timeout_s * lines / self.request_lines)
        return min(own * self.stretch.factor, max(own, self.timeout_s))

    def write(self, lines: list[str]) -> None:
        if not lines:
            return
        timeout_s = self.timeout_for(len(lines))
        started = time.monotonic()
        try:
            self._service.post_write(  # type: ignore[no-untyped-call]
                org=self.org,
                bucket=self.bucket,
                body="\n".join(lines).encode(),
                precision=_MS,
                content_type="text/plain; charset=utf-8",
                _request_timeout=timeout_s * 1000,  # the client counts in ms
            )
            self.stretch.answered(time.monotonic() - started, timeout_s)
        except ApiException as exc:
            if refuses_data(exc.status or 0):
                raise PermanentWriteError(f"HTTP {exc.status}: {str(exc.body)[:300]}") from exc
            detail = f"HTTP {exc.status}: {str(exc.body or exc.reason)[:300]}"
            after = _retry_after_s(exc) if exc.status in (429, 503) else None
            if after is not None:
                raise SinkBackpressure(after, detail) from exc
            raise TransientWriteError(detail) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
                self.stretch.timed_out()
            raise TransientWriteError(f"{type(exc).__name__}: {exc}"[:300]) from exc

    def ensure_bucket(self, retention_s: int) -> None:
        """Create this writer's bucket (with that retention) unless it exists; a transient error if InfluxDB cannot
        be asked."""
        api = self.client.buckets_api()
        try:
            if api.find_bucket_by_name(self.bucket) is None:  # type: ignore[no-untyped-call]
                rule = BucketRetentionRules(type="expire", every_seconds=retention_s)  # type: ignore[no-untyped-call]
                api.create_bucket(bucket_name=self.bucket, retention_rules=rule, org=self.org)
        except ApiException as exc:
            raise TransientWriteError(f"bucket {self.bucket}: HTTP {exc.status}: {str(exc.body)[:200]}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientWriteError(f"{type(exc).__name__}: {exc}"[:300]) from exc

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]
