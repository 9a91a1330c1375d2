"""The conformance kit: every built-in passes it, and it catches each kind of broken plugin with
a message that says what to fix.

Built-ins are enumerated from the registry, so a new one is checked without editing this file.
Broken plugins run on the tiny BERT only: the kit's checks do not depend on the family.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from attrib_bench import Attribution, EvalContext, Trace, TraceField
from attrib_bench.core.registry import load_registry
from attrib_bench.testing import ConformanceError, check_attributor, check_evaluator
from attrib_bench.testing.conformance import EXAMPLES, LayerNormInputs

ROOT = Path(__file__).resolve().parents[1]
FIELD_PLUGIN = ROOT / "tests" / "plugin_fixtures" / "trace_field_plugin.py"
BERT = ("bert",)


#: The sampling methods with fewer samples, and Integrated Gradients with fewer steps: what the
#: kit checks (positions, baselines, determinism, batch independence) does not depend on the
#: count, and the defaults cost 45 s more on the two families here (IG's internal batches are
#: checked by tests/test_batch_independence.py, its steps against Captum by test_gradient.py).
#: These are the only conformance checks of these methods on the kit's families (and, through
#: test_families.py, on every family): tests/test_perturbation.py and test_gradient.py ran the
#: same checks again at these counts.
FEWER_SAMPLES = {
    "integrated-gradients": "integrated-gradients:steps=8",
    "sequential-integrated-gradients": "sequential-integrated-gradients:steps=2",
    "discretized-integrated-gradients": "discretized-integrated-gradients:steps=4",
    "gradient-shap": "gradient-shap:samples=4",
    "smoothgrad": "smoothgrad:samples=4",
    "vargrad": "vargrad:samples=4",
    "shapley-value-sampling": "shapley-value-sampling:samples=3",
    "kernel-shap": "kernel-shap:samples=20",
    "lime": "lime:samples=20",
}
#: The same for evaluators: sMPRT re-runs the method twice per noisy copy (50 by default, 26 s
#: of the kit's evaluator checks here); 4 copies take every path its default does. The
#: robustness evaluators re-run it once per copy (10 by default) and F-Fidelity scores 50
#: random removals per ratio: 3 and 5 take the same paths.
FEWER_EVALUATOR_SAMPLES = {
    "smprt": "smprt:samples=4",
    "sensitivity-max": "sensitivity-max:samples=3",
    "sensitivity-avg": "sensitivity-avg:samples=3",
    "local-lipschitz": "local-lipschitz:samples=3",
    "infidelity": "infidelity:samples=3",
    "ffidelity": "ffidelity:samples=5",
}


def builtin_names(kind: str) -> list[str]:
    registry = load_registry()
    table = registry.attributors if kind == "attributors" else registry.evaluators
    return sorted(name for name, reg in table.items() if reg.source.startswith("attrib-bench "))


def test_the_builtins_are_enumerated():
    # The registry is what is enumerated; make sure it holds the documented built-ins.
    assert set(builtin_names("attributors")) >= {
        "attention",
        "rollout",
        "norm",
        "norm-res",
        "norm-resln",
        "globenc",
        "norm-fixedres",
        "attention-res",
        "effective-attention",
        "hta",
        "saliency",
        "gradient",
        "integrated-gradients",
        "random",
    }
    assert set(builtin_names("evaluators")) >= {
        "spearman",
        "comprehensiveness",
        "sufficiency",
        "masked-accuracy",
        "deletion",
        "insertion",
        "log-odds",
        "token-f1",
        "iou-f1",
        "auprc",
        "sanity",
    }


@pytest.mark.parametrize("name", builtin_names("attributors"))
def test_builtin_attributor_conforms(name):
    report = check_attributor(load_registry().attributor(FEWER_SAMPLES.get(name, name)))
    longest = max(len(e.text.split()) for e in EXAMPLES)
    for family in ("bert", "roberta"):
        assert "aggregated" in report.shapes[family]
        for batch, layers, tokens in report.shapes[family].values():
            assert batch == len(EXAMPLES) and layers in (1, 3) and tokens > longest


@pytest.mark.parametrize("attributor", [None, "saliency"])
@pytest.mark.parametrize("name", builtin_names("evaluators"))
def test_builtin_evaluator_conforms(name, attributor):
    """With the kit's default method (3 layers, both kinds) and a whole-model one (1 layer)."""
    registry = load_registry()
    method = None if attributor is None else registry.attributor(attributor)
    report = check_evaluator(
        registry.evaluator(FEWER_EVALUATOR_SAMPLES.get(name, name)), attributor=method
    )
    for shapes in report.shapes.values():
        assert "aggregated" in shapes
        assert all(batch == len(EXAMPLES) for _, batch in shapes.values())


def test_the_kits_own_method_conforms():
    report = check_attributor(LayerNormInputs())
    assert {kind: shape[1] for kind, shape in report.shapes["bert"].items()} == {
        "aggregated": 3,
        "local": 3,
    }


def test_docs_conformance_example_runs(monkeypatch):
    """The docs' conformance example runs as written, on the docs' example plugin."""
    page = (ROOT / "docs" / "plugins.md").read_text()
    section = page[page.index("## The conformance kit") : page.index("## Evaluators")]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    [example] = [block for block in blocks if "check_attributor" in block]
    assert "check_attributor(ClsMaxAttention())" in example
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "plugin_fixtures"))
    namespace: dict = {}
    exec(compile(example, "docs/plugins.md", "exec"), namespace)
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert tests
    for test in tests:
        test()


# ----------------------------------------------------------------- broken attributors


class LastLayerCls:
    """A conforming method to break: the last layer's [CLS] attention, mean over heads."""

    name = "last-layer-cls"
    description = "Last-layer [CLS] attention, mean over heads"
    requires = frozenset({"attentions"})

    def scores_BN(self, trace: Trace) -> torch.Tensor:
        return trace.need("attentions")[-1][:, :, 0, :].mean(dim=1) * trace.mask_BN

    def attribute(self, trace: Trace) -> Attribution:
        return Attribution(aggregated_BLN=self.scores_BN(trace)[:, None, :])


class TwoDimensional(LastLayerCls):
    def attribute(self, trace):
        return Attribution(aggregated_BLN=self.scores_BN(trace))


class SqueezesBatchOfOne(LastLayerCls):
    def attribute(self, trace):
        return Attribution(aggregated_BLN=self.scores_BN(trace).squeeze(0)[..., None, :])


class PaddingNotZero(LastLayerCls):
    def attribute(self, trace):
        return Attribution(aggregated_BLN=self.scores_BN(trace)[:, None, :] + 0.01)


class NotFinite(LastLayerCls):
    def attribute(self, trace):
        rows_BN = self.scores_BN(trace)
        return Attribution(aggregated_BLN=(rows_BN / (rows_BN * 0))[:, None, :] * trace.mask_BN)


class BatchMaximum(LastLayerCls):
    """Normalised by the largest score of the whole batch, not of the example's own row."""

    def attribute(self, trace):
        rows_BN = self.scores_BN(trace)
        return Attribution(aggregated_BLN=(rows_BN / rows_BN.max())[:, None, :])


class SoftmaxOverPadding(LastLayerCls):
    """Masks after a softmax over every position, padding included."""

    def attribute(self, trace):
        rows_BN = torch.softmax(self.scores_BN(trace), dim=-1) * trace.mask_BN
        return Attribution(aggregated_BLN=rows_BN[:, None, :])


class GlobalRandom(LastLayerCls):
    def attribute(self, trace):
        rows_BN = self.scores_BN(trace) * (1 + torch.rand(trace.mask_BN.shape))
        return Attribution(aggregated_BLN=rows_BN[:, None, :])


class AllZero(LastLayerCls):
    def attribute(self, trace):
        return Attribution(aggregated_BLN=torch.zeros_like(self.scores_BN(trace))[:, None, :])


class Undeclared(LastLayerCls):
    requires = frozenset()


class Raises(LastLayerCls):
    def attribute(self, trace):
        raise ValueError("no attention here")


class ReturnsTensor(LastLayerCls):
    def attribute(self, trace):
        return self.scores_BN(trace)[:, None, :]


class LayerPerExample(LastLayerCls):
    """As many layers as the batch has examples."""

    def attribute(self, trace):
        rows_BN = self.scores_BN(trace)
        return Attribution(aggregated_BLN=rows_BN[:, None, :].expand(-1, len(rows_BN), -1))


class LocalInBatchesOnly(LastLayerCls):
    def attribute(self, trace):
        rows_B1N = self.scores_BN(trace)[:, None, :]
        return Attribution(rows_B1N, local_BLN=rows_B1N if len(rows_B1N) > 1 else None)


class BadInterface(LastLayerCls):
    name = ""
    description = None
    requires = frozenset({"logits"})
    attribute = None


class RequiresList(LastLayerCls):
    requires = ["attentions"]


#: Broken plugins and what the kit's message must say about them.
BROKEN_ATTRIBUTORS = {
    TwoDimensional: ["aggregated_BLN has shape (6, 35); expected (B=6, L or 1, N=35)"],
    SqueezesBatchOfOne: ["on a batch of one example: invalid attribution", "(1, 3)"],
    PaddingNotZero: ["not zero at padded positions", "multiply by trace.mask_BN"],
    NotFinite: ["NaN or infinite values at real tokens"],
    BatchMaximum: ["change when the example is batched", "no statistic of the whole batch"],
    SoftmaxOverPadding: ["change when the example is batched", "before any softmax"],
    GlobalRandom: ["different aggregated rows", "never from torch's global generator"],
    AllZero: ["zero at every real token for 6 of 6 examples", "score the real tokens"],
    Undeclared: ["'attentions' was not captured: add it to the attributor's `requires`"],
    Raises: ["attribute() raised ValueError: no attention here (at test_conformance.py:"],
    ReturnsTensor: ["returned a Tensor; return an attrib_bench.Attribution"],
    LayerPerExample: ["alone: shape (1, 35) instead of (6, 35)"],
    LocalInBatchesOnly: [
        "local rows of 6 of 6 examples change",
        "absent from one of the two results",
    ],
    BadInterface: [
        "set `name`",
        "set `description`",
        "unknown trace fields ['logits']",
        "define `attribute(self, trace) -> attrib_bench.Attribution`",
        "4 problems",
    ],
    RequiresList: ["set `requires`, a frozenset", "not ['attentions']"],
}


@pytest.mark.parametrize("plugin", BROKEN_ATTRIBUTORS, ids=lambda plugin: plugin.__name__)
def test_kit_catches_broken_attributor(plugin):
    with pytest.raises(ConformanceError) as caught:
        check_attributor(plugin(), families=BERT)
    message = str(caught.value)
    for part in BROKEN_ATTRIBUTORS[plugin]:
        assert part in message, message


def test_the_plugins_broken_here_pass_unbroken():
    check_attributor(LastLayerCls())
    check_evaluator(ClsShare())


def test_one_line_per_problem_naming_the_families():
    with pytest.raises(ConformanceError) as caught:
        check_attributor(PaddingNotZero())
    lines = str(caught.value).splitlines()
    assert lines[0] == "'last-layer-cls' does not conform (1 problem):"
    assert lines[1].startswith("- bert, roberta: invalid attribution: aggregated_BLN is not zero")
    assert len(lines) == 2


# -------------------------------------------------------------- under each attribution target


class TargetRow(LastLayerCls):
    """A conforming method that reads the target: the last layer's attention row of the target
    token (``trace.target_positions_B``)."""

    name = "target-row"
    description = "Last-layer attention row of the target token, mean over heads"

    def scores_BN(self, trace: Trace) -> torch.Tensor:
        rows = torch.arange(len(trace.batch.examples))
        last_BHNK = trace.need("attentions")[-1]
        return last_BHNK[rows, :, trace.target_positions_B, :].mean(dim=1) * trace.mask_BN


class PaddedLastRow(TargetRow):
    """Breaks under position=last only: takes the batch's last column, a pad for the shorter."""

    def scores_BN(self, trace):
        if trace.target.position == "first":
            return super().scores_BN(trace)
        return trace.need("attentions")[-1][:, :, -1, :].mean(dim=1) * trace.mask_BN


class NoContrast(TargetRow):
    """Breaks under score=contrastive only: it refuses a foil."""

    def scores_BN(self, trace):
        if trace.target_foils_B is not None:
            raise NotImplementedError("no contrastive scores")
        return super().scores_BN(trace)


def test_the_kit_checks_every_attributor_under_each_kind_of_target():
    report = check_attributor(TargetRow())
    assert report.targets == (
        "position=auto,score=predicted",
        "position=last,score=predicted",
        "position=auto,score=contrastive",
    )
    with pytest.raises(ConformanceError) as caught:
        check_attributor(PaddedLastRow(), families=BERT)
    lines = str(caught.value).splitlines()
    assert len(lines) == 2, lines
    assert lines[1].startswith(
        "- bert: under --target position=last,score=predicted: aggregated rows of "
    )
    assert "change when the example is batched with others" in lines[1]
    with pytest.raises(ConformanceError) as caught:
        check_attributor(NoContrast(), families=BERT)
    lines = str(caught.value).splitlines()
    assert len(lines) == 2, lines
    assert lines[1].startswith(
        "- bert: under --target position=auto,score=contrastive: attribute() raised "
        "NotImplementedError: no contrastive scores"
    )


def test_the_targets_checked_can_be_narrowed():
    """A suite that checks the other targets on other families narrows them: the method broken
    under position=last alone passes under the default target alone, and is caught when
    position=last is asked for."""
    from attrib_bench.core.target import DEFAULT_TARGET, Target

    report = check_attributor(PaddedLastRow(), families=BERT, targets=(DEFAULT_TARGET,))
    assert report.targets == ("position=auto,score=predicted",)
    with pytest.raises(ConformanceError, match="under --target position=last"):
        check_attributor(
            PaddedLastRow(), families=BERT, targets=(DEFAULT_TARGET, Target(position="last"))
        )


def test_a_problem_under_the_default_target_is_reported_once():
    with pytest.raises(ConformanceError) as caught:
        check_attributor(PaddingNotZero(), families=BERT)
    assert "under --target" not in str(caught.value)


# ----------------------------------------------------------------- broken evaluators


class ClsShare:
    """A conforming evaluator to break: the share of each row's total on [CLS] (NaN: no total)."""

    name = "cls-share"
    description = "Share of each row's total score on [CLS]"
    needs_reference = False

    def share_LB(self, attribution: Attribution) -> np.ndarray:
        rows_BLN = attribution.aggregated_BLN.double().numpy()
        with np.errstate(invalid="ignore", divide="ignore"):
            return (rows_BLN[:, :, 0] / rows_BLN.sum(axis=-1)).T

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        return {"aggregated": self.share_LB(attribution)}


class Raising(ClsShare):
    def score(self, attribution, context):
        raise IndexError("no such row")


class RaisesAlone(ClsShare):
    def score(self, attribution, context):
        if len(context.trace.batch.examples) == 1:
            raise ValueError("need two examples")
        return super().score(attribution, context)


class OneDimensional(ClsShare):
    def score(self, attribution, context):
        return {"aggregated": self.share_LB(attribution)[-1]}


class UnknownKey(ClsShare):
    def score(self, attribution, context):
        return {"cls": self.share_LB(attribution)}


class RaisesOnConstant(ClsShare):
    def score(self, attribution, context):
        share_LB = self.share_LB(attribution)
        if np.isnan(share_LB).any():
            raise ZeroDivisionError("the row sums to zero")
        return {"aggregated": share_LB}


class InfiniteOnConstant(ClsShare):
    def score(self, attribution, context):
        with np.errstate(divide="ignore"):
            return {"aggregated": 1 / np.nan_to_num(self.share_LB(attribution))}


class RandomScores(ClsShare):
    def score(self, attribution, context):
        share_LB = self.share_LB(attribution)
        return {"aggregated": share_LB + np.random.default_rng().random(share_LB.shape)}


class CentredOnBatch(ClsShare):
    """Each score minus the batch's mean: depends on what else is in the batch."""

    def score(self, attribution, context):
        share_LB = self.share_LB(attribution)
        return {"aggregated": share_LB - share_LB.mean(axis=1, keepdims=True)}


class PlanMovesScores(ClsShare):
    """A ``plan`` that leaves state behind which ``score`` then reads."""

    def plan(self, attribution, context):
        context.trace.shared["cls-share.offset"] = 1.0

    def score(self, attribution, context):
        return {
            "aggregated": self.share_LB(attribution)
            + context.trace.shared.get("cls-share.offset", 0.0)
        }


class PlanRaises(ClsShare):
    def plan(self, attribution, context):
        raise KeyError("nothing to plan")


class ReferenceUnknown(ClsShare):
    needs_reference = None
    score = None


class PartsWithoutAggregate(ClsShare):
    parts = ("total",)


class PartsString(ClsShare):
    parts = "total"


class PartsMissing(ClsShare):
    parts = ("total",)

    def aggregate(self, values_EP):
        return float(values_EP.mean())


class AggregateRaises(PartsMissing):
    def score(self, attribution, context):
        share_LB = self.share_LB(attribution)
        return {"aggregated": share_LB, "aggregated/total": share_LB}

    def aggregate(self, values_EP):
        raise KeyError("precision")


class AggregateNotANumber(AggregateRaises):
    def aggregate(self, values_EP):
        return values_EP  # the rows, not their score


#: Broken plugins and what the kit's message must say about them.
BROKEN_EVALUATORS = {
    Raising: ["score() raised IndexError: no such row (at test_conformance.py:"],
    RaisesAlone: ["on a batch of one example ('bad'): score() raised ValueError: need two"],
    OneDimensional: ["aggregated scores of shape (6,); expected (layers, 6)"],
    UnknownKey: ["score() returned ['cls']; expected a dict with keys among"],
    RaisesOnConstant: [
        "score() on an attribution that is zero everywhere (constant rows) raised "
        "ZeroDivisionError: the row sums to zero",
        "return NaN for an example that cannot be scored instead of raising",
    ],
    InfiniteOnConstant: ["aggregated scores on constant rows are infinite", "or NaN"],
    RandomScores: ["two calls with seed 0 gave different aggregated scores"],
    CentredOnBatch: ["change when the example is scored alone", "batch_independent=False"],
    PlanMovesScores: ["plan() changed the aggregated scores", "never change what score returns"],
    PlanRaises: ["plan() raised KeyError"],
    ReferenceUnknown: ["set `needs_reference`", "define `score(self, attribution"],
    PartsWithoutAggregate: ["with `parts`, define `aggregate(values_EP) -> float`"],
    PartsString: ["`parts` must be a tuple of column names, not 'total'"],
    PartsMissing: ["score() returned aggregated without its parts ['aggregated/total']"],
    AggregateRaises: ["aggregate() of aggregated parts (6, 1) raised KeyError"],
    AggregateNotANumber: ["aggregate() of aggregated parts (6, 1) returned a ndarray"],
}


@pytest.mark.parametrize("plugin", BROKEN_EVALUATORS, ids=lambda plugin: plugin.__name__)
def test_kit_catches_broken_evaluator(plugin):
    with pytest.raises(ConformanceError) as caught:
        check_evaluator(plugin(), families=BERT)
    message = str(caught.value)
    for part in BROKEN_EVALUATORS[plugin]:
        assert part in message, message


def test_batch_dependent_evaluator_passes_when_declared():
    check_evaluator(CentredOnBatch(), families=BERT, batch_independent=False)


# ----------------------------------------------------------------- plugin trace fields and needs

#: A field defined here, not by any plugin: each layer's key vectors.
KEYS = TraceField("keys", "L tensors (B, N, D): key vectors", modules="attention.self.key")


class KeyNorm:
    name = "key-norm"
    description = "Norm of each token's key vector, per layer"
    requires = frozenset({"keys"})

    def attribute(self, trace: Trace) -> Attribution:
        norms_BLN = torch.stack([k_BND.norm(dim=-1) for k_BND in trace.need("keys")], dim=1)
        return Attribution(aggregated_BLN=norms_BLN * trace.mask_BN[:, None, :])


def test_the_kit_traces_a_plugins_trace_field():
    """The example plugin's ffn-norm, with the fields its file registers."""
    registry = load_registry([FIELD_PLUGIN])
    fields = registry.trace_field_specs()
    report = check_attributor(registry.attributor("ffn-norm"), fields=fields)
    assert {family: shapes["aggregated"][1] for family, shapes in report.shapes.items()} == {
        "bert": 3,
        "roberta": 3,
    }
    assert report.skipped == {}
    # An evaluator checked on it traces the field too.
    check_evaluator(ClsShare(), attributor=registry.attributor("ffn-norm"), fields=fields)


def test_the_kit_traces_a_field_defined_in_a_test():
    report = check_attributor(KeyNorm(), families=BERT, fields={"keys": KEYS})
    assert report.shapes["bert"]["aggregated"][1] == 3


def test_an_unknown_field_names_the_registered_ones_and_the_fix():
    class Misspelled(KeyNorm):
        requires = frozenset({"key"})

    with pytest.raises(ConformanceError) as caught:
        check_attributor(Misspelled(), families=BERT, fields={"keys": KEYS})
    message = str(caught.value)
    listed = "attentions, attn_lrp_graph, cp_lrp_graph, embedding_graph, ffn_post_activations"
    for part in ["unknown trace fields ['key']", listed, "fields="]:
        assert part in message, message
    with pytest.raises(ConformanceError, match=r"unknown trace fields \['keys'\]"):
        check_attributor(KeyNorm(), families=BERT)  # not registered anywhere


def test_a_field_that_cannot_be_captured_is_reported():
    odd = TraceField("odd", "", modules="no.such.module")

    class ReadsOdd(KeyNorm):
        requires = frozenset({"odd"})

    with pytest.raises(ConformanceError) as caught:
        check_attributor(ReadsOdd(), families=BERT, fields={"odd": odd})
    assert "tracing ['odd'] raised UsageError" in str(caught.value)
    assert "has no module 'no.such.module'" in str(caught.value)


class AbsolutePositionsOnly(LastLayerCls):
    """Runs on BERT (absolute positions), not on RoBERTa (positions after the padding)."""

    needs = {"positions": "absolute"}


class PreLnOnly(LastLayerCls):
    """Needs pre-LN blocks: no tiny family has them."""

    needs = {"block": "pre-ln"}


class UnknownCapability(LastLayerCls):
    needs = {"layout": "bert"}


def test_a_family_the_needs_rule_out_is_skipped_and_named_in_the_report():
    report = check_attributor(AbsolutePositionsOnly())
    assert list(report.shapes) == ["bert"]
    assert list(report.skipped) == ["roberta"]
    assert "cannot run on model type 'roberta'" in report.skipped["roberta"]
    assert "it needs absolute positions" in report.skipped["roberta"]
    evaluated = check_evaluator(ClsShare(), attributor=AbsolutePositionsOnly())
    assert list(evaluated.shapes) == ["bert"] and list(evaluated.skipped) == ["roberta"]


def test_needs_no_family_meets_are_a_problem():
    with pytest.raises(ConformanceError) as caught:
        check_attributor(PreLnOnly())
    message = str(caught.value)
    for part in [
        "last-layer-cls cannot run on model type 'bert': it needs pre-LN blocks",
        "cannot run on model type 'roberta'",
        "nothing was checked",
        "declare in `needs` only the capabilities attribute() relies on",
    ]:
        assert part in message, message
    with pytest.raises(ConformanceError, match="run on no family"):
        check_attributor(AbsolutePositionsOnly(), families=("roberta",))
    with pytest.raises(ConformanceError, match="bad `needs`: unknown capability 'layout'"):
        check_attributor(UnknownCapability(), families=BERT)


def test_the_attributor_given_to_the_evaluator_check_is_checked_too():
    with pytest.raises(ConformanceError) as caught:
        check_evaluator(ClsShare(), attributor=PaddingNotZero(), families=BERT)
    assert "the attributor 'last-layer-cls' given to the check failed: invalid attribution" in str(
        caught.value
    )
