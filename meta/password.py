"""RabbitMQ's password hashing (rabbit_password + rabbit_password_hashing_sha256).

stored = base64(salt || sha256(salt || utf8(password))) with a 4-byte random salt,
so users imported from RabbitMQ definitions keep their passwords. The same scheme with
md5 (users from before 3.6) and sha512 (``password_hashing_module``) is checked too.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

SHA256_ALGORITHM = "rabbit_password_hashing_sha256"
SHA512_ALGORITHM = "rabbit_password_hashing_sha512"
MD5_ALGORITHM = "rabbit_password_hashing_md5"
# rabbit_password_hashing_<name>:hash/1 of each module RabbitMQ ships.
ALGORITHMS = {SHA256_ALGORITHM: "sha256", SHA512_ALGORITHM: "sha512", MD5_ALGORITHM: "md5"}
_SALT_BYTES = 4


def hash_password(
    password: str, *, salt: bytes | None = None, algorithm: str = SHA256_ALGORITHM
) -> str:
    """Hash ``password``; ``salt`` is for tests and reproducible vectors only."""
    salt = os.urandom(_SALT_BYTES) if salt is None else salt
    digest = hashlib.new(ALGORITHMS[algorithm], salt + password.encode("utf-8")).digest()
    return base64.b64encode(salt + digest).decode("ascii")


def check_password(password: str, password_hash: str, algorithm: str = SHA256_ALGORITHM) -> bool:
    """True iff ``password`` matches; compares in constant time."""
    digest_name = ALGORITHMS.get(algorithm)
    if digest_name is None:
        return False  # an unknown module: refuse, never guess
    try:
        decoded = base64.b64decode(password_hash, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(decoded) != _SALT_BYTES + hashlib.new(digest_name).digest_size:
        return False
    salt, expected = decoded[:_SALT_BYTES], decoded[_SALT_BYTES:]
    actual = hashlib.new(digest_name, salt + password.encode("utf-8")).digest()
    return hmac.compare_digest(actual, expected)
