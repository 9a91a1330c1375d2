"""ALTI, Aggregation of Layer-wise Token-to-token Interactions (Ferrando et al. 2022).

Follows the official code (github.com/mt-upc/transformer-contributions, ``src/contributions.py``
and ``normalize_contributions(scaling="min_sum")``). For token i of one post-LN layer, with
f^h(x_j) = (x_j W_V^h + b_V^h) W_O^h from ``toolkit.norm_decomposition`` (value bias kept, b_O
dropped) and g1_i(v) = gamma1 (v - mean(v)) / sqrt(var(u1_i) + eps1) LN1 with the frozen
statistics of its real input u1_i:

    T_i(x_j) = g1_i(sum_h alpha^h_ij f^h(x_j) + [i = j] x_i)
    y_i      = LN1(u1_i), the real LN1 output = sum_j T_i(x_j) + g1_i(b_O) + beta1
    d_ij     = -||y_i - T_i(x_j)||_p            (p = 1, the paper's; p = 2 with distance=l2)
    c_ij     = max(0, d_ij + ||y_i||_p), each row scaled to sum to 1

b_O and beta1 enter y_i but belong to no token, as in the official code. One difference: that
code divides by std(u1_i + eps), which is std(u1_i); here the frozen scale is LN1's own,
sqrt(var(u1_i) + eps1), so that the T_i(x_j) sum back to the real LN1 output exactly.
A pre-LN block (GPT-2, LLaMA) takes the official code's pre-LN branch: no norm is linearised,
T_i(x_j) = sum_h alpha^h_ij f^h(x_j) + [i = j] x_i with f^h reading N1(x_j), and y_i = u1_i, the
residual stream after attention (T_i(x_j) for j > i is 0 under the causal mask, so c_ij = 0).

Aggregation is the official ``compute_joint_attention``: R^1 = C^1, R^l = C^l R^(l-1), no
identity added. Local rows are the target row of C^l, aggregated rows that of R^l.

Cost: the L_p distance of T_i(x_j) to y_i is no norm of a linear map of z_ij (for p = 2 it could
be, through the norm family's Gram form, but L1 cannot), so the (n, n, d) vectors are formed,
in chunks of query rows of at most ``chunk_elements`` elements. The aggregated target row needs
every full C^l below the top layer (R^(l-1) is multiplied by C^l's target row, and R^(l-1) is a
product of full matrices); of the top layer only the target row is computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace
from attrib_bench.toolkit.aggregation import layerwise_attribution, normalize_rows, pair_mask
from attrib_bench.toolkit.norm_decomposition import NEEDS, REQUIRES, layer_inputs

#: The order of each ``distance``'s vector norm.
ORDERS = {"l1": 1, "l2": 2}


@dataclass
class AltiLayer:
    """What one layer's T_i(x_j) are made of, each already through the norm's linear map.

    T_i(x_j) = scale_i * (sum_h alpha^h_ij mapped_f^h(x_j) + [i = j] mapped_x_i), the mapped
    f^h(x_k) stored keys first (B, K, H, D) for the per-key matmul over heads;
    ``dropped_BND`` is what y_i holds besides sum_j T_i(x_j) (the b_O and beta terms).
    """

    attention_BHNK: torch.Tensor
    mapped_BKHD: torch.Tensor
    mapped_x_BND: torch.Tensor
    scale_BN1: torch.Tensor
    resultant_BND: torch.Tensor
    dropped_BND: torch.Tensor

    def _rows(self, tensor_BN_: torch.Tensor, queries_BQ: torch.Tensor) -> torch.Tensor:
        index = queries_BQ.reshape(*queries_BQ.shape, *([1] * (tensor_BN_.dim() - 2)))
        return tensor_BN_.gather(1, index.expand(-1, -1, *tensor_BN_.shape[2:]))

    def transformed(self, queries_BQ: torch.Tensor) -> torch.Tensor:
        """T_i(x_j) for the query tokens i in ``queries_BQ`` (per example) and every key j, laid
        out (B, K, Q, D): keys lead, as the per-key matmul makes them."""
        batch, heads, _, keys = self.attention_BHNK.shape
        index = queries_BQ[:, None, :, None].expand(batch, heads, -1, keys)
        attention_BHQK = self.attention_BHNK.gather(2, index)
        attention_BHQK = attention_BHQK * self._rows(self.scale_BN1, queries_BQ)[:, None]
        vectors_BKQD = attention_BHQK.permute(0, 3, 2, 1) @ self.mapped_BKHD
        own_BQD = self._rows(self.mapped_x_BND * self.scale_BN1, queries_BQ)
        examples = torch.arange(batch, device=queries_BQ.device)[:, None]
        slots = torch.arange(queries_BQ.shape[1], device=queries_BQ.device)[None, :]
        vectors_BKQD[examples, queries_BQ, slots] += own_BQD  # the residual, key i of row i
        return vectors_BKQD

    def contributions(self, queries_BQ: torch.Tensor, order: int) -> torch.Tensor:
        """max(0, ||y_i||_p - ||y_i - T_i(x_j)||_p) for the query rows, (B, Q, K), unnormalised."""
        resultant_BQD = self._rows(self.resultant_BND, queries_BQ)
        difference_BKQD = self.transformed(queries_BQ).neg_().add_(resultant_BQD[:, None])
        distance_BKQ = torch.linalg.vector_norm(difference_BKQD, ord=order, dim=-1)
        size_BQ = torch.linalg.vector_norm(resultant_BQD, ord=order, dim=-1)
        return (size_BQ[:, :, None] - distance_BKQ.transpose(1, 2)).clamp_min(0)


def alti_layer(trace: Trace, layer: int) -> AltiLayer:
    """Layer ``layer``'s pieces, in float64 for a float64 model and float32 otherwise."""
    inputs = layer_inputs(trace, layer)
    dtype = torch.promote_types(inputs.x_BND.dtype, torch.float32)
    output_bias_D = trace.adapter.layer_params(layer).output_bias_D.to(dtype)
    x_BND = inputs.x_BND.to(dtype)
    transformed_BKHD = inputs.transformed_BHKD.to(dtype).transpose(1, 2).contiguous()
    if inputs.post_ln:
        norm = inputs.norm1
        u1_BND = trace.pre_ln1[layer].to(dtype)
        scale_BN1 = inputs.scale1_BN1.to(dtype)
        return AltiLayer(
            attention_BHNK=inputs.attention_BHNK.to(dtype),
            mapped_BKHD=inputs.ln1_map(transformed_BKHD),
            mapped_x_BND=inputs.ln1_map(x_BND),
            scale_BN1=scale_BN1,
            resultant_BND=torch.nn.functional.layer_norm(
                u1_BND, u1_BND.shape[-1:], norm.weight_D.to(dtype), norm.bias_D.to(dtype), norm.eps
            ),
            dropped_BND=inputs.ln1_map(output_bias_D) * scale_BN1 + norm.bias_D.to(dtype),
        )
    u1_BND = trace.pre_ln2[layer].to(dtype)  # the residual stream after attention
    return AltiLayer(
        attention_BHNK=inputs.attention_BHNK.to(dtype),
        mapped_BKHD=transformed_BKHD,
        mapped_x_BND=x_BND,
        scale_BN1=torch.ones_like(u1_BND[..., :1]),
        resultant_BND=u1_BND,
        dropped_BND=output_bias_D.expand_as(u1_BND),
    )


def contribution_rows(
    pieces: AltiLayer, queries_BQ: torch.Tensor, mask_BN: torch.Tensor, order: int, budget: int
) -> torch.Tensor:
    """The normalised contribution rows c_i. of the query tokens, (B, Q, K): computed in chunks
    of query rows whose (B, K, rows, D) vectors hold at most ``budget`` elements (one row at
    least), padded keys and queries zeroed."""
    batch, keys, width = pieces.mapped_x_BND.shape
    step = max(1, budget // (batch * keys * width))
    chunks = [
        pieces.contributions(queries_BQ[:, start : start + step], order)
        for start in range(0, queries_BQ.shape[1], step)
    ]
    rows_BQK = torch.cat(chunks, dim=1)
    real_BN = mask_BN.to(rows_BQK.dtype)
    rows_BQK = rows_BQK * real_BN.gather(1, queries_BQ)[:, :, None] * real_BN[:, None, :]
    return normalize_rows(rows_BQK)


def alti_matrices(trace: Trace, order: int, budget: int) -> list[torch.Tensor]:
    """The per-layer matrices C^l, (B, N, N) in the model's dtype; the top layer's holds only
    each example's target row (all that the local and aggregated target rows read)."""
    mask_BN = trace.mask_BN
    batch, tokens = mask_BN.shape
    all_BQ = torch.arange(tokens, device=mask_BN.device).expand(batch, -1)
    target_BQ = trace.target_positions_B.to(mask_BN.device, torch.long)[:, None]
    matrices = []
    for layer in range(trace.num_layers):
        pieces = alti_layer(trace, layer)
        if layer < trace.num_layers - 1:
            matrix_BNK = contribution_rows(pieces, all_BQ, mask_BN, order, budget)
        else:
            row_B1K = contribution_rows(pieces, target_BQ, mask_BN, order, budget)
            matrix_BNK = row_B1K.new_zeros(batch, tokens, tokens)
            matrix_BNK.scatter_(1, target_BQ[:, :, None].expand(-1, -1, tokens), row_B1K)
        matrices.append(matrix_BNK * pair_mask(mask_BN).to(matrix_BNK.dtype))
    dtype = trace.hidden_states[0].dtype
    return [matrix.to(dtype) for matrix in matrices]


class Alti(Configurable):
    """ALTI: L1 (or L2) distances of each token's transformed vector to the layer output.

    Reference: Ferrando, Gállego & Costa-jussà 2022, "Measuring the Mixing of Contextual
    Information in the Transformer", EMNLP.
    """

    name = "alti"
    description = "ALTI (Ferrando 2022): L1 distance of T_i(x_j) to LN1's output, rolled out"
    requires = REQUIRES
    needs = NEEDS
    family = "decomposition"
    parameters = {"distance": "l1", "chunk_elements": 2**24}
    choices = {"distance": tuple(ORDERS)}
    parameter_docs = {
        "distance": "the vector norm of the distance of T_i(x_j) to the layer output: l1 (the "
        "paper's and the official code's) or l2",
        "chunk_elements": "the most elements of the (n, n, d) transformed vectors formed at "
        "once (chunks of query rows); bounds memory, not the result; an integer >= 1",
    }

    def validate(self) -> None:
        if self.params["chunk_elements"] < 1:
            raise self.out_of_range("chunk_elements", "at least 1")

    def attribute(self, trace: Trace) -> Attribution:
        matrices = alti_matrices(
            trace, ORDERS[self.params["distance"]], self.params["chunk_elements"]
        )
        return layerwise_attribution(matrices, trace.mask_BN, positions_B=trace.target_positions_B)


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [Alti()]
