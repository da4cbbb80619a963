"""The Python examples of ``docs/spark.md`` run as written, in a directory holding the
examples' ``fraud.vigil`` and ``events/``, with the tests' SparkSession, so an example that
stops working fails CI."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from spark_udf import read_outputs

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(doc: Path) -> list[str]:
    """The fenced ``python`` blocks of a Markdown file, in order."""
    return _BLOCK.findall(doc.read_text(encoding="utf-8"))


def test_spark_md_examples_run(spark, tmp_path, monkeypatch, capsys):
    for name in ("fraud.vigil", "common.vigil"):
        shutil.copy(ROOT / "examples" / name, tmp_path / name)
    shutil.copytree(ROOT / "examples" / "lists", tmp_path / "lists")
    (tmp_path / "events").mkdir()
    for part in sorted((ROOT / "examples" / "events").glob("*.jsonl")):
        shutil.copy(part, tmp_path / "events" / part.name)
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(ROOT / "docs" / "spark.md")
    assert len(blocks) >= 2  # run_spark, and detect over a frame of one's own
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/spark.md", "exec"), namespace)
    printed = capsys.readouterr().out
    by_run = read_outputs(str(tmp_path / "out" / "matches"))
    own = read_outputs(str(tmp_path / "out" / "own"))
    assert by_run, printed
    # The same rules over the same lines: the same matches, whatever numbers the rows.
    assert sorted({m["name"] for m in own}) == sorted({m["name"] for m in by_run})
    assert len(own) == len(by_run)
    # The new checkpoint recorded its size: the session's shuffle partitions, and buckets
    # chosen from them.
    record = json.loads((tmp_path / "out" / "matches" / "_checkpoint" / "vigil.json").read_text())
    assert (record["layout"]["shuffle_partitions"], record["layout"]["buckets"]) == (
        int(spark.conf.get("spark.sql.shuffle.partitions")), 16)
