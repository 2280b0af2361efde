import base64

from meta.password import check_password, hash_password

# From rabbitmq-server deps/rabbit/test/definition_import_SUITE_data/case6.json: user guest.
RABBITMQ_GUEST_HASH = "J+UiUxNQ3I8uPn6Lo2obWcl93VgXgbw4R+xhl3L5zHwkRFZG"
# From RabbitMQ's "Credentials and Passwords" guide (salt 908DC60A, password test12).
RABBITMQ_DOCS_HASH = "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"


def test_rabbitmq_vectors_verify() -> None:
    assert check_password("guest", RABBITMQ_GUEST_HASH)
    assert check_password("test12", RABBITMQ_DOCS_HASH)
    assert not check_password("guesT", RABBITMQ_GUEST_HASH)
    assert not check_password("test13", RABBITMQ_DOCS_HASH)


def test_hash_with_known_salt_reproduces_docs_vector() -> None:
    assert hash_password("test12", salt=bytes.fromhex("908DC60A")) == RABBITMQ_DOCS_HASH


def test_hash_is_salted_and_roundtrips() -> None:
    first, second = hash_password("s3cret"), hash_password("s3cret")
    assert first != second
    assert len(base64.b64decode(first)) == 4 + 32
    assert check_password("s3cret", first) and check_password("s3cret", second)
    assert check_password("pässwörd", hash_password("pässwörd"))


def test_malformed_or_foreign_hashes_are_rejected() -> None:
    assert not check_password("guest", "not base64!!")
    assert not check_password("guest", base64.b64encode(b"short").decode())
    assert not check_password("guest", RABBITMQ_GUEST_HASH, "rabbit_password_hashing_md5")
