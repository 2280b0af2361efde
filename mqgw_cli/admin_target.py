"""Where the admin API is and who calls it, for `mqgw ctl`, `mqgw queue` and `mqgw
definitions` (docs/operations.md, "The operator commands").

The URL, first found of:
  ``--admin URL``; ``--dir D`` (a local cluster's first gateway, D/cluster.json);
  ``MQGW_ADMIN_URL``; ``admin_host``/``admin_port`` as `mqgw serve` reads them
  (``MQGW_ADMIN_HOST``, ``MQGW_ADMIN_PORT``, ``MQGW_HOST``, then the ``--config`` file or
  ``MQGW_CONFIG_FILE``; https when ``admin_tls_cert`` is set); http://127.0.0.1:15672.
The user and the password, each the first found of:
  ``--user``/``--password`` (visible to every user of the machine in ``ps``: avoid the
  password flag); ``MQGW_ADMIN_USER``/``MQGW_ADMIN_PASSWORD``; the credentials file; guest.
The credentials file is ``--credentials FILE``, else ``MQGW_ADMIN_CREDENTIALS``, else
``$XDG_CONFIG_HOME/mqgw/credentials`` (``~/.config/mqgw/credentials``) when it exists: TOML
with ``user`` and ``password``. As ssh does with a private key, a file that its group or
other users may read is refused.
"""

from __future__ import annotations

import argparse
import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_ADMIN_URL = "http://127.0.0.1:15672"
URL_ENV = "MQGW_ADMIN_URL"
USER_ENV = "MQGW_ADMIN_USER"
PASSWORD_ENV = "MQGW_ADMIN_PASSWORD"
CREDENTIALS_ENV = "MQGW_ADMIN_CREDENTIALS"
# MQGW_* variables that the operator commands read and `mqgw serve` has no setting for.
CLIENT_ENV = (URL_ENV, USER_ENV, PASSWORD_ENV, CREDENTIALS_ENV)
# The settings whose MQGW_* variables give the admin URL (the others are not read here, so a
# bad value of an unrelated one does not stop `mqgw ctl`).
_URL_SETTINGS = ("config_file", "host", "admin_host", "admin_port", "admin_tls_cert")
_ANY_ADDRESS = ("", "0.0.0.0", "::", "[::]")  # listening everywhere: ask loopback


class AdminConfigError(Exception):
    """The admin URL or the credentials cannot be worked out: one line, exit 2."""


@dataclass(frozen=True)
class AdminTarget:
    url: str
    user: str
    password: str
    url_source: str  # for messages: "flag --admin", "env MQGW_ADMIN_URL", "the default", ...
    user_source: str


def add_admin_options(parser: argparse.ArgumentParser) -> None:
    """--admin/--dir, --config, --credentials, --user, --password."""
    group = parser.add_argument_group(
        "admin API, where and as whom (each: flag > env > file > default; docs/operations.md)"
    )
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--admin",
        default=None,
        metavar="URL",
        help=f"admin API base URL (env {URL_ENV}; default {DEFAULT_ADMIN_URL})",
    )
    where.add_argument(
        "--dir",
        type=Path,
        default=None,
        metavar="D",
        help="a local cluster's directory: its first gateway (D/cluster.json)",
    )
    group.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="the gateway's TOML settings file: admin_host, admin_port (env MQGW_CONFIG_FILE)",
    )
    group.add_argument(
        "--credentials",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"TOML user/password, mode 600 (env {CREDENTIALS_ENV}; "
        "default ~/.config/mqgw/credentials if it exists)",
    )
    group.add_argument("--user", default=None, help=f"admin user (env {USER_ENV}; default guest)")
    group.add_argument(
        "--password",
        default=None,
        help=f"its password: prefer env {PASSWORD_ENV} or the credentials file "
        "(a flag shows in ps)",
    )


def _settings_url(config: Path | None, environ: dict[str, str]) -> tuple[str, str]:
    """The URL `mqgw serve` with these settings listens on, and where that came from."""
    from gateway.config.sources import ConfigError, env_name, resolve

    names = {env_name(key) for key in _URL_SETTINGS}
    flags = {"config_file": config} if config is not None else {}
    try:
        resolved = resolve(flags, {k: v for k, v in environ.items() if k in names})
    except ConfigError as error:
        raise AdminConfigError(f"configuration error: {error}") from None
    settings = resolved.settings
    if settings.admin_port == 0:
        where = resolved.source("admin_port")
        raise AdminConfigError(f"admin_port is 0 ({where}): that gateway has no admin API")
    host = settings.admin_host.strip()
    if host in _ANY_ADDRESS:
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # IPv6
    scheme = "https" if settings.admin_tls_cert is not None else "http"
    sources = {str(resolved.source(k)) for k in ("admin_host", "admin_port", "admin_tls_cert")}
    sources.discard("default")
    source = ", ".join(sorted(sources)) if sources else "the default"
    return f"{scheme}://{host}:{settings.admin_port}", source


def _cluster_url(directory: Path) -> tuple[str, str]:
    from localcluster.layout import ClusterError, load

    try:
        cluster = load(directory.resolve())
    except ClusterError as error:
        raise AdminConfigError(str(error)) from None
    if not cluster.gateways:
        raise AdminConfigError(f"the cluster in {directory} has no gateway")
    first = cluster.gateways[0]
    return first.admin_url, f"--dir {directory}: {first.name}"


def credentials_path(args: argparse.Namespace, environ: dict[str, str]) -> tuple[Path, bool]:
    """The credentials file and whether it was named (a named file must exist)."""
    if args.credentials is not None:
        return args.credentials, True
    if environ.get(CREDENTIALS_ENV):
        return Path(environ[CREDENTIALS_ENV]), True
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")) / ".config")
    return Path(base).expanduser() / "mqgw" / "credentials", False


def read_credentials(path: Path, named: bool) -> dict[str, str]:
    """``user`` and ``password`` from the TOML file (either may be left out); {} when the
    default file does not exist. AdminConfigError names the file and what is wrong."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        if named:
            raise AdminConfigError(f"credentials file {path}: not found") from None
        return {}
    except OSError as error:
        raise AdminConfigError(f"credentials file {path}: {error.strerror or error}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AdminConfigError(
            f"credentials file {path} may be read by other users (mode "
            f"{stat.S_IMODE(mode):04o}): `chmod 600 {path}`"
        )
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise AdminConfigError(f"credentials file {path}: {error}") from None
    unknown = sorted(set(data) - {"user", "password"})
    if unknown:
        raise AdminConfigError(
            f"credentials file {path}: unknown key {unknown[0]!r} (it holds user and password)"
        )
    for key, value in data.items():
        if not isinstance(value, str):
            raise AdminConfigError(f"credentials file {path}: {key} must be a string")
    return data


def admin_target(args: argparse.Namespace, environ: dict[str, str] | None = None) -> AdminTarget:
    """Where and as whom, from the parsed options of ``add_admin_options`` and ``environ``
    (default os.environ). AdminConfigError when something given cannot be used."""
    env = dict(os.environ if environ is None else environ)
    if args.admin:
        url, url_source = args.admin, "flag --admin"
    elif args.dir is not None:
        url, url_source = _cluster_url(args.dir)
    elif env.get(URL_ENV):
        url, url_source = env[URL_ENV], f"env {URL_ENV}"
    else:
        url, url_source = _settings_url(args.config, env)
    if not url.startswith(("http://", "https://")):
        raise AdminConfigError(f"admin URL {url!r} ({url_source}) is not http:// or https://")
    path, named = credentials_path(args, env)
    stored: dict[str, str] | None = None

    def pick(flag: str | None, flag_name: str, variable: str, key: str) -> tuple[str, str]:
        nonlocal stored
        if flag is not None:
            return flag, f"flag {flag_name}"
        if env.get(variable):
            return env[variable], f"env {variable}"
        if stored is None:
            stored = read_credentials(path, named)
        if key in stored:
            return stored[key], f"credentials file {path}"
        return "guest", "the default"

    user, user_source = pick(args.user, "--user", USER_ENV, "user")
    password, _ = pick(args.password, "--password", PASSWORD_ENV, "password")
    return AdminTarget(url.rstrip("/"), user, password, url_source, user_source)
