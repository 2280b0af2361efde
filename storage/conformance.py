"""Every implementation of the store port fits it: mypy checks these assignments (nothing
imports this module; it sits above the implementations so that the port imports none)."""

from __future__ import annotations

from storage.clients.group import GroupStore
from storage.clients.remote import RemoteStore
from storage.clients.routed import RoutedStore
from storage.log.embedded import EmbeddedStore
from storage.port import StorePort
from storage.replication.replicated_store import ReplicatedStore
from storage.rocketmq.store import RocketMQStore

IMPLEMENTATIONS: tuple[type[StorePort], ...] = (
    EmbeddedStore,
    RemoteStore,
    GroupStore,
    RoutedStore,
    ReplicatedStore,
    RocketMQStore,
)
