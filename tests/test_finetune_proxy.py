"""The pretraining-seed proxy of ``attrib-bench finetune --reinit-top K``: re-initialised top
layers, their re-training against the original hidden states, the cache key, the command."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from helpers import ARCHITECTURES

from attrib_bench.model import finetune as finetune_module
from attrib_bench.model.finetune import (
    FinetuneConfig,
    build_proxy,
    cache_key,
    proxy_layers,
    reinit_top_layers,
)
from attrib_bench.model.load import load_model


def _linear_weights(module: torch.nn.Module) -> list[torch.Tensor]:
    return [m.weight.detach().clone() for m in module.modules() if isinstance(m, torch.nn.Linear)]


def _outside(loaded, top) -> dict[str, torch.Tensor]:
    inside = {id(p) for layer in top for p in layer.parameters()}
    return {
        name: p.detach().clone()
        for name, p in loaded.model.named_parameters()
        if id(p) not in inside
    }


def test_reinit_changes_the_top_layers_only_and_depends_on_the_seed(tiny_bert):
    source = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    layers = proxy_layers(source)
    assert len(layers) == 3
    original_top = _linear_weights(layers[-1])
    original_rest = _outside(source, layers[-1:])
    rng = torch.get_rng_state()

    proxies = []
    for seed in (0, 1, 0):
        loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
        top = reinit_top_layers(loaded, 1, seed)
        assert top == proxy_layers(loaded)[-1:]
        proxies.append(_linear_weights(top[0]))
        rest = _outside(loaded, top)  # embeddings, lower layers, pooler, head: bit-identical
        assert rest.keys() == original_rest.keys()
        assert all(torch.equal(rest[k], original_rest[k]) for k in rest)
    assert torch.equal(torch.get_rng_state(), rng)  # the global random state is left alone
    for weights in proxies:
        assert all(not torch.equal(a, b) for a, b in zip(weights, original_top, strict=True))
    assert all(not torch.equal(a, b) for a, b in zip(proxies[0], proxies[1], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(proxies[0], proxies[2], strict=True))


def test_retraining_lowers_the_reconstruction_error(tiny_bert):
    from attrib_bench.data.batches import make_batches
    from attrib_bench.model.finetune import _train_data

    config = FinetuneConfig(
        model=str(tiny_bert), dataset="default", limit=64, batch_size=16, reinit_top=2
    )
    config = replace(config, reinit_steps=40, reinit_learning_rate=3e-3)
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    original = _outside(loaded, proxy_layers(loaded)[-2:])
    batches, _ = make_batches(_train_data(config).examples, loaded.tokenizer, 16, 128)
    losses: list[float] = []
    report = build_proxy(loaded, config, batches, batches[:2], losses.append)
    assert len(losses) == 40
    # Measured on the same sentences before and after: re-training brings the proxy closer.
    assert report["reinit_mse_after"] < 0.8 * report["reinit_mse_before"], report
    assert sum(losses[-5:]) < sum(losses[:5])
    rest = _outside(loaded, proxy_layers(loaded)[-2:])  # still frozen: nothing else moved
    assert all(torch.equal(rest[k], original[k]) for k in rest)
    # frozen again, as load_model leaves a model: fine-tuning (_train) unfreezes all of them
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert report["reinit_top"] == 2 and report["reinit_steps"] == 40
    assert "top 2 layers' pretraining init" in report["seed_varies"]


def test_reinit_all_leaves_no_encoder_weight_of_the_original(tiny_bert):
    """--reinit-top all: the embeddings and every layer re-initialised from the seed, so the
    embedding output (layer 0) depends on the seed; re-training moves all of them and lowers
    the error against the original's last hidden states."""
    from attrib_bench.data.batches import make_batches
    from attrib_bench.model.finetune import ALL_LAYERS, _train_data

    config = FinetuneConfig(
        model=str(tiny_bert), dataset="default", limit=64, batch_size=16, reinit_top=ALL_LAYERS
    )
    config = replace(config, reinit_steps=40, reinit_learning_rate=3e-3)
    original = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    encoder = {n: p.detach().clone() for n, p in original.model.base_model.named_parameters()}
    students = []
    for seed in (0, 1):
        loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
        batches, _ = make_batches(_train_data(config).examples, loaded.tokenizer, 16, 128)
        report = build_proxy(loaded, replace(config, seed=seed), batches, batches[:2])
        assert report["reinit_mse_after"] < 0.8 * report["reinit_mse_before"], report
        assert "every encoder weight's init (embeddings and all 3 layers)" in report["seed_varies"]
        trained = dict(loaded.model.base_model.named_parameters())
        moved = [n for n in encoder if n.startswith(("embeddings.", "encoder."))]
        unchanged = [n for n in moved if torch.equal(trained[n], encoder[n])]
        # LayerNorm weights start at 1 and biases at 0 either way; every matrix differs.
        assert not [n for n in unchanged if n.endswith("weight") and trained[n].dim() == 2]
        students.append(loaded.model.base_model.embeddings.word_embeddings.weight.detach())
    assert not torch.equal(students[0], students[1])


def test_cache_key_unchanged_without_a_proxy_and_distinct_with_one():
    # Keys computed by the code before the proxy existed (FINETUNE_VERSION 1).
    plain = FinetuneConfig(model="some-org/some-model", dataset="default")
    assert cache_key(plain, "fp123") == "ed78c6b87a4988242e73"
    other = FinetuneConfig(model="some-org/some-model", dataset="glue", limit=100, seed=3, epochs=2)
    assert cache_key(other, "abc") == "b46620551c0527ca87a9"
    # Proxy settings do not count while the proxy is off; they do once it is on.
    assert cache_key(replace(plain, reinit_steps=7, reinit_learning_rate=1.0), "fp123") == (
        cache_key(plain, "fp123")
    )
    one = replace(plain, reinit_top=1)
    keys = {
        cache_key(plain, "fp123"),
        cache_key(one, "fp123"),
        cache_key(replace(plain, reinit_top=2), "fp123"),
        cache_key(replace(one, reinit_steps=7), "fp123"),
        cache_key(replace(one, reinit_learning_rate=1e-2), "fp123"),
    }
    assert len(keys) == 5
    assert cache_key(replace(plain, reinit_top=1), "fp123") == cache_key(one, "fp123")


def test_cli_proxy_seeds_write_models_with_metadata_and_are_cached(
    tiny_bert, run_cli, tmp_path, monkeypatch
):
    cache = tmp_path / "my-cache"
    monkeypatch.setenv("ATTRIB_BENCH_CACHE", str(cache))
    output = tmp_path / "proxies"
    common = ("finetune", "--model", tiny_bert, "--dataset", "default", "--limit", "32")
    common += ("--batch-size", "16", "--quiet", "--reinit-top", "1", "--reinit-steps", "4")
    code, out, err = run_cli(*common, "--seeds", "0,1", "--output", output)
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and all("re-training mse: " in line for line in lines), out
    metadata = [
        json.loads((output / f"seed-{s}" / finetune_module.METADATA_FILE).read_text())
        for s in (0, 1)
    ]
    for seed, entry in enumerate(metadata):
        assert entry["config"]["seed"] == seed
        assert entry["reinit_top"] == 1 and entry["reinit_steps"] == 4
        assert entry["reinit_mse_before"] > 0 and entry["reinit_mse_after"] > 0
        assert "pretraining init" in entry["seed_varies"]
    models = [
        load_model(str(output / f"seed-{s}"), "cpu", architectures=ARCHITECTURES) for s in (0, 1)
    ]
    assert models[0].weights_sha256 != models[1].weights_sha256
    assert len(list((cache / "models").iterdir())) == 2

    # Same settings: both cached. Another K: a new model.
    calls = []
    real_train = finetune_module._train

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real_train(*args, **kwargs)

    monkeypatch.setattr(finetune_module, "_train", counting)
    code, _, err = run_cli(*common, "--seeds", "0,1")
    assert code == 0, err
    assert not calls
    code, _, err = run_cli(*common, "--reinit-top", "2", "--seed", "0")  # the last K counts
    assert code == 0, err
    assert [c.reinit_top for c in calls] == [2]
    assert len(list((cache / "models").iterdir())) == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--reinit-top", "-1"), "--reinit-top must be at least 0 or all, got -1"),
        (("--reinit-top", "top"), "--reinit-top must be at least 0 or all, got top"),
        (("--reinit-top", "4"), "--reinit-top 4 exceeds the 3 layers of"),
        (("--reinit-top", "1", "--reinit-steps", "0"), "--reinit-steps must be at least 1"),
        (("--reinit-steps", "10"), "--reinit-steps needs --reinit-top"),
    ],
)
def test_cli_bad_proxy_settings_exit_2_with_one_line(tiny_bert, run_cli, extra, message):
    code, out, err = run_cli(
        "finetune", "--model", tiny_bert, "--dataset", "default", "--quiet", *extra
    )
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and message in err, err


@pytest.mark.parametrize("family", ["mpnet", "albert"])
def test_cli_proxy_needs_layers_it_can_find(family, run_cli, tmp_path):
    from transformers import AlbertConfig, MPNetConfig

    model = tmp_path / family
    config = MPNetConfig if family == "mpnet" else AlbertConfig
    config(num_hidden_layers=2).save_pretrained(model)
    code, out, err = run_cli(
        "finetune", "--model", model, "--dataset", "default", "--reinit-top", "1", "--quiet"
    )
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1, err
    assert "--reinit-top" in err and repr(family) in err


def test_student_output_norm_starts_at_the_teachers_marginals(tiny_bert):
    """A student's output LayerNorm starts with gain = the teacher's per-dimension standard
    deviation and bias = its mean, over the real tokens of the batches given (float64
    reference), and that start is closer to the teacher than the re-initialised norm."""
    import copy

    from attrib_bench.data.batches import make_batches
    from attrib_bench.model.finetune import (
        ALL_LAYERS,
        _probe_mse,
        _train_data,
        match_output_marginals,
        output_norm,
    )

    config = FinetuneConfig(model=str(tiny_bert), dataset="default", limit=48, batch_size=16)
    loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
    batches, _ = make_batches(_train_data(config).examples, loaded.tokenizer, 16, 128)
    teacher = copy.deepcopy(loaded.model.base_model)
    rows = []
    for batch in batches:
        hidden = teacher(**batch.model_inputs()).last_hidden_state.detach().double()
        rows += [hidden[b, :n] for b, n in enumerate(batch.lengths)]
    hidden = torch.cat(rows)
    reinit_top_layers(loaded, ALL_LAYERS, seed=0)
    norm = output_norm(loaded)
    assert norm is loaded.model.base_model.encoder.layer[-1].output.LayerNorm
    fresh = _probe_mse(loaded.model.base_model, teacher, batches, loaded.device)
    match_output_marginals(loaded, teacher, batches, loaded.device)
    torch.testing.assert_close(
        norm.weight.double(), hidden.std(0, unbiased=False), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(norm.bias.double(), hidden.mean(0), atol=1e-6, rtol=0)
    assert _probe_mse(loaded.model.base_model, teacher, batches, loaded.device) < 0.8 * fresh


def test_student_cache_key_names_its_start():
    from attrib_bench.model.finetune import ALL_LAYERS, STUDENT_START

    student = FinetuneConfig(model="some-org/some-model", dataset="default", reinit_top=ALL_LAYERS)
    key = cache_key(student, "fp")
    assert key != cache_key(replace(student, reinit_top=2), "fp")
    original = finetune_module.STUDENT_START
    try:
        finetune_module.STUDENT_START = STUDENT_START + "-other"
        assert cache_key(student, "fp") != key
    finally:
        finetune_module.STUDENT_START = original


def test_every_layer_reinitialised_starts_as_a_student(tiny_bert, monkeypatch):
    """K = the layer count re-initialises the output norm with every layer, so it starts at the
    teacher's marginals as ``all`` does, and keeps the embeddings; K below it is a proxy."""
    from attrib_bench.data.batches import make_batches
    from attrib_bench.model.finetune import _train_data

    matched: list[int] = []
    real = finetune_module.match_output_marginals
    monkeypatch.setattr(
        finetune_module,
        "match_output_marginals",
        lambda loaded, *rest: matched.append(len(proxy_layers(loaded))) or real(loaded, *rest),
    )
    config = FinetuneConfig(model=str(tiny_bert), dataset="default", limit=32, batch_size=16)
    for k in (2, 3):
        loaded = load_model(str(tiny_bert), "cpu", architectures=ARCHITECTURES)
        embeddings = {
            n: p.detach().clone() for n, p in loaded.adapter.embeddings.named_parameters()
        }
        batches, _ = make_batches(_train_data(config).examples, loaded.tokenizer, 16, 128)
        build_proxy(loaded, replace(config, reinit_top=k, reinit_steps=2), batches, batches[:1])
        after = dict(loaded.adapter.embeddings.named_parameters())
        assert all(torch.equal(after[n], p) for n, p in embeddings.items())
    assert matched == [3]


def test_student_key_needs_the_layer_count():
    from attrib_bench.model.finetune import STUDENT_START

    every = FinetuneConfig(model="some-org/some-model", dataset="default", reinit_top=3)
    key = cache_key(every, "fp", layers=3)
    assert key != cache_key(every, "fp", layers=6) == cache_key(every, "fp")
    original = finetune_module.STUDENT_START
    try:
        finetune_module.STUDENT_START = STUDENT_START + "-other"
        assert cache_key(every, "fp", layers=3) != key
        assert cache_key(every, "fp", layers=6) == cache_key(every, "fp")  # a proxy: no start
    finally:
        finetune_module.STUDENT_START = original
