"""Hidden-token attribution, HTA (Brunner et al., ICLR 2020): docs/math/identifiability.md, eq. (4).

The contribution of input token i (its embedding output x_i) to hidden token j after layer l:

    c^l_ij = ||d e_j^l / d x_i|| / sum_k ||d e_j^l / d x_k||

``norm=frobenius`` (default) takes the Frobenius norm of the exact d x d Jacobian block: d
backward passes per layer, vectorised with ``torch.func.jacrev``/``vmap``. ``norm=sum``
differentiates the sum of e_j^l's coordinates (one backward pass per layer and target) and takes
the L2 norm of that gradient. The attributor reports j = the run's target token per layer ([CLS]
by default; ``Trace.target_positions_B``); each layer's row already accounts for every layer
below it, so it is the "aggregated" row (there is no single-layer row).
Examples run one at a time on their real tokens, so padding never enters.
"""

from __future__ import annotations

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace
from attrib_bench.toolkit.token_contributions import contributions


class HiddenTokenAttribution(Configurable):
    """Per layer, each input token's share of the Jacobian norms of the target hidden token.

    Reference: Brunner et al. 2020, "On Identifiability in Transformers", ICLR
    (hidden-token attribution).
    """

    name = "hta"
    passes = "d backward per layer and example (norm=sum: 1 per layer)"
    description = "Hidden-token attribution (Brunner et al. 2020): Jacobian-norm share per layer"
    requires = frozenset({"hidden_states"})
    #: It runs the layers one by one through the adapter: any family with a spec will do.
    needs: dict[str, str] = {}
    #: d backward passes per layer and example: seconds per example on a CPU; select it by name.
    in_default_run = False
    family = "gradient"
    parameters = {"norm": "frobenius", "chunk_size": 256}
    choices = {"norm": ("frobenius", "sum")}
    parameter_docs = {
        "norm": "frobenius: the Frobenius norm of the exact d x d Jacobian block (d backward "
        "passes per layer); sum: the L2 norm of the gradient of the hidden state's coordinate "
        "sum (one backward pass per layer), the cheap variant",
        "chunk_size": "the most backward passes torch.func.jacrev vectorises at once; bounds "
        "memory, not the result; an integer >= 1",
    }

    def attribute(self, trace: Trace) -> Attribution:
        x_BND = trace.hidden_states[0]
        scores_BLN = torch.zeros(x_BND.shape[0], trace.num_layers, x_BND.shape[1])
        positions = trace.target_positions_B.tolist()
        for row, length in enumerate(trace.batch.lengths):
            rows_L1N = contributions(
                trace.loaded,
                x_BND[row, :length],
                self.params["norm"],
                targets=(positions[row],),
                chunk_size=self.params["chunk_size"],
            )
            scores_BLN[row, :, :length] = rows_L1N[:, 0].cpu()
        return Attribution(aggregated_BLN=scores_BLN.to(x_BND.device))


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [HiddenTokenAttribution()]
