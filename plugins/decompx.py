"""DecompX (Modarressi et al., ACL 2023), as the official code computes it.

github.com/mohsenfayyaz/DecompX, ``src/modeling_bert.py`` run with its demo's ``DecompXConfig``:
biases included and split by ``absdot``, both LayerNorms, the feed-forward network with
``FFN_approx_type="GeLU_ZO"``, ``aggregation="vector"``, and the pooler and classifier with
``tanh_approx_type="ZO"``.

Token i's representation after layer l is written as a sum over the input tokens k of
decomposition vectors x^l_(i<-k), with sum_k x^l_(i<-k) the real hidden state. Each step of a
post-LN block is linear once its nonlinear parts are frozen at the real input:

- attention and the first residual: z_(i<-k) = sum_h sum_j alpha^h_ij (x^(l-1)_(j<-k) W_V^h) W_O^h
  + x^(l-1)_(i<-k). In the first layer, where x^0_(j<-k) = [j = k] x_j, the value bias stays
  with its token, z_(i<-k) = sum_h alpha^h_ik (x_k W_V^h + b_V^h) W_O^h + [i = k] x_i, and only
  b_O is split; in later layers the bias split is sum_h b_V^h W_O^h + b_O, as in the code.
- every bias b (the attention biases above, both LayerNorm betas, both feed-forward biases, the
  pooler's and the classifier's) is split over tokens k in proportion to |<v_(i<-k), b>|, the
  weights divided by their sum plus 1e-12 (``absdot``);
- LayerNorm: gamma (v - mean(v)) / sqrt(var(u_i) + eps), u_i the real pre-norm vector, then beta;
- feed-forward: W1, b1 split, the activation replaced by its slope from zero at the real
  pre-activation h_i, theta_i = act(h_i) / (h_i + 1e-12) (``GeLU_ZO``), W2, b2 split, and the
  second residual adds the LN1 vectors before LN2;
- the head (``head=true``): the pooler's (or classification head's) dense layer on the first
  token's vectors, its activation by the slope from zero at the real pre-activation, then the
  output layer: per-class logit contributions (B, K, C) that sum to the logits.

Attributions. ``head=true`` scores token k by its contribution to the target score (the
explained class's logit; minus the foil's under a contrastive target): one aggregated row, which
needs ``position=first`` since the head reads the first token. ``head=false`` (the paper's
ablation without the classification head, the fair comparison with GlobEnc and ALTI) scores k by
||x^l_(t<-k)||, the norm of the target token's vector from k after layer l, as the code's
``output_aggregated="norm"``: one aggregated row per layer. No local rows: the vectors are
propagated, never recomputed from one layer alone.

Families: post-LN encoders with BERT's feed-forward layout (BERT, ELECTRA, RoBERTa, XLM-R,
CamemBERT), DistilBERT and ALBERT (the official code covers BERT and RoBERTa); the heads of
their sequence classifiers (BERT's and ALBERT's pooler, RoBERTa's and ELECTRA's classification
heads, DistilBERT's pre-classifier). The feed-forward pre-activations and activations are read
from the trace (two plugin trace fields), not recomputed.

Cost: each example runs on its n real tokens (the cost grows as n^2, so padding would dominate
a batch of mixed lengths). A layer's vectors are (n, n, D), and the feed-forward's (n, n, D_ff)
are formed in chunks of query rows of at most ``chunk_elements`` elements; time grows as
n^2 D D_ff per layer, n times the forward pass's feed-forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

import attrib_bench
from attrib_bench import Attribution, Configurable, Trace, TraceField

if TYPE_CHECKING:
    from attrib_bench.core.adapter import EncoderAdapter, LayerNormParams, LayerParams
    from attrib_bench.core.loaded_model import LoadedModel

#: The feed-forward's two linear layers inside each encoder layer, by model type.
FFN_PATHS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(
        ("bert", "electra", "roberta", "xlm-roberta", "camembert"),
        ("intermediate.dense", "output.dense"),
    ),
    "distilbert": ("ffn.lin1", "ffn.lin2"),
    "albert": ("ffn", "ffn_output"),
}


@dataclass(frozen=True)
class Head:
    """A sequence classifier's head on the first token: dense, activation, output layer (paths
    from the model; ``activation`` is a function name or a module path)."""

    dense: str
    activation: str
    output: str


HEADS: dict[str, Head] = {
    "bert": Head("base_model.pooler.dense", "tanh", "classifier"),
    "albert": Head("base_model.pooler", "tanh", "classifier"),
    **dict.fromkeys(
        ("roberta", "xlm-roberta", "camembert"),
        Head("classifier.dense", "tanh", "classifier.out_proj"),
    ),
    "electra": Head("classifier.dense", "classifier.activation", "classifier.out_proj"),
    "distilbert": Head("pre_classifier", "relu", "classifier"),
}
FUNCTIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "relu": torch.relu,
}
#: The official code's guard against division by zero in the bias weights and slopes.
TINY = 1e-12


def _ffn_modules(adapter: EncoderAdapter, which: int) -> list[nn.Module]:
    paths = FFN_PATHS.get(adapter.model.config.model_type)
    if paths is None:
        return []  # the attributor says which families it serves
    return [layer.get_submodule(paths[which]) for layer in adapter.layers]


FIELDS = (
    TraceField(
        "ffn_pre_activations",
        "L tensors (B, N, D_ff): the feed-forward's first linear layer's output, before the "
        "activation",
        modules=lambda adapter: _ffn_modules(adapter, 0),
        keep="output",
    ),
    TraceField(
        "ffn_post_activations",
        "L tensors (B, N, D_ff): the feed-forward's activations (its second linear layer's input)",
        modules=lambda adapter: _ffn_modules(adapter, 1),
        keep="input",
    ),
)


def split_bias(vectors_IKD: torch.Tensor, bias_D: torch.Tensor) -> torch.Tensor:
    """``vectors`` (..., K, D) plus ``bias`` shared over the K tokens by |<v_k, bias>|, in
    place (every caller passes a fresh tensor: the feed-forward's are the largest of a run)."""
    weights_IK = (vectors_IKD @ bias_D).abs_()
    weights_IK /= weights_IK.sum(dim=-1, keepdim=True) + TINY
    return vectors_IKD.addcmul_(weights_IK[..., None], bias_D)


def layer_norm_vectors(
    vectors_BNKD: torch.Tensor, pre_norm_BND: torch.Tensor, norm: LayerNormParams
) -> torch.Tensor:
    """The norm applied to each vector with the frozen scale of the real input, beta split."""
    dtype = vectors_BNKD.dtype
    pre_norm_BND = pre_norm_BND.to(dtype)
    scale_BN11 = torch.rsqrt(pre_norm_BND.var(dim=-1, unbiased=False, keepdim=True) + norm.eps)
    normed_BNKD = vectors_BNKD - vectors_BNKD.mean(dim=-1, keepdim=True)
    normed_BNKD.mul_(scale_BN11[:, :, None]).mul_(norm.weight_D.to(dtype))
    return split_bias(normed_BNKD, norm.bias_D.to(dtype))


def slope(output: torch.Tensor, pre_activation: torch.Tensor) -> torch.Tensor:
    """An activation's slope from zero, act(h) / (h + 1e-12), as the code's ``_zo`` variants."""
    return output / (pre_activation + TINY)


@dataclass
class FeedForward:
    """One layer's feed-forward, its activation frozen at the real pre-activations."""

    first: nn.Linear
    second: nn.Linear
    theta_BNF: torch.Tensor

    def vectors(self, vectors_BQKD: torch.Tensor, rows: slice) -> torch.Tensor:
        """The feed-forward's decomposition vectors of the query rows ``rows``."""
        dtype = vectors_BQKD.dtype
        hidden_BQKF = vectors_BQKD @ self.first.weight.to(dtype).T
        hidden_BQKF = split_bias(hidden_BQKF, self.first.bias.to(dtype))
        hidden_BQKF.mul_(self.theta_BNF[:, rows, None].to(dtype))
        out_BQKD = hidden_BQKF @ self.second.weight.to(dtype).T
        return split_bias(out_BQKD, self.second.bias.to(dtype))


@dataclass
class Traced:
    """What DecompX reads of the trace, per layer, for some examples and tokens: the whole
    padded batch, or one example's real tokens (``Traced.example``)."""

    attentions: list[torch.Tensor]
    hidden_states: list[torch.Tensor]
    values: list[torch.Tensor]
    pre_ln1: list[torch.Tensor]
    pre_ln2: list[torch.Tensor]
    pre_activations: list[torch.Tensor]
    activations: list[torch.Tensor]

    @classmethod
    def of(cls, trace: Trace) -> Traced:
        return cls(
            attentions=list(trace.attentions),
            hidden_states=list(trace.hidden_states),
            values=list(trace.values),
            pre_ln1=list(trace.pre_ln1),
            pre_ln2=list(trace.pre_ln2),
            pre_activations=list(trace.need("ffn_pre_activations")),
            activations=list(trace.need("ffn_post_activations")),
        )

    def example(self, row: int, length: int) -> Traced:
        """Example ``row`` on its ``length`` real tokens: the cost grows as n^2 per example,
        so padding is not computed."""
        tokens = slice(0, length)
        return Traced(
            attentions=[a[row : row + 1, :, tokens, tokens] for a in self.attentions],
            **{
                name: [t[row : row + 1, tokens] for t in getattr(self, name)]
                for name in (
                    "hidden_states",
                    "values",
                    "pre_ln1",
                    "pre_ln2",
                    "pre_activations",
                    "activations",
                )
            },
        )


def attention_vectors(
    adapter: EncoderAdapter,
    params: LayerParams,
    traced: Traced,
    layer: int,
    previous_BNKD: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Attention and the first residual, before LN1, with the attention biases split."""
    attention_BHNK = traced.attentions[layer].to(dtype)
    output_weight_HED = params.output_weight_HED.to(dtype)
    if previous_BNKD is None:  # the first layer: x^0_(j<-k) = [j = k] x_j
        values_BKHE = adapter.query_head_values(traced.values[layer]).to(dtype)
        transformed_BHKD = torch.einsum("bkhe,hed->bhkd", values_BKHE, output_weight_HED)
        vectors_BNKD = torch.einsum("bhnk,bhkd->bnkd", attention_BHNK, transformed_BHKD)
        own = torch.arange(vectors_BNKD.shape[1], device=vectors_BNKD.device)
        vectors_BNKD[:, own, own] += traced.hidden_states[layer].to(dtype)
        bias_D = params.output_bias_D.to(dtype)
    else:
        values_BSKHE = torch.einsum(
            "bskd,hde->bskhe", previous_BNKD, params.value_weight_HDE.to(dtype)
        )
        mixed_BNKHE = torch.einsum("bhns,bskhe->bnkhe", attention_BHNK, values_BSKHE)
        del values_BSKHE
        vectors_BNKD = torch.einsum("bnkhe,hed->bnkd", mixed_BNKHE, output_weight_HED)
        vectors_BNKD += previous_BNKD
        value_bias_HE = params.value_bias_HE.to(dtype)
        bias_D = torch.einsum("he,hed->d", value_bias_HE, output_weight_HED)
        bias_D = bias_D + params.output_bias_D.to(dtype)
    return split_bias(vectors_BNKD, bias_D)


def layer_vectors(
    adapter: EncoderAdapter,
    traced: Traced,
    layer: int,
    previous_BNKD: torch.Tensor | None,
    budget: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """x^l_(i<-k) for every token i and input token k, (B, N, K, D)."""
    params = adapter.layer_params(layer)
    first_path, second_path = FFN_PATHS[adapter.model.config.model_type]
    module = adapter.layer_sequence[layer]
    ffn = FeedForward(
        first=module.get_submodule(first_path),
        second=module.get_submodule(second_path),
        theta_BNF=slope(
            traced.activations[layer].to(dtype), traced.pre_activations[layer].to(dtype)
        ),
    )
    mixed_BNKD = attention_vectors(adapter, params, traced, layer, previous_BNKD, dtype)
    ln1_BNKD = layer_norm_vectors(mixed_BNKD, traced.pre_ln1[layer], params.ln1)
    del mixed_BNKD
    batch, tokens, keys, _ = ln1_BNKD.shape
    step = max(1, budget // (batch * keys * ffn.theta_BNF.shape[-1]))
    for start in range(0, tokens, step):  # the second residual, in place
        rows = slice(start, start + step)
        ln1_BNKD[:, rows] += ffn.vectors(ln1_BNKD[:, rows], rows)
    return layer_norm_vectors(ln1_BNKD, traced.pre_ln2[layer], params.ln2)


def head_contributions(
    loaded: LoadedModel, first_BD: torch.Tensor, vectors_BKD: torch.Tensor
) -> torch.Tensor:
    """The per-class logit contributions (B, K, C) of the first token's vectors ``vectors_BKD``
    through the model's classification head; ``first_BD`` is the real first-token state the
    head reads."""
    model = loaded.model
    head = HEADS.get(model.config.model_type)
    if head is None or loaded.is_language_model:
        raise ValueError(
            f"decompx:head=true needs a sequence classifier of type {', '.join(sorted(HEADS))}; "
            f"this is {type(model).__name__} (decompx:head=false needs no head)"
        )
    dtype = vectors_BKD.dtype
    dense, output = model.get_submodule(head.dense), model.get_submodule(head.output)
    activation = FUNCTIONS.get(head.activation) or model.get_submodule(head.activation)
    pre_BD = first_BD.to(dtype) @ dense.weight.to(dtype).T + dense.bias.to(dtype)
    pooled_BKD = split_bias(vectors_BKD @ dense.weight.to(dtype).T, dense.bias.to(dtype))
    pooled_BKD = pooled_BKD * slope(activation(pre_BD), pre_BD)[:, None]
    return split_bias(pooled_BKD @ output.weight.to(dtype).T, output.bias.to(dtype))


def decompx_vectors(adapter: EncoderAdapter, traced: Traced, budget: int) -> list[torch.Tensor]:
    """Every layer's decomposition vectors (B, N, K, D) of ``traced``, in float64 for a float64
    model and float32 otherwise."""
    model_type = adapter.model.config.model_type
    if model_type not in FFN_PATHS:
        raise ValueError(
            f"decompx knows the feed-forward layout of {', '.join(sorted(FFN_PATHS))}, "
            f"not of model type {model_type!r}"
        )
    dtype = torch.promote_types(traced.hidden_states[0].dtype, torch.float32)
    layers, vectors_BNKD = [], None
    for layer in range(len(traced.attentions)):
        vectors_BNKD = layer_vectors(adapter, traced, layer, vectors_BNKD, budget, dtype)
        layers.append(vectors_BNKD)
    return layers


class DecompX(Configurable):
    """DecompX: decomposition vectors through every part of the encoder, optionally the head.

    Reference: Modarressi et al. 2023, "DecompX: Explaining Transformers Decisions by
    Propagating Token Decomposition", ACL.
    """

    name = "decompx"
    description = (
        "DecompX (Modarressi 2023): token vectors through attention, norms, FFN (and the head: "
        "per-class logit contributions; head=false: norms per layer)"
    )
    requires = frozenset(
        {"attentions", "hidden_states", "values", "pre_layernorm"} | {f.name for f in FIELDS}
    )
    needs = {"block": "post-ln", "norm": "layernorm", "heads": "multi-head"}
    #: About 20x a batched forward pass on SST-2 sentences (benchmarks/method_cost.py): over
    #: the default run's 10x budget, so it runs when selected by name.
    in_default_run = False
    family = "decomposition"
    parameters = {"head": True, "chunk_elements": 2**24}
    parameter_docs = {
        "head": "true: on through the pooler and classifier to the explained class's logit, one "
        "aggregated row (needs --target position=first); false: the norm of the target token's "
        "vector from each input token, per layer (the paper's ablation without the head)",
        "chunk_elements": "the most elements of the feed-forward's (n, n, d_ff) vectors formed "
        "at once (chunks of query rows); bounds memory; an integer >= 1",
    }

    def validate(self) -> None:
        if self.params["chunk_elements"] < 1:
            raise self.out_of_range("chunk_elements", "at least 1")

    @property
    def target_positions(self) -> tuple[str, ...]:
        """The head reads the first token; without it any token's row can be explained."""
        return ("first",) if self.params["head"] else ("first", "last")

    @property
    def completeness(self) -> str | None:
        """With the head, every bias split over the tokens and every nonlinearity replaced by
        its slope at the real input: the row sums to the explained logit itself (up to the
        1e-12 guards). Without it, norms sum to nothing."""
        return "score" if self.params["head"] else None

    @torch.no_grad()
    def attribute(self, trace: Trace) -> Attribution:
        head = self.params["head"]
        if head and bool((trace.target_positions_B != 0).any()):
            raise ValueError(
                "decompx:head=true explains the classification head, which reads the first "
                "token; run with --target position=first, or use decompx:head=false"
            )
        batch, tokens = trace.mask_BN.shape
        rows = []
        for row, (target_LKD, first_KD) in enumerate(example_rows(trace, self.params)):
            if head:
                first_1D = trace.hidden_states[-1][row : row + 1, 0]
                contributions_1KC = head_contributions(trace.loaded, first_1D, first_KD[None])
                rows.append(explained_scores(trace, contributions_1KC, row)[:, None, :])
            else:
                rows.append(target_LKD.norm(dim=-1)[None])
        dtype = trace.hidden_states[0].dtype
        rows_BLN = trace.mask_BN.new_zeros((batch, rows[0].shape[1], tokens), dtype=dtype)
        for row, (row_1LK, length) in enumerate(zip(rows, trace.batch.lengths, strict=True)):
            rows_BLN[row, :, :length] = row_1LK[0].to(dtype)
        return Attribution(aggregated_BLN=rows_BLN)


def example_rows(trace: Trace, params: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per example, on its real tokens: the target token's vectors after every layer
    (L, K, D), and the first token's after the last (K, D), what either variant reads. Memoised
    on the trace, so ``decompx`` and ``decompx:head=false`` in one run share one computation."""

    def compute() -> list[tuple[torch.Tensor, torch.Tensor]]:
        traced = Traced.of(trace)
        positions = trace.target_positions_B.tolist()
        rows = []
        for row, length in enumerate(trace.batch.lengths):
            example = traced.example(row, length)
            layers = decompx_vectors(trace.adapter, example, params["chunk_elements"])
            target_LKD = torch.stack([v[0, positions[row]] for v in layers])
            rows.append((target_LKD, layers[-1][0, 0]))
        return rows

    return trace.memo("decompx.rows", compute)


def explained_scores(trace: Trace, contributions_1KC: torch.Tensor, row: int) -> torch.Tensor:
    """Each token's share of example ``row``'s target score: the explained class's
    contribution, minus the foil's under a contrastive target, (1, K)."""
    scores_1K = contributions_1KC[:, :, int(trace.target_classes_B[row])]
    foils_B = trace.target_foils_B
    if foils_B is not None:
        scores_1K = scores_1K - contributions_1KC[:, :, int(foils_B[row])]
    return scores_1K


@attrib_bench.hookimpl
def attrib_bench_attributors() -> list:
    return [DecompX()]


@attrib_bench.hookimpl
def attrib_bench_trace_fields() -> list:
    return list(FIELDS)
