"""The alerting vocabulary: matchers, subscriptions, receivers, silences, acks, alert and group state.

Everything here is a frozen dataclass that travels through :func:`pipeline.codec.encode_record`:

* on ``topics.alert_config`` (compacted, written by the CLI/HTTP API after validation): ``Subscription``
  (key ``subscription/<id>``), ``Silence`` (``silence/<id>``), ``Ack`` (``ack/<dedup key>``);
  a tombstone deletes.
* on ``topics.alert_state`` (compacted, written only by the alert manager): ``AlertState``
  (``alert/<dedup key>``), ``GroupState`` (``group/<subscription>/<group key>``, the notification log) and
  ``Delivery`` (``outbox/<id>``, a notification not yet delivered or given up).

Matchers follow Alertmanager: ``name="v"``, ``name!="v"``, ``name=~"re"``, ``name!~"re"``, regexes anchored at
both ends, a missing label matches as the empty string. Regexes have RE2's semantics, as Alertmanager's (Go's
regexp) do: they run in time linear in the label's length, so no pattern can stall the manager with catastrophic
backtracking (``(a+)+`` on a long node name); what RE2 lacks (backreferences, lookaround) is refused with its
reason. Anything malformed raises :class:`AlertConfigError` with one line saying what to fix.

Free text people type (names, owners, comments) is stored without control characters (:func:`clean_text`), so an
ANSI escape or a bidi override in a silence's author cannot rewrite a terminal or a page that shows it.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import re
import unicodedata
import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import re2

from pipeline.codec import decode_record, encode_record
from pipeline.errors import AlertConfigError, DecodeError
from pipeline.events import APPLICATIONS, Finding, Severity, Verdict

#: Labels an alert carries and a matcher may name (``alertname`` is the detector, for Alertmanager tooling).
LABELS: Final = (
    "alertname",
    "detector",
    "severity",
    "cluster",
    "node",
    "gpu",
    "gpu_model",
    "gpu_index",
    "job",
    "user",
    "tenant",
    "application",
    "verdict",
    "driver_version",
    "rack",
    "switch",
    "maintenance",
)
_VOCABULARY: Final[dict[str, tuple[str, ...]]] = {
    "severity": tuple(s.value for s in Severity),
    "application": APPLICATIONS,
    "verdict": tuple(v.value for v in Verdict),
}
RECEIVER_KINDS: Final = ("webhook", "slack", "email", "kafka")
_MATCHER = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*(.*?)\s*$")
_BARE_VALUE = re.compile(r"^[^\s\"',{}=!~]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_EMAIL = re.compile(r"^[^@\s,;<>]+@[^@\s,;<>]+$")
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
#: labels every alert carries (finding_labels): a matcher that takes any value of one of them mutes all alerts
ALWAYS_PRESENT: Final = frozenset({"alertname", "detector", "severity", "cluster", "node"})
#: a regex longer than this is refused (RE2 bounds the time; this bounds the memory of thousands of them)
MAX_REGEX_CHARS: Final = 1024
#: stand-ins for "any value" of a free-text label when a silence's regex is checked for muting everything: a regex
#: that takes all of them (and the empty value where the label may be absent) is taken to take any value
_ANY_VALUES: Final = ("node-0042", "q7", "GPU-7f3a0c1e-5b2d-4e8f-9a61-0d3c2b1a4e5f", "Zq 9_/.:-@", "0", "\u00e9\u6f22")


class MatchOp(StrEnum):
    EQ = "="
    NE = "!="
    RE = "=~"
    NRE = "!~"


def _re2_options() -> Any:
    options = re2.Options()
    options.dot_nl = True  # "." crosses newlines, as Go's (?s) and the DOTALL this replaced
    options.log_errors = False  # a refused pattern is the caller's one-line error, not a line on stderr
    return options


_RE2_OPTIONS: Final = _re2_options()


@functools.lru_cache(maxsize=4096)
def _regex(value: str) -> Any:
    """The RE2 program of a matcher's value (anchored by ``fullmatch``); re2.error when RE2 refuses it."""
    return re2.compile(f"(?:{value})", _RE2_OPTIONS)


def clean_text(text: str) -> str:
    """``text`` without control and format characters (ANSI escapes' ESC, NUL, bidi overrides, zero-width joiners):
    Unicode categories Cc and Cf. A newline is a control character too: these fields are one line."""
    return "".join(ch for ch in text if unicodedata.category(ch) not in ("Cc", "Cf")).strip()


@dataclass(frozen=True, slots=True)
class Matcher:
    """One label condition; build it with :func:`parse_matcher`, which validates."""

    name: str
    op: MatchOp
    value: str

    def matches(self, labels: dict[str, str]) -> bool:
        actual = labels.get(self.name, "")
        if self.op is MatchOp.EQ:
            return actual == self.value
        if self.op is MatchOp.NE:
            return actual != self.value
        hit = _regex(self.value).fullmatch(actual) is not None
        return hit if self.op is MatchOp.RE else not hit

    def __str__(self) -> str:
        return f"{self.name}{self.op.value}{json.dumps(self.value)}"


def parse_matcher(text: str) -> Matcher:
    """``severity=~"warning|critical"`` -> Matcher, or AlertConfigError naming the problem."""
    m = _MATCHER.match(text)
    if m is None:
        raise AlertConfigError(f'matcher {text!r} is not name="value" (operators =, !=, =~, !~)')
    name, op, raw = m.group(1), MatchOp(m.group(2)), m.group(3)
    if name not in LABELS:
        close = difflib.get_close_matches(name, LABELS, n=1)
        hint = f" (did you mean {close[0]}?)" if close else f" (labels: {', '.join(LABELS)})"
        raise AlertConfigError(f"matcher {text!r}: unknown label {name!r}{hint}")
    if raw.startswith('"'):
        try:
            value = json.loads(raw)
        except ValueError:
            raise AlertConfigError(f"matcher {text!r}: the quoted value is not closed or has a bad escape") from None
        if not isinstance(value, str):
            raise AlertConfigError(f"matcher {text!r}: the value must be one quoted string")
    elif _BARE_VALUE.match(raw):
        value = raw
    else:
        raise AlertConfigError(f"matcher {text!r}: quote values that contain spaces, quotes, commas, braces or = ! ~")
    if op in (MatchOp.RE, MatchOp.NRE):
        if len(value) > MAX_REGEX_CHARS:
            raise AlertConfigError(f"matcher {text[:40]!r}...: the regex is longer than {MAX_REGEX_CHARS} characters")
        try:
            _regex(value)
        except re2.error as exc:
            reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            raise AlertConfigError(f"matcher {text!r}: invalid regular expression for RE2 ({reason})") from None
    elif op is MatchOp.EQ and value and name in _VOCABULARY and value not in _VOCABULARY[name]:
        raise AlertConfigError(f"matcher {text!r} can never match: {name} is one of {', '.join(_VOCABULARY[name])}")
    return Matcher(name, op, value)


def parse_matchers(texts: list[str] | tuple[str, ...]) -> tuple[Matcher, ...]:
    """Several matchers; a single text may also hold a comma-separated list inside braces (``{a="1",b="2"}``)."""
    out: list[Matcher] = []
    for text in texts:
        stripped = text.strip()
        if stripped.startswith("{") and stripped.endswith("}"):
            out.extend(parse_matcher(part) for part in _split_top(stripped[1:-1]) if part.strip())
        else:
            out.append(parse_matcher(stripped))
    return tuple(out)


def _split_top(text: str) -> list[str]:
    """Split on commas outside quoted values."""
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for ch in text:
        if ch == "," and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(ch)
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
    parts.append("".join(current))
    return parts


def matches_all(matchers: tuple[Matcher, ...], labels: dict[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)


def takes_any_value(m: Matcher) -> bool:
    """Whether ``m`` holds for every value its label can have on an alert: each value of the label's vocabulary
    where it has one; else any text, so ``!=`` one value takes any value (all but one of endless many) and a
    regex is probed with :data:`_ANY_VALUES`; and the empty value where the label may be absent.

    Labels are independent, so a conjunction of matchers mutes every alert exactly when each of them takes any
    value: ``node!=""``, ``node=~".*"``, ``node!="n1"``, ``severity=~"info|warning|critical"`` and
    ``{gpu=~".*", node=~".+"}`` all do; ``gpu!=""`` (node-level alerts have no GPU) and ``severity!="info"`` do not."""
    optional = m.name not in ALWAYS_PRESENT
    vocabulary = _VOCABULARY.get(m.name)
    if vocabulary is None:
        if m.op is MatchOp.EQ:
            return False
        if m.op is MatchOp.NE:
            return m.value != "" or not optional
        vocabulary = _ANY_VALUES
    values = (*vocabulary, "") if optional else vocabulary
    return all(m.matches({m.name: v}) for v in values)


def new_id() -> str:
    return uuid.uuid4().hex[:12]


# --- configuration records (alert_config topic) ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Receiver:
    """Where a subscription's notifications go. Which fields apply depends on ``kind``.

    Secrets (``secret`` = the webhook's HMAC key, the SMTP password) are either named by an environment variable
    of the alert manager (``secret_env``, ``smtp_password_env``; the operator's choice) or, for self-service
    subscriptions made over the API, held inline in the config record: that topic is the one place they are
    stored (access to it is access to the alerting configuration); they are never logged, listed or written to
    InfluxDB.
    """

    kind: str
    url: str | None = None
    secret: str | None = None
    secret_env: str | None = None
    to: str | None = None
    smtp_host: str | None = None
    smtp_port: int | None = None
    smtp_starttls: bool = False
    smtp_user: str | None = None
    smtp_password_env: str | None = None
    topic: str | None = None

    def validate(self) -> Receiver:
        if self.kind not in RECEIVER_KINDS:
            raise AlertConfigError(f"receiver kind {self.kind!r} is not one of {', '.join(RECEIVER_KINDS)}")
        if self.kind in ("webhook", "slack") and (not self.url or not re.match(r"^https?://[^\s/?#]+", self.url)):
            raise AlertConfigError(f"{self.kind} receiver needs an http:// or https:// URL, got {self.url!r}")
        if self.kind == "email":
            if not self.to or not _EMAIL.match(self.to):
                raise AlertConfigError(f"email receiver needs an address like ops@example.com, got {self.to!r}")
            if not self.smtp_host:
                raise AlertConfigError("email receiver needs an SMTP server (--smtp host:port)")
            if self.smtp_port is not None and not 0 < self.smtp_port < 65536:
                raise AlertConfigError(f"SMTP port {self.smtp_port} is not a port number")
        if self.kind == "kafka" and (not self.topic or not _TOPIC.match(self.topic)):
            raise AlertConfigError(f"kafka receiver needs a topic name (letters, digits, . _ -), got {self.topic!r}")
        for what, name in (("secret_env", self.secret_env), ("smtp_password_env", self.smtp_password_env)):
            if name is not None and not _ENV_NAME.match(name):
                raise AlertConfigError(f"{what} {name!r} is not an environment variable name")
        if self.secret is not None and self.secret_env is not None:
            raise AlertConfigError("give the webhook secret inline or as an environment variable, not both")
        return self

    def target(self) -> str:
        """Who is told, safe to show and store: no secrets, no URL paths (a Slack URL's path is its token)."""
        if self.kind in ("webhook", "slack"):
            m = re.match(r"^(https?://[^\s/?#]+)", self.url or "")
            return f"{self.kind} {m.group(1) if m else '?'}"
        if self.kind == "email":
            return f"email {self.to}"
        return f"kafka {self.topic}"

    def redacted(self) -> Receiver:
        """The receiver as shown to people: inline secrets masked, Slack URLs cut to their host."""
        url = self.url
        if self.kind == "slack" and url:
            url = self.target().split(" ", 1)[1] + "/…"
        return Receiver(
            self.kind,
            url,
            "***" if self.secret else None,
            self.secret_env,
            self.to,
            self.smtp_host,
            self.smtp_port,
            self.smtp_starttls,
            self.smtp_user,
            self.smtp_password_env,
            self.topic,
        )


@dataclass(frozen=True, slots=True)
class Subscription:
    """A person's or team's standing order: alerts matching ``matchers`` go to ``receivers``, grouped.

    Timers left None use the ``alerts`` settings' defaults; an empty ``group_by`` uses ``alerts.group_by``;
    ``("...",)`` groups every alert on its own (Alertmanager's ``group_by: ['...']``).
    """

    id: str
    name: str
    owner: str
    matchers: tuple[Matcher, ...]
    receivers: tuple[Receiver, ...]
    team: str | None = None
    group_by: tuple[str, ...] = ()
    group_wait_s: float | None = None
    group_interval_s: float | None = None
    repeat_interval_s: float | None = None
    send_resolved: bool = True
    created_ns: int = 0

    def validate(self) -> Subscription:
        if not _ID.match(self.id):
            raise AlertConfigError(f"subscription id {self.id!r} must be 1-64 letters, digits, . _ -")
        if not self.name.strip():
            raise AlertConfigError("a subscription needs a name")
        if not self.owner.strip():
            raise AlertConfigError("a subscription needs an owner")
        if not self.receivers:
            raise AlertConfigError(
                "a subscription needs at least one receiver (--webhook, --slack, --email, --kafka-topic)"
            )
        for r in self.receivers:
            r.validate()
        for label in self.group_by:
            if label != "..." and label not in LABELS:
                raise AlertConfigError(f"group-by label {label!r} is not one of {', '.join(LABELS)} (or ...)")
        for what, value in (
            ("group wait", self.group_wait_s),
            ("group interval", self.group_interval_s),
            ("repeat interval", self.repeat_interval_s),
        ):
            if value is not None and not 0 <= value <= 30 * 86_400:
                raise AlertConfigError(f"{what} must be between 0s and 30d, got {value}s")
        if self.repeat_interval_s is not None and self.repeat_interval_s <= 0:
            raise AlertConfigError("repeat interval must be more than 0s")
        for m in self.matchers:
            parse_matcher(str(m))  # a record built in code, not parsed, gets the same checks
        return self

    @property
    def key(self) -> bytes:
        return f"subscription/{self.id}".encode()


@dataclass(frozen=True, slots=True)
class Silence:
    """Alerts matching every matcher send nothing between ``starts_ns`` and ``ends_ns`` (they still resolve)."""

    id: str
    matchers: tuple[Matcher, ...]
    starts_ns: int
    ends_ns: int
    created_by: str
    comment: str = ""

    def validate(self) -> Silence:
        if not _ID.match(self.id):
            raise AlertConfigError(f"silence id {self.id!r} must be 1-64 letters, digits, . _ -")
        if not self.matchers:
            raise AlertConfigError("a silence needs at least one matcher (--match)")
        if all(takes_any_value(m) for m in self.matchers):
            raise AlertConfigError(
                'at least one matcher must need a value not every alert has (e.g. node="n1"): these match every '
                "alert, and a silence cannot mute everything"
            )
        if self.ends_ns <= self.starts_ns:
            raise AlertConfigError("a silence must end after it starts")
        if not self.created_by.strip():
            raise AlertConfigError("a silence needs a creator (--by)")
        for m in self.matchers:
            parse_matcher(str(m))
        return self

    def active(self, now_ns: int) -> bool:
        return self.starts_ns <= now_ns < self.ends_ns

    def state(self, now_ns: int) -> str:
        return "active" if self.active(now_ns) else "pending" if now_ns < self.starts_ns else "expired"

    @property
    def key(self) -> bytes:
        return f"silence/{self.id}".encode()


@dataclass(frozen=True, slots=True)
class Ack:
    """Someone took an alert: no more repeats for the firing episode that started before ``at_ns``."""

    dedup_key: str
    by: str
    at_ns: int
    comment: str = ""

    @property
    def key(self) -> bytes:
        return f"ack/{self.dedup_key}".encode()


ConfigRecord = Subscription | Silence | Ack


def decode_config(payload: bytes) -> ConfigRecord:
    """A record of the alert_config topic, validated (an invalid one raises DecodeError and is skipped)."""
    record = _decode_any(payload, (Subscription, Silence, Ack))
    try:
        if isinstance(record, Subscription | Silence):
            record.validate()
    except AlertConfigError as exc:
        raise DecodeError("invalid_config", str(exc)) from exc
    return record  # type: ignore[return-value]


def encode_config(record: ConfigRecord) -> bytes:
    if isinstance(record, Subscription | Silence):
        record.validate()
    return encode_record(record)


# --- alert state (alert_state topic) -------------------------------------------------------------------------


class AlertStatus(StrEnum):
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class AlertState:
    """One alert (one Finding dedup key) through its lifecycle; all times UTC epoch ns.

    ``episode`` counts firing episodes (a new one starts each time it fires again); ``changes`` holds the times
    of recent firing/resolved changes (the flap window); while ``flapping``, notifications are held; each
    flapping period that ends bumps ``flap_periods`` so every subscriber gets exactly one summary of it.
    """

    dedup_key: str
    labels: dict[str, str]
    summary: str
    status: AlertStatus
    active_since_ns: int
    last_seen_ns: int
    action: str = ""
    evidence: dict[str, float] = field(default_factory=dict)
    starts_ns: int = 0
    ends_ns: int = 0
    clear_since_ns: int = 0
    episode: int = 0
    changes: tuple[int, ...] = ()
    flapping: bool = False
    flap_started_ns: int = 0
    flap_changes: int = 0
    flap_periods: int = 0
    resolved_reason: str = ""
    #: when the manager received the last finding / saw the last change (its clock; the others are event time)
    seen_at_ns: int = 0
    changed_at_ns: int = 0
    #: its finding stopped repeating: the event time of the last one (0: fresh). Silence is no evidence of health,
    #: so a stale alert stays open (alerting.lifecycle); the next finding, a repeat or a clear, ends the mark
    stale_since_ns: int = 0

    @property
    def key(self) -> bytes:
        return f"alert/{self.dedup_key}".encode()

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.dedup_key)

    @property
    def signature(self) -> str:
        """What a subscriber was told: status, episode and flapping period (a change means: tell again)."""
        return f"{'F' if self.status is AlertStatus.FIRING else 'R'}{self.episode}.{self.flap_periods}"


def fingerprint(dedup_key: str) -> str:
    """16 hex digits, like Alertmanager's fingerprints: stable across restarts (derived from the dedup key)."""
    return hashlib.sha256(dedup_key.encode()).hexdigest()[:16]


def finding_labels(f: Finding) -> dict[str, str]:
    """The labels of the alert a finding raises (absent values are left out, as in Alertmanager)."""
    labels = {
        "alertname": f.detector,
        "detector": f.detector,
        "severity": f.severity.value,
        "cluster": f.cluster,
        "node": f.node,
    }
    if f.gpu_uuid:
        labels["gpu"] = f.gpu_uuid
    if f.gpu_model:
        labels["gpu_model"] = f.gpu_model
    if f.gpu_index is not None:
        labels["gpu_index"] = str(f.gpu_index)
    wl = f.workload
    if wl is not None:
        for name, value in (
            ("application", wl.application),
            ("job", wl.job_id),
            ("user", wl.user),
            ("tenant", wl.tenant),
        ):
            if value:
                labels[name] = value
    if f.detector == "baseline-anomaly":
        labels["verdict"] = Verdict.ANOMALOUS.value
    for name, value in (
        ("driver_version", f.driver_version),
        ("rack", f.rack),
        ("switch", f.switch),
        ("maintenance", f.maintenance),
    ):
        if value:
            labels[name] = value
    return labels


@dataclass(frozen=True, slots=True)
class GroupState:
    """The notification log of one group of one subscription (Alertmanager's nflog entry).

    ``sent``: dedup key -> signature last told to the receivers; ``suppressed``: the same for alerts whose
    notification a silence or an inhibition swallowed (recorded once per episode); ``first_ns``: when the group
    got something to say (group_wait counts from there); ``last_sent_ns``: 0 until the group's first
    notification (and again after it has told everything resolved).
    """

    subscription_id: str
    group_key: str
    group_labels: dict[str, str]
    first_ns: int = 0
    last_sent_ns: int = 0
    sent: dict[str, str] = field(default_factory=dict)
    suppressed: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> bytes:
        return group_state_key(self.subscription_id, self.group_key)


def group_state_key(subscription_id: str, group_key: str) -> bytes:
    return f"group/{subscription_id}/{group_key}".encode()


@dataclass(frozen=True, slots=True)
class AlertView:
    """One alert as a notification shows it (a snapshot: the payload must not change while it is retried)."""

    dedup_key: str
    status: AlertStatus
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_ns: int
    ends_ns: int

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.dedup_key)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One notification to one receiver of one subscription, kept in the outbox until delivered or given up.

    ``reason``: ``firing`` (something new), ``resolved``, ``repeat`` (repeat_interval) or ``flap-summary``.
    """

    id: str
    notification_id: str
    subscription_id: str
    receiver_index: int
    group_key: str
    group_labels: dict[str, str]
    status: AlertStatus
    reason: str
    alerts: tuple[AlertView, ...]
    created_ns: int

    @property
    def key(self) -> bytes:
        return f"outbox/{self.id}".encode()


StateRecord = AlertState | GroupState | Delivery


def decode_state(payload: bytes) -> StateRecord:
    return _decode_any(payload, (AlertState, GroupState, Delivery))  # type: ignore[return-value]


def _decode_any(payload: bytes, classes: tuple[type, ...]) -> object:
    last: DecodeError | None = None
    for cls in classes:
        try:
            return decode_record(cls, payload)
        except DecodeError as exc:
            if exc.reason != "wrong_type" or "expected a" not in exc.detail:
                raise
            last = exc
    assert last is not None
    raise DecodeError("wrong_type", f"not one of {', '.join(c.__name__ for c in classes)}")
