"""Remake the Inseq-saved continuation files tests/test_context_inseq.py reads.

Inseq 0.7.1 itself attributes each step's log-probability (``attributed_fn="probability"``,
``logprob=True``) of two prompts' continuations with input x gradient, on the tiny random Llama
and T5 of ``attrib_bench.testing.segment_conformance`` (seeded, so the tests rebuild the same
weights), and saves them as Inseq users do: ``llama_steps.json`` (granular, one score per hidden
unit) and ``t5_steps.json.gz`` (granular, the target attributed too, gzip-compressed).
``expected_steps.json`` holds, per file and sequence, what Inseq's own
``FeatureAttributionOutput.load`` reads back, summed over the hidden size: the prompt's tokens,
its step x token scores and the step x continuation-prefix scores.

Run it in the environment ``benchmarks/inseq_reference.py`` makes:

    $ATTRIB_BENCH_CACHE/inseq-venv/bin/python tests/inseq_files/make_steps.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import inseq

from attrib_bench.testing.segment_conformance import save_tiny_decoder, save_tiny_seq2seq

HERE = Path(__file__).parent
PROMPTS = ["the cat sat on the", "when mary and john went to the store , john gave a drink to"]
ANSWERS = [" mat .", " mary"]


def expected(path: Path) -> list[dict]:
    """What Inseq reads back from ``path``, per sequence (see the module)."""
    out = inseq.FeatureAttributionOutput.load(str(path), decompress=path.suffix == ".gz")
    rows = []
    for sequence in out.sequence_attributions:
        start = sequence.attr_pos_start
        if sequence.source_attributions is not None:  # encoder-decoder: row 0 is the start
            tokens = [token.token for token in sequence.source]
            prompt = sequence.source_attributions.sum(-1)
            prefix = sequence.target_attributions.sum(-1)[1:-1]
        else:
            tokens = [token.token for token in sequence.target[:start]]
            prompt = sequence.target_attributions.sum(-1)[:start]
            prefix = sequence.target_attributions.sum(-1)[start:-1]
        rows.append(
            {"tokens": tokens, "steps": prompt.T.tolist(), "prefix_steps": prefix.T.tolist()}
        )
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        llama = save_tiny_decoder(Path(scratch) / "llama", "llama")
        t5 = save_tiny_seq2seq(Path(scratch) / "t5", "t5")
        steps = dict(attributed_fn="probability", logprob=True, show_progress=False)
        model = inseq.load_model(str(llama), "input_x_gradient")
        full = [prompt + answer for prompt, answer in zip(PROMPTS, ANSWERS, strict=True)]
        out = model.attribute(PROMPTS, generated_texts=full, **steps)
        out.save(HERE / "llama_steps.json", overwrite=True)
        model = inseq.load_model(str(t5), "input_x_gradient")
        answers = [answer.strip() for answer in ANSWERS]
        out = model.attribute(PROMPTS, generated_texts=answers, attribute_target=True, **steps)
        out.save(HERE / "t5_steps.json.gz", overwrite=True, compress=True)
    files = {name: expected(HERE / name) for name in ("llama_steps.json", "t5_steps.json.gz")}
    (HERE / "expected_steps.json").write_text(json.dumps(files, indent=1) + "\n")


if __name__ == "__main__":
    main()
