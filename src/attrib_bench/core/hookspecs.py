"""Hook specifications: how a plugin contributes attributors, evaluators, model families and
trace fields."""

from __future__ import annotations

import pluggy

PROJECT = "attrib_bench"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def attrib_bench_attributors() -> list:
    """Return a list of attributor objects (see ``attrib_bench.Attributor``).

    Each object has a unique ``name``; two plugins returning the same name is an error that
    names both plugins. Every plugin's list is collected (this is not a first-result hook).
    """


@hookspec
def attrib_bench_evaluators() -> list:
    """Return a list of evaluator objects (see ``attrib_bench.Evaluator``), unique by ``name``."""


@hookspec
def attrib_bench_architectures() -> list:
    """Return a list of ``attrib_bench.core.adapter.ArchitectureSpec`` objects.

    Each serves the Hugging Face ``model_type``s in its ``model_types``; two plugins serving one
    model type is an error that names both plugins.
    """


@hookspec
def attrib_bench_trace_fields() -> list:
    """Return a list of ``attrib_bench.TraceField`` objects: fields the trace can capture.

    An attributor lists a field's ``name`` in ``requires`` and reads it with
    ``trace.need(name)``. A name that a built-in field (``attrib_bench.TRACE_FIELDS``) or
    another plugin's field has is an error that names both.
    """


@hookspec
def attrib_bench_segment_attributors() -> list:
    """Return a list of segment attributors (``attrib_bench.SegmentAttributor``): methods that
    score a context's segments for the answer's log-probability; unique by ``name``."""


@hookspec
def attrib_bench_segment_evaluators() -> list:
    """Return a list of segment evaluators (``attrib_bench.SegmentEvaluator``), unique by
    ``name``."""
