"""The built-in model families, registered through the hook exactly as a third party's are.

The encoders are post-LayerNorm, with separate Q/K/V projections and one key/value head per
query head. BERT, ELECTRA and the RoBERTa descendants keep BERT's layout (ArchitectureSpec's
default paths; RoBERTa's number positions after the padding index); DistilBERT names its modules
its own way and has no token type embeddings; ALBERT applies one shared layer L times, after
mapping its smaller embeddings to the hidden size (``hidden_states[0]`` is that mapping's
output, the first layer's input, as for ELECTRA's projected embeddings).

The decoders (docs/math/attention-family-pre-ln.md) are pre-LN and causal, and explain each
example's last real token by default, as their language-model and classification heads read
it; ``model.base_model`` is the same under both heads, and ``embeddings`` is the token
embedding module under both (what ``LoadedModel.embeddings`` takes for a language model).
GPT-2: LayerNorms, one fused ``c_attn`` Conv1D for Q/K/V, absolute positions added to the token
embeddings in its forward (``hidden_states[0]`` is their sum). LLaMA, Mistral and Qwen2 share
one layout: RMSNorms, separate projections (value biases in Qwen2 only), rotary positions, and
key/value heads as the model's config sets them (grouped-query when fewer than query heads).
"""

from __future__ import annotations

import attrib_bench
from attrib_bench.core.architecture_spec import ArchitectureSpec


@attrib_bench.hookimpl
def attrib_bench_architectures() -> list:
    return [
        ArchitectureSpec(model_types=("bert", "electra")),
        ArchitectureSpec(
            model_types=("roberta", "xlm-roberta", "camembert"), positions="after_padding"
        ),
        ArchitectureSpec(
            model_types=("distilbert",),
            layers="transformer.layer",
            value="attention.v_lin",
            attention_output="attention.out_lin",
            ln1="sa_layer_norm",
            ln2="output_layer_norm",
        ),
        ArchitectureSpec(
            model_types=("albert",),
            layers="encoder.albert_layer_groups.0.albert_layers.0",
            shared_layer=True,
            value="attention.value",
            attention_output="attention.dense",
            ln1="attention.LayerNorm",
            ln2="full_layer_layer_norm",
        ),
        ArchitectureSpec(
            model_types=("gpt2",),
            embeddings="wte",
            layers="h",
            value="attn.c_attn",
            attention_output="attn.c_proj",
            ln1="ln_1",
            ln2="ln_2",
            final_norm="ln_f",
            block="pre-ln",
            qkv="fused",
            mask="causal",
            target_position="last",
        ),
        ArchitectureSpec(
            model_types=("llama", "mistral", "qwen2"),
            embeddings="embed_tokens",
            layers="layers",
            value="self_attn.v_proj",
            attention_output="self_attn.o_proj",
            ln1="input_layernorm",
            ln2="post_attention_layernorm",
            final_norm="norm",
            block="pre-ln",
            norm="rmsnorm",
            heads="grouped-query",
            mask="causal",
            positions="rotary",
            target_position="last",
        ),
    ]
