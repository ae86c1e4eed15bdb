"""A password hash that costs nothing and still verifies anywhere.

It is Django's PBKDF2 with one iteration: the iteration count is stored in the hash, so a server
started as a subprocess (with the real hashers) still signs in users the tests created.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class OneIterationPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1
