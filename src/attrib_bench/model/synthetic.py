"""A synthetic classifier whose true attribution is known exactly: a bag of tokens.

The logit difference logit(1) - logit(0) is the sum, over the input's real tokens, of a seeded
weight w[token]; [MASK], [PAD] and every other special token weigh 0. A token's contribution to
the explained score is then its weight (with the sign of the target class), whatever the other
tokens are: erasing the k tokens of highest contribution lowers the target class's probability
the most of all k-token erasures, so an evaluator that cannot rank this model's exact
attribution first cannot rank anything (the meta-evaluation: attrib_bench.runner.meta).

Each token's embedding is D copies of w / D and the logit difference is the sum of every
embedding element of the unmasked tokens, so the model reads ``inputs_embeds`` as the gradient
methods pass them, a zeroed embedding (``removal=zero``) or dropped elements (soft erasure)
remove that share of the weight, and gradient x input of a token is its weight.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput

from attrib_bench.core.interfaces import Attribution, scored_classes
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.trace import Trace

MODEL_TYPE = "attrib-bench-linear-bag"
#: How the synthetic model is named in results.
SYNTHETIC_NAME = "synthetic linear bag-of-tokens classifier"
#: The embedding width: the soft-erasure evaluators drop embedding elements one by one, so a
#: token's weight is split over this many of them.
HIDDEN_SIZE = 16


class LinearBagConfig(PretrainedConfig):
    """The vocabulary, the embedding width and the seed of the weights."""

    model_type = MODEL_TYPE

    def __init__(
        self,
        vocab_size: int = 2,
        hidden_size: int = HIDDEN_SIZE,
        weight_seed: int = 0,
        zero_ids: list[int] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("num_labels", 2)
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.weight_seed = weight_seed
        self.zero_ids = list(zero_ids or [])


def token_weights(config: LinearBagConfig) -> torch.Tensor:
    """(V,) float64 weights w ~ N(0, 1) drawn from ``weight_seed``; the ``zero_ids`` weigh 0."""
    generator = torch.Generator().manual_seed(config.weight_seed)
    weights = torch.randn(config.vocab_size, generator=generator, dtype=torch.float64)
    weights[torch.tensor(config.zero_ids, dtype=torch.long)] = 0.0
    return weights


class LinearBagClassifier(PreTrainedModel):
    """Two classes; logits (-d / 2, d / 2), d the sum of the unmasked tokens' embeddings."""

    config_class = LinearBagConfig
    base_model_prefix = "linear_bag"
    main_input_name = "input_ids"

    def __init__(self, config: LinearBagConfig) -> None:
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        #: (V,) float64 on the CPU, whatever the model's dtype and device: the exact weights.
        self.weights = token_weights(config)
        self.post_init()
        self.fill_embeddings()

    def fill_embeddings(self) -> None:
        """Each embedding element w / D, rounded once from float64 to the model's dtype (so
        call it again after a ``.to(dtype)``)."""
        width = self.config.hidden_size
        with torch.no_grad():
            self.embeddings.weight.copy_((self.weights / width)[:, None].expand(-1, width))

    def _init_weights(self, module: nn.Module) -> None:
        """The weights are the seeded ones set in ``__init__``: nothing to initialise."""

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        **_: Any,
    ) -> SequenceClassifierOutput:
        """Token types and positions are accepted, as every caller passes them, and ignored: a
        bag of tokens has no order."""
        embedded_BND = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        if attention_mask is None:
            attention_mask = torch.ones(embedded_BND.shape[:2], device=embedded_BND.device)
        kept_BN = attention_mask.to(embedded_BND.dtype)
        d_B = (embedded_BND.sum(dim=-1) * kept_BN).sum(dim=-1)
        logits = torch.stack([-d_B / 2, d_B / 2], dim=-1)
        return SequenceClassifierOutput(
            logits=logits,
            hidden_states=(embedded_BND,) if output_hidden_states else None,
            attentions=() if output_attentions else None,
        )


def synthetic_model(
    tokenizer: Any,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    *,
    architectures: Any,
) -> LoadedModel:
    """The bag-of-tokens classifier over ``tokenizer``'s vocabulary, weights seeded by
    ``seed``, as a ``LoadedModel`` (eval mode, weights frozen, like ``load_model``'s)."""
    config = LinearBagConfig(
        vocab_size=len(tokenizer),
        weight_seed=seed,
        zero_ids=sorted(set(tokenizer.all_special_ids)),
    )
    model = LinearBagClassifier(config).to(device=device, dtype=dtype).eval()
    model.fill_embeddings()
    model.requires_grad_(False)
    digest = hashlib.sha256(model.weights.numpy().tobytes()).hexdigest()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=f"{MODEL_TYPE}@seed{seed}",
        weights_sha256=digest,
        fresh_head=False,
        device=torch.device(device),
        architectures=architectures,
        name=SYNTHETIC_NAME,
    )


def weight_sums(loaded: LoadedModel, texts: list[tuple[str, str | None]]) -> list[float]:
    """d of each (text, pair) read from the weights, in float64: the model's logit difference
    on the untruncated input (how the synthetic data is labelled)."""
    weights = loaded.model.weights
    sums = []
    for text, pair in texts:
        ids = loaded.tokenizer(text, pair)["input_ids"]
        sums.append(float(weights[torch.tensor(ids, dtype=torch.long)].sum()))
    return sums


class ExactAttributor:
    """The synthetic model's exact attribution: each token's weight, signed for the explained
    class (its contribution to logit(y) - logit(other)); 0 at special and padded tokens.

    Reference: none; exact by construction of ``LinearBagClassifier``.
    """

    name = "exact"
    description = "The synthetic bag-of-tokens model's token weights, signed for the target class"
    requires = frozenset()

    def attribute(self, trace: Trace) -> Attribution:
        weights = trace.loaded.model.weights
        batch = trace.batch
        classes_B, _ = scored_classes(None, trace)
        sign_B = classes_B.to(torch.float64) * 2 - 1
        scores_BN = weights.to(batch.input_ids_BN.device)[batch.input_ids_BN] * sign_B[:, None]
        scores_BN = scores_BN * batch.attention_mask_BN.to(scores_BN.dtype)
        return Attribution(aggregated_BLN=scores_BN[:, None, :])
