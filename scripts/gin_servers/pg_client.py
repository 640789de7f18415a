"""PostgreSQL's client side: its programs (psql, pg_isready, the server binaries), its URLs,
whether a server answers, the server on the standard port, and a database per test run."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from gin_servers.common import (
    LOCALHOST,
    Installer,
    ServerError,
    log,
    output_of,
    redact,
    run,
    tcp_open,
)

PG_STANDARD_PORT = 5432


def _version_key(path: str) -> tuple[int, ...]:
    name = Path(path).parent.name
    return tuple(int(part) for part in re.findall(r"\d+", name)) or (0,)


def find_pg_bindir() -> Path | None:
    """The newest /usr/lib/postgresql/*/bin holding initdb, pg_ctl and postgres."""
    candidates = [
        path
        for path in glob.glob("/usr/lib/postgresql/*/bin")
        if all(os.access(Path(path, exe), os.X_OK) for exe in ("initdb", "pg_ctl", "postgres"))
    ]
    if not candidates:
        return None
    return Path(max(candidates, key=_version_key))


def find_client(name: str) -> str | None:
    """psql / pg_isready: on PATH, else in a /usr/lib/postgresql/*/bin."""
    found = shutil.which(name)
    if found:
        return found
    bindirs = [
        d for d in glob.glob("/usr/lib/postgresql/*/bin") if os.access(Path(d, name), os.X_OK)
    ]
    return str(Path(max(bindirs, key=_version_key), name)) if bindirs else None


def find_psql(installer: Installer | None) -> str:
    psql = find_client("psql")
    if psql is None and installer is not None:
        installer.install(["postgresql"], "psql is missing")
        psql = find_client("psql")
    if psql is None:
        raise ServerError("psql is not installed (Debian package postgresql-client)")
    return psql


def pg_bindir(installer: Installer) -> Path:
    bindir = find_pg_bindir()
    if bindir is None:
        installer.install(["postgresql"], "PostgreSQL binaries are missing")
        bindir = find_pg_bindir()
    if bindir is None:
        raise ServerError("no PostgreSQL under /usr/lib/postgresql/*/bin even after apt-get")
    return bindir


# --------------------------------------------------------------------------------------------
# PostgreSQL clients


def pg_env() -> dict[str, str]:
    """The environment for psql / pg_isready: no stray PG* settings, a connect timeout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = "5"
    return env


def pg_hosts(url: str) -> list[tuple[str, int]]:
    """The (host, port) of each server a URL names: one, or several (``h1:p1,h2:p2``, as
    libpq and asyncpg read it: the first that suits ``target_session_attrs``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ServerError(f"{redact(url)} is not a postgresql:// URL")
    hosts = parts.netloc.rpartition("@")[2]
    found = []
    for spec in hosts.split(","):
        host, port = spec, ""
        if ":" in spec and not spec.endswith("]"):  # [::1] alone is a host without a port
            host, _, port = spec.rpartition(":")
        try:
            number = int(port) if port else PG_STANDARD_PORT
        except ValueError as exc:
            raise ServerError(f"{redact(url)} has an invalid port") from exc
        if not 0 < number < 65536:
            raise ServerError(f"{redact(url)} has an invalid port")
        found.append((unquote(host.strip("[]")) or LOCALHOST, number))
    return found


def pg_host_port(url: str) -> tuple[str, int]:
    """The first server a URL names."""
    return pg_hosts(url)[0]


def pg_ready(url: str) -> tuple[bool, str]:
    """TCP connect (to any of the URL's servers), then pg_isready when it is installed."""
    hosts = pg_hosts(url)
    if not any(tcp_open(host, port, timeout=3.0) for host, port in hosts):
        named = ", ".join(f"{host}:{port}" for host, port in hosts)
        return False, f"nothing accepts TCP connections on {named}"
    pg_isready = find_client("pg_isready")
    if pg_isready is None:
        return True, "TCP connect ok (pg_isready not installed)"
    result = run([pg_isready, "-d", url, "-t", "5"], env=pg_env(), timeout=15)
    if result.returncode == 0:
        return True, "accepting connections"
    return False, f"pg_isready says: {output_of(result)}"


def psql_query(url: str, sql: str, psql: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [psql or find_psql(None), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
    return run([*command, "-d", url, "-c", sql], env=pg_env(), timeout=60)


DB_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def database_url(admin_url: str, name: str) -> str:
    """admin_url pointing at database ``name`` instead."""
    return urlunsplit(urlsplit(admin_url)._replace(path="/" + quote(name)))


def _check_db_name(name: str) -> None:
    if not DB_NAME_RE.fullmatch(name):
        raise ServerError(
            f"database name {name!r}: use 1 to 63 letters, digits or _, not a digit first"
        )


def create_database(admin_url: str, name: str) -> str:
    """Create database ``name`` through admin_url (a role allowed CREATE DATABASE); its URL."""
    _check_db_name(name)
    pg_host_port(admin_url)
    result = psql_query(admin_url, f'CREATE DATABASE "{name}"')
    if result.returncode != 0:
        raise ServerError(
            f"cannot create database {name} on {redact(admin_url)}: {output_of(result)}"
        )
    return database_url(admin_url, name)


def drop_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` (if it exists), disconnecting its sessions."""
    _check_db_name(name)
    pg_host_port(admin_url)
    result = psql_query(admin_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    if result.returncode != 0:
        raise ServerError(
            f"cannot drop database {name} on {redact(admin_url)}: {output_of(result)}"
        )


def standard_postgres_url(installer: Installer) -> str | None:
    """A URL for the server on 127.0.0.1:5432 that psql can log in to, if any."""
    if not tcp_open(LOCALHOST, PG_STANDARD_PORT):
        return None
    psql = find_psql(installer)
    failures: list[str] = []
    for user in ("postgres", "root"):
        url = f"postgresql://{user}@{LOCALHOST}:{PG_STANDARD_PORT}/postgres"
        result = psql_query(url, "select 1", psql)
        if result.returncode == 0 and result.stdout.strip() == "1":
            return url
        failures.append(f"{user}: {output_of(result)}")
    log(f"postgres: port {PG_STANDARD_PORT} answers but psql cannot log in ({'; '.join(failures)})")
    return None
