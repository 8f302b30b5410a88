"""What a Kubernetes cluster should say about hermeneut's health, and what to change to get there: a pure plan.

Two objects carry the health (pipeline.health) to what acts in a cluster:

- a **node condition** (``condition_type``, True when all of the node's GPUs and the node itself are healthy), as
  the EKS node monitoring agent's ``AcceleratedHardwareReady``: what node auto-repair, a drain controller or a
  person reading ``kubectl describe node`` act on. False for degraded or unhealthy (the reason says which, the
  message names the GPUs, their first reason and remedy), Unknown for a node held in maintenance or without
  telemetry;
- a **DRA DeviceTaintRule** per GPU that is not healthy (Kubernetes 1.37, KEP-5055, ``resource.k8s.io/v1``),
  selecting the device by driver, pool and name as the DRA driver's ResourceSlices list it (the GPU is found there
  by its ``uuid`` attribute): effect None for degraded (seen, nothing refused), NoSchedule for unhealthy,
  NoExecute for unhealthy only where the operator allows it. The taint's value is the state, what a toleration
  names to accept a degraded GPU.

The fleet-incident breaker: no more than ``max_tainted_share`` of the cluster's GPUs (at least one) under a
NoSchedule or NoExecute taint at once. A taint that is already there stays; new ones are admitted strongest remedy
first, then the longest unhealthy; the rest are written with effect None and reported as held, so a bad driver
roll-out cannot make the controller empty a cluster (NVSentinel's circuit breaker against mass quarantine).

Unknown and maintenance are no evidence either way: whatever taint a GPU has stays as it is and none is added. A
node or GPU without a health record is left alone; only objects labelled as hermeneut's are ever changed or
deleted.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pipeline.errors import DecodeError
from pipeline.health.states import BADNESS, STRENGTH, Health, Remedy

#: the labels on every DeviceTaintRule this controller owns (and the only ones it changes or deletes)
MANAGED_BY: Final = ("app.kubernetes.io/managed-by", "hermeneut")
LABEL_NODE: Final = "hermeneut.io/node"
LABEL_GPU: Final = "hermeneut.io/gpu"
#: the rule's annotations: the first reason and the remedy, for a person reading the rule
ANNOTATION_REASON: Final = "hermeneut.io/reason"
ANNOTATION_REMEDY: Final = "hermeneut.io/remedy"
NONE, NO_SCHEDULE, NO_EXECUTE = "None", "NoSchedule", "NoExecute"
#: how strong an effect is (what the breaker counts: NoSchedule and NoExecute)
_EFFECT_RANK: Final = {NONE: 0, NO_SCHEDULE: 1, NO_EXECUTE: 2}
#: the reason a health record that cannot be read is skipped with
BAD_RECORD: Final = "bad_health_record"
#: a condition's message at most (the API takes more; a describe output does not want it)
MESSAGE_CHARS: Final = 1024


@dataclass(frozen=True, slots=True)
class HealthRecord:
    """One key of the health topic: a GPU's (``gpu`` set) or a node's own health."""

    cluster: str
    node: str
    gpu: str | None
    state: Health
    remedy: Remedy
    #: the first reason's detector and summary ("" when healthy)
    detector: str = ""
    summary: str = ""
    since_ns: int = 0


def parse_record(value: bytes) -> HealthRecord:
    """The health topic's JSON (pipeline.health.fold.assessment_json) as a record."""
    try:
        raw = json.loads(value)
        reasons = raw.get("reasons") or []
        first = reasons[0] if reasons and isinstance(reasons[0], Mapping) else {}
        gpu = raw.get("gpu")
        return HealthRecord(
            cluster=str(raw["cluster"]),
            node=str(raw["node"]),
            gpu=str(gpu) if gpu not in (None, "", "-") else None,
            state=Health(raw["state"]),
            remedy=Remedy(raw.get("remedy", "none")),
            detector=str(first.get("detector", "")),
            summary=str(first.get("summary", "")),
            since_ns=int(first.get("since_ns") or 0),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DecodeError(BAD_RECORD, f"{type(exc).__name__}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class Condition:
    status: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class DeviceRef:
    """Where a GPU is in DRA's terms: the ResourceSlice's driver and pool and the device's name."""

    driver: str
    pool: str
    device: str
    #: the slice's node (spec.nodeName; "" for a pool of several nodes): counts the node's GPUs, selects nothing
    node: str = field(default="", compare=False)


@dataclass(frozen=True, slots=True)
class Rule:
    """A DeviceTaintRule for one GPU, as wanted or as found (``name`` is the object's). Its node and GPU are read
    back from labels, which hold 63 characters: they name the rule (as ``name`` does), and are not compared, so a
    long node name never makes a rule look changed."""

    name: str
    node: str = field(compare=False)
    gpu: str = field(compare=False)
    ref: DeviceRef
    effect: str
    value: str
    reason: str = ""
    remedy: str = ""

    def manifest(self, taint_key: str) -> dict[str, Any]:
        """The object to create or put (resource.k8s.io/v1)."""
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceTaintRule",
            "metadata": {
                "name": self.name,
                "labels": {
                    MANAGED_BY[0]: MANAGED_BY[1],
                    LABEL_NODE: _label_value(self.node),
                    LABEL_GPU: _label_value(self.gpu),
                },
                "annotations": {ANNOTATION_REASON: self.reason, ANNOTATION_REMEDY: self.remedy},
            },
            "spec": {
                "deviceSelector": {"driver": self.ref.driver, "pool": self.ref.pool, "device": self.ref.device},
                "taint": {"key": taint_key, "value": self.value, "effect": self.effect},
            },
        }


@dataclass(frozen=True, slots=True)
class Held:
    """A GPU the breaker kept from a stronger taint."""

    node: str
    gpu: str
    wanted: str
    why: str


@dataclass(frozen=True, slots=True)
class Plan:
    conditions: tuple[tuple[str, Condition], ...] = ()
    create: tuple[Rule, ...] = ()
    update: tuple[Rule, ...] = ()
    delete: tuple[str, ...] = ()
    held: tuple[Held, ...] = ()
    #: GPUs that should be tainted but that no ResourceSlice of the driver lists (node, gpu)
    unplaced: tuple[tuple[str, str], ...] = ()
    #: nodes hermeneut has health for that the cluster does not have
    absent_nodes: tuple[str, ...] = ()

    @property
    def writes(self) -> int:
        return len(self.conditions) + len(self.create) + len(self.update) + len(self.delete)


@dataclass(frozen=True, slots=True)
class Policy:
    """The operator's choices (pipeline.config.KubernetesSettings)."""

    taint_key: str = "hermeneut.io/gpu-health"
    no_execute: bool = False
    max_tainted_share: float = 0.1


def node_condition(records: Sequence[HealthRecord], gpus: int = 0) -> Condition:
    """A node's condition from its own record and its GPUs': True when all are healthy. ``gpus``: how many GPUs
    the node has (its ResourceSlices'); the topic holds records only for GPUs whose health ever changed."""
    worst = max(records, key=lambda r: (BADNESS[r.state], STRENGTH[r.remedy]))
    ill = [r for r in records if r.state in (Health.DEGRADED, Health.UNHEALTHY)]
    gpus = max(gpus, sum(r.gpu is not None for r in records))
    if ill:
        ill.sort(key=lambda r: (-BADNESS[r.state], -STRENGTH[r.remedy], r.gpu or ""))
        n_bad = sum(r.gpu is not None for r in ill)
        head = f"{n_bad} of {gpus} GPUs {worst.state.value}" if n_bad else f"node {worst.state.value}"
        parts = [
            f"{r.gpu or 'node'} {r.state.value}: {r.summary or r.detector} (remedy: {r.remedy.value})" for r in ill
        ]
        status, reason, message = "False", f"GPU{worst.state.value.capitalize()}", f"{head}; " + "; ".join(parts)
    elif worst.state is Health.MAINTENANCE:
        status, reason, message = "Unknown", "Maintenance", "held out of service by its scheduler"
    elif worst.state is Health.UNKNOWN:
        status, reason, message = "Unknown", "NoTelemetry", f"no telemetry: {worst.summary or 'silent'}"
    else:
        status, reason, message = "True", "GPUsHealthy", f"{gpus} GPUs healthy"
    return Condition(status, reason, _words(message, MESSAGE_CHARS))


def devices_of(slices: Iterable[Mapping[str, Any]], driver: str) -> dict[str, DeviceRef]:
    """GPU uuid -> its device, from ResourceSlices (resource.k8s.io/v1) of ``driver``: a device's ``uuid``
    attribute (NVIDIA's DRA driver publishes it; a string attribute) names the GPU."""
    found: dict[str, DeviceRef] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool, node = (spec.get("pool") or {}).get("name", ""), str(spec.get("nodeName") or "")
        for d in spec.get("devices") or []:
            uuid = ((d.get("attributes") or {}).get("uuid") or {}).get("string")
            if uuid and d.get("name"):
                found[str(uuid)] = DeviceRef(driver, str(pool), str(d["name"]), node)
    return found


def rule_of(obj: Mapping[str, Any]) -> Rule | None:
    """A DeviceTaintRule object as found, if it is one of ours."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(MANAGED_BY[0]) != MANAGED_BY[1]:
        return None
    spec = obj.get("spec") or {}
    sel, taint = spec.get("deviceSelector") or {}, spec.get("taint") or {}
    notes = meta.get("annotations") or {}
    return Rule(
        name=str(meta.get("name", "")),
        node=str(labels.get(LABEL_NODE, "")),
        gpu=str(labels.get(LABEL_GPU, "")),
        ref=DeviceRef(str(sel.get("driver", "")), str(sel.get("pool", "")), str(sel.get("device", ""))),
        effect=str(taint.get("effect", "")),
        value=str(taint.get("value", "")),
        reason=str(notes.get(ANNOTATION_REASON, "")),
        remedy=str(notes.get(ANNOTATION_REMEDY, "")),
    )


def rule_name(node: str, gpu: str) -> str:
    """A DNS-subdomain name for a GPU's rule: ``hermeneut-<node>-<gpu>``, lower case, other characters as ``-``."""
    name = re.sub(r"[^a-z0-9.-]+", "-", f"hermeneut-{node}-{gpu}".lower()).strip("-.")
    return name[:253].rstrip("-.")


def plan(
    records: Iterable[HealthRecord],
    nodes: Mapping[str, Condition | None],
    devices: Mapping[str, DeviceRef],
    rules: Iterable[Rule],
    policy: Policy,
) -> Plan:
    """What to write so the cluster says what ``records`` say.

    ``nodes``: the cluster's nodes and the condition each has now (None: not yet); ``devices``: GPU uuid -> DRA
    device (:func:`devices_of`); ``rules``: the DeviceTaintRules of ours found (:func:`rule_of`)."""
    by_node: dict[str, list[HealthRecord]] = {}
    for r in records:
        by_node.setdefault(r.node, []).append(r)
    per_node = Counter(ref.node for ref in devices.values())
    conditions = []
    for node in sorted(by_node):
        if node in nodes:
            want = node_condition(by_node[node], per_node[node])
            if nodes[node] != want:
                conditions.append((node, want))
    now = {r.name: r for r in rules}
    wanted, keep, unplaced = {}, set(), []
    for r in sorted((r for rs in by_node.values() for r in rs if r.gpu), key=lambda r: r.gpu or ""):
        gpu = r.gpu or ""
        name = rule_name(r.node, gpu)
        if r.state in (Health.UNKNOWN, Health.MAINTENANCE):
            keep.add(name)  # no evidence either way: what is there stays
            continue
        effect = _effect(r.state, policy)
        if effect is None:
            continue
        ref = devices.get(gpu)
        if ref is None:
            unplaced.append((r.node, gpu))
            keep.add(name)
            continue
        reason = _words(f"{r.detector}: {r.summary}" if r.detector else r.summary, 256)
        wanted[name] = (Rule(name, r.node, gpu, ref, effect, r.state.value, reason, r.remedy.value), r)
    admitted, held = _breaker(
        wanted, now, len(devices) or sum(1 for rs in by_node.values() for r in rs if r.gpu), policy
    )
    create = tuple(rule for name, rule in admitted.items() if name not in now)
    update = tuple(rule for name, rule in admitted.items() if name in now and now[name] != rule)
    delete = tuple(sorted(name for name in now if name not in admitted and name not in keep))
    return Plan(
        conditions=tuple(conditions),
        create=create,
        update=update,
        delete=delete,
        held=held,
        unplaced=tuple(unplaced),
        absent_nodes=tuple(sorted(n for n in by_node if n not in nodes)),
    )


def _effect(state: Health, policy: Policy) -> str | None:
    if state is Health.DEGRADED:
        return NONE
    if state is Health.UNHEALTHY:
        return NO_EXECUTE if policy.no_execute else NO_SCHEDULE
    return None


def _breaker(
    wanted: Mapping[str, tuple[Rule, HealthRecord]], now: Mapping[str, Rule], gpus: int, policy: Policy
) -> tuple[dict[str, Rule], tuple[Held, ...]]:
    """The wanted rules with effects beyond the breaker's allowance lowered to None (and those listed as held)."""
    limit = max(1, math.floor(policy.max_tainted_share * gpus))
    strong = [n for n, (rule, _) in wanted.items() if _EFFECT_RANK[rule.effect] > 0]
    # what already carries a strong taint keeps it; then the strongest remedy, the longest ill, first
    strong.sort(
        key=lambda n: (
            not (n in now and _EFFECT_RANK.get(now[n].effect, 0) > 0),
            -STRENGTH[wanted[n][1].remedy],
            wanted[n][1].since_ns,
            n,
        )
    )
    admitted = {n: rule for n, (rule, _) in wanted.items()}
    held = []
    share = f"{policy.max_tainted_share:.0%}"
    for n in strong[limit:]:
        rule = wanted[n][0]
        admitted[n] = Rule(rule.name, rule.node, rule.gpu, rule.ref, NONE, rule.value, rule.reason, rule.remedy)
        why = f"breaker: {limit} of {gpus} GPUs may carry {NO_SCHEDULE}/{NO_EXECUTE} at once ({share})"
        held.append(Held(rule.node, rule.gpu, rule.effect, why))
    return admitted, tuple(held)


def _label_value(value: str) -> str:
    """A label value (63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", value)[:63].strip("-._")


def _words(text: str, limit: int) -> str:
    """``text`` cut at a word to at most ``limit`` characters, with an ellipsis when cut (never mid-word)."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ;,:")
    return cut + "…"
