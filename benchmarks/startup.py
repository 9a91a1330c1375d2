"""Start-up time of the ``attrib-bench`` command: how long a usage error takes to answer.

Each command runs ``--repeats`` times in a fresh process (wall time, min and median), with a
cache folder in a known state: holding the plugin names listing one full registry load wrote
("fresh"), or empty ("none": the first typo after an install or an edit of the plugins or of
attrib-bench, which a registry load answers). ``import torch`` alone is timed for scale. The
machine and its load (``uptime``, before and after) are recorded with the numbers: on a shared
machine they move with the load.

    python benchmarks/startup.py [--repeats 5]

Writes benchmarks/results/startup.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CLI = shutil.which("attrib-bench") or "attrib-bench"
#: (command, argv, exit status, the names listing: "fresh", "none", or "-" when not read)
CASES = [
    ("attrib-bench --help", [CLI, "--help"], 0, "-"),
    ("attrib-bench run --attributors nosuch", [CLI, "run", "--attributors", "nosuch"], 2, "fresh"),
    ("attrib-bench run --attributors nosuch", [CLI, "run", "--attributors", "nosuch"], 2, "none"),
    ("attrib-bench run --dataset nosuch.csv", [CLI, "run", "--dataset", "nosuch.csv"], 2, "-"),
    ("python -c 'import torch'", [sys.executable, "-c", "import torch"], 0, "-"),
]


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle if "model name" in line)
    except (OSError, StopIteration):
        return platform.processor()


def timed(argv: list[str], expected: int, env: dict[str, str], cwd: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != expected:
        raise SystemExit(f"{argv}: exit {done.returncode}, expected {expected}\n{done.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    before = uptime()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        fresh = {**env, "ATTRIB_BENCH_CACHE": str(work / "fresh")}
        listing = "from attrib_bench.core.registry import load_registry; load_registry()"
        subprocess.run([sys.executable, "-c", listing], env=fresh, check=True)
        for number, (name, argv, expected, listing_state) in enumerate(CASES):
            seconds = []
            for repeat in range(args.repeats):
                empty = {**env, "ATTRIB_BENCH_CACHE": str(work / f"empty-{number}-{repeat}")}
                cache = empty if listing_state == "none" else fresh
                seconds.append(timed(argv, expected, cache, work))
            rows.append(
                {
                    "command": name,
                    "names_listing": listing_state,
                    "exit": expected,
                    "seconds": [round(s, 3) for s in seconds],
                    "min": round(min(seconds), 3),
                    "median": round(statistics.median(seconds), 3),
                }
            )
            row = rows[-1]
            print(
                f"{name} (listing {row['names_listing']}): {row['min']} s min, "
                f"{row['median']} s median"
            )
    after = uptime()
    document = {
        "machine": {
            "cpu": cpu(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "uptime_before": before,
            "uptime_after": after,
        },
        "repeats": args.repeats,
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "startup.json").write_text(json.dumps(document, indent=1) + "\n")
    lines = [
        "# Start-up: how fast a usage error answers",
        "",
        f"`python benchmarks/startup.py --repeats {args.repeats}`: each command in a fresh "
        f"process, wall time over {args.repeats} runs; {document['machine']['cpu']}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}.",
        "",
        f"- before: `{before}`",
        f"- after: `{after}`",
        "",
        "| command | names listing | exit | min s | median s |",
        "|---|---|---:|---:|---:|",
        *(
            f"| `{r['command']}` | {r['names_listing']} | {r['exit']} | {r['min']:.2f} | "
            f"{r['median']:.2f} |"
            for r in rows
        ),
        "",
        "The names listing (attrib_bench.core.plugin_names) is written by every full registry "
        "load (any run, `list`); with none (the first typo after an install or an edit of the "
        "plugins or of attrib-bench) a registry load answers: torch and the plugins, before "
        "transformers, datasets and the run's modules. The machine's load is "
        "recorded above: compare rows of one run, not figures across runs.",
    ]
    (RESULTS / "startup.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
