"""TLS for AMQP (``tls_port``) and the admin API, with certificates reloaded while running.

The settings follow RabbitMQ's ``ssl_options``; client certificates are asked for this way:

    tls_verify = "none"                                   -> CERT_NONE (none asked for)
    tls_verify = "peer"                                   -> CERT_OPTIONAL (if sent, verified)
    tls_verify = "peer", tls_fail_if_no_peer_cert = true  -> CERT_REQUIRED

A verified certificate's CN is the user name of the EXTERNAL mechanism (gateway/amqp/sasl.py).
``tls_versions`` gives the lowest and highest protocol version; ``tls_ciphers`` is an OpenSSL
cipher string (TLS 1.2 and below; Python cannot restrict TLS 1.3's suites).

Reload: on SIGHUP, and when the mtime, size or inode of a certificate, key or CA file changes
(polled every ``POLL_INTERVAL_S``), the context is rebuilt from the files. New connections get
the new one; open connections keep theirs. A rebuild that fails (a key that does not match, a
file half written) is logged as an error and the previous context stays.
"""

from __future__ import annotations

import logging
import signal
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import ByteStream, SocketAttribute, TaskStatus
from anyio.streams.tls import TLSStream

from gateway.config.settings import GatewaySettings
from gateway.node import Node
from gateway.sessions.connection_io import serve_connection

log = logging.getLogger("mqgw.tls")

TLS_VERSIONS = {
    "tlsv1": ssl.TLSVersion.TLSv1,
    "tlsv1.1": ssl.TLSVersion.TLSv1_1,
    "tlsv1.2": ssl.TLSVersion.TLSv1_2,
    "tlsv1.3": ssl.TLSVersion.TLSv1_3,
}
HANDSHAKE_TIMEOUT_S = 5.0  # RabbitMQ's ssl_handshake_timeout (5000 ms)
POLL_INTERVAL_S = 2.0

FileStamp = tuple[int, int, int] | None


class TLSSettingsError(ValueError):
    """TLS settings that cannot work; the message names the setting (a startup error)."""


def check_settings(settings: GatewaySettings) -> None:
    """Raise TLSSettingsError for a combination of TLS settings that cannot work."""
    if settings.tls_port:
        for key in ("tls_cert", "tls_key"):
            if getattr(settings, key) is None:
                raise TLSSettingsError(f"tls_port is {settings.tls_port} but {key} is not set")
        if settings.tls_verify == "peer" and settings.tls_ca is None:
            raise TLSSettingsError(
                'tls_verify = "peer" needs tls_ca (the CA certificates that client '
                "certificates are verified against)"
            )
    if (settings.admin_tls_cert is None) != (settings.admin_tls_key is None):
        missing = "admin_tls_key" if settings.admin_tls_key is None else "admin_tls_cert"
        raise TLSSettingsError(f"HTTPS for the admin API needs both keys: {missing} is not set")
    version_range(settings.tls_versions)


def version_range(versions: Sequence[str]) -> tuple[ssl.TLSVersion, ssl.TLSVersion]:
    """tls_versions -> (minimum, maximum); unknown names are a TLSSettingsError."""
    unknown = [v for v in versions if v.lower() not in TLS_VERSIONS]
    if unknown or not versions:
        raise TLSSettingsError(
            f"tls_versions: {unknown or 'empty'}; known: {', '.join(TLS_VERSIONS)}"
        )
    chosen = sorted(TLS_VERSIONS[v.lower()] for v in versions)
    return chosen[0], chosen[-1]


@dataclass(frozen=True)
class CertFiles:
    """A listener's files and the names of the settings they come from (for messages)."""

    cert: Path
    key: Path
    ca: Path | None = None
    names: tuple[str, str] = ("tls_cert", "tls_key")

    @property
    def paths(self) -> tuple[Path, ...]:
        return (self.cert, self.key) if self.ca is None else (self.cert, self.key, self.ca)


def build_context(
    settings: GatewaySettings, files: CertFiles, *, client_auth: bool
) -> ssl.SSLContext:
    """A server-side context from the files; TLSSettingsError names what is wrong."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version, context.maximum_version = version_range(settings.tls_versions)
    if settings.tls_ciphers:
        try:
            context.set_ciphers(settings.tls_ciphers)
        except ssl.SSLError as error:
            raise TLSSettingsError(f"tls_ciphers {settings.tls_ciphers!r}: {error}") from error
    try:
        context.load_cert_chain(files.cert, files.key)
    except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
        cert_name, key_name = files.names
        raise TLSSettingsError(
            f"{cert_name} {files.cert} / {key_name} {files.key}: {error}"
        ) from error
    if client_auth and files.ca is not None:
        try:
            context.load_verify_locations(cafile=files.ca)
        except (OSError, ValueError) as error:
            raise TLSSettingsError(f"tls_ca {files.ca}: {error}") from error
    if client_auth and settings.tls_verify == "peer":
        required = settings.tls_fail_if_no_peer_cert
        context.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
    return context


def _stamp(path: Path) -> FileStamp:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size, stat.st_ino


class ReloadingContext:
    """One listener's SSLContext, rebuilt from its files by ``reload``.

    ``in_place``: the context object stays and gets the new certificate and key loaded into it
    (after a trial build): for servers that hold on to the object (uvicorn). Otherwise
    ``context`` is replaced, and the accept loop reads it for every new connection.
    """

    def __init__(
        self,
        name: str,
        settings: GatewaySettings,
        files: CertFiles,
        *,
        client_auth: bool,
        in_place: bool = False,
    ) -> None:
        self.name = name
        self.files = files
        self._settings = settings
        self._client_auth = client_auth
        self._in_place = in_place
        self._stamps = self._current_stamps()
        self.context = self._build()
        self.reloads = 0

    def _build(self) -> ssl.SSLContext:
        return build_context(self._settings, self.files, client_auth=self._client_auth)

    def _current_stamps(self) -> tuple[FileStamp, ...]:
        return tuple(_stamp(path) for path in self.files.paths)

    def changed(self) -> bool:
        return self._current_stamps() != self._stamps

    def reload(self, reason: str) -> bool:
        """Rebuild from the files; on failure keep the current context (and say so)."""
        # Stamped before reading: a write racing with this build shows up at the next poll.
        self._stamps = self._current_stamps()
        try:
            context = self._build()
            if self._in_place:
                self.context.load_cert_chain(self.files.cert, self.files.key)
        except (TLSSettingsError, OSError, ValueError) as error:
            log.error(
                "TLS certificate for %s not reloaded (%s): %s; the previous one stays in use",
                self.name, reason, error,
            )  # fmt: skip
            return False
        if not self._in_place:
            self.context = context
        self.reloads += 1
        log.info(
            "TLS certificate for %s reloaded (%s) from %s: new connections use it",
            self.name, reason, self.files.cert,
        )  # fmt: skip
        return True


@dataclass
class TLSSetup:
    """The reloadable contexts of a node: AMQP's (tls_port) and the admin API's."""

    amqp: ReloadingContext | None = None
    admin: ReloadingContext | None = None
    contexts: list[ReloadingContext] = field(default_factory=list)

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> TLSSetup:
        """Check the settings and load every certificate; TLSSettingsError if one is wrong."""
        check_settings(settings)
        setup = cls()
        if settings.tls_port and settings.tls_cert and settings.tls_key:
            files = CertFiles(settings.tls_cert, settings.tls_key, settings.tls_ca)
            setup.amqp = ReloadingContext("AMQP", settings, files, client_auth=True)
            if settings.tls_fail_if_no_peer_cert and settings.tls_verify == "none":
                log.warning('tls_fail_if_no_peer_cert has no effect with tls_verify = "none"')
        if settings.admin_port and settings.admin_tls_cert and settings.admin_tls_key:
            names = ("admin_tls_cert", "admin_tls_key")
            files = CertFiles(settings.admin_tls_cert, settings.admin_tls_key, names=names)
            setup.admin = ReloadingContext(
                "the admin API", settings, files, client_auth=False, in_place=True
            )
        setup.contexts = [c for c in (setup.amqp, setup.admin) if c is not None]
        return setup

    def reload(self, reason: str) -> None:
        for context in self.contexts:
            context.reload(reason)

    async def watch(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Reload on SIGHUP and when a file changes; started (SIGHUP caught) before ready."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._poll)
            with anyio.open_signal_receiver(signal.SIGHUP) as signals:
                task_status.started()
                async for _ in signals:
                    self.reload("SIGHUP")

    async def _poll(self) -> None:
        while True:
            await anyio.sleep(POLL_INTERVAL_S)
            for context in self.contexts:
                if context.changed():
                    context.reload("files changed")


def _peer(stream: ByteStream) -> str:
    address = stream.extra(SocketAttribute.remote_address, None)
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address)


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return f"no TLS handshake within {HANDSHAKE_TIMEOUT_S:g} s"
    if isinstance(error, anyio.EndOfStream):
        return "the client closed the connection"
    cause = error.__cause__ or error
    return str(cause) or type(cause).__name__


async def serve_tls_connection(node: Node, stream: ByteStream, tls: ReloadingContext) -> None:
    """TLS handshake with the context current at accept, then the AMQP connection.

    Runs in the connection's own task, so a slow or failing handshake holds up nobody else.
    Clients often close without close_notify: the closing handshake is skipped.
    """
    try:
        with anyio.fail_after(HANDSHAKE_TIMEOUT_S):
            wrapped = await TLSStream.wrap(
                stream, server_side=True, ssl_context=tls.context, standard_compatible=False
            )
    except Exception as error:  # only this connection fails; cancellation passes through
        log.warning("TLS handshake with %s failed: %s", _peer(stream), _describe(error))
        await anyio.aclose_forcefully(stream)
        return
    await serve_connection(node, wrapped)
