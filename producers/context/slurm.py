"""Slurm jobs per GPU, two ways: files the job prolog drops, or ``squeue`` + ``scontrol -d show job``.

**Prolog files** (``SlurmFileSource``, preferred: no load on slurmctld): ``hermeneut-slurm-prolog.sh`` (shipped
next to this module) writes ``<dir>/<jobid>.env`` with the job's variables as ``KEY=value`` lines, and
``hermeneut-slurm-epilog.sh`` removes it. Per Slurm's Prolog and Epilog Guide the node Prolog sees
``SLURM_JOB_ID``, ``SLURM_JOB_USER``, ``SLURM_JOB_ACCOUNT``, ``SLURM_JOB_PARTITION``, ``SLURM_JOB_NUM_NODES``,
``SLURM_JOB_COMMENT``, ``SLURM_JOB_GPUS`` ("GPU IDs of GPUs in the job allocation") and ``CUDA_VISIBLE_DEVICES``
(the node's device index, since the prolog runs outside the job's cgroup); ``SLURM_JOB_NAME`` only reaches
PrologSlurmctld, so it is used when present.

**Commands** (``SlurmCommandSource``, at most every 30 s: every node asking slurmctld adds up):
``squeue --noheader --states=RUNNING --nodelist=<node> --format=%A`` lists the node's running jobs;
``scontrol -d show job <id>`` gives each new one's detail lines
``Nodes=gpu[01-02] CPU_IDs=0-31 Mem=0 GRES=gpu:a100:4(IDX:0-3)``, where ``IDX`` are the node's GPU indices, and
``AllocTRES=...,gres/gpu=8`` (``TRES=`` in older releases), the job's GPU count across nodes.

The application comes from the job comment (``--comment="application=llm-finetuning model=org/name"``, keys
``application``/``app``, ``model``, ``framework``, optionally prefixed ``hermeneut.``) with confidence 0.95, else
is guessed from the job name and command (capped at 0.6), else is ``unknown``. ``tenant`` is the account.
"""

from __future__ import annotations

import itertools
import logging
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from pipeline.config import ContextSettings
from pipeline.errors import ConfigError, SourceUnavailable
from pipeline.events import Workload
from pipeline.registry import from_section, section_config
from producers.context.base import (
    DECLARED_CONFIDENCE,
    HINT_CONFIDENCE_CAP,
    Observation,
    is_application,
)
from producers.context.inference import Evidence, capped, infer
from producers.context.inventory import GpuInventory
from producers.source import Runner, run_command

if TYPE_CHECKING:
    from pipeline.config import Settings

log = logging.getLogger(__name__)

PROLOG: Final = Path(__file__).with_name("hermeneut-slurm-prolog.sh")
EPILOG: Final = Path(__file__).with_name("hermeneut-slurm-epilog.sh")

_NONE: Final = frozenset({"", "(null)", "N/A", "None", "n/a"})
_COMMENT_KV: Final = re.compile(r"(?:^|[\s,;])(?:hermeneut\.)?(application|app|model|framework)=([^\s,;]+)")
_GPU_IDX: Final = re.compile(r"(?:^|,)gpu(?::[^(,]*)?\(IDX:([^)]*)\)")
_TRES_GPUS: Final = re.compile(r"(?:^|,)gres/gpu=(\d+)")
#: keys whose value is the rest of the line (free text, may hold spaces and '=')
_FREE_TEXT: Final = (
    "Comment=",
    "AdminComment=",
    "SystemComment=",
    "Command=",
    "WorkDir=",
    "StdErr=",
    "StdIn=",
    "StdOut=",
)


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """A running job as far as it concerns this node."""

    job_id: str
    gpus: tuple[str, ...]
    user: str | None = None
    name: str | None = None
    account: str | None = None
    comment: str | None = None
    command: str | None = None
    num_nodes: int | None = None
    #: GPUs across the whole job, when known
    total_gpus: int | None = None


def _value(raw: str | None) -> str | None:
    return None if raw is None or raw.strip() in _NONE else raw.strip()


def _int(raw: str | None) -> int | None:
    raw = _value(raw)
    return int(raw) if raw is not None and raw.isdigit() else None


def expand_ranges(spec: str) -> list[int]:
    """``"0-2,5"`` -> ``[0, 1, 2, 5]``; raises ValueError on anything else."""
    out: list[int] = []
    for part in spec.split(","):
        low, dash, high = part.strip().partition("-")
        out.extend(range(int(low), int(high) + 1) if dash else [int(low)])
    return out


def _split_top(expr: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, ch in enumerate(expr):
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            yield expr[start:i]
            start = i + 1
    yield expr[start:]


def expand_hostlist(expr: str) -> list[str]:
    """A Slurm hostlist (``gpu[01-03,07],login1``, ``rack[1-2]-n[1-2]``) as host names, zero padding kept."""
    hosts = []
    for item in _split_top(expr.strip()):
        parts = re.split(r"\[([^\]]*)\]", item)
        choices: list[list[str]] = []
        for i, part in enumerate(parts):
            if i % 2 == 0:
                choices.append([part])
                continue
            names: list[str] = []
            for piece in part.split(","):
                low, dash, high = piece.partition("-")
                width = len(low)
                names += [str(n).zfill(width) for n in range(int(low), int(high) + 1)] if dash else [low]
            choices.append(names)
        hosts += ["".join(combo) for combo in itertools.product(*choices)]
    return [h for h in hosts if h]


def parse_comment(comment: str | None) -> dict[str, str]:
    """``application=...``, ``model=...``, ``framework=...`` pairs in a job comment (the rest is ignored)."""
    out: dict[str, str] = {}
    for key, value in _COMMENT_KV.findall(comment or ""):
        out.setdefault("application" if key == "app" else key, value)
    return out


def job_workload(job: SlurmJob, source: str = "slurm") -> Workload:
    """What a job tells about the workload on each of its GPUs."""
    declared = parse_comment(job.comment)
    guessed = infer(Evidence(argv=(job.command,) if job.command else (), name=job.name))
    guessed = capped(guessed, HINT_CONFIDENCE_CAP) if guessed is not None else None
    application, confidence = "unknown", 0.0
    if is_application(declared.get("application", "")):
        application, confidence = declared["application"], DECLARED_CONFIDENCE
    elif guessed is not None and guessed.application != "unknown":
        application, confidence = guessed.application, guessed.confidence
    return Workload(
        application,
        job_id=job.job_id,
        user=job.user,
        source=source,
        confidence=confidence,
        tenant=job.account,
        model=declared.get("model") or (guessed.model if guessed else None),
        framework=declared.get("framework") or (guessed.framework if guessed else None),
        job_gpus=job.total_gpus,
    )


def observe_jobs(
    jobs: Sequence[SlurmJob], inventory: GpuInventory, source: str = "slurm"
) -> tuple[dict[str, Workload], list[str]]:
    """Workload per GPU uuid of this node; plus the GPU references the inventory does not know.

    When two jobs claim a GPU (a stale prolog file whose epilog never ran), the later one in ``jobs`` wins.
    """
    out: dict[str, Workload] = {}
    unknown = []
    for job in jobs:
        workload = job_workload(job, source)
        for ref in job.gpus:
            uuid = inventory.resolve(ref)
            if uuid is None:
                unknown.append(f"job {job.job_id} gpu {ref}")
            else:
                out[uuid] = workload
    return out, unknown


# --- prolog files -------------------------------------------------------------------------------------------


def parse_env_file(text: str, where: str) -> SlurmJob:
    """One prolog file (``KEY=value`` lines); raises ValueError when it does not describe a job."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not eq or not re.fullmatch(r"[A-Z_][A-Z0-9_]*", key):
            raise ValueError(f"{where}:{number}: expected KEY=value, got {line[:80]!r}")
        env[key] = value
    job_id = _value(env.get("SLURM_JOB_ID"))
    if job_id is None:
        raise ValueError(f"{where}: SLURM_JOB_ID is missing")
    devices = _value(env.get("SLURM_JOB_GPUS")) or _value(env.get("CUDA_VISIBLE_DEVICES")) or ""
    # Slurm sets CUDA_VISIBLE_DEVICES=NoDevFiles for a job without GPU device files
    gpus = tuple(d.strip() for d in devices.split(",") if d.strip() and d.strip() != "NoDevFiles")
    num_nodes = _int(env.get("SLURM_JOB_NUM_NODES"))
    total = _int(env.get("HERMENEUT_JOB_GPUS"))
    if total is None and num_nodes is not None and gpus:
        total = num_nodes * len(gpus)  # assumes the same GPU count on every node (the usual --gpus-per-node)
    return SlurmJob(
        job_id=job_id,
        gpus=gpus,
        user=_value(env.get("SLURM_JOB_USER")),
        name=_value(env.get("SLURM_JOB_NAME")),
        account=_value(env.get("SLURM_JOB_ACCOUNT")),
        comment=_value(env.get("SLURM_JOB_COMMENT")),
        num_nodes=num_nodes,
        total_gpus=total,
    )


#: what both Slurm sources say: two ways to the same answer
SLURM_JOBS: Final = "Slurm's jobs"


@dataclass(frozen=True, slots=True)
class SlurmDirConfig:
    """The ``slurm-dir`` context source's settings."""

    slurm_dir: Path = from_section(ContextSettings, "slurm_dir", "Where the prolog writes <jobid>.env files.")


@dataclass(frozen=True, slots=True)
class SqueueConfig:
    """The ``squeue`` context source's settings."""

    command_timeout_s: float = from_section(ContextSettings, "command_timeout_s")


class SlurmFileSource:
    """Jobs from the prolog's ``<dir>/<jobid>.env`` files (registered as ``slurm-dir``); a file is parsed again only
    when it changes."""

    name = "slurm-dir"
    description = "Jobs from the prolog's <jobid>.env files (default dir: context.slurm_dir)."
    covers = SLURM_JOBS
    Config = SlurmDirConfig

    @classmethod
    def configure(cls, settings: Settings, **options: object) -> SlurmDirConfig:
        return section_config(SlurmDirConfig, settings.context, "the slurm-dir context source", **options)

    @classmethod
    def validate(cls, config: SlurmDirConfig) -> None:
        """Nothing to check before it runs: the folder appears with the first job."""

    @classmethod
    def from_config(cls, config: SlurmDirConfig, node: str, inventory: GpuInventory) -> SlurmFileSource:
        return cls(config.slurm_dir, inventory)

    def __init__(self, directory: Path, inventory: GpuInventory) -> None:
        self.directory, self.inventory = directory, inventory
        self._cache: dict[Path, tuple[int, SlurmJob | None]] = {}
        self._warned: set[str] = set()
        self.malformed = 0

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("slurm: %s", message)

    def _read(self, path: Path, mtime: int) -> SlurmJob | None:
        cached = self._cache.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            job: SlurmJob | None = parse_env_file(path.read_text(errors="replace"), str(path))
        except OSError:
            return None  # the epilog removed it between listing and reading
        except ValueError as exc:
            self.malformed += 1
            self._warn_once(f"skipping {exc}")
            job = None
        self._cache[path] = (mtime, job)
        return job

    def poll(self) -> Observation:
        try:
            entries = [(p, p.stat().st_mtime_ns) for p in self.directory.glob("*.env")]
        except OSError as exc:
            raise SourceUnavailable(f"cannot list {self.directory}: {exc.strerror}") from exc
        if not entries and not self.directory.is_dir():
            self._warn_once(f"{self.directory} does not exist (yet): no prolog has written a job file")
        self._cache = {p: v for p, v in self._cache.items() if any(p == q for q, _ in entries)}
        jobs = [job for p, mtime in sorted(entries, key=lambda e: e[1]) if (job := self._read(p, mtime)) is not None]
        observed, unknown = observe_jobs(jobs, self.inventory)
        for ref in unknown:
            self._warn_once(f"{ref} is not a GPU of this node")
        return observed


# --- squeue + scontrol --------------------------------------------------------------------------------------


def _fields(line: str) -> dict[str, str]:
    for key in _FREE_TEXT:
        if line.startswith(key):
            return {key[:-1]: line[len(key) :].rstrip()}
    if line.startswith("JobId="):
        # JobName (free text, may hold spaces) is the last field of the first line
        head, sep, name = line.partition(" JobName=")
        return dict(t.split("=", 1) for t in head.split() if "=" in t) | ({"JobName": name.rstrip()} if sep else {})
    return dict(t.split("=", 1) for t in line.split() if "=" in t)


def parse_scontrol(text: str, node: str) -> list[SlurmJob]:
    """Jobs in ``scontrol -d show job`` output that hold GPUs on ``node`` (other jobs are left out).

    Raises ValueError when a record's GPU indices do not parse (a format this parser does not know).
    """
    records: list[list[str]] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("JobId="):
            records.append([])
        if stripped and records:
            records[-1].append(stripped)
    jobs = []
    for record in records:
        fields: dict[str, str] = {}
        gpus: list[str] = []
        for line in record:
            parsed = _fields(line)
            if "Nodes" in parsed and node in expand_hostlist(parsed["Nodes"]):
                gres = parsed.get("GRES") or parsed.get("GRES_IDX") or ""
                for spec in _GPU_IDX.findall(gres):
                    gpus += [str(i) for i in expand_ranges(spec)]
            elif "Nodes" not in parsed:
                fields.update(parsed)
        if not gpus:
            continue
        tres = fields.get("AllocTRES") or fields.get("TRES") or ""
        total = _TRES_GPUS.search(tres)
        user = _value(fields.get("UserId"))
        jobs.append(
            SlurmJob(
                job_id=fields["JobId"],
                gpus=tuple(gpus),
                user=user.split("(", 1)[0] if user else None,
                name=_value(fields.get("JobName")),
                account=_value(fields.get("Account")),
                comment=_value(fields.get("Comment")),
                command=_value(fields.get("Command")),
                num_nodes=_int(fields.get("NumNodes")),
                total_gpus=int(total[1]) if total else None,
            )
        )
    return jobs


def parse_squeue_ids(text: str) -> list[str]:
    """Job ids from ``squeue --noheader --format=%A``, one per line."""
    return [line.strip() for line in text.splitlines() if re.fullmatch(r"\d+(?:_\d+)?", line.strip())]


class SlurmCommandSource:
    """Jobs from ``squeue`` (which jobs run here) and ``scontrol -d show job`` (which GPUs, asked once per job);
    registered as ``squeue``."""

    name = "squeue"
    description = "Jobs from squeue + scontrol -d show job."
    covers = SLURM_JOBS
    Config = SqueueConfig

    @classmethod
    def configure(cls, settings: Settings, **options: object) -> SqueueConfig:
        return section_config(SqueueConfig, settings.context, "the squeue context source", **options)

    @classmethod
    def validate(cls, config: SqueueConfig) -> None:
        """The bounds are the settings' (context.command_timeout_s)."""

    @classmethod
    def from_config(
        cls, config: SqueueConfig, node: str, inventory: GpuInventory, runner: Runner | None = None
    ) -> SlurmCommandSource:
        """Built with the real commands (which must be on PATH), or ``runner``'s stand-ins."""
        return cls(node, inventory, runner or run_command, timeout_s=config.command_timeout_s)

    def __init__(
        self,
        node: str,
        inventory: GpuInventory,
        runner: Runner = run_command,
        timeout_s: float = 10.0,
        refresh_s: float = 300.0,
        squeue_interval_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if runner is run_command:
            missing = [c for c in ("squeue", "scontrol") if shutil.which(c) is None]
            if missing:
                raise ConfigError(f"--squeue needs {' and '.join(missing)} on PATH")
        self.node, self.inventory, self.runner = node, inventory, runner
        self.timeout_s, self.refresh_s, self.clock = timeout_s, refresh_s, clock
        # every node asks slurmctld: at 10 s polls a 1,000-node cluster would send it 100 squeue calls a second
        self.squeue_interval_s = squeue_interval_s
        self._last: tuple[float, Observation] | None = None
        # job id -> (when asked, jobs parsed): a job's GPUs do not change while it runs; its comment may
        self._jobs: dict[str, tuple[float, list[SlurmJob]]] = {}
        self._warned: set[str] = set()
        self.malformed = 0

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            log.warning("slurm: %s", message)

    def _job(self, job_id: str) -> list[SlurmJob]:
        cached = self._jobs.get(job_id)
        if cached is not None and self.clock() - cached[0] < self.refresh_s:
            return cached[1]
        try:
            text = self.runner(["scontrol", "-d", "show", "job", job_id], self.timeout_s)
        except SourceUnavailable as exc:
            # the job may have ended between squeue and scontrol: keep what we knew, ask again next time
            log.debug("scontrol for job %s: %s", job_id, exc)
            return cached[1] if cached else []
        try:
            jobs = parse_scontrol(text, self.node)
        except (ValueError, KeyError) as exc:
            self.malformed += 1
            self._warn_once(f"cannot parse scontrol output for job {job_id}: {exc}")
            jobs = []
        self._jobs[job_id] = (self.clock(), jobs)
        return jobs

    def poll(self) -> Observation:
        if self._last is not None and self.clock() - self._last[0] < self.squeue_interval_s:
            return self._last[1]
        listing = self.runner(
            ["squeue", "--noheader", "--states=RUNNING", f"--nodelist={self.node}", "--format=%A"], self.timeout_s
        )
        ids = parse_squeue_ids(listing)
        self._jobs = {i: v for i, v in self._jobs.items() if i in ids}
        jobs = [job for job_id in ids for job in self._job(job_id)]
        observed, unknown = observe_jobs(jobs, self.inventory)
        for ref in unknown:
            self._warn_once(f"{ref} is not a GPU of this node")
        self._last = (self.clock(), observed)
        return observed
