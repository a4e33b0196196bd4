"""The package's metadata: what a user's pip installs, on every Python it claims."""

from __future__ import annotations

from importlib import metadata

from packaging.requirements import Requirement


def test_tomli_is_installed_where_tomllib_is_missing():
    """Python 3.10 has no tomllib: agent/base/config.py reads TOML with tomli there."""
    reqs = [Requirement(r) for r in metadata.requires("gpudiag") or []]
    tomli = [r for r in reqs if r.name == "tomli"]
    assert tomli, "tomli must be a dependency for Python < 3.11"
    assert tomli[0].marker is not None
    assert tomli[0].marker.evaluate({"python_version": "3.10"})
    assert not tomli[0].marker.evaluate({"python_version": "3.11"})
    assert metadata.metadata("gpudiag")["Requires-Python"] == ">=3.10"
