"""The installed plugins' method names, known without importing the plugins.

Importing the plugins imports torch (seconds; a minute on a loaded machine), so a typo in
``--attributors`` cost that import before its one-line answer. Every full registry load
without plugin files (:func:`attrib_bench.core.registry.load_registry`) writes the names the
entry points gave into the cache folder, with a fingerprint of what decides them: the entry
points; the size and modification time of every Python file of the packages they live in and
of attrib-bench; and the modification time of the site-packages folders, which an install
or or uninstall changes. :func:`read_listing` returns the names only while that fingerprint holds
(and says whether a plugin failed to import: then a name missing may be that plugin's).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import site
import sysconfig
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from attrib_bench.core.cache_dir import cache_root

ENTRY_POINT_GROUP = "attrib_bench"
LISTING_FILE = "plugin-names.json"


@dataclass(frozen=True)
class Listing:
    """The entry-point plugins' attributor and evaluator names."""

    attributors: frozenset[str]
    evaluators: frozenset[str]
    #: A plugin failed to import: a name missing here may be one of its own.
    broken: bool = False


def fingerprint(entry_points: Iterable[importlib.metadata.EntryPoint]) -> str | None:
    """What the entry-point plugins' names depend on, hashed; None when a plugin's package
    cannot be found without importing it."""
    digest = hashlib.sha256()
    packages = {"attrib_bench"}
    for ep in sorted(entry_points, key=lambda ep: (ep.name, ep.value)):
        # Not the distribution's version (parsing its metadata costs more than all the rest):
        # reinstalling one rewrites its files, or at least its sys.path folder.
        digest.update(repr((ep.name, ep.value)).encode())
        packages.add(ep.value.partition(":")[0].partition(".")[0].strip())
    try:
        for package in sorted(packages):
            spec = importlib.util.find_spec(package)  # a top-level name: imports nothing
            roots = list(spec.submodule_search_locations or []) if spec is not None else []
            files = [Path(spec.origin)] if spec is not None and spec.origin and not roots else []
            files += [file for root in roots for file in sorted(Path(root).rglob("*.py"))]
            if not files:
                return None
            for file in files:
                stat = file.stat()
                digest.update(repr((str(file), stat.st_mtime_ns, stat.st_size)).encode())
        for folder in sorted(_install_folders()):
            digest.update(repr((folder, Path(folder).stat().st_mtime_ns)).encode())
    except (ImportError, ValueError, OSError):
        return None
    return digest.hexdigest()


def _install_folders() -> set[str]:
    """Where pip installs (not all of ``sys.path``: its first entry is the launching script's
    or the working folder, which differ between ``attrib-bench`` and ``python -m``)."""
    folders = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    if site.ENABLE_USER_SITE:
        folders.add(site.getusersitepackages())
    return {folder for folder in folders if folder and Path(folder).is_dir()}


def write_listing(
    entry_points: Iterable[importlib.metadata.EntryPoint],
    attributors: Collection[str],
    evaluators: Collection[str],
    broken: bool,
) -> None:
    """Record the names a full load of the entry points found (a speed-up only: a cache
    folder that cannot be written is ignored)."""
    key = fingerprint(entry_points)
    if key is None:
        return
    document = {
        "fingerprint": key,
        "broken": broken,
        "attributors": sorted(attributors),
        "evaluators": sorted(evaluators),
    }
    path = cache_root() / LISTING_FILE
    try:
        if path.is_file() and json.loads(path.read_text()) == document:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(document))
        temporary.replace(path)
    except (OSError, ValueError):
        return


def read_listing() -> Listing | None:
    """The names of the last full load if nothing they depend on changed since; else None."""
    try:
        document = json.loads((cache_root() / LISTING_FILE).read_text())
        stored = document["fingerprint"]
        listing = Listing(
            frozenset(document["attributors"]),
            frozenset(document["evaluators"]),
            bool(document["broken"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return listing if stored == fingerprint(entry_points) else None
