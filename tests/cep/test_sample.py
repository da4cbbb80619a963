"""The sample generator is deterministic and every situation it plants is found by the
example rule files, run through `vigil run` (rules, queries and metrics)."""

from __future__ import annotations

import json

from cep.cli import main
from cep.cli.sample import generate, write_sample


def test_generator_is_deterministic():
    assert generate(500, seed=3) == generate(500, seed=3)
    assert generate(500, seed=3) != generate(500, seed=4)


def test_every_planted_situation_is_found(tmp_path, capsys):
    events = tmp_path / "events"
    planted = write_sample(str(events), 4000, seed=11, files=3)
    out = tmp_path / "matches.jsonl"
    dead = tmp_path / "dead.jsonl"
    code = main(["run", "examples/", "--events", str(events), "--out", str(out),
                 "--dead-letter", str(dead), "--engine", "embedded", "--no-alerts"])
    assert code == 0, capsys.readouterr().err
    matches = [json.loads(line) for line in out.read_text().splitlines()]
    assert dead.read_text() == ""  # the generator writes only valid, on-time events
    found: dict[str, set[str]] = {}
    for m in matches:
        keys = {str(v) for v in (m.get("key") or {}).values()}
        if m["kind"] == "query":
            keys.add(m["document_id"])
        found.setdefault(m["name"], set()).update(keys)
    for name, wanted in vars(planted).items():
        assert wanted, f"nothing planted for {name}"
        missing = set(wanted) - found.get(name, set())
        assert not missing, f"{name}: planted but not found: {sorted(missing)[:5]}"
    kinds = {m["kind"] for m in matches}
    assert kinds == {"rule", "query", "metric"}


def test_the_examples_events_are_the_generators(tmp_path):
    """`examples/events/` is `vigil sample --out examples/events --events 3000 --files 3`."""
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples" / "events"
    assert main(["sample", "--out", str(tmp_path), "--events", "3000", "--files", "3"]) == 0
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(p.name for p in examples.iterdir())
    for name in made:
        assert (tmp_path / name).read_bytes() == (examples / name).read_bytes(), name
