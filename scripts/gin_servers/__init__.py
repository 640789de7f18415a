"""The parts of ``scripts/servers.py``, one module a concern.

- ``common``: errors, messages, processes, ports, short commands, Debian packages;
- ``state``: what the throwaway servers of a state dir are, kept in its ``state.json``;
- ``pg_client``: PostgreSQL's client programs, its URLs, liveness and per-run databases;
- ``postgres``: a throwaway PostgreSQL server, started, reused and stopped;
- ``amqp``: whether a broker answers, learned by logging in with aio-pika;
- ``rabbitmq``: a throwaway RabbitMQ node, started, reused and stopped.

Import them through ``scripts/servers.py``, whose names the benches, chaos runs and tests use.
"""
