"""Metadata calls as AMQP sees them: the metadata store (meta/) raises typed ``MetaError``s
with a reply code; a vhost's methods and the sessions turn them into the AMQP error of the
method that made the call (its class and method ids), so the client gets the channel or
connection close RabbitMQ would send.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

from gateway.amqp.errors import AMQPError, error_for_code
from meta.errors import MetaError

T = TypeVar("T")


def amqp_error(error: MetaError, class_id: int, method_id: int) -> AMQPError:
    return error_for_code(error.reply_code, error.detail, class_id, method_id)


async def meta_call(call: Awaitable[T], class_id: int, method_id: int) -> T:
    """Await a metadata operation, turning its typed error into the AMQP one."""
    try:
        return await call
    except MetaError as error:
        raise amqp_error(error, class_id, method_id) from None
