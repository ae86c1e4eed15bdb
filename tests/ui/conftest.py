"""The Chromium the browser tests drive: one per module, a fresh context for each test."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.support.browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.timing import scaled

# What the page must come to show, not how fast: Playwright's 5 s ran out once in a fresh CI run
# (the /context navigation, at the suite's start, with every worker's servers starting on 2 cores).
expect.set_options(timeout=scaled(15_000))


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, launched once per module: a launch and Playwright's driver cost seconds of CPU
    each, and a context per test isolates as well (its own cookies, storage and cache)."""
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser):
    """A fresh page in a fresh browser context, closed after the test."""
    context = browser.new_context()
    yield context.new_page()
    context.close()
