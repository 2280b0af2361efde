"""RabbitMQ's password hashing (rabbit_password + rabbit_password_hashing_sha256).

stored = base64(salt || sha256(salt || utf8(password))) with a 4-byte random salt,
so users imported from RabbitMQ definitions keep their passwords.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

SHA256_ALGORITHM = "rabbit_password_hashing_sha256"
_SALT_BYTES = 4


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    """Hash ``password``; ``salt`` is for tests and reproducible vectors only."""
    salt = os.urandom(_SALT_BYTES) if salt is None else salt
    digest = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(password: str, password_hash: str, algorithm: str = SHA256_ALGORITHM) -> bool:
    """True iff ``password`` matches; compares in constant time."""
    if algorithm != SHA256_ALGORITHM:
        return False  # md5/sha512 imports are not supported yet: refuse, never guess
    try:
        decoded = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(decoded) != _SALT_BYTES + hashlib.sha256().digest_size:
        return False
    salt, expected = decoded[:_SALT_BYTES], decoded[_SALT_BYTES:]
    actual = hashlib.sha256(salt + password.encode("utf-8")).digest()
    return hmac.compare_digest(actual, expected)
