"""The Chromium page the browser tests drive."""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS


@pytest.fixture
def page():
    """A fresh page in a fresh headless Chromium, closed after the test."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser.new_context().new_page()
        browser.close()
