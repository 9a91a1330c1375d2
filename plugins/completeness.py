"""Completeness (Quantus's axiomatic family, for tokens): do a method's attributions add up to
the score they explain?

Only a method that claims it is scored (``AttributorInfo.completeness``, read through
``attrib_bench.toolkit.completeness``): Integrated Gradients with ``reduce=sum`` claims that an
example's scores sum to f(x) - f(x'), x' its [PAD] baseline (the completeness axiom of
Sundararajan et al. 2017; with ``steps`` path points the gap is Captum's convergence delta, so
it shrinks as steps grow); DecompX with its head claims they sum to the explained logit f(x),
every bias included. Per example the score is |sum_i a_i - (f(x) - f(x'))| (f(x') = 0 for a
claim of the score itself), or with ``relative=true`` that gap divided by |f(x) - f(x')|.
Lower is better; 0 is the claim held exactly.

A method that claims nothing is NaN for every example, with one warning per method naming it:
a norm per token, an attention weight or a removal effect sums to no score. Captum's DeepLift
makes no claim here: on a transformer it cannot apply its rescale rule to GELU, the attention
softmax or LayerNorm, and its sums miss f(x) - f(x') by as much as the plain gradient x input's
(tests/test_completeness.py). Cost: two forward passes per example (one for a claim of the
score), each example alone over its real tokens.
"""

from __future__ import annotations

import numpy as np

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext
from attrib_bench.core import console
from attrib_bench.toolkit.completeness import completeness_terms


class Completeness(Configurable):
    """|sum of the attributions - the explained score's change from the method's baseline|.

    Reference: Sundararajan, Taly & Yan 2017, "Axiomatic Attribution for Deep Networks", ICML
    (completeness); Shrikumar, Greenside & Kundaje 2017, "Learning Important Features Through
    Propagating Activation Differences", ICML (summation-to-delta).
    """

    name = "completeness"
    description = (
        "|sum of scores - (f(x) - f(baseline))| for methods that claim completeness; lower is "
        "better"
    )
    needs_reference = False
    in_default_run = False
    higher_is_better = False
    family = "axiomatic"
    parameters = {"relative": False}
    parameter_docs = {
        "relative": "divide each example's gap by |f(x) - f(baseline)| (|f(x)| for a method "
        "whose scores sum to the score itself)",
    }

    #: Methods this configured copy has warned about (rebound, never mutated: a copy made by
    #: ``configure`` starts with its own).
    warned: frozenset[str] = frozenset()

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        if context.attributor is None:
            raise ValueError("completeness needs the attributor, to read what it claims")
        terms = completeness_terms(context.attributor, context.trace, attribution)
        if terms is None:
            name = context.attributor.name
            if name not in self.warned:
                self.warned = self.warned | {name}
                console.warn(
                    f"completeness: {name} claims no completeness (its scores sum to no score), "
                    "so it is NaN; integrated-gradients:reduce=sum and decompx claim it"
                )
            return {"aggregated": np.full((1, len(context.trace.batch.examples)), np.nan)}
        gaps_B = np.abs(terms.sums_B - terms.expected_B)
        if self.params["relative"]:
            expected_B = np.abs(terms.expected_B)
            with np.errstate(divide="ignore", invalid="ignore"):
                gaps_B = np.where(expected_B > 0, gaps_B / expected_B, np.nan)
        return {"aggregated": gaps_B[None]}


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [Completeness()]
