"""A randomly initialised copy of a model: the floor seed comparisons must beat.

Saved as a normal model directory under the cache, so the runner loads it like any ``--model``
and caches its attributions by its weights, like any run's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from pathlib import Path

import torch
import transformers

from attrib_bench.core.cache_dir import cache_root
from attrib_bench.core.loaded_model import LoadedModel

#: Bump when what a random-init copy holds changes.
RANDOM_INIT_VERSION = 1
METADATA_FILE = "attrib_bench_random_init.json"


def random_init_name(source: str, seed: int) -> str:
    """How results name the copy: the source model and the seed."""
    return f"random-init:{source}@seed{seed}"


def random_init_copy(loaded: LoadedModel, seed: int) -> Path:
    """A directory holding ``loaded``'s architecture (config, head, tokenizer) with weights
    drawn by its own initialiser under ``torch.manual_seed(seed)``; built once, then cached.

    The key is the config, the seed and the torch and transformers versions (the initialiser's
    code), not the source's weights, which a random copy does not read.
    """
    config = loaded.model.config
    identity = {
        "config": config.to_json_string(use_diff=False),
        "class": type(loaded.model).__name__,
        "seed": seed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "version": RANDOM_INIT_VERSION,
    }
    key = _digest(identity)
    target = cache_root() / "models" / f"random-init-{key}"
    if (target / METADATA_FILE).is_file():
        return target
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = type(loaded.model)(config)
    staging = target.with_name(f"{target.name}.{uuid.uuid4().hex}.tmp")
    model.save_pretrained(staging)
    loaded.tokenizer.save_pretrained(staging)
    metadata = {"source": loaded.model_id, "seed": seed, "identity": identity}
    (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=1) + "\n")
    if target.exists():  # another process built it meanwhile
        shutil.rmtree(staging)
    else:
        staging.rename(target)
    return target


def _digest(value: dict) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]
