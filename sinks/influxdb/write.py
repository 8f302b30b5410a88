"""The InfluxDB package's only I/O: prepared line protocol written to InfluxDB 2.x, errors sorted for the runner.

    HTTP 400, 413                       PermanentWriteError: the data itself was refused (dead-lettered)
    HTTP 429, 503 with Retry-After      SinkBackpressure: wait that long, then retry the same lines
    any other HTTP error, no answer     TransientWriteError: retry with backoff

Reads go through the query layer (:class:`sinks.query.store.Store`), never through here.
"""

from __future__ import annotations

from typing import Any, Final, cast

import urllib3
from influxdb_client.client.influxdb_client import InfluxDBClient
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.domain.write_precision import WritePrecision
from influxdb_client.rest import ApiException

from pipeline.config import InfluxSettings
from pipeline.errors import PermanentWriteError, SinkBackpressure, TransientWriteError

_MS: Final = cast(WritePrecision, WritePrecision.MS)


def _retry_after_s(exc: ApiException) -> float | None:
    """The server's Retry-After in seconds (the delta form), if it sent one."""
    headers: Any = exc.headers
    value = headers.get("Retry-After") if headers else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare; the backoff handles it


class InfluxWriter:
    """Synchronous writes of prepared lines (timestamps in ms) to one bucket; building one connects to nothing."""

    def __init__(self, url: str, token: str, org: str, bucket: str, timeout_s: float = 10.0) -> None:
        self.bucket, self.org = bucket, org
        self.client = InfluxDBClient(url=url, token=token, org=org, timeout=int(timeout_s * 1000), retries=False)
        self._write = self.client.write_api(write_options=SYNCHRONOUS)

    @classmethod
    def from_settings(cls, settings: InfluxSettings) -> InfluxWriter:
        """For resolved settings (URL and token known)."""
        assert settings.url and settings.token, "resolve settings first"
        return cls(settings.url, settings.token.get_secret_value(), settings.org, settings.bucket, settings.timeout_s)

    def write(self, lines: list[str]) -> None:
        if not lines:
            return
        try:
            self._write.write(self.bucket, self.org, "\n".join(lines).encode(), write_precision=_MS)
        except ApiException as exc:
            if exc.status in (400, 413):
                raise PermanentWriteError(f"HTTP {exc.status}: {str(exc.body)[:300]}") from exc
            detail = f"HTTP {exc.status}: {str(exc.body or exc.reason)[:300]}"
            after = _retry_after_s(exc) if exc.status in (429, 503) else None
            if after is not None:
                raise SinkBackpressure(after, detail) from exc
            raise TransientWriteError(detail) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientWriteError(f"{type(exc).__name__}: {exc}"[:300]) from exc

    def close(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]
