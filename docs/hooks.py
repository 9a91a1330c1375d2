"""MkDocs hooks for the attrib-bench site (mkdocs.yml: ``hooks: [docs/hooks.py]``).

- The committed benchmark outputs (``benchmarks/results/``) join the site as they are, so the
  benchmarks page links them instead of copying their numbers. A page links them by their path
  in the repository (``../benchmarks/results/x.md`` from ``docs/``), which works on GitHub too;
  the hook points such links at the copies on the site, and strict mode fails on a missing one.
- ``<!-- methods-table -->`` and ``<!-- evaluators-table -->`` become tables built from the
  plugin registry (``attrib_bench.core.registry.load_registry``) at build time, so they list
  exactly the installed built-ins with their real defaults.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results"

#: Built-in attributor plugin module -> (family, the model passes beyond the shared trace,
#: reference). tests/test_docs.py checks that every built-in attributor's module is here.
MODULES: dict[str, tuple[str, str, str]] = {
    "attention": (
        "attention",
        "",
        "Abnar & Zuidema 2020 ([math](math/attention-family.md))",
    ),
    "attention_flow": (
        "attention",
        "",
        "Abnar & Zuidema 2020 ([math](math/decompositions.md#attention-flow))",
    ),
    "norm": (
        "attention: norm-based",
        "",
        "Kobayashi et al. 2020, 2021; Modarressi et al. 2022 "
        "([math](math/attention-family.md#the-norm-family))",
    ),
    "effective": (
        "attention: identifiability",
        "",
        "Brunner et al. 2020 ([math](math/identifiability.md#effective-attention))",
    ),
    "alti": (
        "decomposition",
        "",
        "Ferrando et al. 2022 ([math](math/decompositions.md#alti))",
    ),
    "decompx": (
        "decomposition",
        "",
        "Modarressi et al. 2023 ([math](math/decompositions.md#decompx))",
    ),
    "value_zeroing": (
        "decomposition: erasure of values",
        "each layer rerun with one token's values zeroed, per token",
        "Mohebbi et al. 2023 ([math](math/decompositions.md#value-zeroing))",
    ),
    "hta": (
        "Jacobian",
        "forward and backward passes from the first layer's input",
        "Brunner et al. 2020 ([math](math/identifiability.md#hidden-token-attribution-hta))",
    ),
    "gradient": (
        "gradient",
        "",
        "Captum ([math](math/gradients.md))",
    ),
    "perturbation": (
        "perturbation",
        "",
        "Captum ([math](math/gradients.md#perturbation-methods))",
    ),
    "baselines": ("baseline", "", "the floor ([evaluators](evaluators.md))"),
}


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
    if "<!-- methods-table -->" in markdown:
        markdown = markdown.replace("<!-- methods-table -->", methods_table())
    if "<!-- evaluators-table -->" in markdown:
        markdown = markdown.replace("<!-- evaluators-table -->", evaluators_table())
    return markdown


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _params(obj: Any) -> str:
    parameters = getattr(obj, "parameters", {}) or {}
    return ", ".join(f"`{key}={value}`" for key, value in parameters.items()) or "none"


def _module(obj: Any) -> str:
    return type(obj).__module__.rpartition(".")[2]


def _passes(obj: Any, extra: str) -> str:
    requires = sorted(getattr(obj, "requires", ()) or ())
    if not requires:
        module = _module(obj)
        if module == "baselines":
            return "none"
        kind = "forward and backward" if module == "gradient" else "forward"
        return f"its own {kind} passes (Captum)"
    passes = "the shared trace"
    if "embedding_graph" in requires:
        passes += " and one backward pass through it"
    if extra:
        passes += f"; {extra}"
    return passes + " (" + ", ".join(f"`{field}`" for field in requires) + ")"


def methods_table() -> str:
    from attrib_bench.core.registry import load_registry

    registry = load_registry()
    rows = [
        "| name | family | passes (trace fields) | needs (capabilities) | default run | parameters "
        "| reference |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, registered in sorted(registry.attributors.items()):
        if not registered.shipped:
            continue
        obj = registered.obj
        module = _module(obj)
        if module not in MODULES:
            raise KeyError(f"docs/hooks.py: add the built-in plugin module {module!r} to MODULES")
        family, extra, reference = MODULES[module]
        needs = getattr(obj, "needs", {}) or {}
        needs_text = ", ".join(f"`{key}={value}`" for key, value in needs.items()) or "none"
        default = "yes" if getattr(obj, "in_default_run", True) else "by name"
        rows.append(
            f"| `{name}` | {family} | {_cell(_passes(obj, extra))} | {_cell(needs_text)} "
            f"| {default} | {_cell(_params(obj))} | {reference} |"
        )
    return "\n".join(rows)


def evaluators_table() -> str:
    from attrib_bench.core.interfaces import compares_models
    from attrib_bench.core.registry import load_registry

    registry = load_registry()
    rows = [
        "| name | what | better | reference | default run | parameters |",
        "|---|---|---|---|---|---|",
    ]
    for name, registered in sorted(registry.evaluators.items()):
        if not registered.shipped:
            continue
        obj = registered.obj
        better = "higher" if getattr(obj, "higher_is_better", True) else "lower"
        reference = "reads it" if getattr(obj, "needs_reference", False) else "no"
        default = "yes" if getattr(obj, "in_default_run", True) else "by name"
        if compares_models(obj):
            default = "under `--models`"
        description = _cell(getattr(obj, "description", ""))
        rows.append(
            f"| `{name}` | {description} | {better} | {reference} | {default} "
            f"| {_cell(_params(obj))} |"
        )
    return "\n".join(rows)
