"""The Python API: one function per ``attrib-bench`` command, so that Python does all the
command line does.

The command line is a thin layer over these: it parses its flags, calls one of them and prints
what it returns. They raise ``attrib_bench.UsageError`` (one line) for bad input instead of
exiting. Runs return a typed :class:`~attrib_bench.results.Result`; its JSON is the file
``--output`` writes.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Union

if TYPE_CHECKING:
    from attrib_bench.core.plugin_info import PluginInfo
    from attrib_bench.core.registry import Registered, Registry
    from attrib_bench.results.compare import Comparison
    from attrib_bench.results.typed import Result
    from attrib_bench.runner.config import RunPlan
    from attrib_bench.runner.meta import MetaResult

#: A result given as a ``Result``, its document or the path of its JSON file.
Results = Union["Result", Mapping[str, Any], Path, str]


def run(
    config: Path | str | None = None,
    *,
    output: Path | str | None = None,
    quiet: bool = True,
    meta: bool | str = False,
    **settings: Any,
) -> Result | None:
    """Run a benchmark and return its result.

    ``config`` is an optional TOML file; ``settings`` override it with the same keys
    (``model``, ``dataset``, ``split``, ``limit``, ``attributors=[...]``, ``evaluators=[...]``,
    ``reference``, ``seed``, ``target``, ``batch_size``, ``device``, ``plugins=[...]``,
    ``shard="i/N"``, ``cache=False``). The result is written to ``output`` (or the file's
    ``output``) when one is given. Under torchrun or accelerate launch only rank 0 gets it;
    the other processes get None. ``meta``: add the meta-evaluation of the run's evaluators
    (:func:`meta`) as the result's ``meta`` section, with the reference method (True) or the
    method named as its base.
    """
    from attrib_bench.runner.config import make_plan

    if output is not None:
        settings["output"] = Path(output)
    return run_plan(make_plan(config, settings), quiet=quiet, meta=meta)


def run_plan(plan: RunPlan, quiet: bool = True, meta: bool | str = False) -> Result | None:
    """Run a resolved plan (a config merged with overrides): fine-tune if it says so, run,
    and write the result where the plan says. Under torchrun or accelerate launch each process
    runs its shard and rank 0 alone gets (and writes) the merged result; the others get None
    (attrib_bench.runner.distributed)."""
    from attrib_bench.results import Result, check_writable, write_json
    from attrib_bench.runner.config import build_model
    from attrib_bench.runner.distributed import launched, refuse, run_sharded
    from attrib_bench.runner.models import run_config

    if plan.output is not None:
        check_writable(plan.output)
    if launched():
        if meta:
            refuse("run --meta runs in one process, not under torchrun or accelerate launch")
        document = run_sharded(plan, quiet)
        if document is None:
            return None
    else:
        plan = build_model(plan, quiet=quiet)
        section = None
        if meta:  # first: its settings are checked before the run's work
            from attrib_bench.runner.meta import run_section

            section = run_section(plan.config, None if meta is True else meta, quiet)
        document = run_config(plan.config, quiet=quiet, cache=plan.cache)
        document.update(plan.extra)
        if section is not None:
            document["meta"] = section
    result = Result.from_document(document)
    if plan.output is not None:
        write_json(document, plan.output)
        result.source = str(plan.output)
    return result


def run_settings(flags: Mapping[str, Any]) -> dict[str, Any]:
    """For command lines: the run settings among parsed flags (``vars(args)``), as :func:`run`
    takes them: the ``RunConfig`` fields given (not None), ``--plugin`` as ``plugins``,
    ``--no-cache`` as ``cache=False``."""
    from dataclasses import fields

    from attrib_bench.runner.state import RunConfig

    names = {f.name for f in fields(RunConfig)}
    settings = {key: value for key, value in flags.items() if key in names and value is not None}
    if flags.get("plugin"):
        settings["plugins"] = flags["plugin"]
    if flags.get("no_cache"):
        settings["cache"] = False
    return settings


def evaluate(
    attributions: Path | str,
    *,
    method: str | None = None,
    name: str | None = None,
    reduce: str = "l2",
    output: Path | str | None = None,
    quiet: bool = True,
    **settings: Any,
) -> Result:
    """Score attributions computed elsewhere (``attrib-bench evaluate``) and return the result;
    formats and settings in attrib_bench.runner.outside. ``settings`` are RunConfig
    keys (``model``, ``dataset``, ``limit``, ``evaluators=[...]``, ``reference``, ``target``,
    ...); the result is written to ``output`` when given."""
    from attrib_bench.results import Result, check_writable, write_json
    from attrib_bench.runner.distributed import launched, refuse
    from attrib_bench.runner.outside import evaluate as evaluate_file
    from attrib_bench.runner.state import RunConfig

    if launched():  # every process would score the whole file
        refuse("evaluate runs in one process, not under torchrun or accelerate launch")
    if output is not None:
        check_writable(Path(output))
    config = _config(RunConfig, "evaluate", settings)
    document = evaluate_file(
        Path(attributions),
        config,
        method=method,
        name=name,
        reduce=reduce,
        quiet=quiet,
        keep_seed="seed" in settings,
    )
    if output is not None:
        write_json(document, Path(output))
    return Result.from_document(document)


def load(results: Results) -> Result:
    """A result as a typed ``attrib_bench.results.Result``: from the path of its JSON file or a
    document (validated first), or a ``Result`` as is."""
    from attrib_bench.results.typed import as_result

    return as_result(results)


def check(
    results: Results,
    baseline: Results,
    *,
    tolerance: float | None = None,
    all_layers: bool = False,
    seed: int = 0,
    allow_removed: Collection[str] = (),
    allow_model_change: bool = False,
    allow_reference_change: bool = False,
) -> Comparison:
    """Compare a result with a baseline (the CI gate): ``.passed``, ``.exit_code``, ``.rows``
    and ``attrib_bench.reports.gate_markdown`` say what changed. A method gone from the
    results is a regression unless named in ``allow_removed``; a different model or reference
    is a UsageError unless allowed."""
    from attrib_bench.results.compare import DEFAULT_TOLERANCE, compare

    return compare(
        load(results),
        load(baseline),
        tolerance=DEFAULT_TOLERANCE if tolerance is None else tolerance,
        all_layers=all_layers,
        seed=seed,
        allow_removed=allow_removed,
        allow_model_change=allow_model_change,
        allow_reference_change=allow_reference_change,
    )


def report(
    results: Results,
    *,
    html: Path | str | None = None,
    markdown: Path | str | None = None,
    attributions: Path | str | None = None,
    examples: int = 6,
) -> str:
    """The Markdown report of a result; also written to ``markdown`` and, as a self-contained
    HTML page, to ``html`` when given. Token heatmaps come from ``attributions`` (a JSONL file
    of ``attrib-bench attribute``) or the run's cache.

    A similarity result (``attrib-bench similarity --output``, ``"schema":
    "attrib-bench/similarity"``) gets its own report: per model pair each measure's layer
    heatmaps beside the random-init floor (HTML), the diagonal tables (Markdown). So does a
    segment report (``attrib-bench context --output``, ``"kind": "segments"``): per example
    each segment's score under each method, and the step x segment matrices."""
    import json

    from attrib_bench.core.errors import UsageError
    from attrib_bench.reports.attributions import read_attributions
    from attrib_bench.reports.html import render_html, render_similarity_html
    from attrib_bench.reports.markdown import render_markdown
    from attrib_bench.reports.segments import is_segments, render_segments_html, segments_markdown
    from attrib_bench.reports.similarity import (
        is_similarity,
        render_similarity_markdown,
        validate_similarity,
    )

    if examples < 0:
        raise UsageError(f"examples must be at least 0, got {examples}")
    raw, name = results, "results"
    if isinstance(results, (str, Path)):
        name = str(results)
        try:
            raw = json.loads(Path(results).read_text())
        except (OSError, ValueError):
            raw = None  # load() says what is wrong with the file
    if is_segments(raw):
        if attributions is not None:
            raise UsageError("attributions are for run results; a segment report has none")
        page = render_segments_html(raw, examples) if html is not None else None
        text = segments_markdown(raw, examples)
    elif is_similarity(raw):
        if attributions is not None:
            raise UsageError("attributions are for run results; a similarity result has none")
        validate_similarity(raw, name)
        page = render_similarity_html(raw) if html is not None else None
        text = render_similarity_markdown(raw)
    else:
        if isinstance(raw, Mapping) and "methods" not in raw:
            raise UsageError(
                f"{name!r} is neither an attrib-bench run result (no 'methods') nor a similarity "
                f'result (no "schema": "attrib-bench/similarity"; it has '
                f"{raw.get('schema')!r})"
            )
        document = load(results)
        rows = read_attributions(Path(attributions)) if attributions is not None else None
        page = render_html(document, rows, examples) if html is not None else None
        text = render_markdown(document, rows, examples)
    if html is not None:
        Path(html).parent.mkdir(parents=True, exist_ok=True)
        Path(html).write_text(page)
    if markdown is not None:
        Path(markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(markdown).write_text(text)
    return text


def meta(
    *,
    base: str | None = None,
    evaluators: Sequence[str] | None = None,
    only: str | None = None,
    output: Path | str | None = None,
    quiet: bool = True,
    **settings: Any,
) -> MetaResult:
    """Meta-evaluate the evaluators (``attrib-bench meta``): how far each orders a base method's
    degradations (0 to 100% of the scores replaced by noise, then the ranking reversed) as
    known in advance, on a synthetic bag-of-tokens model whose exact attribution is the base,
    and on the run's model (``base``: default the reference method). ``evaluators``: default
    every faithfulness evaluator; ``only``: ``"synthetic"`` or ``"model"``. ``settings`` are
    RunConfig keys (``model``, ``dataset``, ``limit``, ``seed``, ...); the JSON is written to
    ``output`` when given (attrib_bench.runner.meta)."""
    from attrib_bench.results import check_writable, write_json
    from attrib_bench.runner.meta import meta as meta_evaluation
    from attrib_bench.runner.state import RunConfig

    if output is not None:
        check_writable(Path(output))
    config = _config(RunConfig, "meta", settings)
    result = meta_evaluation(config, base, evaluators, only, quiet)
    if output is not None:
        write_json(result.to_document(), Path(output))
        result.source = str(output)
    return result


def _config(kind: Any, command: str, settings: Mapping[str, Any]) -> Any:
    """``kind(**settings)``, a misspelt or missing key as one UsageError naming the command."""
    from attrib_bench.core.errors import UsageError

    try:
        return kind(**settings)
    except TypeError as error:
        raise UsageError(f"{command}: {error}") from None


def list_plugins(plugins: Sequence[Path | str] = ()) -> dict[str, list[dict[str, Any]]]:
    """What ``attrib-bench list`` shows: every attributor and evaluator installed (and in the
    ``plugins`` files) with its description, parameters, whether a plain run takes it and its
    plugin; every model family with its capabilities and the attributors it serves; the segment
    methods and evaluators of ``attrib-bench context``.

    >>> listing = list_plugins()
    >>> sorted(listing)
    ['architectures', 'attributors', 'evaluators', 'segment_attributors', 'segment_evaluators']
    >>> "globenc" in [row["name"] for row in listing["attributors"]]
    True
    """
    from attrib_bench.core.registry import load_registry

    registry = load_registry(plugins)
    return {
        "attributors": _plugin_rows(registry, "attributors"),
        "evaluators": _plugin_rows(registry, "evaluators"),
        "architectures": _architecture_rows(registry),
        "segment_attributors": _segment_rows(registry.segment_attributors),
        "segment_evaluators": _segment_rows(registry.segment_evaluators),
    }


def _segment_rows(table: dict[str, Registered]) -> list[dict[str, Any]]:
    """Segment plugins: name, description, reference and parameters (with their choices)."""
    from attrib_bench.core.plugin_info import segment_info

    return [
        {
            "name": name,
            "description": reg.obj.description,
            "reference": getattr(reg.obj, "reference", ""),
            "parameters": _parameters(segment_info(reg.obj)),
            "plugin": reg.source,
        }
        for name, reg in sorted(table.items())
    ]


def _parameters(info: PluginInfo) -> dict[str, dict[str, Any]]:
    """A plugin's parameters: each default, the allowed values where the set is closed, and
    its meaning and range (``parameter_docs``; "" where the plugin documents none)."""
    choices = info.choices
    return {
        key: {
            "default": default,
            **({"choices": list(choices[key])} if key in choices else {}),
            "doc": info.parameter_docs.get(key, ""),
        }
        for key, default in info.parameters.items()
    }


def _plugin_rows(registry: Registry, kind: str) -> list[dict[str, Any]]:
    from attrib_bench.core.interfaces import compares_models

    return [
        {
            "name": name,
            "description": reg.obj.description,
            "family": reg.info.family,
            "parameters": _parameters(reg.info),
            # A third party's attributor runs only when named (Registry.defaults).
            "default_run": reg.info.in_default_run and (reg.shipped or kind != "attributors"),
            # A ModelEvaluator: scored in runs over several models (--models) only.
            "compares_models": compares_models(reg.obj),
            "plugin": reg.source,
            # The class docstring's ``Reference:`` line: the paper, or why there is none.
            "reference": reg.info.reference,
            # An attributor's cost in model passes and the family capabilities it needs.
            **(
                {"passes": reg.info.passes, "needs": dict(reg.info.needs or {})}
                if kind == "attributors"
                else {}
            ),
        }
        for name, reg in sorted(getattr(registry, kind).items())
    ]


def _architecture_rows(registry: Registry) -> list[dict[str, Any]]:
    """Each model family once: its model types, capabilities and plugin, and the attributors
    whose ``needs`` it offers (the check the runner makes before a method's first batch)."""
    from attrib_bench.core.adapter import unmet_capabilities
    from attrib_bench.core.architecture_spec import CAPABILITIES

    families = {id(reg.obj): reg for reg in registry.architectures.values()}.values()
    listing = [
        {
            "model_types": list(reg.obj.model_types),
            "capabilities": {
                capability: getattr(reg.obj, capability) for capability in CAPABILITIES
            },
            "plugin": reg.source,
            "attributors": [
                name
                for name, attributor in sorted(registry.attributors.items())
                if not unmet_capabilities(attributor.obj, reg.obj)
            ],
        }
        for reg in families
    ]
    return sorted(listing, key=lambda family: family["model_types"])


def attribute(
    output: Path | str, config: Path | str | None = None, *, quiet: bool = True, **settings: Any
) -> bool:
    """Write every selected method's attributions for every example to ``output`` (JSON Lines,
    what ``evaluate`` and ``report --attributions`` read); False when a method failed.
    ``config`` and ``settings`` are those of :func:`run`."""
    from attrib_bench.results import check_writable
    from attrib_bench.runner.attribute import write_attributions
    from attrib_bench.runner.config import make_plan
    from attrib_bench.runner.distributed import launched, refuse

    if launched():  # every process would write the whole file
        refuse("attribute runs in one process; split it over machines with --shard i/N")
    check_writable(Path(output))
    return write_attributions(make_plan(config, settings).config, Path(output), quiet=quiet)


def merge(parts: Sequence[Results], *, output: Path | str | None = None) -> Result:
    """Join the results of runs over disjoint examples (``run --shard i/N``) into the result
    of the whole run; written to ``output`` when given."""
    from attrib_bench.results import check_writable
    from attrib_bench.results.merge import merge as merge_results

    if output is not None:
        check_writable(Path(output))
    merged = merge_results([load(part) for part in parts])
    if output is not None:
        merged.save(output)
    return merged


class Finetuned(NamedTuple):
    """A fine-tuned model: its directory (``run(model=...)`` takes it) and what made it (the
    config, training seconds, held-out accuracy)."""

    directory: Path
    metadata: dict[str, Any]


def finetune(
    *,
    seeds: Sequence[int] | None = None,
    output: Path | str | None = None,
    device: str = "auto",
    quiet: bool = True,
    plugins: Sequence[Path | str] = (),
    accuracy_tolerance: float | None = None,
    **settings: Any,
) -> list[Finetuned]:
    """Fine-tune an encoder as a classifier (cached by every input that changes the weights)
    and return the models: one, or with ``seeds`` one per seed in their order (copied to
    ``output``/seed-S). ``settings`` are ``FinetuneConfig`` fields (``model``,
    default the embedded MiniLM; ``dataset``, ``epochs``, ``learning_rate``, ``seed``,
    ``reinit_top``, ``masking``, ...). A masked fine-tune (``masking`` > 0, from the classifier
    ``model``) is refused when it loses more held-out accuracy than ``accuracy_tolerance``
    (default ``attrib_bench.model.finetune.ACCURACY_TOLERANCE``)."""
    from attrib_bench.core.errors import UsageError
    from attrib_bench.core.registry import load_registry
    from attrib_bench.model.finetune import (
        ACCURACY_TOLERANCE,
        FinetuneConfig,
        default_model_source,
        finetune_seeds,
        read_metadata,
    )
    from attrib_bench.model.finetune import finetune as finetune_one

    if seeds is not None and "seed" in settings:
        raise UsageError("give seed (one model) or seeds (one per seed), not both")
    if "reinit_steps" in settings and not settings.get("reinit_top"):
        raise UsageError("reinit_steps needs reinit_top K (K > 0)")
    settings["model"] = settings.get("model") or default_model_source()
    config = _config(FinetuneConfig, "finetune", settings)
    architectures = load_registry(plugins).architecture_specs()
    target = None if output is None else Path(output)
    tolerance = ACCURACY_TOLERANCE if accuracy_tolerance is None else accuracy_tolerance
    checks = {"architectures": architectures, "accuracy_tolerance": tolerance}
    if seeds is None:
        directories = [finetune_one(config, target, device, quiet, **checks)]
    else:
        directories = finetune_seeds(config, seeds, target, device, quiet, **checks)
    return [Finetuned(directory, read_metadata(directory)) for directory in directories]


def identifiability(
    output_dir: Path | str,
    *,
    plugins: Sequence[Path | str] = (),
    **settings: Any,
) -> dict[str, Any]:
    """Brunner et al.'s token identifiability and hidden-token attribution on a model (default:
    the embedded one); writes ``identifiability.json`` and ``.png`` into ``output_dir`` and
    returns the report. ``settings`` are ``IdentifiabilityConfig`` fields."""
    from attrib_bench.analyses.identifiability import IdentifiabilityConfig, run_identifiability
    from attrib_bench.core.registry import load_registry
    from attrib_bench.runner.engine import resolve_model

    architectures = load_registry(plugins).architecture_specs()
    if settings.get("model") is None:
        device = settings.get("device", "auto")
        settings["model"] = resolve_model(None, device, architectures=architectures).model_id
    config = _config(IdentifiabilityConfig, "identifiability", settings)
    return run_identifiability(config, Path(output_dir), architectures=architectures)


def similarity(
    models: Sequence[str],
    *,
    output: Path | str | None = None,
    quiet: bool = True,
    plugins: Sequence[Path | str] = (),
    **settings: Any,
) -> dict[str, Any]:
    """Compare two or more models' representations layer by layer (CKA family, SVCCA, PWCCA,
    learned maps) beside a random-init floor; the report is written to ``output`` when given
    (``report`` renders it, :func:`similarity_plots` draws it). ``settings`` are
    ``SimilarityConfig`` fields."""
    from attrib_bench.analyses.similarity import SimilarityConfig, run_similarity
    from attrib_bench.core.registry import load_registry
    from attrib_bench.results import write_json

    config = _config(SimilarityConfig, "similarity", {"models": list(models), **settings})
    architectures = load_registry(plugins).architecture_specs()
    report = run_similarity(config, quiet=quiet, architectures=architectures)
    if output is not None:
        write_json(report, Path(output))
    return report


def context(
    dataset: Path | str,
    *,
    output: Path | str | None = None,
    quiet: bool = True,
    plugins: Sequence[Path | str] = (),
    **settings: Any,
) -> dict[str, Any]:
    """Segment attribution of a language model's answer to its context (docs/segments.md):
    every segment method, every segment evaluator; the report is written to ``output`` when
    given. ``settings`` are ``ContextConfig`` fields (``model``, ``methods``, ``generate``...)."""
    from attrib_bench.core.registry import load_registry
    from attrib_bench.model.load import load_model
    from attrib_bench.results import write_json
    from attrib_bench.segments.run import ContextConfig, run_segments

    config = _config(ContextConfig, "context", {"dataset": str(dataset), **settings})
    registry = load_registry(plugins)
    loaded = load_model(config.model, config.device, architectures=registry.architecture_specs())
    report = run_segments(config, loaded, registry, quiet=quiet)
    if output is not None:
        write_json(report, Path(output))
    return report


def similarity_plots(report: Mapping[str, Any], folder: Path | str) -> list[Path]:
    """A heatmap PNG per model pair and measure of a :func:`similarity` report, in ``folder``
    (needs matplotlib: ``attrib-bench[plot]``)."""
    from attrib_bench.analyses.similarity import plot_pairs

    return plot_pairs(dict(report), Path(folder))


class Cleared(NamedTuple):
    """What ``clear_cache`` removed: cached example results, bytes freed, from which folder."""

    entries: int
    size_bytes: int
    folder: Path


def clear_cache(*, include_models: bool = False) -> Cleared:
    """Delete the cached results (``attrib-bench cache clear``), and with ``include_models``
    the fine-tuned models too."""
    from attrib_bench.runner.cache import clear, results_root

    entries, size = clear(include_models=include_models)
    return Cleared(entries, size, results_root().parent)
