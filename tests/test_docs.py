"""The README stays true: its plugin example is the tested file, its commands are the real ones."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_plugin_example_is_the_tested_file():
    source = (ROOT / "tests" / "plugin_fixtures" / "example_plugin.py").read_text()
    start = source.index("# --8<-- [start:example]\n") + len("# --8<-- [start:example]\n")
    end = source.index("# --8<-- [end:example]")
    assert source[start:end].strip() in README


def test_readme_first_screen_has_the_two_commands():
    first_screen = "\n".join(README.splitlines()[:20])
    assert "pip install -e . && attrib-bench run" in first_screen
    assert 'pip install -e ".[test]" && python -m pytest' in first_screen


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[test]"' in ci and "python -m pytest" in ci


def test_every_builtin_attributor_is_documented():
    from attrib_bench.core.registry import load_registry

    documented = set(re.findall(r"^\| `([a-z-]+)` \|", README, flags=re.M))
    builtins = {
        name
        for name, reg in load_registry().attributors.items()
        if reg.source.startswith("attrib-bench ")
    }
    assert builtins <= documented, builtins - documented
