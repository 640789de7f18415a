"""A PostgreSQL role per service, on a real server (issue 14, part 6).

A throwaway PostgreSQL (``scripts/servers.py``; its roles are its own, so the machine's server
is not touched) is set up as CloudNativePG sets up the prod overlay's Cluster: the database
``gin`` owned by ``gin``, then the Cluster's ``postInitApplicationSQL`` (a role per service
owning its schema) and its managed roles, all read from the rendered manifests. Every service
then runs as a process connected as its own role: each migrates its schema (the Job's
``migrate`` too), all reach ready and a match against TITO is played to the end with a chat
message. Last, each role is refused every table of the other schemas (the chat cannot read
``gin_table.tables``, which holds hands and deck orders), a schema of its own making, tables in
``public`` and the other roles; the one exception is the table's view of its deadlines, which
the timer service reads (issue 29), and reads as its role. And the runbook's one-off SQL hands
the schemas of a database made before (owned by ``gin``) to the roles.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import aiohttp
import asyncpg
import msgspec
import pytest

from shared.infra import amqp, db
from shared.infra.auth import mint
from shared.infra.outbox import SQL_DIR
from shared.infra.settings import Settings, env_name
from tests.deploy.test_prod_broker import play_against_tito, render_prod
from tests.e2e.processes import ROOT, Service, all_ready

sys.path.insert(0, str(ROOT / "scripts"))
import servers

pytestmark = pytest.mark.slow
SCHEMAS = {"table": "gin_table", "chat": "gin_chat", "timers": "gin_timers"}
SERVICES = ("table", "chat", "timers", "bots")
# What a role may read of another schema: the table's deadlines, by the timer service.
SHARED = {"timers": {("gin_table", "timer_deadlines")}}


@pytest.fixture(scope="module")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.PgState]:
    state_dir = tmp_path_factory.mktemp("postgres")
    entry = servers.start_postgres(
        state_dir, servers.load_state(state_dir), servers.Installer(), 120
    )
    try:
        yield entry
    finally:
        servers.stop_postgres(entry, servers.owner_of(state_dir))


def with_user(url: str, user: str, database: str) -> str:
    """``url`` (the superuser's) as ``user`` on ``database``."""
    host = url.split("@", 1)[1].rsplit("/", 1)[0]
    return f"postgresql://{user}@{host}/{database}"


async def bootstrap(superuser_url: str) -> dict[str, str]:
    """What CloudNativePG does for the prod Cluster: its initdb (database and owner), the
    post-init SQL, then the managed roles; each service's role by service."""
    cluster = next(
        o
        for o in render_prod()
        if o["kind"] == "Cluster" and o["metadata"]["name"] == "gin-postgres"
    )
    initdb = cluster["spec"]["bootstrap"]["initdb"]
    database, owner = initdb["database"], initdb["owner"]
    conn = await asyncpg.connect(superuser_url)
    try:
        await conn.execute(f'CREATE ROLE "{owner}" LOGIN')
        await conn.execute(f'CREATE DATABASE "{database}" OWNER "{owner}"')
    finally:
        await conn.close()
    conn = await asyncpg.connect(with_user(superuser_url, "postgres", database))
    try:
        for statement in initdb["postInitApplicationSQL"]:
            await conn.execute(statement)
        roles = cluster["spec"]["managed"]["roles"]
        for role in roles:  # the operator: attributes and the Secret's password
            login = "LOGIN" if role["login"] else "NOLOGIN"
            await conn.execute(
                f'ALTER ROLE "{role["name"]}" {login} NOSUPERUSER NOCREATEDB NOCREATEROLE'
                f" PASSWORD '{uuid.uuid4().hex}'"
            )
    finally:
        await conn.close()
    by_secret = {r["passwordSecret"]["name"]: r["name"] for r in roles}
    return {service: by_secret[f"gin-{service}-database"] for service in SCHEMAS}


@pytest.fixture
async def prefix(settings: Settings) -> AsyncIterator[str]:
    """A broker prefix of this test's own: the services declare their topology themselves."""
    own = f"{settings.prefix}roles-{uuid.uuid4().hex[:6]}."
    yield own
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        await amqp.delete_topology(channel, own)  # the chat's and the timers' queues too


async def refused(url: str, sql: str) -> bool:
    """True when the role of ``url`` gets "insufficient privilege" (42501) for ``sql``."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    except asyncpg.InsufficientPrivilegeError:
        return True
    finally:
        await conn.close()
    return False


async def test_each_service_uses_only_its_own_schema_as_its_own_role(
    postgres: servers.PgState, settings: Settings, prefix: str, tmp_path: Path
) -> None:
    roles = await bootstrap(postgres.url)
    urls = {service: with_user(postgres.url, role, "gin") for service, role in roles.items()}
    s = msgspec.structs.replace(settings, prefix=prefix, log_format="json", bot_think_s=0.0)

    # The migrations Job's step for one service, as its role.
    migrated = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "services.chat", "migrate"],
        env={**os.environ, env_name("database_url"): urls["chat"]},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert migrated.returncode == 0, migrated.stderr

    logs = {name: tmp_path / f"{name}.log" for name in SERVICES}
    services = {
        name: Service(
            f"services.{name}",
            msgspec.structs.replace(s, database_url=urls.get(name, s.database_url)),
            log_to=logs[name],
            GIN_LOG_LEVEL="info",
        )
        for name in SERVICES
    }
    try:
        await all_ready(services, logs, within_s=90)
        table, chat = services["table"].base, services["chat"].base
        async with aiohttp.ClientSession() as session:
            token = mint(s.auth_secret, f"ana-{uuid.uuid4().hex}", "Ana")
            table_id = await play_against_tito(session, table, token)
            async with session.post(
                f"{chat}/v1/tables/{table_id}/messages",
                json={"text": "boa"},
                headers={"Authorization": f"Bearer {token}"},
            ) as r:
                assert r.status == 201, await r.text()
    finally:
        for service in services.values():
            service.stop()
    for name, path in logs.items():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            assert record["level"] not in ("error", "critical"), (name, line)
            assert record["event"] != "timer_firing_failed", (name, line)  # it reads the view

    superuser = await asyncpg.connect(with_user(postgres.url, "postgres", "gin"))
    try:
        objects = await superuser.fetch(
            "SELECT n.nspname AS schema, c.relname AS name, pg_get_userbyid(c.relowner) AS owner"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = ANY($1::text[]) AND c.relkind IN ('r', 'p', 'u', 'S', 'v')",
            list(SCHEMAS.values()),
        )
    finally:
        await superuser.close()
    tables = {(r["schema"], r["name"]) for r in objects}
    assert ("gin_table", "tables") in tables
    for row in objects:  # every object made by the migrations is its own role's
        service = next(s for s, schema in SCHEMAS.items() if schema == row["schema"])
        assert row["owner"] == roles[service], dict(row)

    failures: list[str] = []
    for service, url in urls.items():
        own = SCHEMAS[service]
        shared = SHARED.get(service, set())
        attempts = [
            f"SELECT 1 FROM {schema}.{name} LIMIT 1"
            for schema, name in sorted(tables)
            if schema != own and (schema, name) not in shared
        ]
        attempts += [
            f"CREATE TABLE {other}.stolen (x int)" for other in SCHEMAS.values() if other != own
        ]
        attempts += [
            "CREATE SCHEMA another",
            "CREATE TABLE public.stolen (x int)",
            *(f"SET ROLE {role}" for s, role in roles.items() if s != service),
            "SET ROLE gin",
        ]
        for sql in attempts:
            if not await refused(url, sql):
                failures.append(f"{roles[service]}: {sql}")
        for schema, name in sorted(tables):  # what it may do: its own tables, and the shared
            if schema == own or (schema, name) in shared:
                assert not await refused(url, f"SELECT 1 FROM {schema}.{name} LIMIT 1")
    assert not failures, failures
    assert await refused(urls["chat"], "SELECT * FROM gin_table.tables")  # hands, deck orders
    assert await refused(urls["timers"], "SELECT * FROM gin_table.deadlines")  # the view only


def handover_sql(service: str) -> str:
    """The runbook's one-off statements for a database made before, for one service."""
    text = (ROOT / "deploy" / "README.md").read_text()
    section = text.split("hand each schema and what is in it to its role once", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    sql = block.split('-c "', 1)[1].rsplit('"', 1)[0]
    return sql.replace("\\$", "$").replace("$s", service)


async def test_the_runbook_hands_the_schemas_of_an_older_database_to_their_roles(
    postgres: servers.PgState,
) -> None:
    superuser = await asyncpg.connect(postgres.url)
    try:
        if not await superuser.fetchval("SELECT 1 FROM pg_roles WHERE rolname = 'gin'"):
            await superuser.execute("CREATE ROLE gin LOGIN")
        await superuser.execute("CREATE DATABASE gin_before OWNER gin")
    finally:
        await superuser.close()
    migrations = {s: ROOT / "services" / s / "migrations" for s in SCHEMAS}
    for service, schema in SCHEMAS.items():  # as every release before this one: all as gin
        await db.migrate_url(
            with_user(postgres.url, "gin", "gin_before"), schema, SQL_DIR, migrations[service]
        )
    superuser = await asyncpg.connect(with_user(postgres.url, "postgres", "gin_before"))
    try:
        for service in SCHEMAS:
            await superuser.execute(handover_sql(service))
            await superuser.execute(handover_sql(service))  # twice: safe to run again
        owners = await superuser.fetch(
            "SELECT n.nspname AS schema, c.relname AS name, pg_get_userbyid(c.relowner) AS owner"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = ANY($1::text[])"
            " UNION ALL SELECT nspname, '', pg_get_userbyid(nspowner) FROM pg_namespace"
            " WHERE nspname = ANY($1::text[])",
            list(SCHEMAS.values()),
        )
    finally:
        await superuser.close()
    assert len(owners) > 3 * 5
    for row in owners:  # the schema, its tables, sequences and indexes: its role's
        assert row["owner"] == row["schema"], dict(row)  # (the role is named as its schema)
    for service, schema in SCHEMAS.items():  # each service migrates on as its role
        url = with_user(postgres.url, f"gin_{service}", "gin_before")
        assert await db.migrate_url(url, schema, SQL_DIR, migrations[service]) == []
    chat = with_user(postgres.url, "gin_chat", "gin_before")
    assert await refused(chat, "SELECT * FROM gin_table.tables")
    timers = with_user(postgres.url, "gin_timers", "gin_before")
    assert not await refused(timers, "SELECT * FROM gin_table.timer_deadlines")
