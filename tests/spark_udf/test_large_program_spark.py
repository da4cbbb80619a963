"""A program that pickles above a mebibyte (a few hundred rules): PySpark would broadcast it,
and the transformWithState operator cannot load a broadcast command, so the query failed at
its start (``BROADCAST_VARIABLE_NOT_LOADED``). Sessions built by ``spark_udf.session`` keep it
inline; another session gets a clear refusal."""

from __future__ import annotations

import random

import pytest
from pyspark import cloudpickle
from spark_support import ids, run_both

from spark_udf import operator
from spark_udf.errors import OperatorConfigError
from spark_udf.rules import detect_specs, processor_specs
from spark_udf.session import INLINE_COMMAND_BYTES
from spark_udf.sources import read_jsonl

RULES = 300
PROGRAM = "stream ev (k string, kind string, v int, ts timestamp) time ts lateness 5s\n" + "".join(
    f"rule r{i} from ev by k pattern a b within 1m\n"
    f'  define a as kind == "a" and v > {i % 50}, b as kind == "b" and v < {i % 7 + 40}\n'
    for i in range(RULES)
)


def _events(n: int) -> list[dict]:
    rng = random.Random(11)
    return [{"stream": "ev", "k": f"k{rng.randrange(5)}", "kind": rng.choice("ab"),
             "v": rng.randrange(60), "ts": 1_767_225_600 + i} for i in range(n)]


@pytest.mark.slow
def test_a_program_above_a_mebibyte_runs_and_equals_the_embedded_engine(spark, tmp_path):
    (spec,), _ = processor_specs(PROGRAM)
    assert len(cloudpickle.dumps(spec.processor)) > 1 << 20  # PySpark's default threshold
    assert spark.conf.get("spark.broadcast.UDFCompressionThreshold") == str(INLINE_COMMAND_BYTES)
    engine, got, dead = run_both(spark, tmp_path, PROGRAM, _events(120))
    expected = engine.drain()
    assert len(expected) > 100 and not dead
    assert ids(got) == ids(expected)


def test_a_session_that_would_broadcast_it_is_refused_with_what_to_set(spark, tmp_path,
                                                                        monkeypatch):
    path = tmp_path / "events.jsonl"
    path.write_text('{"stream": "ev", "k": "k", "kind": "a", "v": 1, "ts": 1767225600}\n')
    specs, _ = processor_specs(PROGRAM)
    monkeypatch.setattr(operator, "broadcast_threshold", lambda df: 1 << 20)
    with pytest.raises(OperatorConfigError, match="spark.broadcast.UDFCompressionThreshold"):
        detect_specs(read_jsonl(spark, str(path), streaming=True), specs)
