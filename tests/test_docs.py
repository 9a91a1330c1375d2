"""The documentation stays true: README.md and docs/ run as written.

- Every ```python block of README.md and docs/**/*.md runs: a page's blocks in order, in one
  namespace, in a temporary folder, with the default model cached and tests/plugin_fixtures
  importable; a block that defines argument-free ``test_*`` functions has them called too. A
  block that cannot run as written is marked ``<!-- not-run: the reason -->`` on the line
  before its fence; those are few and give their reason.
- Every ``attrib-bench <command>`` in a shell block or an inline code span names a real command.
- The README's first screen has the two commands, its plugin example is the tested file, and
  ``.ci/run`` runs its test command, the docs build and the format check.
- Every built-in method is on the methods page, whose table the docs hook generates.

The site itself is built by ``.ci/run`` (``mkdocs build --strict``), not here.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
FIXTURES = ROOT / "tests" / "plugin_fixtures"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: At most this many blocks may be marked not-run across all pages.
MAX_NOT_RUN = 3

FENCE = re.compile(
    r"^(?P<indent>[ ]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ ]*$",
    flags=re.M | re.S,
)
NOT_RUN = re.compile(r"<!-- not-run:(?P<reason>[^>]*)-->\s*\Z")
SNIPPET = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<section>[\w-]+))?"[ ]*$', flags=re.M)
SHELL = {"bash", "console", "sh", "shell"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, when marked not-run


def snippet(path: str, section: str | None) -> str:
    """What pymdownx.snippets includes for ``--8<-- "path:section"`` (mkdocs.yml: base_path .)."""
    text = (ROOT / path).read_text()
    if section is None:
        return text
    start, end = f"# --8<-- [start:{section}]\n", f"# --8<-- [end:{section}]"
    assert start in text and end in text, f"{path} has no section {section!r}"
    return text[text.index(start) + len(start) : text.index(end)]


def expand(code: str) -> str:
    return SNIPPET.sub(lambda m: snippet(m["path"], m["section"]).rstrip("\n"), code)


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()]
        marker = NOT_RUN.search(before.rstrip("\n") + "\n")
        reason = marker["reason"].strip() if marker else None
        body = "\n".join(line[len(match["indent"]) :] for line in match["body"].splitlines())
        found.append(
            Block(page, before.count("\n") + 1, match["lang"], expand(body), reason)
        )  # fmt: skip
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
PYTHON_PAGES = sorted({b.page for b in ALL_BLOCKS if b.lang == "python" and b.not_run is None})


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


# ----------------------------------------------------------------- code blocks run


@pytest.mark.slow
@pytest.mark.xdist_group("default_model")  # one worker fine-tunes it (conftest.py)
@pytest.mark.parametrize("page", PYTHON_PAGES, ids=page_id)
def test_python_blocks_run(page, default_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(FIXTURES))
    namespace: dict = {"__name__": "docs_example"}
    for block in blocks(page):
        if block.lang != "python" or block.not_run is not None:
            continue
        before = set(namespace)
        exec(compile(block.code, f"{page_id(page)}:{block.line}", "exec"), namespace)
        for name in sorted(set(namespace) - before):
            function = namespace[name]
            takes_nothing = callable(function) and not inspect.signature(function).parameters
            if name.startswith("test_") and takes_nothing:
                function()


def test_not_run_blocks_are_few_and_say_why():
    marked = [b for b in ALL_BLOCKS if b.not_run is not None]
    assert len(marked) <= MAX_NOT_RUN, [f"{page_id(b.page)}:{b.line}" for b in marked]
    assert all(b.not_run for b in marked), "a not-run marker needs its reason"
    for page in PAGES:  # a marker must sit right before a fence, or it marks nothing
        text = page.read_text()
        markers = len(re.findall(r"^<!-- not-run:", text, flags=re.M))
        assert markers == sum(1 for b in blocks(page) if b.not_run is not None), page_id(page)


def test_python_blocks_compile():
    """Fast: a syntax error is reported without the default model (marked blocks too)."""
    for block in ALL_BLOCKS:
        if block.lang == "python":
            compile(block.code, f"{page_id(block.page)}:{block.line}", "exec")


def test_snippets_name_real_sections():
    for page in PAGES:
        for match in SNIPPET.finditer(page.read_text()):
            assert (ROOT / match["path"]).is_file(), f"{page_id(page)}: {match['path']}"
            snippet(match["path"], match["section"])


# ----------------------------------------------------------------- commands are real


def cli_commands() -> set[str]:
    import argparse

    from attrib_bench.cli import build_parser

    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(commands.choices)


COMMAND = re.compile(r"(?:attrib-bench|-m attrib_bench)\s+(?P<command>[a-z][\w-]*)")


def named_commands(page: Path) -> list[tuple[str, str]]:
    """(command, where) for every attrib-bench command a shell block or code span runs."""
    text = page.read_text()
    found = []
    for block in blocks(page):
        if block.lang in SHELL:
            for line in block.code.splitlines():
                found += [(m["command"], line) for m in COMMAND.finditer(line.partition("#")[0])]
    prose = FENCE.sub("", text)
    for span in re.findall(r"`([^`]+)`", prose):
        found += [(m["command"], span) for m in COMMAND.finditer(span)]
    return found


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_are_real(page):
    real = cli_commands()
    wrong = [f"{c!r} in {where.strip()!r}" for c, where in named_commands(page) if c not in real]
    assert not wrong, f"{page_id(page)} names commands attrib-bench lacks: {wrong}"


def test_the_readme_names_every_command():
    assert {command for command, _ in named_commands(ROOT / "README.md")} >= cli_commands()


# ----------------------------------------------------------------- the README


def test_readme_plugin_example_is_the_tested_file():
    assert snippet("tests/plugin_fixtures/example_plugin.py", "example").strip() in README


def test_docs_include_the_tested_plugins_by_snippet():
    plugins = (ROOT / "docs" / "plugins.md").read_text()
    for name in ("example_plugin", "trace_field_plugin"):
        assert f'--8<-- "tests/plugin_fixtures/{name}.py:example"' in plugins


def test_readme_first_screen_has_the_two_commands():
    first_screen = "\n".join(README.splitlines()[:20])
    assert "pip install -e . && attrib-bench run" in first_screen
    assert 'pip install -e ".[test]" && python -m pytest' in first_screen


def test_readme_is_a_front_door():
    assert len(README.splitlines()) < 200
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).is_file(), target


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    install = re.search(r'pip install -q -e "\.\[([\w,]+)\]"', ci)
    assert install and "test" in install[1].split(","), "CI installs the test extra"
    assert "docs" in install[1].split(","), "CI installs the docs extra for mkdocs"
    assert 'pip install -e ".[test]" && python -m pytest' in README
    commands = ("python -m pytest", "ruff check .", "ruff format --check .", "mkdocs build")
    for command in (*commands, ".ci/wheel-check"):
        assert command in ci, command
    assert "mkdocs build --strict" in ci


# ----------------------------------------------------------------- references stay in the repo


def test_no_reference_to_the_shared_folder():
    """Code, docs and changelog cite docs/, never the ../shared folder a user does not have
    (tests and benchmarks may read data from it)."""
    paths = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    for folder in ("src", "plugins", "docs"):
        paths += [p for p in (ROOT / folder).rglob("*") if p.suffix in {".py", ".md", ".json"}]
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in paths
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\.\./shared|shared/(specs|data)", line)
    ]
    assert not hits, hits


# ----------------------------------------------------------------- the methods page


def docs_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_builtin_attributor_is_documented():
    """The tables come from the registry's info records (every built-in has a reference and a
    doc per parameter: tests/test_plugin_info.py), so each lists every built-in as declared."""
    from attrib_bench.core.registry import load_registry

    methods = (ROOT / "docs" / "methods.md").read_text()
    evaluators_page = (ROOT / "docs" / "evaluators.md").read_text()
    for marker in ("<!-- methods-table -->", "<!-- methods-parameters -->"):
        assert marker in methods, marker  # the generated tables
    for marker in ("<!-- evaluators-table -->", "<!-- evaluators-parameters -->"):
        assert marker in evaluators_page, marker
    hooks = docs_hooks()
    registry = load_registry()
    builtins = {name: reg for name, reg in registry.attributors.items() if reg.shipped}
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", methods, flags=re.M))
    assert set(builtins) <= documented, set(builtins) - documented
    for kind, table in (
        ("attributors", hooks.methods_table()),
        ("evaluators", hooks.evaluators_table()),
    ):
        parameters = hooks.parameters_table(kind)
        for name, reg in getattr(registry, kind).items():
            if not reg.shipped:
                continue
            info = reg.info
            assert f"| `{name}` | {info.family} |" in table, name
            assert hooks._cell(info.reference) in table, name
            for key in info.parameters:
                doc = hooks._cell(info.parameter_docs[key])
                assert re.search(
                    rf"^\| `{name}` \| `{key}` \| .* \| {re.escape(doc)} \|$",
                    parameters,
                    flags=re.M,
                ), (name, key)
