"""mkdocs hook (mkdocs.yml `hooks:`): puts the benchmark plots of bench/ into the site beside the benchmark
pages, and fails a strict build while the committed CRD reference is not what the CRD generates."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.ignis")


def _root(config) -> Path:
    return Path(config.config_file_path).resolve().parent


def on_files(files: Files, config) -> Files:
    """bench/*.png -> benchmarks/*.png in the site: the pictures stay where the benchmarks write them."""
    for png in sorted((_root(config) / "bench").glob("*.png")):
        files.append(File.generated(config, f"benchmarks/{png.name}", abs_src_path=str(png)))
    return files


def on_pre_build(config) -> None:
    root = _root(config)
    spec = importlib.util.spec_from_file_location("gen_crd_reference", root / "docs" / "gen_crd_reference.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    if not gen.is_current(root):
        log.warning("docs/kubernetes/crd-reference.md is out of date with crds/: run python docs/gen_crd_reference.py")
