"""Matchers, durations, receivers, subscriptions and silences: valid input parses, invalid input is one line."""

from __future__ import annotations

import threading

import pytest

from alerting.admin import (
    make_receiver,
    make_silence,
    make_subscription,
    receiver_from_json,
    silence_from_json,
    subscription_from_json,
    subscription_json,
)
from alerting.model import (
    Matcher,
    MatchOp,
    Receiver,
    Subscription,
    clean_text,
    decode_config,
    encode_config,
    finding_labels,
    parse_matcher,
    parse_matchers,
)
from pipeline.codec import encode_record
from pipeline.errors import AlertConfigError, DecodeError
from tests.unit.alerting.helpers import finding


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('severity="critical"', Matcher("severity", MatchOp.EQ, "critical")),
        ("severity=critical", Matcher("severity", MatchOp.EQ, "critical")),
        ('severity=~"warning|critical"', Matcher("severity", MatchOp.RE, "warning|critical")),
        (' node != "n 1" ', Matcher("node", MatchOp.NE, "n 1")),
        ('job!~"tmp-.*"', Matcher("job", MatchOp.NRE, "tmp-.*")),
        ('application=""', Matcher("application", MatchOp.EQ, "")),
        (r'node="a\"b"', Matcher("node", MatchOp.EQ, 'a"b')),
    ],
)
def test_matchers_parse(text: str, expected: Matcher) -> None:
    assert parse_matcher(text) == expected
    assert parse_matcher(str(expected)) == expected  # round trip through the stored text form


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("severity", "is not name="),
        ('sevrity="critical"', "did you mean severity"),
        ('flavour="red"', "labels: alertname"),
        ('node=~"("', "invalid regular expression"),
        ('node="unterminated', "not closed"),
        ("node=a b", "quote values"),
        ('severity="critcal"', "can never match: severity is one of info, warning, critical"),
        ('application="llm"', "can never match"),
        ("node==x", "quote values"),
    ],
)
def test_bad_matchers_are_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(AlertConfigError) as err:
        parse_matcher(text)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_matcher_semantics_follow_alertmanager() -> None:
    labels = {"severity": "critical", "node": "n12"}
    assert parse_matcher('severity=~"warning|critical"').matches(labels)
    assert not parse_matcher('severity=~"crit"').matches(labels)  # anchored at both ends
    assert parse_matcher('node=~"n1.*"').matches(labels)
    assert parse_matcher('job=""').matches(labels)  # a missing label is the empty string
    assert not parse_matcher('job!=""').matches(labels)
    assert parse_matcher('job!~"x.*"').matches(labels)


def test_braced_list_of_matchers() -> None:
    assert parse_matchers(['{severity="critical", node=~"a,b|c"}']) == (
        Matcher("severity", MatchOp.EQ, "critical"),
        Matcher("node", MatchOp.RE, "a,b|c"),
    )


def test_finding_labels_carry_the_context() -> None:
    labels = finding_labels(finding(True, 100, detector="baseline-anomaly"))
    assert labels == {
        "alertname": "baseline-anomaly",
        "detector": "baseline-anomaly",
        "severity": "warning",
        "cluster": "c1",
        "node": "n1",
        "gpu": "GPU-1",
        "gpu_model": "H100-SXM5-80GB",
        "gpu_index": "0",
        "application": "llm-pretraining",
        "job": "job-7",
        "user": "alice",
        "tenant": "team-a",
        "verdict": "anomalous",
    }
    assert "gpu" not in finding_labels(finding(True, 100, gpu=None))


@pytest.mark.parametrize(
    ("kind", "target", "extra", "message"),
    [
        ("webhook", "ftp://x", {}, "http:// or https:// URL"),
        ("slack", "hooks.example.com/x", {}, "http:// or https:// URL"),
        ("email", "not-an-address", {"smtp": "localhost:25"}, "address like"),
        ("email", "ops@example.com", {}, "needs an SMTP server"),
        ("email", "ops@example.com", {"smtp": "localhost:99999"}, "is not host:port"),
        ("kafka", "bad topic!", {}, "topic name"),
        ("webhook", "http://x", {"secret_env": "1BAD"}, "not an environment variable name"),
        ("pager", "x", {}, "is not one of webhook, slack, email, kafka"),
    ],
)
def test_bad_receivers(kind: str, target: str, extra: dict[str, str], message: str) -> None:
    with pytest.raises(AlertConfigError, match=message):
        make_receiver(kind, target, **extra)  # type: ignore[arg-type]


def test_subscription_validation() -> None:
    hook = make_receiver("webhook", "http://127.0.0.1:9/hook", secret_env="HOOK_SECRET")
    sub = make_subscription("gpu ops", "alice", ['severity=~"warning|critical"'], [hook], group_wait="10s", repeat="4h")
    assert sub.group_wait_s == 10 and sub.repeat_interval_s == 14400 and sub.send_resolved
    for kwargs, message in [
        ({"receivers": []}, "at least one receiver"),
        ({"owner": " "}, "needs an owner"),
        ({"group_by": ["gpu", "colour"]}, "group-by label 'colour'"),
        ({"group_wait": "soon"}, "group wait 'soon' is not a duration"),
        ({"repeat": "0s"}, "repeat interval must be more than 0s"),
        ({"match": ['node=~"["']}, "invalid regular expression"),
    ]:
        args = {"name": "x", "owner": "alice", "match": [], "receivers": [hook]} | kwargs
        with pytest.raises(AlertConfigError, match=message):
            make_subscription(**args)  # type: ignore[arg-type]


def test_subscription_json_validation_and_redaction() -> None:
    sub = subscription_from_json(
        {
            "name": "infra",
            "owner": "bob",
            "match": ['detector="xid-storm"'],
            "receivers": [
                {"kind": "webhook", "url": "https://hooks.example.com/x?token=1", "secret": "s3cr3t"},
                {"kind": "slack", "url": "https://hooks.slack.example/services/T0/B0/XXXX"},
            ],
        }
    )
    shown = str(subscription_json(sub))
    assert "s3cr3t" not in shown and "XXXX" not in shown and "***" in shown
    for body, message in [
        ([], "must be a JSON object"),
        ({"name": "x", "owner": "y", "receivers": [{"kind": "webhook"}]}, "webhook receiver needs 'url'"),
        ({"name": "x", "owner": "y", "receivers": "http://x"}, "non-empty list"),
        (
            {"name": "x", "owner": "y", "receivers": [{"kind": "webhook", "url": "http://x"}], "colour": 1},
            "unknown field",
        ),
        ({"name": "x", "owner": "y", "match": "node=~(", "receivers": [{"kind": "kafka", "topic": "t"}]}, "matcher"),
        ({"name": 3, "owner": "y", "receivers": [{"kind": "kafka", "topic": "t"}]}, "'name' must be a string"),
    ]:
        with pytest.raises(AlertConfigError, match=message):
            subscription_from_json(body)
    with pytest.raises(AlertConfigError, match="'smtp_starttls' must be true or false"):
        receiver_from_json({"kind": "email", "to": "a@b.c", "smtp": "h:25", "smtp_starttls": "yes"})


def test_silences() -> None:
    s = make_silence(['node="n1"'], "2h", "carol", "maintenance", now_ns=1000)
    assert s.ends_ns - s.starts_ns == 7200 * 10**9 and s.active(1000) and not s.active(s.ends_ns)
    with pytest.raises(AlertConfigError, match="at least one matcher must need a value"):
        make_silence(['node!="n1"'], "2h", "carol")
    with pytest.raises(AlertConfigError, match="needs at least one matcher"):
        make_silence([], "2h", "carol")
    with pytest.raises(AlertConfigError, match="silence duration"):
        silence_from_json({"match": ['node="n1"'], "for": "forever", "by": "carol"})


def test_config_records_round_trip_and_invalid_ones_are_rejected() -> None:
    sub = make_subscription("x", "alice", ['node="n1"'], [make_receiver("kafka", "out")])
    assert decode_config(encode_config(sub)) == sub
    broken = Subscription("id1", "x", "alice", (Matcher("node", MatchOp.RE, "("),), (Receiver("kafka", topic="t"),))
    with pytest.raises(AlertConfigError):
        encode_config(broken)  # the writers validate before publishing...
    with pytest.raises(DecodeError, match="invalid regular expression"):
        decode_config(encode_record(broken))  # ...and a reader skips what got in anyway


def test_a_backtracking_pattern_runs_in_linear_time() -> None:
    """``(a+)+`` took 3 s on a 27-character node name with Python's backtracking engine and doubled per character;
    under RE2 a 100,000-character one is answered at once (the worker's join bound is a liveness check: the old
    engine would not return within the age of the universe)."""
    matcher = parse_matcher('node=~"(a+)+"')
    answers: list[bool] = []
    worker = threading.Thread(target=lambda: answers.append(matcher.matches({"node": "a" * 100_000 + "!"})))
    worker.start()
    worker.join(30)
    assert answers == [False]
    assert parse_matcher('node=~"(a+)+"').matches({"node": "aaaa"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (r'node=~"(a)\\1"', "invalid regular expression for RE2"),  # a backreference: RE2 has none
        ('node=~"(?=n)n1"', "invalid regular expression for RE2"),  # lookahead
        ('node=~"((a{1000}){1000}){1000}"', "invalid regular expression for RE2"),  # a program without bound
        ('node=~"' + "a" * 2000 + '"', "longer than 1024 characters"),
    ],
)
def test_regexes_re2_cannot_run_in_linear_time_are_refused_with_one_line(text: str, message: str) -> None:
    with pytest.raises(AlertConfigError, match=message) as caught:
        parse_matcher(text)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "match",
    [
        ['node!=""'],
        ['node=~".*"'],
        ['node=~".+"'],
        ['node!="n1"'],
        ['node!~"n1"'],
        ['cluster=~"(?s).*"'],
        ['severity=~"info|warning|critical"'],
        ['gpu=~".*"', 'node=~".+"'],
        ['{alertname!="", detector=~".*"}'],
        ['application=~".*"'],
        ['verdict!~"x"'],
    ],
)
def test_a_silence_that_matches_every_alert_is_refused_whatever_its_form(match: list[str]) -> None:
    with pytest.raises(AlertConfigError, match="a silence cannot mute everything"):
        make_silence(match, "1h", "mallory")


@pytest.mark.parametrize(
    "match",
    [['node="n1"'], ['gpu!=""'], ['node=~"node-00.*"'], ['severity!="info"'], ['job=~"tmp-.*"', 'node!="n2"']],
)
def test_a_silence_narrowed_to_some_alerts_is_accepted(match: list[str]) -> None:
    assert make_silence(match, "1h", "carol").matchers


def test_a_silence_longer_than_the_bound_is_refused() -> None:
    with pytest.raises(AlertConfigError, match="longer than"):
        silence_from_json({"match": ['node="n1"'], "for": "99999999999h", "by": "carol"})


def test_control_characters_are_stripped_from_what_people_type() -> None:
    assert clean_text("\x1b[31mroot\x1b[0m\u202e\x00 ok\n") == "[31mroot[0m ok"
    s = silence_from_json({"match": ['node="n1"'], "for": "1h", "by": "\x1b]0;pwned\x07eve", "comment": "a\r\nb\u200b"})
    assert (s.created_by, s.comment) == ("]0;pwnedeve", "ab")
    sub = make_subscription("\x1b[2Jops", "al\x00ice", ['node="n1"'], [make_receiver("kafka", "out")], team="\x7f")
    assert (sub.name, sub.owner, sub.team) == ("[2Jops", "alice", None)
    with pytest.raises(AlertConfigError, match="needs a creator"):
        make_silence(['node="n1"'], "1h", "\x1b\x07")
