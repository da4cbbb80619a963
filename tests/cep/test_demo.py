"""The README's main job, `vigil demo`, end to end on Spark (its default) and on the embedded
engine: matches in out/, every alert delivered to the loopback receiver and verified."""

from __future__ import annotations

import glob
import json
import socket

import pytest

from cep.cli import main
from cep.cli.demo import DEMO_PORT


@pytest.fixture
def port_8787_taken():
    """Port 8787 held by a listening socket here (or already by another program)."""
    with socket.socket() as held:
        try:
            held.bind(("127.0.0.1", DEMO_PORT))
            held.listen()
        except OSError:
            pass  # someone else holds it: the same situation
        yield


def _matches(out, engine):
    files = (sorted(glob.glob(str(out / "matches" / "*.jsonl"))) if engine == "spark"
             else [str(out / "matches.jsonl")])
    return [json.loads(line) for path in files for line in open(path).read().splitlines()]


@pytest.mark.parametrize("engine", [pytest.param("spark", marks=pytest.mark.slow), "embedded"])
def test_demo_delivers_every_alert(tmp_path, capsys, engine, port_8787_taken):
    out = tmp_path / "out"
    argv = ["demo", "--out", str(out), "--quiet"]
    # 8787, where the example webhooks point, is busy: the receiver takes a free port and the
    # webhooks follow it (spark: a free port asked for with --port 0)
    argv += ["--port", "0"] if engine == "spark" else ["--engine", "embedded"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    if engine == "embedded":
        assert f"port {DEMO_PORT} is busy" in err
    assert "the webhooks fraud_team, media_team, ops_team (declared on 127.0.0.1:8787) " in err
    matches = _matches(out, engine)
    assert {m["kind"] for m in matches} == {"rule", "query", "metric"}
    assert "0 failed, 0 pending" in err
    assert ", 0 rejected" in err
    # every rule with notify alerted at least once, and the receiver verified each alert
    for name in ("card_testing", "stolen_card_use", "unpaid_order", "acme_news",
                 "merchant_velocity", "brute_force_success", "card_testing_abroad",
                 "watched_merchant_sale"):
        line = next(ln for ln in err.splitlines() if f" {name} " in ln)
        assert int(line.split()[-1]) >= 1, line


def test_demo_on_a_busy_port_asked_for_says_so(tmp_path, capsys, port_8787_taken):
    argv = ["demo", "--out", str(tmp_path / "out"), "--engine", "embedded", "--port", "8787"]
    assert main(argv) == 2
    assert "vigil demo: cannot listen on 127.0.0.1:8787" in capsys.readouterr().err
