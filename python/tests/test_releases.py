"""Which accelerate release the launchers imitate: read from the installed
package's metadata as accel's Rust table reads a dist-info name."""

from __future__ import annotations

import importlib.metadata
import os
import warnings

import pytest

from accel import launchers


@pytest.mark.parametrize(
    "installed, expected, warns",
    [
        ("1.10.1", (1, 10), False),
        ("1.15.0", (1, 15), False),
        ("1.16.0", (1, 16), False),
        ("1.16.2", (1, 16), False),
        ("1.17.0.dev0", (1, 16), True),
        ("1.9.0", (1, 10), True),
        ("not-a-version", (1, 16), False),
    ],
)
def test_the_release_is_read_as_the_table_reads_it(monkeypatch, installed, expected, warns) -> None:
    monkeypatch.setattr(importlib.metadata, "version", lambda name: installed)
    launchers._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert launchers._accelerate_release() == expected
        launchers._accelerate_release()  # a second call says nothing more
    assert len(caught) == (1 if warns else 0), [str(w.message) for w in caught]
    if warns:
        assert installed in str(caught[0].message)


def test_no_accelerate_behaves_as_the_newest(monkeypatch) -> None:
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert launchers._accelerate_release() == launchers._NEWEST_KNOWN


@pytest.mark.parametrize("installed, plain", [("1.15.0", True), ("1.16.0", False), ("1.10.1", True)])
def test_notebook_precision_variables_follow_the_release(monkeypatch, installed, plain) -> None:
    # What the workers would inherit, captured where the agent would start.
    seen = {}

    def capture(function, args, flags, title, debug=False):
        seen.update({k: os.environ.get(k) for k in ("MIXED_PRECISION", "ACCELERATE_MIXED_PRECISION")})

    monkeypatch.setattr(importlib.metadata, "version", lambda name: installed)
    monkeypatch.setattr(launchers, "_launch", capture)
    monkeypatch.delenv("MIXED_PRECISION", raising=False)
    launchers.notebook_launcher(print, num_processes=2, mixed_precision="bf16")
    assert seen == {"MIXED_PRECISION": "bf16" if plain else None, "ACCELERATE_MIXED_PRECISION": "bf16"}
