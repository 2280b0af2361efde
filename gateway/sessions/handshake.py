"""A connection's login and vhost open: the answers RabbitMQ gives before any channel.

Authentication (a password, or EXTERNAL with a verified client certificate), the
loopback-only users, the connection limits and the vhost access check of connection.open,
and connection.update-secret. Each takes the session it changes and answers through its
sans-IO connection; the events those answers produce go back to ``Session.handle_events``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.amqp import AuthRequested, SecretUpdateRequested, VHostOpenRequested
from gateway.amqp.errors import NotAllowed
from gateway.amqp.sasl import EXTERNAL
from gateway.sessions.connection_limits import count_in, count_out
from gateway.sessions.taps import session_tap

if TYPE_CHECKING:
    from gateway.sessions.session import Session

log = logging.getLogger("mqgw.connection")


async def authenticate(session: Session, event: AuthRequested) -> None:
    node = session.node
    if event.mechanism == EXTERNAL:  # a verified client certificate (its CN): no password
        user = await node.get_user(event.username) if event.username else None
    else:
        user = await node.authenticate(event.username, event.password)
    reason = ""
    if user is None:
        reason = f"user '{event.username}' - invalid credentials"
    elif event.username in node.settings.loopback_users and not _is_loopback(session.peer):
        reason = f"user '{event.username}' can only connect via localhost"
    if reason:
        log.warning(
            "connection %s: login refused: %s",
            session.id,
            reason,
            extra={"connection": session.name},
        )
        await session.handle_events(session.conn.reject_auth(reason))
        return
    session.user = event.username
    await session.handle_events(session.conn.accept_auth())


async def open_vhost(session: Session, event: VHostOpenRequested) -> None:
    node = session.node
    vhost = node.vhosts.get(event.vhost)
    if vhost is None:
        await session.handle_events(session.conn.reject_vhost())
        return
    limit = node.settings.max_connections
    if limit and node.open_connections >= limit:
        error = NotAllowed(
            f"access to vhost '{event.vhost}' refused for user '{session.user}': "
            f"connection limit ({limit}) is reached"
        )
        await session.handle_events(session.conn.reject_vhost(error))
        return
    refused = await count_in(session, vhost.name)  # RabbitMQ: before the access check
    if refused is not None:
        await session.handle_events(session.conn.reject_vhost(refused))
        return
    if not node.access.may_use_vhost(session.user, vhost.name):
        # rabbit_access_control:check_vhost_access/4: no permission entry in the vhost.
        error = NotAllowed(f"access to vhost '{vhost.name}' refused for user '{session.user}'")
        log.warning(
            "connection %s: %s", session.id, error.reply_text, extra={"connection": session.name}
        )
        await count_out(session)
        await session.handle_events(session.conn.reject_vhost(error))
        return
    # Decisions cached per resource; the object stays current across permission changes.
    session.grants = node.access.grants(session.user, vhost.name)
    # rabbit_channel:check_user_id_header/2 lets the 'impersonator' tag publish any
    # user-id; the tags are those of the login, as RabbitMQ keeps them on the connection.
    user = node.known_user(session.user)
    session.impersonator = user is not None and "impersonator" in user.tags
    session.vhost = vhost
    session.tap = session_tap(session)
    session.opened = True
    session.vhost_opened.set()
    node.controls.attach_session(session)
    node.gray.attach(session)
    node.open_connections += 1
    log.info(
        "accepting AMQP connection %s (user '%s', vhost '%s')",
        session.id,
        session.user,
        vhost.name,
        extra={"connection": session.name},
    )
    await session.handle_events(session.conn.accept_vhost())
    if node.alarms.blocked:
        session.conn.send_blocked(node.block_reason())


def update_secret(session: Session, event: SecretUpdateRequested) -> None:
    """connection.update-secret, as rabbit_reader 3.10 answers it with its internal users.

    rabbit_access_control:update_state/2 passes the new secret only to backends whose
    state can expire (OAuth 2 tokens); rabbit_auth_backend_internal:state_can_expire()
    is false, so the user is kept as authenticated and update-secret-ok is sent whatever
    the secret. The refusal (530 NOT_ALLOWED, conn.refuse_secret_update) is for such
    backends, which mqgw does not have.
    """
    log.info(
        "connection %s: user '%s' updated secret, reason: %s",
        session.id,
        session.user,
        event.reason,
        extra={"connection": session.name},
    )
    session.conn.accept_secret_update()
    session.mark_dirty()


def _is_loopback(peer: str) -> bool:
    host = peer.rsplit(":", 1)[0].strip("[]")
    return host.startswith("127.") or host in ("::1", "localhost")
