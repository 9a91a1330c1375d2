"""Plugin capabilities are declared once: read into a frozen record with documented defaults.

What a plugin documents is read the same way: its paper (the class docstring's ``Reference:``
line), its family and a line per parameter; every built-in has them, ``list_plugins`` shows them.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from pathlib import Path

import pytest

import attrib_bench
from attrib_bench.core.errors import UsageError
from attrib_bench.core.plugin_info import (
    POSITIONS,
    AttributorBase,
    AttributorInfo,
    EvaluatorBase,
    EvaluatorInfo,
    attributor_info,
    evaluator_info,
)
from attrib_bench.core.registry import load_registry

SOURCE = Path(__file__).resolve().parents[1] / "src" / "attrib_bench"
#: Every optional attribute a plugin may declare: the record holds it, nothing else reads it.
OPTIONAL = (
    "in_default_run",
    "target_positions",
    "explained_target",
    "needs",
    "needs_reference",
    "needs_floor",
    "higher_is_better",
    "parts",
    "plan",
    "batch_independent",
    "version",
    "params",
    "parameters",
    "choices",
    "parameter_docs",
    "family",
    "passes",
)
#: A reference names a year and a quoted title, or says plainly that there is none.
CITATION = re.compile(r'^(none \(.+\)\.|.* (19|20)\d\d, ".+", .+)$')


class Minimal:
    name = "minimal"
    description = "the fewest attributes an attributor can have"
    requires = frozenset({"attentions"})

    def attribute(self, trace):
        raise NotImplementedError


class MinimalEvaluator:
    name = "minimal-evaluator"
    description = "the fewest attributes an evaluator can have"
    needs_reference = False

    def score(self, attribution, context):
        raise NotImplementedError


def test_an_attributor_that_declares_nothing_optional_gets_the_documented_defaults():
    info = attributor_info(Minimal())
    assert info == AttributorInfo(
        name="minimal",
        description="the fewest attributes an attributor can have",
        requires=frozenset({"attentions"}),
    )
    assert (info.needs, info.in_default_run, info.target_positions) == (None, True, POSITIONS)
    assert (info.explains_own_target, info.settings, info.version) == (False, None, "0")
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.in_default_run = False  # type: ignore[misc]


def test_an_evaluator_that_declares_nothing_optional_gets_the_documented_defaults():
    info = evaluator_info(MinimalEvaluator())
    assert info == EvaluatorInfo(
        name="minimal-evaluator", description="the fewest attributes an evaluator can have"
    )
    assert (info.higher_is_better, info.parts, info.plans, info.compares_models) == (
        True,
        (),
        False,
        False,
    )


def test_the_base_classes_declare_the_same_defaults_as_the_records():
    class Based(AttributorBase):
        name = "based"
        description = "a subclass of the optional base"
        requires = frozenset({"attentions"})

        def attribute(self, trace):
            raise NotImplementedError

    class BasedEvaluator(EvaluatorBase):
        name = "based-evaluator"
        description = "a subclass of the optional base"

        def score(self, attribution, context):
            raise NotImplementedError

    assert dataclasses.replace(attributor_info(Based()), name="minimal", description="x") == (
        dataclasses.replace(attributor_info(Minimal()), description="x")
    )
    assert dataclasses.replace(
        evaluator_info(BasedEvaluator()), name="minimal-evaluator", description="x"
    ) == dataclasses.replace(evaluator_info(MinimalEvaluator()), description="x")


@pytest.mark.parametrize(
    ("attribute", "value", "needle"),
    [
        ("in_default_run", "yes", "`in_default_run` must be True or False, not 'yes'"),
        ("target_positions", ("middle",), "`target_positions` must be a tuple among"),
        ("needs", ["block"], "`needs` must be a dict"),
    ],
)
def test_a_wrong_declaration_is_one_line_naming_the_plugin(attribute, value, needle):
    plugin = Minimal()
    setattr(plugin, attribute, value)
    with pytest.raises(UsageError, match=re.escape(needle)) as raised:
        attributor_info(plugin)
    assert "'minimal'" in str(raised.value) and "\n" not in str(raised.value)


def test_the_registry_refuses_a_wrong_declaration_at_registration(tmp_path):
    plugin = tmp_path / "wrong.py"
    plugin.write_text(
        "import attrib_bench\n"
        "class Wrong:\n"
        "    name = 'wrong'\n"
        "    description = 'declares its default run as a string'\n"
        "    requires = frozenset({'attentions'})\n"
        "    in_default_run = 'no'\n"
        "    def attribute(self, trace):\n"
        "        raise NotImplementedError\n"
        "@attrib_bench.hookimpl\n"
        "def attrib_bench_attributors():\n"
        "    return [Wrong()]\n"
    )
    with pytest.raises(UsageError, match=r"attributor 'wrong' from file .*in_default_run"):
        load_registry([plugin])


def test_registered_plugins_carry_their_record():
    registry = load_registry()
    rollout = registry.attributors["rollout"]
    assert rollout.info == attributor_info(rollout.obj)
    assert registry.evaluators["spearman"].info.needs_reference is True


def test_the_core_reads_optional_attributes_only_through_the_record():
    """No ``getattr(obj, "in_default_run", True)`` outside the record's reader."""
    pattern = re.compile(r"getattr\([^,]+,\s*\"(" + "|".join(OPTIONAL) + r")\"")
    offenders = [
        f"{path.relative_to(SOURCE)}:{line}"
        for path in SOURCE.rglob("*.py")
        if path.name != "plugin_info.py"
        for line, text in enumerate(path.read_text().splitlines(), start=1)
        if pattern.search(text)
    ]
    assert offenders == []


# ----------------------------------------------------------------- what a plugin documents


class Documented(Minimal):
    """A minimal attributor that documents itself.

    Reference: Someone et al. 2024, "A Title That Runs
        Over Two Lines", Venue.

    Anything after a blank line is no part of it.
    """

    family = "attention"
    parameters = {"residual": 0.5, "seed": 0}
    parameter_docs = {"residual": "share of the identity; in [0, 1)"}


class Inherits(Documented):
    pass


def test_the_reference_is_the_docstring_paragraph_and_the_docs_are_read_once():
    info = attributor_info(Documented())
    assert info.reference == 'Someone et al. 2024, "A Title That Runs Over Two Lines", Venue.'
    assert info.family == "attention"
    assert info.parameter_docs == {"residual": "share of the identity; in [0, 1)"}
    assert attributor_info(Inherits()).reference == info.reference  # a subclass without its own
    assert attributor_info(Minimal()).reference == ""  # no docstring at all


def test_every_builtin_cites_its_paper_and_documents_every_parameter():
    """The methods and evaluators tables of the docs and ``attrib-bench list`` show these."""
    registry = load_registry()
    for kind in ("attributors", "evaluators"):
        for name, registered in getattr(registry, kind).items():
            if not registered.shipped:
                continue
            info = registered.info
            assert CITATION.match(info.reference), (name, info.reference)
            assert info.family, name
            undocumented = set(info.parameters) - set(info.parameter_docs)
            assert not undocumented, (name, undocumented)


THIRD_PARTY = """
    import attrib_bench


    class Plain:
        name = "plain"
        description = "declares nothing it may leave out"
        requires = frozenset({{"attentions"}})
        parameters = {{"width": 3}}
        {extra}

        def attribute(self, trace):
            raise NotImplementedError


    @attrib_bench.hookimpl
    def attrib_bench_attributors():
        return [Plain()]
"""


def third_party(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "plain.py"
    path.write_text(textwrap.dedent(THIRD_PARTY.format(extra=extra)).lstrip())
    return path


def test_list_plugins_shows_references_and_parameter_docs(tmp_path):
    listing = attrib_bench.list_plugins([third_party(tmp_path)])
    rows = {row["name"]: row for kind in ("attributors", "evaluators") for row in listing[kind]}
    rollout = rows["rollout"]
    assert rollout["reference"].startswith('Abnar & Zuidema 2020, "Quantifying Attention Flow')
    assert rollout["family"] == "attention"
    assert rollout["parameters"]["residual"]["default"] == 0.5
    assert rollout["parameters"]["residual"]["doc"].endswith("in [0, 1)")
    assert rows["spearman"]["parameters"]["drop_special"]["doc"]
    assert rows["random"]["reference"].startswith("none (")
    # What a method costs in passes and which family capabilities it needs.
    assert rows["atman"]["passes"] == "n + 1 forward per example of n tokens, batched"
    assert rows["value-zeroing"]["needs"] == {"block": "post-ln", "mask": "bidirectional"}
    assert (rows["rollout"]["passes"], rows["rollout"]["needs"]) == ("", {})
    # A third party's plugin that documents nothing still loads, with the empty defaults.
    plain = rows["plain"]
    assert (plain["reference"], plain["family"]) == ("", "")
    assert plain["parameters"] == {"width": {"default": 3, "doc": ""}}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ('parameter_docs = ["x"]', "`parameter_docs` must be a dict of parameter name"),
        ('parameter_docs = {"width": 3}', "`parameter_docs` must be a dict of parameter name"),
        ('parameter_docs = {"height": "x"}', "documents parameters it does not have: ['height']"),
        ("family = 3", "`family` must be a string, not 3"),
        ("passes = 2", "`passes` must be a string (the passes it costs, in words), not 2"),
    ],
)
def test_a_wrong_documentation_type_is_one_usage_error_naming_the_plugin(tmp_path, extra, needle):
    with pytest.raises(UsageError) as raised:
        attrib_bench.list_plugins([third_party(tmp_path, extra)])
    message = str(raised.value)
    assert message.startswith("attributor 'plain' from file "), message
    assert needle in message and "\n" not in message
