"""The query index on Spark's Python workers: built once per worker, rebuilt when the queries
change (no JVM needed)."""

from __future__ import annotations

from spark_udf import queries

PROGRAM = """
stream news (id string, title text, ts timestamp) time ts
query acme from news match title:acme
"""


def test_a_worker_builds_the_index_once_per_set_of_queries():
    decls, streams = queries._queries(PROGRAM)
    first, schemas = queries._index("v1", decls, streams)
    again, _ = queries._index("v1", decls, streams)
    assert again is first and set(schemas) == {"news"}
    changed_decls, changed_streams = queries._queries(PROGRAM.replace("acme", "globex"))
    changed, _ = queries._index("v2", changed_decls, changed_streams)
    assert changed is not first and list(queries._INDEXES) == ["v2"]
    assert changed.names == ["globex"] and first.names == ["acme"]
