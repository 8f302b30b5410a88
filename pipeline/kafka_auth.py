"""Kafka credentials checked once at start-up, so a wrong password or certificate stops a stage with one line.

librdkafka and aiokafka treat a refused login like a broker that is away: they log it and keep retrying, so a stage
started with a wrong SCRAM password, a client certificate the broker does not trust, or a CA that does not match
the broker's would run forever, consuming nothing. :func:`check_credentials` asks the cluster for its metadata
once with the stage's own client settings: an authentication or TLS failure is a :class:`ConfigError` (the CLI's
one line and exit code 2); a broker that does not answer yet is left to the stage's own retries, as before.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from pipeline.errors import ConfigError

#: librdkafka's codes for a refused login and a failed TLS handshake (the broker's certificate not trusted)
REFUSED = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})


def refused(error: KafkaError) -> bool:
    """A refusal of our credentials, not an absent broker. Under TLS 1.3 the broker checks a client certificate
    after the client's side of the handshake is done: its refusal arrives as a TLS alert on the first read, which
    librdkafka reports as a transport error."""
    return error.code() in REFUSED or (error.code() == KafkaError._TRANSPORT and "ssl/tls alert" in error.str())


def check_credentials(conf: dict[str, Any], timeout_s: float = 20.0) -> None:
    """Raise ConfigError when the cluster refuses these client settings' credentials (PLAINTEXT: nothing to
    check). Returns once the cluster answered, or when it did not answer within ``timeout_s`` for another reason."""
    if conf.get("security.protocol", "PLAINTEXT") == "PLAINTEXT":
        return
    seen: list[KafkaError] = []
    # log_level 0: the error comes back as one line here, not as librdkafka's retry lines on stderr
    client = Producer(conf | {"error_cb": seen.append, "log_level": 0})
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            seen.extend(a for a in exc.args if isinstance(a, KafkaError))
        client.poll(0)  # serves the error callbacks of what happened meanwhile
        refusals = [e for e in seen if refused(e)]
        if refusals:
            raise ConfigError(
                f"invalid configuration: Kafka at {conf.get('bootstrap.servers')} refused {conf['security.protocol']} "
                f"(kafka.sasl_*, kafka.ssl_*): {refusals[0].str()}"
            )
        if time.monotonic() >= deadline:
            return
