"""Pure, synchronous routing: exchanges and bindings in, destination queues out."""

from gateway.routing.exchange_router import (
    Router,
    RouteResult,
    UnknownExchange,
    header_routing_keys,
    strip_bcc,
)
from gateway.routing.headers_match import HeadersMatcher, headers_match
from gateway.routing.topic_trie import TopicTrie

__all__ = [
    "HeadersMatcher",
    "RouteResult",
    "Router",
    "TopicTrie",
    "UnknownExchange",
    "header_routing_keys",
    "headers_match",
    "strip_bcc",
]
