"""Value zeroing (Mohebbi et al., EACL 2023), as the official code computes it.

For layer l and token j, layer l's whole block (attention, residual, LayerNorm, feed-forward,
LayerNorm) is run again on its clean input hidden states with token j's value vectors
(v = x W_V + b_V, every head) set to zero; the attention weights stay as they are. The score of
output token i is the cosine distance between its perturbed and its clean output,

    M^l_ij = 1 - cos(e^l_i(v_j = 0), e^l_i),

rows normalised to sum to 1 over the real tokens (github.com/hmohebbi/ValueZeroing,
``scoring/value_zeroing.py``), and rolled out without the residual: R^1 = M^1,
R^l = M^l R^(l-1) (its ``compute_joint_attention(res=False)``). ``local_BLN`` is the target row of
each M^l, ``aggregated_BLN`` that of each R^l.

Each example runs on its real tokens only, as the official code (one unpadded sentence at a
time), so padding never enters and no attention mask is needed; the n reruns of a layer are one
batched call of the layer on n copies of its input, a forward hook on the value projection
zeroing token j's row in copy j. ``chunk_size`` (default 32) bounds the copies per call: in
float64 a call holds about chunk_size * n * (H n + 3 d_ff) * 8 bytes, ~2 GB for BERT-base at
n = 512. The encoder families all qualify (BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA, DistilBERT,
ALBERT: each layer called alone reproduces the traced hidden states); decoders are refused
through ``needs``, since their layers called alone need a causal mask and position embeddings.

Precision: in MiniLM's lower layers zeroing one token moves [CLS] by cosine distances summing to
1e-5..5e-4, about float32's resolution of 1 - cos near 1. ``precision=float64`` (default) reruns
each layer on a float64 copy of its module, the clean output included, so the distances and their
ranking are exact to float64 rounding; ``precision=model`` reruns the layer (and the clean
output) in the model's dtype and only computes the distances in float64: about twice as fast on a
CPU, normalised rows within ~1e-6 of float64's on MiniLM, and a near-tie in about 1 of 200
[CLS] rows ordered the other way. 1 - cos computed in float32, as the official code's sklearn
call on float32 arrays does, orders almost every lower-layer [CLS] row of MiniLM differently.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace
from attrib_bench.toolkit.aggregation import layerwise_attribution, normalize_rows


def cosine_distances(perturbed_CND: torch.Tensor, clean_ND: torch.Tensor) -> torch.Tensor:
    """1 - cos(perturbed_ci, clean_i), (C, N), in float64, as half the squared distance of the
    unit vectors: no cancellation of 1 - cos where cos is close to 1."""
    unit = nn.functional.normalize(perturbed_CND.double(), dim=-1)
    clean = nn.functional.normalize(clean_ND.double(), dim=-1)
    return 0.5 * (unit - clean).pow(2).sum(dim=-1)


def _output(module: nn.Module, hidden_CND: torch.Tensor) -> torch.Tensor:
    out = module(hidden_CND)
    return out[0] if isinstance(out, tuple) else out


def zeroed_outputs(
    layer: nn.Module, value: nn.Module, hidden_ND: torch.Tensor, zeroed: torch.Tensor
) -> torch.Tensor:
    """The layer's outputs (C, N, D) on C copies of one unpadded input, copy c with the value
    vectors of token ``zeroed[c]`` set to zero (a negative index zeroes nothing)."""
    copies = zeroed.shape[0]
    keep_CN1 = torch.ones(copies, hidden_ND.shape[0], 1, dtype=hidden_ND.dtype)
    real = zeroed >= 0
    keep_CN1[torch.arange(copies)[real], zeroed[real]] = 0.0
    keep_CN1 = keep_CN1.to(hidden_ND.device)

    def zero_values(_module: nn.Module, _inputs: tuple, out: torch.Tensor) -> torch.Tensor:
        return out * keep_CN1

    handle = value.register_forward_hook(zero_values)
    try:
        return _output(layer, hidden_ND.expand(copies, -1, -1))
    finally:
        handle.remove()


def layer_matrix(
    layer: nn.Module, value: nn.Module, hidden_ND: torch.Tensor, chunk_size: int
) -> torch.Tensor:
    """M (n, n) of one layer for one unpadded example: M_ij the cosine distance of output i when
    token j's values are zeroed, rows normalised. The clean output comes from the same module
    and dtype as the perturbed ones (the first copy of the first call zeroes nothing)."""
    n = hidden_ND.shape[0]
    zeroed = torch.arange(-1, n)
    outputs = [zeroed_outputs(layer, value, hidden_ND, part) for part in zeroed.split(chunk_size)]
    outputs_CND = torch.cat(outputs)
    distances_JN = cosine_distances(outputs_CND[1:], outputs_CND[0])
    return normalize_rows(distances_JN.T)


class ValueZeroing(Configurable):
    """Per layer, the cosine distance of each output token when one token's values are zeroed.

    Reference: Mohebbi, Zuidema, Chrupała & Alishahi 2023, "Quantifying Context Mixing in
    Transformers", EACL.
    """

    name = "value-zeroing"
    passes = "n + 1 reruns of every layer per example of n tokens"
    description = (
        "Value zeroing (Mohebbi 2023): cosine distance of each layer's output when a token's "
        "values are zeroed; rollout without residual"
    )
    requires = frozenset({"hidden_states"})
    #: Calling one layer alone without a mask and position embeddings is right for
    #: bidirectional post-LN encoders only: a causal or rotary decoder layer needs both.
    needs = {"block": "post-ln", "mask": "bidirectional"}
    #: n + 1 reruns of every layer per example of n tokens, in float64: select it by name.
    in_default_run = False
    family = "decomposition"
    parameters = {"precision": "float64", "chunk_size": 32}
    choices = {"precision": ("float64", "model")}
    parameter_docs = {
        "precision": "float64: each layer rerun on a float64 copy (the tiny distances ranked "
        "exactly); model: rerun in the model's dtype, distances in float64 (about 2x faster "
        "on a CPU, rows within ~1e-6)",
        "chunk_size": "the most copies of a layer's input (one per zeroed token) in one call; "
        "bounds memory, about chunk_size * n * (H n + 3 d_ff) * 8 bytes; an integer >= 1",
    }

    def validate(self) -> None:
        if self.params["chunk_size"] < 1:
            raise self.out_of_range("chunk_size", "at least 1")

    def attribute(self, trace: Trace) -> Attribution:
        adapter = trace.adapter
        path = adapter.spec.value
        high = self.params["precision"] == "float64"
        copies: dict[int, nn.Module] = {}  # a shared layer (ALBERT) is copied once
        lengths = trace.batch.lengths
        batch, width = trace.mask_BN.shape
        matrices = []
        with torch.no_grad():
            for index, module in enumerate(adapter.layer_sequence):
                if high and id(module) not in copies:
                    copies[id(module)] = copy.deepcopy(module).double()
                layer = copies[id(module)] if high else module
                value = layer.get_submodule(path)
                inputs_BND = trace.hidden_states[index]
                matrix_BNK = torch.zeros(
                    batch, width, width, dtype=torch.float64, device=inputs_BND.device
                )
                for row, n in enumerate(lengths):
                    hidden_ND = inputs_BND[row, :n]
                    hidden_ND = hidden_ND.double() if high else hidden_ND
                    matrix_BNK[row, :n, :n] = layer_matrix(
                        layer, value, hidden_ND, self.params["chunk_size"]
                    )
                matrices.append(matrix_BNK)
        return layerwise_attribution(matrices, trace.mask_BN, positions_B=trace.target_positions_B)


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [ValueZeroing()]
