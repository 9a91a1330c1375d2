"""Complexity of an attribution (Quantus's complexity family, for tokens): how concentrated a
method's scores are over the tokens it could credit.

Both read the method's scored row (its last aggregated row, or ``layer=l``) over the candidate
tokens (real and not special: ``attrib_bench.toolkit.erasure.candidates``), take magnitudes
|a_i| and call no model:

- ``sparseness``: the Gini index of the magnitudes sorted ascending, a_(1) <= ... <= a_(n):
  G = sum_i (2i - n - 1) a_(i) / (n sum_i a_(i)) (Chalasani et al. 2020, as Quantus's
  ``Sparseness`` computes it). 0 when every token gets the same magnitude, (n - 1) / n, its
  maximum, when one token gets everything. Higher is better (a sparser explanation).
- ``complexity``: the Shannon entropy (natural log) of the fractional contributions
  p_i = |a_i| / sum_j |a_j| (Bhatt et al. 2020, Quantus's ``Complexity``): 0 for one token,
  log n, its maximum, for a uniform row. Lower is better.

Quantus adds 1e-7 to every magnitude before the Gini index and 1e-12 inside the logarithm to
avoid dividing by zero; here a row with no candidate or whose magnitudes are all zero is NaN
instead (undefined), so the other rows are the formulas exactly.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import attrib_bench
from attrib_bench import Attribution, Configurable, EvalContext
from attrib_bench.toolkit.erasure import candidates
from attrib_bench.toolkit.ranking import scored_row


def gini_index(magnitudes: np.ndarray) -> float:
    """The Gini index of non-negative values (see the module docstring); NaN for none or all
    zero."""
    n, total = len(magnitudes), float(np.sum(magnitudes))
    if n == 0 or total == 0.0:
        return float("nan")
    ranks = np.arange(1, n + 1)
    return float(np.sum((2 * ranks - n - 1) * np.sort(magnitudes)) / (n * total))


def contribution_entropy(magnitudes: np.ndarray) -> float:
    """The entropy of the fractional contributions |a_i| / sum |a|; NaN for none or all zero."""
    if len(magnitudes) == 0 or float(np.sum(magnitudes)) == 0.0:
        return float("nan")
    from scipy.stats import entropy  # not at `list` time: scipy is heavy to import

    return float(entropy(magnitudes))  # scipy normalises to a distribution, 0 log 0 = 0


class _Complexity(Configurable):
    needs_reference = False
    in_default_run = False  # cheap, but the default run scores agreement alone
    family = "complexity"
    parameters = {"layer": -1}
    parameter_docs = {
        "layer": "the method's row scored: -1, its last aggregated row; l >= 1, layer l's",
    }

    #: The score of one row's candidate magnitudes (each subclass's formula).
    measure: Callable[[np.ndarray], float]

    def validate(self) -> None:
        if self.params["layer"] == 0 or self.params["layer"] < -1:
            raise self.out_of_range("layer", "-1 (last) or a layer number >= 1")

    def score(self, attribution: Attribution, context: EvalContext) -> dict[str, np.ndarray]:
        rows_BN = scored_row(attribution, self.params["layer"]).detach().double().cpu().numpy()
        candidates_BN = candidates(context.trace)
        values = [
            self.measure(np.abs(row_N[keep_N]))
            for row_N, keep_N in zip(rows_BN, candidates_BN, strict=True)
        ]
        return {"aggregated": np.asarray([values], dtype=float)}


class Sparseness(_Complexity):
    """The Gini index of |attribution| over the candidate tokens: 0 uniform, (n - 1) / n one
    token.

    Reference: Chalasani et al. 2020, "Concise Explanations of Neural Networks using
    Adversarial Training", ICML.
    """

    name = "sparseness"
    description = "Gini index of |scores| over real non-special tokens (Quantus); higher is better"
    higher_is_better = True
    measure = staticmethod(gini_index)


class Complexity(_Complexity):
    """The entropy of the fractional contributions |a_i| / sum |a| over the candidate tokens:
    0 one token, log n uniform.

    Reference: Bhatt, Weller & Moura 2020, "Evaluating and Aggregating Feature-based Model
    Explanations", IJCAI.
    """

    name = "complexity"
    description = (
        "Entropy of |scores| / sum |scores| over real non-special tokens (Quantus); lower is better"
    )
    higher_is_better = False
    measure = staticmethod(contribution_entropy)


@attrib_bench.hookimpl
def attrib_bench_evaluators() -> list:
    return [Sparseness(), Complexity()]
