"""The adapter's position ids are those the model itself derives for an unmodified input."""

from __future__ import annotations

import torch
from helpers import ARCHITECTURES, examples, one_batch

from attrib_bench.model.load import load_model


def model_position_ids(loaded, batch) -> torch.Tensor:
    """What the position embedding receives when the model is run on ``batch`` as it is."""
    seen = []
    handle = loaded.adapter.embeddings.position_embeddings.register_forward_pre_hook(
        lambda _module, args: seen.append(args[0])
    )
    try:
        with torch.no_grad():
            loaded.model(**batch.model_inputs())
    finally:
        handle.remove()
    (positions,) = seen
    return positions.expand_as(batch.input_ids_BN)


def test_position_ids_match_the_model_on_a_padded_batch(tiny_model):
    loaded = load_model(str(tiny_model), "cpu", architectures=ARCHITECTURES)
    batch = one_batch(loaded, examples())
    assert not batch.attention_mask_BN.bool().all()  # padded rows: where the families differ
    expected = model_position_ids(loaded, batch)
    assert torch.equal(loaded.adapter.position_ids(batch.input_ids_BN), expected)


def test_roberta_positions_skip_padding(tiny_roberta):
    loaded = load_model(str(tiny_roberta), "cpu", architectures=ARCHITECTURES)
    batch = one_batch(loaded, examples())
    positions = loaded.adapter.position_ids(batch.input_ids_BN)
    pad = loaded.model.config.pad_token_id
    real = batch.attention_mask_BN.bool()
    # Real tokens count from pad + 1; padding sits at pad: not 0..N-1 as in BERT.
    assert (positions[~real] == pad).all()
    assert torch.equal(
        positions[0, : int(real[0].sum())], torch.arange(int(real[0].sum())) + pad + 1
    )


def test_the_weights_hash_ignores_buffers_and_sees_every_parameter(tiny_model):
    """A buffer a transformers release adds or drops leaves the weights' identity alone; any
    parameter that changes changes it (the gate compares models by it)."""
    from attrib_bench.model.load import weights_hash

    model = load_model(tiny_model, "cpu", architectures=ARCHITECTURES).model
    before = weights_hash(model)
    model.register_buffer("extra_ids", torch.arange(7))
    assert weights_hash(model) == before
    with torch.no_grad():
        list(model.parameters())[-1].view(-1)[0] += 1e-6  # the head's last parameter
    assert weights_hash(model) != before
