"""Topic trie vs RabbitMQ's semantics, by table and against a reference matcher."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.routing.topic_trie import TopicTrie, split_words


def reference_match(pattern: list[str], words: list[str]) -> bool:
    """Obviously-correct recursive matcher: '*' one word, '#' zero or more."""
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(reference_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and reference_match(rest, words[1:])


def matches(binding_key: str, routing_key: str) -> bool:
    trie: TopicTrie[str] = TopicTrie()
    trie.add(binding_key, "d")
    return trie.match(routing_key) == {"d"}


@pytest.mark.parametrize(
    ("binding_key", "routing_key", "expected"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a", False),
        ("a.*", "a.b.c", False),
        ("a.#", "a", True),  # '#' matches zero words
        ("a.#", "a.b.c", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y", False),
        ("#", "", True),
        ("#", "anything.at.all", True),
        ("*", "", False),  # the empty key has no words
        ("", "", True),
        ("", "a", False),
        ("*", ".", False),  # '.' is two empty words
        ("*.*", ".", True),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
        ("*.a", ".a", True),
        ("a.*", "a.", True),
        ("#.#", "", True),
        ("#.#.#.#", "x", True),
        ("#.*.#", "", False),
        ("#.*.#", "x", True),
        ("a.#.#.b.#", "a.b", True),
        ("*.#", "", False),
        ("a.b", "a.*", False),  # wildcards in routing keys are literal words
        ("a.*", "a.*", True),
        ("a.#", "a.#", True),
    ],
)
def test_table(binding_key: str, routing_key: str, expected: bool) -> None:
    assert matches(binding_key, routing_key) is expected
    assert reference_match(split_words(binding_key), split_words(routing_key)) is expected


def test_add_remove_refcounts_and_prunes() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add("a.#", "q1")
    trie.add("a.#", "q1")  # a second binding (other arguments) to the same queue
    trie.add("a.b", "q2")
    assert trie.match("a.b") == {"q1", "q2"}
    assert trie.remove("a.#", "q1")
    assert trie.match("a.b") == {"q1", "q2"}
    assert trie.remove("a.#", "q1")
    assert trie.match("a.b") == {"q2"}
    assert not trie.remove("a.#", "q1")
    assert not trie.remove("x.y", "q2")
    assert trie.remove("a.b", "q2")
    assert len(trie) == 0 and trie.match("a.b") == set()
    assert not trie._root.children  # branches pruned


def test_many_hashes_stay_fast() -> None:
    trie: TopicTrie[str] = TopicTrie()
    trie.add(".".join(["#"] * 30) + ".z", "q")
    assert trie.match(".".join(["a"] * 200)) == set()
    assert trie.match(".".join(["a"] * 200) + ".z") == {"q"}


WORDS = st.sampled_from(["a", "b", "", "*", "#"])
ROUTING_WORDS = st.sampled_from(["a", "b", ""])
KEYS = st.lists(WORDS, max_size=6).map(".".join)
ROUTING_KEYS = st.lists(ROUTING_WORDS, max_size=7).map(".".join)


@settings(max_examples=500, deadline=None)
@given(
    patterns=st.lists(KEYS, min_size=1, max_size=8),
    routing_keys=st.lists(ROUTING_KEYS, min_size=1, max_size=5),
    removals=st.sets(st.integers(min_value=0, max_value=7)),
)
def test_matches_reference(
    patterns: list[str], routing_keys: list[str], removals: set[int]
) -> None:
    trie: TopicTrie[int] = TopicTrie()
    for index, pattern in enumerate(patterns):
        trie.add(pattern, index)
    live = dict(enumerate(patterns))
    for index in removals:
        if index in live:
            assert trie.remove(live.pop(index), index)
    for routing_key in routing_keys:
        expected = {
            i for i, p in live.items() if reference_match(split_words(p), split_words(routing_key))
        }
        assert trie.match(routing_key) == expected
