"""AR-2: the suite's own rules. No test module imports another test module or a conftest (shared
helpers live in tests/support/, fixtures in conftest.py files), and tests hash passwords with the
one-iteration hasher that subprocess servers, with Django's real hashers, still verify."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.hashers import PBKDF2PasswordHasher, get_hasher, make_password

from tests.support.factories import UserFactory
from tests.support.hashers import OneIterationPBKDF2PasswordHasher

TESTS = Path(__file__).resolve().parents[1]


def _test_modules_imported(source: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, module) for each import in `source` (a module of `package`) that names a test module
    (test_*.py) or a conftest.py under tests/."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *filter(None, [node.module])])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            file = TESTS.parent.joinpath(*name.split(".")).with_suffix(".py")
            if name.split(".")[0] == "tests" and file.is_file() and file.name.startswith(("test_", "conftest")):
                yield node.lineno, name


def test_the_rule_sees_every_form_of_importing_a_test_module():
    source = (
        "import tests.ui.test_browser_ui\n"
        "from tests.ui import test_browser_ui\n"
        "from tests.conftest import alice\n"
        "from .test_browser_ui import page\n"
        "from tests.support.browser import seed\n"
        "from tests.support import browser\n"
    )
    found = [line for line, _ in _test_modules_imported(source, "tests.ui")]
    assert found == [1, 2, 3, 4]


@pytest.mark.req("AR-2")
def test_no_test_module_imports_another_test_module_or_a_conftest():
    offending = [
        f"{path.relative_to(TESTS.parent)}:{line} imports {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, name in _test_modules_imported(
            path.read_text(), ".".join(path.relative_to(TESTS.parent).parent.parts)
        )
    ]
    assert offending == [], "move what they share to tests/support/ or a conftest.py:\n" + "\n".join(offending)


@pytest.mark.req("AR-2")
@pytest.mark.django_db
def test_tests_hash_with_one_iteration_and_the_real_hasher_still_verifies_it():
    assert isinstance(get_hasher(), OneIterationPBKDF2PasswordHasher)
    assert make_password("pw-1").startswith("pbkdf2_sha256$1$")
    user = UserFactory(username="carol", password="carol-password-1")
    assert user.password.startswith("pbkdf2_sha256$1$") and user.check_password("carol-password-1")
    # What a server started as a subprocess checks it with: Django's hasher, whose own count is far higher.
    assert PBKDF2PasswordHasher.iterations > 1
    assert PBKDF2PasswordHasher().verify("carol-password-1", user.password)
