"""One version for the crates and the wheel: ``kvdrain.__version__`` is the Rust crate's
version (exported by the extension module), and it is what the installed wheel's metadata
says."""

from __future__ import annotations

import importlib.metadata
import pathlib
import re

import kvdrain
from kvdrain import _kvdrain as ext

WORKSPACE_MANIFEST = pathlib.Path(__file__).resolve().parents[4] / "Cargo.toml"


def workspace_version() -> str:
    text = WORKSPACE_MANIFEST.read_text()
    section = text[text.index("[workspace.package]") :]
    match = re.search(r'^version = "([^"]+)"$', section, re.M)
    assert match is not None, "no version in [workspace.package]"
    return match.group(1)


def test_version_is_the_crate_version() -> None:
    assert kvdrain.__version__ == workspace_version()
    assert kvdrain.__version__ is ext.__version__


def test_version_is_the_wheel_version() -> None:
    assert importlib.metadata.version("kvdrain") == kvdrain.__version__


def test_version_is_major_minor_patch() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", kvdrain.__version__)
