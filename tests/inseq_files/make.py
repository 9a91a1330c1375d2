"""Remake the Inseq-saved attribution files the tests read (tests/test_inseq_import.py).

Inseq 0.7.1 itself explains the tiny random Llama of tests/helpers.py (``save_tiny_decoder``) on
three prefixes of the toy next-token rows, each followed by its correct next word (one of them
by a second token too, so a file holds more than one generation step). It saves the output as
Inseq users do (``FeatureAttributionOutput.save``): ``granular.json`` (input x gradient, one
score per hidden unit), ``aggregated.json.gz`` (the same after Inseq's default aggregation,
gzip-compressed) and ``attention.json`` (Inseq's attention, per layer and head). ``expected.json``
holds, per file and prefix, what Inseq's own ``FeatureAttributionOutput.load`` reads back for
the first generated token: the prefix tokens and their scores (the L2 norm over the hidden size
for the granular file).

Run it in the environment ``benchmarks/inseq_reference.py`` makes (``$ATTRIB_BENCH_CACHE/
inseq-venv``, which sees this environment's packages):

    $ATTRIB_BENCH_CACHE/inseq-venv/bin/python tests/inseq_files/make.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import inseq

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from helpers import save_tiny_decoder  # noqa: E402

#: (prefix, continuation): prefixes and next words of tests/test_next_token_runs.py ROWS.
PROMPTS = [
    ("the cat sat on the", " mat"),
    ("a dog sat on the", " mat ."),
    ("when mary and john went to the store , john gave a drink to", " mary"),
]


def expected(path: Path, granular: bool) -> list[dict]:
    """What Inseq reads back from ``path``: the first step's scores over each prefix."""
    out = inseq.FeatureAttributionOutput.load(str(path), decompress=path.suffix == ".gz")
    rows = []
    for text, sequence in zip(out.info["input_texts"], out.sequence_attributions, strict=True):
        start = sequence.attr_pos_start
        scores = sequence.target_attributions[:start, 0]
        if granular:
            scores = scores.norm(dim=-1)
        tokens = [token.token for token in sequence.target[:start]]
        rows.append({"text": text, "tokens": tokens, "scores": scores.tolist()})
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        model = save_tiny_decoder(Path(scratch) / "llama", "llama")
        texts = [prefix for prefix, _ in PROMPTS]
        generated = [prefix + continuation for prefix, continuation in PROMPTS]
        saliency = inseq.load_model(str(model), "input_x_gradient")
        out = saliency.attribute(texts, generated_texts=generated, show_progress=False)
        out.save(HERE / "granular.json", overwrite=True)
        out.aggregate().save(HERE / "aggregated.json.gz", overwrite=True, compress=True)
        attention = inseq.load_model(str(model), "attention")
        out = attention.attribute(texts, generated_texts=generated, show_progress=False)
        out.save(HERE / "attention.json", overwrite=True)
    files = {
        "granular.json": expected(HERE / "granular.json", granular=True),
        "aggregated.json.gz": expected(HERE / "aggregated.json.gz", granular=False),
    }
    (HERE / "expected.json").write_text(json.dumps(files, indent=1) + "\n")


if __name__ == "__main__":
    main()
