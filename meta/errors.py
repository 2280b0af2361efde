"""Typed metadata errors carrying the AMQP reply code and RabbitMQ's detail text.

The gateway maps these onto channel/connection closes: the reply text it sends is
``f"{error.reply_name} - {error.detail}"`` exactly as RabbitMQ formats it.
This module knows nothing about the gateway (meta must not import gateway).
"""

from __future__ import annotations

# The AMQP 0-9-1 spec's name for each reply code these errors carry.
REPLY_NAMES = {
    403: "ACCESS_REFUSED",
    404: "NOT_FOUND",
    405: "RESOURCE_LOCKED",
    406: "PRECONDITION_FAILED",
    409: "CONFLICT",  # not AMQP: RouteConflict is the admin API's (HTTP 409), no channel's
    503: "COMMAND_INVALID",
    530: "NOT_ALLOWED",
    541: "INTERNAL_ERROR",
}


class MetaError(Exception):
    """Base class: ``reply_code`` (and its ``reply_name``) as in the AMQP 0-9-1 spec."""

    reply_code: int = 541

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    @property
    def reply_name(self) -> str:
        return REPLY_NAMES[self.reply_code]

    @property
    def reply_text(self) -> str:
        """The text RabbitMQ puts in channel.close / connection.close."""
        return f"{self.reply_name} - {self.detail}"


class AccessRefused(MetaError):
    reply_code = 403


class NotFound(MetaError):
    reply_code = 404


class ResourceLocked(MetaError):
    reply_code = 405


class PreconditionFailed(MetaError):
    reply_code = 406


class RouteConflict(MetaError):
    """A route's compare-and-set lost: another writer changed the route since the caller
    read it (meta/queue_route.py); read it again and redo the change."""

    reply_code = 409


class CommandInvalid(MetaError):
    """Connection-level (503); e.g. an unknown exchange type."""

    reply_code = 503


class NotAllowed(MetaError):
    """Connection-level (530); e.g. an unknown vhost."""

    reply_code = 530


def resource_name(kind: str, name: str, vhost: str) -> str:
    """rabbit_misc:rs/1: ``exchange 'x' in vhost '/'``."""
    return f"{kind} '{name}' in vhost '{vhost}'"


def exchange_not_found(vhost: str, name: str) -> NotFound:
    return NotFound(f"no {resource_name('exchange', name, vhost)}")


def queue_not_found(vhost: str, name: str) -> NotFound:
    return NotFound(f"no {resource_name('queue', name, vhost)}")


def route_conflict(vhost: str, queue: str, version: int | None) -> RouteConflict:
    """``version``: the route's version stored now (None: there is none)."""
    now = "none" if version is None else f"version {version}"
    return RouteConflict(
        f"route of {resource_name('queue', queue, vhost)} changed meanwhile (now {now})"
    )


def vhost_not_found(vhost: str) -> NotAllowed:
    return NotAllowed(f"vhost {vhost} not found")


class MetadataUnavailable(MetaError):
    """The metadata store (Redis) could not be reached within its bound.

    405 RESOURCE_LOCKED: the request was valid but cannot be served now. A channel error on
    purpose: only the channel that asked is closed, while the connection, its other channels
    and traffic on existing topology go on (every AMQP code that says "try later" — 506, 541
    — would close the whole connection). The store reconnects by itself on its next call.
    """

    reply_code = 405
