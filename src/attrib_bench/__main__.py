"""``python -m attrib_bench`` runs the command line."""

from attrib_bench.cli import entry

entry()
