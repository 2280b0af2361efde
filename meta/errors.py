"""Typed metadata errors carrying the AMQP reply code and RabbitMQ's detail text.

The gateway maps these onto channel/connection closes: the reply text it sends is
``f"{error.reply_name} - {error.detail}"`` exactly as RabbitMQ formats it.
This module knows nothing about the gateway (meta must not import gateway).
"""

from __future__ import annotations


class MetaError(Exception):
    """Base class: ``reply_code``/``reply_name`` as in the AMQP 0-9-1 spec."""

    reply_code: int = 541
    reply_name: str = "INTERNAL_ERROR"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail

    @property
    def reply_text(self) -> str:
        """The text RabbitMQ puts in channel.close / connection.close."""
        return f"{self.reply_name} - {self.detail}"


class AccessRefused(MetaError):
    reply_code = 403
    reply_name = "ACCESS_REFUSED"


class NotFound(MetaError):
    reply_code = 404
    reply_name = "NOT_FOUND"


class ResourceLocked(MetaError):
    reply_code = 405
    reply_name = "RESOURCE_LOCKED"


class PreconditionFailed(MetaError):
    reply_code = 406
    reply_name = "PRECONDITION_FAILED"


class CommandInvalid(MetaError):
    """Connection-level (503); e.g. an unknown exchange type."""

    reply_code = 503
    reply_name = "COMMAND_INVALID"


class NotAllowed(MetaError):
    """Connection-level (530); e.g. an unknown vhost."""

    reply_code = 530
    reply_name = "NOT_ALLOWED"


def resource_name(kind: str, name: str, vhost: str) -> str:
    """rabbit_misc:rs/1: ``exchange 'x' in vhost '/'``."""
    return f"{kind} '{name}' in vhost '{vhost}'"


def exchange_not_found(vhost: str, name: str) -> NotFound:
    return NotFound(f"no {resource_name('exchange', name, vhost)}")


def queue_not_found(vhost: str, name: str) -> NotFound:
    return NotFound(f"no {resource_name('queue', name, vhost)}")


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
    reply_name = "RESOURCE_LOCKED"
