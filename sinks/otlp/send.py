"""The OTLP package's only I/O: OTLP/HTTP requests with JSON bodies (``Content-Type: application/json``, which the
OTLP specification allows beside protobuf), answers sorted for the runner as the specification's "OTLP/HTTP
Response" section says:

    200                                 accepted; a ``partialSuccess`` (rejectedDataPoints / rejectedLogRecords,
                                        errorMessage) is returned to the caller, never retried (the spec: the
                                        client MUST NOT retry a partial success)
    429, 502, 503, 504 with Retry-After SinkBackpressure: wait that long, then send the same request
    429, 502, 503, 504 without          TransientWriteError: retry with backoff
    400, 413 and other 4xx but 401,     PermanentWriteError: the data itself was refused (the sink sends each
    403, 404, 408                       message of the request alone, and refuses only those still refused)
    401, 403, 404, 408, other 5xx,      TransientWriteError: a header, a permission or a path to fix, a server
    no answer                           that is down: nothing is wrong with the data, so it waits, stalled

urllib3 is already a dependency; one pooled connection per sink.
"""

from __future__ import annotations

import email.utils
import json
import time
from dataclasses import dataclass
from typing import Any, Final

import urllib3

from pipeline.errors import PermanentWriteError, SinkBackpressure, TransientWriteError

#: answers the specification lists as retryable (throttled or the server unavailable)
RETRYABLE: Final = frozenset({429, 502, 503, 504})
#: client errors that say nothing against the data (as the InfluxDB writer's)
_FIXABLE: Final = frozenset({401, 403, 404, 408})


@dataclass(frozen=True, slots=True)
class Answer:
    """A 200's partial success: how many items the collector rejected, and why (0, "": everything taken)."""

    rejected: int = 0
    message: str = ""


def retry_after_s(value: str | None, now_s: float | None = None) -> float | None:
    """A Retry-After header in seconds: the delta form, or an HTTP date (RFC 9110, 10.2.3); None if absent or
    unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now_s is None else now_s))


def partial_success(body: bytes, signal: str) -> Answer:
    """The ``partialSuccess`` of an Export*ServiceResponse (``signal``: metrics or logs); an empty or unreadable
    body is a full success (the collector answers ``{}`` or ``{"partialSuccess":{}}``)."""
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        return Answer()
    partial = data.get("partialSuccess") if isinstance(data, dict) else None
    if not isinstance(partial, dict):
        return Answer()
    key = "rejectedDataPoints" if signal == "metrics" else "rejectedLogRecords"
    try:
        rejected = int(partial.get(key) or 0)  # int64: a string in JSON
    except (TypeError, ValueError):
        rejected = 0
    return Answer(rejected, str(partial.get("errorMessage") or ""))


def refuses_data(status: int) -> bool:
    """Is an answer a refusal of the data itself (sending it again changes nothing)?"""
    return 400 <= status < 500 and status not in _FIXABLE and status not in RETRYABLE


class OtlpClient:
    """POSTs OTLP/JSON to ``<endpoint>/v1/metrics`` and ``/v1/logs``; building one connects to nothing."""

    def __init__(self, endpoint: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.pool = urllib3.PoolManager(num_pools=1, maxsize=1, retries=False)

    def export(self, signal: str, body: dict[str, Any]) -> Answer:
        """Send one Export*ServiceRequest (``signal``: metrics or logs); raises as the module docstring says."""
        url = f"{self.endpoint}/v1/{signal}"
        data = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
        try:
            resp = self.pool.request("POST", url, body=data, headers=self.headers, timeout=self.timeout_s)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise TransientWriteError(f"{type(exc).__name__}: {exc}"[:300]) from exc
        status, text = resp.status, resp.data
        if status == 200:
            return partial_success(text, signal)
        detail = f"HTTP {status} from {url}: {text[:300].decode(errors='replace')}"
        if status in RETRYABLE:
            after = retry_after_s(resp.headers.get("Retry-After"))
            if after is not None:
                raise SinkBackpressure(after, detail)
            raise TransientWriteError(detail)
        if refuses_data(status):
            raise PermanentWriteError(detail)
        raise TransientWriteError(detail)

    def close(self) -> None:
        self.pool.clear()
