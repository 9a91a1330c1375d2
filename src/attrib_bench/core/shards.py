"""``--shard i/N``: which of N independent parts of one run this process computes.

Parsed in the core because the CLI checks it before any heavy import, the runner slices its
batches by it, and ``merge`` reads it back from each part's config.
"""

from __future__ import annotations

from attrib_bench.core.errors import UsageError


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/N"`` as (i, N), 1 <= i <= N: shard i of N (``run --shard``; which examples, see
    ``attrib_bench.runner.engine.shard_batches``).

    >>> parse_shard("2/4")
    (2, 4)
    """
    index, slash, count = str(text).strip().partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not slash or n < 1 or not 1 <= i <= n:
        raise UsageError(
            f"--shard must be i/N with whole numbers 1 <= i <= N (2/4: the second of four "
            f"shards), got {text!r}"
        )
    return i, n
