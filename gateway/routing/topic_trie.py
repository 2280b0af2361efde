"""A trie over dot-separated words for topic exchanges, matching as RabbitMQ does.

Words are what ``key.split('.')`` gives, except that the empty key has no words
(rabbit_db_topic_exchange:split_topic_key_binary/1), so ``a..b`` has an empty middle
word and ``""`` matches only the binding keys ``""`` and ``#`` (and ``#.#``...).
``*`` matches exactly one word (possibly empty), ``#`` zero or more words.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

D = TypeVar("D", bound=Hashable)


def split_words(key: str) -> list[str]:
    return key.split(".") if key else []


class _Node(Generic[D]):
    __slots__ = ("children", "destinations")

    def __init__(self) -> None:
        self.children: dict[str, _Node[D]] = {}
        # destination -> number of bindings with this key to it (bindings may differ
        # only in arguments; the route must stay until the last one goes)
        self.destinations: dict[D, int] = {}


class TopicTrie(Generic[D]):
    def __init__(self) -> None:
        self._root: _Node[D] = _Node()
        self._bindings = 0

    def __len__(self) -> int:
        return self._bindings

    def add(self, binding_key: str, destination: D) -> None:
        node = self._root
        for word in split_words(binding_key):
            node = node.children.setdefault(word, _Node())
        node.destinations[destination] = node.destinations.get(destination, 0) + 1
        self._bindings += 1

    def remove(self, binding_key: str, destination: D) -> bool:
        """Drop one binding; prunes emptied branches. False if it was not there."""
        path: list[tuple[_Node[D], str]] = []
        node = self._root
        for word in split_words(binding_key):
            child = node.children.get(word)
            if child is None:
                return False
            path.append((node, word))
            node = child
        count = node.destinations.get(destination)
        if count is None:
            return False
        if count > 1:
            node.destinations[destination] = count - 1
        else:
            del node.destinations[destination]
        self._bindings -= 1
        for parent, word in reversed(path):
            child = parent.children[word]
            if child.children or child.destinations:
                break
            del parent.children[word]
        return True

    def match(self, routing_key: str) -> set[D]:
        """Destinations of every binding key that matches ``routing_key``."""
        words = split_words(routing_key)
        last = len(words)
        found: set[D] = set()
        # (node, position) pairs already explored: a '#' run can reach the same pair
        # many ways; remembering them (for this call only) keeps matching polynomial.
        seen: set[tuple[int, int]] = set()
        stack: list[tuple[_Node[D], int]] = [(self._root, 0)]
        while stack:
            node, position = stack.pop()
            state = (id(node), position)
            if state in seen:
                continue
            seen.add(state)
            children = node.children
            hash_child = children.get("#")
            if position == last:
                found.update(node.destinations)
                if hash_child is not None:  # '#' may match zero words
                    stack.append((hash_child, last))
                continue
            exact = children.get(words[position])
            if exact is not None:
                stack.append((exact, position + 1))
            star = children.get("*")
            if star is not None:
                stack.append((star, position + 1))
            if hash_child is not None:
                stack.extend((hash_child, skip) for skip in range(position, last + 1))
        return found
