"""The built-in model families, registered through the hook exactly as a third party's are.

All are post-LayerNorm encoders laid out like BERT (ArchitectureSpec's default paths), with
separate Q/K/V projections and one key/value head per query head; the RoBERTa descendants
number positions after the padding index.
"""

from __future__ import annotations

import attrib_bench
from attrib_bench.core.architecture_spec import ArchitectureSpec


@attrib_bench.hookimpl
def attrib_bench_architectures() -> list:
    return [
        ArchitectureSpec(model_types=("bert", "electra")),
        ArchitectureSpec(
            model_types=("roberta", "xlm-roberta", "camembert"), positions="after_padding"
        ),
    ]
