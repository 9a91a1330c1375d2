"""Plugin discovery and the registry of attributors, evaluators, model families and trace fields.

Plugins come from the entry-point group ``attrib_bench`` (the built-ins too) and from
``--plugin FILE.py``. The manager is built on every call to :func:`load_registry`, never at
import time, so tests and long-lived processes get a fresh view.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from attrib_bench.core import hookspecs
from attrib_bench.core.architecture_spec import ArchitectureSpec
from attrib_bench.core.console import warn
from attrib_bench.core.errors import UsageError, unknown_choice
from attrib_bench.core.interfaces import Attributor, Evaluator, ModelEvaluator, compares_models
from attrib_bench.core.plugin_info import (
    AttributorInfo,
    EvaluatorInfo,
    PluginInfo,
    attributor_problems,
    evaluator_problems,
)
from attrib_bench.core.plugin_names import ENTRY_POINT_GROUP, write_listing
from attrib_bench.core.segment_interfaces import SegmentAttributor, SegmentEvaluator
from attrib_bench.core.trace_fields import BUILTIN_FIELDS, TraceField

#: The source the registry names for the built-in trace fields (captured by the core).
BUILTIN_SOURCE = "attrib-bench (built-in)"
#: The distribution whose methods make up the default run (its own entry points).
DISTRIBUTION = "attrib-bench"


@dataclass(frozen=True)
class Spec:
    """A method as written by the user: ``name`` or ``name:key=value,key=value``."""

    name: str
    params: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Spec:
        """A method as the command line and config files write it.

        >>> Spec.parse("rollout:residual=0.9")
        Spec(name='rollout', params=(('residual', '0.9'),))
        >>> str(Spec.parse("rollout:residual=0.9,discard=0"))
        'rollout:residual=0.9,discard=0'
        """
        name, _, rest = text.strip().partition(":")
        params: list[tuple[str, str]] = []
        for item in filter(None, (part.strip() for part in rest.split(","))):
            key, eq, value = item.partition("=")
            if not eq or not key.strip():
                raise UsageError(f"bad parameter {item!r} in {text!r}; write name:key=value,...")
            params.append((key.strip(), value.strip()))
        if not name:
            raise UsageError(f"empty method name in {text!r}")
        return cls(name, tuple(params))

    def __str__(self) -> str:
        if not self.params:
            return self.name
        return self.name + ":" + ",".join(f"{k}={v}" for k, v in self.params)


@dataclass
class Registered:
    """A plugin object and where it came from (a distribution name or a file path); for an
    attributor or evaluator, its optional attributes as read at registration."""

    obj: Any
    source: str
    info: PluginInfo | None = None

    @property
    def shipped(self) -> bool:
        """Registered by attrib-bench's own distribution (``source`` starts with the
        distribution's name), not by a third party's package nor a ``--plugin`` file."""
        distribution = self.source.partition(" ")[0]
        return re.sub(r"[-_.]+", "-", distribution).lower() == DISTRIBUTION


@dataclass
class Registry:
    attributors: dict[str, Registered] = field(default_factory=dict)
    evaluators: dict[str, Registered] = field(default_factory=dict)
    #: Hugging Face model_type -> the ArchitectureSpec serving it.
    architectures: dict[str, Registered] = field(default_factory=dict)
    #: Trace field name -> its TraceField: the built-ins, then those plugins register.
    trace_fields: dict[str, Registered] = field(default_factory=dict)
    #: Segment methods and their evaluators (attrib_bench.core.segment_interfaces), by name.
    segment_attributors: dict[str, Registered] = field(default_factory=dict)
    segment_evaluators: dict[str, Registered] = field(default_factory=dict)
    #: Plugins that failed to import: source -> error message. They are reported, not fatal.
    broken: dict[str, str] = field(default_factory=dict)

    def defaults(self, kind: str) -> list[str]:
        """Names run when none are selected: all but those marked ``in_default_run = False``,
        and of the attributors only those attrib-bench ships (``Registered.shipped``), so that
        installing a plugin never changes what a plain run compares: a third party's method
        runs when named.

        ``kind`` is "attributors", "evaluators" (those scoring one model's attributions) or
        "model_evaluators" (those comparing models, for runs over several: ModelEvaluator).
        """
        table = self.attributors if kind == "attributors" else self.evaluators
        if kind == "attributors":
            table = {n: r for n, r in table.items() if r.shipped}
        else:
            wanted = kind == "model_evaluators"
            table = {n: r for n, r in table.items() if compares_models(r.obj) == wanted}
        return [n for n, reg in sorted(table.items()) if reg.info.in_default_run]

    def left_out_of_default(self) -> list[str]:
        """Attributors that would run by default were they shipped: a third party's package's
        or a ``--plugin`` file's, which a run takes only when named."""
        return [
            n
            for n, reg in sorted(self.attributors.items())
            if not reg.shipped and reg.info.in_default_run
        ]

    def architecture_specs(self) -> dict[str, ArchitectureSpec]:
        """The model families, as ``load_model`` takes them."""
        return {model_type: reg.obj for model_type, reg in self.architectures.items()}

    def trace_field_specs(self) -> dict[str, TraceField]:
        """The fields a trace can capture, as ``trace_batch`` takes them."""
        return {name: reg.obj for name, reg in self.trace_fields.items()}

    def attributor(self, spec: Spec | str) -> Any:
        return self._configured(self.attributors, "attributor", spec)

    def evaluator(self, spec: Spec | str) -> Any:
        return self._configured(self.evaluators, "evaluator", spec)

    def segment_attributor(self, spec: Spec | str) -> Any:
        return self._configured(self.segment_attributors, "segment attributor", spec)

    def segment_evaluator(self, spec: Spec | str) -> Any:
        return self._configured(self.segment_evaluators, "segment evaluator", spec)

    @staticmethod
    def _configured(table: dict[str, Registered], kind: str, spec: Spec | str) -> Any:
        spec = Spec.parse(spec) if isinstance(spec, str) else spec
        if spec.name not in table:
            raise unknown_choice(kind, spec.name, table)
        obj = table[spec.name].obj
        if not spec.params:
            return obj
        if not hasattr(obj, "configure"):
            raise UsageError(f"{kind} {spec.name!r} takes no parameters (got {spec})")
        return obj.configure(dict(spec.params))


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise UsageError(f"plugin file {str(path)!r} does not exist")
    module_name = f"attrib_bench_local_{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"plugin file {str(path)!r} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[module_name]
        raise UsageError(f"error importing plugin file {str(path)!r}: {error!r}") from error
    return module


def _plugin_manager(
    entry_points: Iterable[importlib.metadata.EntryPoint],
    plugin_files: Sequence[Path],
    registry: Registry,
) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for ep in entry_points:
        dist = ep.dist.name if ep.dist is not None else "unknown distribution"
        version = ep.dist.version if ep.dist is not None else "?"
        source = f"{dist} {version} ({ep.name} = {ep.value})"
        if pm.get_plugin(source) is not None:  # the same distribution seen twice on sys.path
            continue
        try:
            module = ep.load()
        except Exception as error:  # a broken third-party plugin must not take the run down
            registry.broken[source] = repr(error)
            warn(f"plugin {source} failed to import and is skipped: {error!r}")
            continue
        pm.register(module, name=source)
    for path in plugin_files:
        pm.register(_import_file(Path(path)), name=f"file {path}")
    pm.check_pending()
    return pm


def _collect(
    pm: pluggy.PluginManager,
    hook_name: str,
    kind: str,
    protocol: type | tuple[type, ...],
    trace_fields: Collection[str],
) -> dict:
    table: dict[str, Registered] = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        objects = impl.function() or []
        for obj in objects:
            if not isinstance(obj, protocol):
                protocols = protocol if isinstance(protocol, tuple) else (protocol,)
                names = " or ".join(f"attrib_bench.{p.__name__}" for p in protocols)
                raise UsageError(
                    f"plugin {impl.plugin_name} returned {obj!r}, which is not an {kind}: "
                    f"it needs the attributes of {names}"
                )
            read = attributor_problems if kind == "attributor" else evaluator_problems
            values, problems = read(obj)
            if problems:
                raise UsageError(f"{kind} {obj.name!r} from {impl.plugin_name}: {problems[0]}")
            info = (AttributorInfo if kind == "attributor" else EvaluatorInfo)(**values)
            unknown = set(values.get("requires", ())) - set(trace_fields)
            if unknown:
                raise UsageError(
                    f"{kind} {obj.name!r} from {impl.plugin_name} requires unknown trace fields "
                    f"{sorted(unknown)}; valid: {', '.join(sorted(trace_fields))}"
                )
            if obj.name in table:
                raise UsageError(
                    f"two plugins register the {kind} {obj.name!r}: "
                    f"{table[obj.name].source} and {impl.plugin_name}"
                )
            table[obj.name] = Registered(obj, impl.plugin_name, info)
    return table


def _check_description(plugin: str, obj: Any, kind: type, kind_name: str, what: str) -> None:
    """A described object a hook returned (a model family, a trace field) is of its type and
    passes its own ``problem()``; else one UsageError naming the plugin."""
    if not isinstance(obj, kind):
        raise UsageError(f"plugin {plugin} returned {obj!r}, which is not an {kind_name}")
    problem = obj.problem()
    if problem is not None:
        raise UsageError(f"plugin {plugin} returned a bad {what}: {problem}")


def _collect_architectures(pm: pluggy.PluginManager) -> dict[str, Registered]:
    table: dict[str, Registered] = {}
    for impl in pm.hook.attrib_bench_architectures.get_hookimpls():
        for spec in impl.function() or []:
            _check_description(
                impl.plugin_name,
                spec,
                ArchitectureSpec,
                "attrib_bench.core.adapter.ArchitectureSpec",
                "architecture",
            )
            for model_type in spec.model_types:
                if model_type in table:
                    raise UsageError(
                        f"two plugins register the architecture for model type {model_type!r}: "
                        f"{table[model_type].source} and {impl.plugin_name}"
                    )
                table[model_type] = Registered(spec, impl.plugin_name)
    return table


def _collect_named(
    pm: pluggy.PluginManager, hook_name: str, kind: str, protocol: type
) -> dict[str, Registered]:
    """The objects a hook returns, by name: each of ``protocol``, each name once."""
    table: dict[str, Registered] = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        for obj in impl.function() or []:
            if not isinstance(obj, protocol):
                raise UsageError(
                    f"plugin {impl.plugin_name} returned {obj!r}, which is not a {kind}: it "
                    f"needs the attributes of attrib_bench.{protocol.__name__}"
                )
            if obj.name in table:
                raise UsageError(
                    f"two plugins register the {kind} {obj.name!r}: "
                    f"{table[obj.name].source} and {impl.plugin_name}"
                )
            table[obj.name] = Registered(obj, impl.plugin_name)
    return table


def _collect_trace_fields(pm: pluggy.PluginManager) -> dict[str, Registered]:
    table = {f.name: Registered(f, BUILTIN_SOURCE) for f in BUILTIN_FIELDS}
    for impl in pm.hook.attrib_bench_trace_fields.get_hookimpls():
        for trace_field in impl.function() or []:
            _check_description(
                impl.plugin_name, trace_field, TraceField, "attrib_bench.TraceField", "trace field"
            )
            name = trace_field.name
            if name in table and table[name].source == BUILTIN_SOURCE:
                raise UsageError(
                    f"plugin {impl.plugin_name} registers the trace field {name!r}, which is "
                    f"built in (built-in fields: {', '.join(f.name for f in BUILTIN_FIELDS)})"
                )
            if name in table:
                raise UsageError(
                    f"two plugins register the trace field {name!r}: "
                    f"{table[name].source} and {impl.plugin_name}"
                )
            table[name] = Registered(trace_field, impl.plugin_name)
    return table


def load_registry(plugin_files: Sequence[Path | str] = ()) -> Registry:
    """Discover every installed plugin plus ``plugin_files`` and index their objects by name
    (model families by ``model_type``). Trace fields come first: ``requires`` may name them."""
    registry = Registry()
    entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    pm = _plugin_manager(entry_points, [Path(p) for p in plugin_files], registry)
    registry.trace_fields = _collect_trace_fields(pm)
    fields = list(registry.trace_fields)
    registry.attributors = _collect(
        pm, "attrib_bench_attributors", "attributor", Attributor, fields
    )
    registry.evaluators = _collect(
        pm, "attrib_bench_evaluators", "evaluator", (Evaluator, ModelEvaluator), fields
    )
    registry.architectures = _collect_architectures(pm)
    registry.segment_attributors = _collect_named(
        pm, "attrib_bench_segment_attributors", "segment attributor", SegmentAttributor
    )
    registry.segment_evaluators = _collect_named(
        pm, "attrib_bench_segment_evaluators", "segment evaluator", SegmentEvaluator
    )
    if not plugin_files:  # the names the CLI checks before it imports torch
        write_listing(
            entry_points, registry.attributors, registry.evaluators, bool(registry.broken)
        )
    return registry
