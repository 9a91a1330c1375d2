"""The Python API: what ``attrib-bench run``, ``check`` and ``report`` do, as three functions.

The command line is a thin layer over these; they raise ``attrib_bench.UsageError`` (one line)
for bad input instead of exiting.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from attrib_bench.results.compare import Comparison
    from attrib_bench.results.typed import Result
    from attrib_bench.runner.config import RunPlan

#: A result given as a ``Result``, its document or the path of its JSON file.
Results = Union["Result", Mapping[str, Any], Path, str]


def run(
    config: Path | str | None = None,
    *,
    output: Path | str | None = None,
    quiet: bool = True,
    **settings: Any,
) -> dict[str, Any] | None:
    """Run a benchmark and return its result document (the JSON schema's content as a dict;
    ``load`` gives it as a ``Result``).

    ``config`` is an optional TOML file; ``settings`` override it with the same keys
    (``model``, ``dataset``, ``split``, ``limit``, ``attributors=[...]``, ``evaluators=[...]``,
    ``reference``, ``seed``, ``target``, ``batch_size``, ``device``, ``plugins=[...]``,
    ``shard="i/N"``, ``cache=False``). The result is written to ``output`` (or the file's
    ``output``) when one is given. Under torchrun or accelerate launch only rank 0 gets it;
    the other processes get None.
    """
    from attrib_bench.runner.config import make_plan

    if output is not None:
        settings["output"] = Path(output)
    return run_plan(make_plan(config, settings), quiet=quiet)


def run_plan(plan: RunPlan, quiet: bool = True) -> dict[str, Any] | None:
    """Run a resolved plan (a config merged with overrides): fine-tune if it says so, run,
    and write the result where the plan says. Under torchrun or accelerate launch each process
    runs its shard and rank 0 alone gets (and writes) the merged result; the others get None
    (attrib_bench.runner.distributed)."""
    from attrib_bench.results import write_json
    from attrib_bench.runner.config import build_model
    from attrib_bench.runner.distributed import launched, run_sharded
    from attrib_bench.runner.models import run_config

    if launched():
        document = run_sharded(plan, quiet)
        if document is None:
            return None
    else:
        plan = build_model(plan, quiet=quiet)
        document = run_config(plan.config, quiet=quiet, cache=plan.cache)
        document.update(plan.extra)
    if plan.output is not None:
        write_json(document, plan.output)
    return document


def evaluate(
    attributions: Path | str,
    *,
    method: str | None = None,
    name: str | None = None,
    reduce: str = "l2",
    output: Path | str | None = None,
    quiet: bool = True,
    **settings: Any,
) -> dict[str, Any]:
    """Score attributions computed elsewhere (``attrib-bench evaluate``) and return the result
    document; formats and settings in attrib_bench.runner.outside. ``settings`` are RunConfig
    keys (``model``, ``dataset``, ``limit``, ``evaluators=[...]``, ``reference``, ``target``,
    ...); the result is written to ``output`` when given."""
    from attrib_bench.core.errors import UsageError
    from attrib_bench.results import write_json
    from attrib_bench.runner.outside import evaluate as evaluate_file
    from attrib_bench.runner.state import RunConfig

    try:
        config = RunConfig(**settings)
    except TypeError as error:
        raise UsageError(f"evaluate: {error}") from None
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
    return document


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
    heatmaps beside the random-init floor (HTML), the diagonal tables (Markdown)."""
    import json

    from attrib_bench.core.errors import UsageError
    from attrib_bench.reports.attributions import read_attributions
    from attrib_bench.reports.html import render_html, render_similarity_html
    from attrib_bench.reports.markdown import render_markdown
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
    if is_similarity(raw):
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
