"""The public contract of the backend: every event, command and view, the envelope and the
names, as msgspec Structs. Also shipped alone as the distribution selminha-gin-contracts
(``make contracts-dist``), whose only dependency is msgspec: import nothing else here."""

VERSION = "1.0.0"
"""The selminha-gin-contracts version: its major is ``envelope.SCHEMA_VERSION``."""
