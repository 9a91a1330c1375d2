"""MkDocs hooks for the attrib-bench site (mkdocs.yml: ``hooks: [docs/hooks.py]``).

- The committed benchmark outputs (``benchmarks/results/``) join the site as they are, so the
  benchmarks page links them instead of copying their numbers. A page links them by their path
  in the repository (``../benchmarks/results/x.md`` from ``docs/``), which works on GitHub too;
  the hook points such links at the copies on the site, and strict mode fails on a missing one.
- ``<!-- methods-table -->`` and ``<!-- evaluators-table -->`` become tables built at build
  time from the registry's info records (``attrib_bench.core.registry.load_registry``,
  ``Registered.info``): name, family, what it reads or needs, default run and the paper (the
  class docstring's ``Reference:`` line); ``<!-- methods-parameters -->`` and
  ``<!-- evaluators-parameters -->`` list every parameter with its default, allowed values and
  meaning (``parameter_docs``). So they show exactly the installed built-ins, as the plugins
  declare them.
"""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"


def on_files(files: Files, config: Any) -> Files:
    for path in sorted((ROOT / RESULTS).rglob("*")):
        if path.is_file():
            uri = path.relative_to(ROOT).as_posix()
            files.append(
                File(uri, src_dir=str(ROOT), dest_dir=config["site_dir"],
                     use_directory_urls=config["use_directory_urls"])
            )  # fmt: skip
    return files


_LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")


def _site_link(page_uri: str, target: str) -> str:
    """A link written as a repository path, from ``docs/<page_uri>``, as a site path."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return target
    in_repo = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_uri), target))
    if not in_repo.startswith(RESULTS + "/"):
        return target
    return posixpath.relpath(in_repo, posixpath.dirname(page_uri) or ".")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    uri = page.file.src_uri
    markdown = _LINK.sub(lambda m: m[1] + _site_link(uri, m[2]) + m[3], markdown)
    tables = {
        "<!-- methods-table -->": methods_table,
        "<!-- methods-parameters -->": lambda: parameters_table("attributors"),
        "<!-- evaluators-table -->": evaluators_table,
        "<!-- evaluators-parameters -->": lambda: parameters_table("evaluators"),
    }
    for marker, table in tables.items():
        if marker in markdown:
            markdown = markdown.replace(marker, table())
    return markdown


def _cell(text: str) -> str:
    """Text for a table cell: a ``|`` would end the cell, a ``*`` start emphasis."""
    return text.replace("|", "\\|").replace("*", "\\*")


def _codes(values: Any) -> str:
    """``a``, ``b`` as code spans, or "none"."""
    return ", ".join(f"`{value}`" for value in values) or "none"


def _default_run(info: Any, compares_models: bool = False) -> str:
    if compares_models:
        return "under `--models`"
    return "yes" if info.in_default_run else "by name"


def _shipped(kind: str) -> list[tuple[str, Any]]:
    """(name, registered) of the built-in plugins of ``kind``, by name."""
    from attrib_bench.core.registry import load_registry

    table = getattr(load_registry(), kind)
    return [(name, registered) for name, registered in sorted(table.items()) if registered.shipped]


def methods_table() -> str:
    """Captum's algorithm matrix for the built-in attributors, from their info records."""
    rows = [
        "| name | family | trace fields read | needs (capabilities) | default run | reference |",
        "|---|---|---|---|---|---|",
    ]
    for name, registered in _shipped("attributors"):
        info = registered.info
        needs = [f"{key}={value}" for key, value in (info.needs or {}).items()]
        rows.append(
            f"| `{name}` | {info.family} | {_codes(sorted(info.requires))} | {_codes(needs)} "
            f"| {_default_run(info)} | {_cell(info.reference)} |"
        )
    return "\n".join(rows)


def evaluators_table() -> str:
    rows = [
        "| name | family | what | better | reads the reference | default run | reference |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, registered in _shipped("evaluators"):
        info = registered.info
        better = "higher" if info.higher_is_better else "lower"
        reads = "yes" if info.needs_reference else "no"
        default = _default_run(info, info.compares_models)
        rows.append(
            f"| `{name}` | {info.family} | {_cell(info.description)} | {better} | {reads} "
            f"| {default} | {_cell(info.reference)} |"
        )
    return "\n".join(rows)


def parameters_table(kind: str) -> str:
    """Every parameter of the built-in ``kind`` ("attributors" or "evaluators"): its default,
    its allowed values where the set is closed, and its meaning and range."""
    rows = [
        "| name | parameter | default | values | meaning and range |",
        "|---|---|---|---|---|",
    ]
    for name, registered in _shipped(kind):
        info = registered.info
        for key, default in info.parameters.items():
            values = " \\| ".join(f"`{value}`" for value in info.choices.get(key, ()))
            rows.append(
                f"| `{name}` | `{key}` | `{json.dumps(default)}` | {values} "
                f"| {_cell(info.parameter_docs.get(key, ''))} |"
            )
    return "\n".join(rows)
