"""What counts as CI for the tests that fail there instead of skipping (tests/test_serve_browser.py)."""

import pytest

from test_serve_browser import under_ci


@pytest.mark.parametrize("value, ci", [("1", True), ("true", True), ("True", True), ("yes", True), (" on ", True),
                                       ("0", False), ("false", False), ("no", False), ("", False), (None, False)])
def test_only_a_truthy_ci_value_counts_as_ci(monkeypatch, value, ci):
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert under_ci() is ci
