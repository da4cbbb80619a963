"""The registry of standing queries: versions, all-or-nothing changes with located errors,
history, export round trips, and the `vigil registry` commands."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from cep.cli import main
from cep.registry import ChangeRefused, Registry, RegistryError

STREAMS = """
stream txn (card_id string, amount float, merchant string, ts timestamp) time ts
list risky from "risky.txt"
"""
RULES = """
rule big from txn by card_id pattern b define b as amount > 500
query shop from txn match merchant:shop
metric spend from txn by merchant window tumbling 1m select sum(amount) as total
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "risky.txt").write_text("m1\n\nm2\n")
    (tmp_path / "streams.vigil").write_text(STREAMS)
    (tmp_path / "rules.vigil").write_text(RULES)
    return tmp_path


def test_a_push_is_one_version_and_a_same_push_changes_nothing(files):
    with Registry(files / "r.sqlite") as registry:
        first = registry.push([str(files / "streams.vigil"), str(files / "rules.vigil")],
                              author="ana")
        assert (first.version, first.added) == (1, ["txn", "risky", "big", "shop", "spend"])
        again = registry.push([str(files / "rules.vigil")], author="ana")
        assert again.version is None and not again.changed
        assert again.unchanged == ["big", "shop", "spend"]
        # the list file's values are stored inline: the registry needs no file to run
        assert 'list risky ("m1", "m2")' in registry.text()
        assert sorted(registry.program().rules) == ["big"]


def test_a_replacement_is_a_new_version_with_history(files):
    with Registry(files / "r.sqlite") as registry:
        registry.push([str(files / "streams.vigil"), str(files / "rules.vigil")], author="ana")
        (files / "big.vigil").write_text(
            "rule big from txn by card_id pattern b define b as amount > 900\n")
        result = registry.push([str(files / "big.vigil")], author="bo")
        assert (result.version, result.replaced) == (2, ["big"])
        history = registry.store.history("big")
        assert [(c.version, c.author) for _, c in history] == [(1, "ana"), (2, "bo")]
        assert "amount > 900" in history[-1][0].text
        # the past stays readable
        assert "amount > 500" in registry.text(1) and "amount > 900" in registry.text(2)


def test_a_change_with_an_error_is_refused_whole_with_its_location(files):
    with Registry(files / "r.sqlite") as registry:
        registry.push([str(files / "streams.vigil"), str(files / "rules.vigil")], author="ana")
        bad = files / "bad.vigil"
        bad.write_text(
            "rule fine from txn by card_id pattern f define f as amount > 1\n"
            "rule typo from txn by card_id pattern t define t as amout > 1\n"
        )
        with pytest.raises(ChangeRefused) as refused:
            registry.push([str(bad)], author="ana")
        (error,) = refused.value.errors
        assert (error.file, error.line, error.column) == (str(bad), 2, 53)
        assert "undeclared field 'amout'" in error.render()
        assert registry.version == 1 and "rule fine" not in registry.text()  # nothing of it stored


def test_a_removal_others_need_is_refused_and_an_unknown_name_named(files):
    with Registry(files / "r.sqlite") as registry:
        registry.push([str(files / "streams.vigil"), str(files / "rules.vigil")], author="ana")
        with pytest.raises(ChangeRefused, match="undeclared stream 'txn'"):
            registry.remove(["txn"], author="ana")
        with pytest.raises(ChangeRefused, match="not in the registry: nope"):
            registry.remove(["big", "nope"], author="ana")
        assert registry.version == 1
        result = registry.remove(["big", "shop"], author="ana")
        assert (result.version, result.removed) == (2, ["big", "shop"])
        program = registry.program()
        assert (list(program.rules), list(program.queries), list(program.metrics)) == (
            [], [], ["spend"])
        assert "rule big" not in registry.text() and "rule big" in registry.text(1)


def test_export_then_push_changes_nothing(files, tmp_path):
    with Registry(files / "r.sqlite") as registry:
        registry.push([str(files / "streams.vigil"), str(files / "rules.vigil")], author="ana")
        written = registry.export(str(tmp_path / "exported"))
        assert len(written) == 4  # declarations.vigil + one file per rule, query, metric
        result = registry.push(written, author="ana", dry_run=True)
        assert not result.changed and len(result.unchanged) == 5


def test_concurrent_pushes_each_get_their_own_version(files):
    path = files / "r.sqlite"
    with Registry(path) as registry:
        registry.push([str(files / "streams.vigil")], author="ana")
    versions: list[int] = []

    def push(k: int) -> None:
        rule = files / f"rule{k}.vigil"
        rule.write_text(f"rule r{k} from txn by card_id pattern a define a as amount > {k}\n")
        with Registry(path) as own:
            versions.append(own.push([str(rule)], author=f"w{k}").version)

    threads = [threading.Thread(target=push, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(versions) == [2, 3, 4, 5, 6, 7]
    with Registry(path) as registry:
        assert sorted(registry.program().rules) == [f"r{k}" for k in range(6)]


def test_a_file_that_is_not_a_registry_is_refused(tmp_path):
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(RegistryError, match="not a registry"):
        Registry(other)


def test_the_registry_commands(files, tmp_path, capsys):
    reg = ["--registry", str(tmp_path / "r.sqlite")]
    assert main(["registry", "list", *reg]) == 2
    assert "no registry at" in capsys.readouterr().err
    assert main(["registry", "push", str(files / "streams.vigil"), str(files / "rules.vigil"),
                 *reg, "--author", "ana"]) == 0
    assert "version 1 — added: txn, risky, big, shop, spend" in capsys.readouterr().out
    assert main(["registry", "rm", "txn", *reg]) == 1
    err = capsys.readouterr().err
    assert "undeclared stream 'txn'" in err and "refused, nothing stored" in err
    assert main(["registry", "rm", "big", *reg]) == 0
    assert main(["registry", "list", *reg]) == 0
    out = capsys.readouterr().out
    assert "spend" in out and "big " not in out and "at version 2" in out
    assert main(["registry", "history", "big", *reg]) == 0
    assert "version 2" in capsys.readouterr().out
    assert main(["registry", "export", str(tmp_path / "x"), *reg]) == 0
    assert main(["registry", "status", *reg]) == 0
    assert "version 2" in capsys.readouterr().out


def test_a_follower_reads_only_what_changed_and_runs_what_a_fresh_build_runs(files):
    """Versions taken one at a time or several at once, from what each version wrote, give
    the registry's program at that version and the engine a build from it gives."""
    import random

    from cep.engine import Engine
    from cep.registry import RegistryFollower

    rng = random.Random(7)
    with Registry(files / "r.sqlite") as registry:
        registry.push([str(files / "streams.vigil"), str(files / "rules.vigil")])
        follower = RegistryFollower(registry, Engine, consumer="test")
        names = ["big"]
        for step in range(12):
            if names and rng.random() < 0.3:
                gone = rng.choice(names)
                registry.remove([gone])
                names.remove(gone)
            else:
                name = f"r{rng.randrange(6)}"
                threshold = rng.randrange(3) * 100
                path = files / f"step{step}.vigil"
                path.write_text(f'include "streams.vigil"\nrule {name} from txn by card_id '
                                f"pattern b define b as amount > {threshold}\n")
                registry.push([str(path)])
                names = sorted({*names, name})
            if rng.random() < 0.6:
                follower.poll()
                current = registry.store.current()
                # The same declarations (one removed and added again comes last here, in its
                # first place in the registry's listing: both put streams before their rules).
                assert sorted(follower.entries, key=repr) == sorted(current, key=repr)
                assert sorted(follower.engine.rules) == sorted(names)
                fresh = Engine()
                fresh.register(registry.text())
                assert sorted(map(repr, follower.engine.declarations)) == sorted(
                    map(repr, fresh.declarations))
        assert registry.store.applied()["test"][0] == follower.applied


def test_a_stream_change_is_checked_against_every_rule_a_rule_change_only_against_streams(
    files, monkeypatch
):
    with Registry(files / "r.sqlite") as registry:
        registry.push([str(files / "streams.vigil"), str(files / "rules.vigil")])
        narrower = files / "narrower.vigil"
        narrower.write_text("stream txn (card_id string, merchant string, ts timestamp) time ts\n")
        with pytest.raises(ChangeRefused, match="undeclared field 'amount'"):
            registry.push([str(narrower)])  # `big` and `spend` read the amount

        # A rule pushed alone is checked with the streams, lists and webhooks only: the text
        # checked does not hold the other rules (with thousands registered, it costs the one).
        import cep.registry.registry as module

        checked: list[str] = []
        real = module.check_program

        def spy(*args, **kwargs):
            checked.append(kwargs.get("text") or "")
            return real(*args, **kwargs)

        monkeypatch.setattr(module, "check_program", spy)
        rule = files / "new.vigil"
        rule.write_text('include "streams.vigil"\n'
                        "rule small from txn by card_id pattern s define s as amount < 1\n")
        assert registry.push([str(rule)]).added == ["small"]
        assert len(checked) == 2 and all("rule big" not in text for text in checked)
        assert sorted(registry.program().rules) == ["big", "small"]


def test_a_table_pushed_while_events_flow_starts_empty_and_survives_a_rebuild(tmp_path):
    """A table added to a running program sees the changes from then on; a later change that
    rebuilds the engine (a list replaced) keeps its rows."""
    from cep.engine import Engine
    from cep.registry import RegistryFollower

    (tmp_path / "streams.vigil").write_text(
        "stream txn (card_id string, country string, ts timestamp) time ts\n"
        "stream card_changes (card_id string, home string, op string, ts timestamp) time ts\n"
        'list vip ("c9")\n'
    )
    (tmp_path / "cards.vigil").write_text(
        'include "streams.vigil"\n'
        "table cards from card_changes key card_id op op\n"
        "rule abroad from txn by card_id pattern a\n"
        "  define a as country != lookup(cards, card_id).home\n"
        "  emit card_id, lookup(cards, card_id).home as home\n"
    )
    (tmp_path / "vip.vigil").write_text('list vip ("c9", "c8")\n')
    with Registry(tmp_path / "r.sqlite") as registry:
        registry.push([str(tmp_path / "streams.vigil")])
        follower = RegistryFollower(registry, Engine, consumer="test")
        follower.engine.feed({"stream": "card_changes", "card_id": "c2", "home": "FR", "op": "c",
                              "ts": 1})  # before the table: not kept
        registry.push([str(tmp_path / "cards.vigil")])
        follower.poll()
        engine = follower.engine
        for row in ({"stream": "card_changes", "card_id": "c1", "home": "FR", "op": "c", "ts": 2},
                    {"stream": "txn", "card_id": "c1", "country": "DE", "ts": 3},
                    {"stream": "txn", "card_id": "c2", "country": "DE", "ts": 3}):
            engine.feed(row)
        engine.advance_watermark(5_000)
        assert [m["values"] for m in engine.drain()] == [{"card_id": "c1", "home": "FR"}]
        registry.push([str(tmp_path / "vip.vigil")])
        follower.poll()
        assert follower.engine is not engine  # a list replaced: the engine was rebuilt
        follower.engine.feed({"stream": "txn", "card_id": "c1", "country": "DE", "ts": 10})
        follower.engine.close()
        assert [m["values"] for m in follower.engine.drain()] == [
            {"card_id": "c1", "home": "FR"}]
