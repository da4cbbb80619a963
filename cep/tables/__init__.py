"""Tables fed by changelog streams: the rows of each key as they stood at any event time, for
``lookup(table, key).field`` in rules (the stream-table join of Kafka Streams, Flink's
``FOR SYSTEM_TIME AS OF``).

Modules: ``versions`` (one table's versions by key, the as-of read, compaction and state
bytes) and ``changelog`` (a changelog row read as an upsert, a delete or a bad row; the
tables of a program fed by its streams).
"""

from cep.tables.changelog import Change, ChangeError, TableFeed, Tables
from cep.tables.versions import VersionedTable

__all__ = ["Change", "ChangeError", "TableFeed", "Tables", "VersionedTable"]
