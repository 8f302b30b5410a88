"""Plugins by name: every source and sink hermeneut can run, as ``"module:Class"`` strings imported when used.

The table holds strings, never imports: the core imports no stage, and ``hermeneut collect --source nvml`` loads
the NVML plugin only. Adding a plugin (say an importer) is one line in :data:`PLUGINS`. Importers are sources of
history (``hermeneut import <name>``): the same plugin contract, read in blocks by
:class:`producers.importers.driver.ImportDriver` rather than per round by the agent.

What a plugin class offers (tests/unit/pipeline/test_registry.py loads every entry and checks it, the Telegraf habit):

    name: str                                   its registry name
    Config                                      a frozen dataclass: ``Config()`` is the default config
    configure(settings, **options) -> Config    classmethod: the defaults, overlaid with the settings' section
                                                and the command line's options (None: not given)
    validate(config) -> None                    classmethod: raises ConfigError with one readable line; connects
                                                to nothing
    from_config(config, **deps) -> plugin       classmethod: builds it (dependencies such as a fake NVML may be
                                                injected); connects to nothing (a source's ``open()`` does)

A Config field declared with :func:`setting` is also a command-line option: ``hermeneut import <name>`` builds each
importer's subcommand from its Config's flags (help, required, choices, bounds, whether it names input files),
so an importer's settings are declared once, with their defaults, in its Config.

A plugin setting that lives in the settings (a section with bounds, the environment, TOML and the settings
reference: say ``context.kubelet_socket``) is declared there once: its Config field takes the default from it
(:func:`from_section`) and ``configure`` its value (:func:`section_config`).

Sources then follow :class:`producers.source.Source` (open / collect / close), importers
:class:`producers.importers.driver.Importer` (open / blocks / close), context sources
:class:`producers.context.base.ContextSource` (poll; built with ``node`` and ``inventory``: this node's GPUs) and
sinks :class:`sinks.base.Sink` (add / flush / close). :func:`create` does configure, validate and from_config in
that order, so a bad value stops start-up with one line before anything is connected.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeVar

from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance
    from pydantic import BaseModel

    from pipeline.config import Settings

Kind = Literal["source", "sink", "importer", "context"]

#: kind -> name -> "module:Class"
PLUGINS: Final[Mapping[Kind, Mapping[str, str]]] = {
    "source": {
        "nvml": "producers.nvml.source:NvmlSource",
        "dcgm-exporter": "producers.dcgm_exporter:DcgmExporterSource",
        "amd-exporter": "producers.amd.exporter:AmdExporterSource",
        "amd-smi": "producers.amd.smi:AmdSmiSource",
        "simulator": "producers.simulator.source:SimulatorSource",
    },
    "sink": {
        "influxdb": "sinks.influxdb.sink:InfluxDBSink",
        "otlp": "sinks.otlp.sink:OtlpSink",
    },
    "importer": {
        "prometheus": "producers.importers.prometheus:PrometheusImporter",
        "dcgm-exporter": "producers.importers.dcgm_files:DcgmFilesImporter",
        "amd-exporter": "producers.amd.importer:AmdFilesImporter",
        "nvidia-smi-csv": "producers.importers.nvsmi_csv:NvsmiCsvImporter",
        "nvidia-smi-xml": "producers.importers.nvsmi_xml:NvsmiXmlImporter",
        "table": "producers.importers.table:TableImporter",
    },
    # workload context (``hermeneut context watch --<name>``): which job runs on which GPU of a node
    "context": {
        "static": "producers.context.static:StaticSource",
        "slurm-dir": "producers.context.slurm:SlurmFileSource",
        "squeue": "producers.context.slurm:SlurmCommandSource",
        "kubernetes": "producers.context.kubernetes:KubernetesSource",
        "processes": "producers.context.processes:ProcessSource",
    },
}

C = TypeVar("C", bound="DataclassInstance")
#: the metadata key of a Config field's :class:`Flag`
FLAG: Final = "hermeneut.flag"


@dataclasses.dataclass(frozen=True, slots=True)
class Flag:
    """How a plugin setting is given on the command line: ``--<name>`` (underscores as dashes), or the positional
    arguments (``argument``: the files or folders to read)."""

    help: str
    required: bool = False
    choices: tuple[str, ...] = ()
    #: the smallest number allowed
    minimum: int | None = None
    #: names input files: they identify the import with its options (its checkpoint), and must exist
    input: bool = False
    argument: bool = False


def setting(default: Any, help: str, **how: Any) -> Any:
    """A Config field with ``default`` that is also a command-line option (:class:`Flag`)."""
    return dataclasses.field(default=default, metadata={FLAG: Flag(help, **how)})


def from_section(section: type[BaseModel], name: str, help: str | None = None, **how: Any) -> Any:
    """A Config field whose default is the settings section's field ``name`` (declared there once, with bounds);
    with ``help``, also a command-line option (:func:`setting`)."""
    default = section_default(section, name)
    return dataclasses.field(default=default) if help is None else setting(default, help, **how)


def section_default(section: type[BaseModel], name: str) -> Any:
    """The default of the settings section's field ``name`` (a plugin default derived from a setting's)."""
    return section.model_fields[name].get_default(call_default_factory=True)


def section_config(config: type[C], section: BaseModel, plugin: str, **options: Any) -> C:
    """``config`` with the values ``section`` holds for its fields, overlaid with the options that were given."""
    held = {
        f.name: getattr(section, f.name) for f in dataclasses.fields(config) if f.name in type(section).model_fields
    }
    return with_options(config(**held), options, plugin)


class PluginClass(Protocol):
    """What :func:`load` returns: a plugin class (see the module docstring)."""

    name: str
    Config: type[Any]

    @classmethod
    def configure(cls, settings: Settings, **options: Any) -> Any: ...

    @classmethod
    def validate(cls, config: Any) -> None: ...

    @classmethod
    def from_config(cls, config: Any, **deps: Any) -> Any: ...


class ContextPluginClass(PluginClass, Protocol):
    """A context source's class: also what it says (two sources that say the same are two ways to one answer, and
    a watch takes one of them) and a line of help."""

    covers: str
    description: str


def names(kind: Kind) -> tuple[str, ...]:
    """The registered names of a kind, in table order."""
    return tuple(PLUGINS[kind])


def load(kind: Kind, name: str) -> PluginClass:
    """Import the plugin class registered as ``name``; an unknown name is a ConfigError naming the known ones."""
    target = PLUGINS[kind].get(name)
    if target is None:
        raise ConfigError(f"invalid configuration: unknown {kind} {name!r} (known: {', '.join(names(kind))})")
    module, _, attr = target.partition(":")
    plugin: PluginClass = getattr(importlib.import_module(module), attr)
    return plugin


def create(kind: Kind, name: str, settings: Settings, deps: Mapping[str, Any] | None = None, **options: Any) -> Any:
    """The plugin ``name`` for these settings and options, validated and built, not yet connected."""
    plugin = load(kind, name)
    config = plugin.configure(settings, **options)
    plugin.validate(config)
    return plugin.from_config(config, **(deps or {}))


def with_options(config: C, options: Mapping[str, Any], plugin: str) -> C:
    """``config`` with the options that were given (not None); an option the config does not have is a
    ConfigError (say ``--url`` for the NVML source), not silently ignored."""
    given = {k: v for k, v in options.items() if v is not None}
    known = [f.name for f in dataclasses.fields(config)]
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(f"invalid configuration: {plugin} has no setting {unknown[0]!r} (it has: {', '.join(known)})")
    return dataclasses.replace(config, **given)
