"""The README's main job, `vigil demo`, end to end on Spark (its default) and on the embedded
engine: matches in out/, every alert delivered to the loopback receiver and verified."""

from __future__ import annotations

import glob
import json
import socket

import pytest

from cep.cli import main
from cep.cli.demo import DEMO_PORT


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.mark.parametrize("engine", [pytest.param("spark", marks=pytest.mark.slow), "embedded"])
def test_demo_delivers_every_alert(tmp_path, capsys, engine, unavailable):
    if not _port_free(DEMO_PORT):
        unavailable(f"port {DEMO_PORT}, which the example webhooks use, is busy")
    out = tmp_path / "out"
    argv = ["demo", "--out", str(out), "--quiet"]
    assert main(argv if engine == "spark" else [*argv, "--engine", "embedded"]) == 0
    err = capsys.readouterr().err
    files = (sorted(glob.glob(str(out / "matches" / "*.jsonl"))) if engine == "spark"
             else [str(out / "matches.jsonl")])
    matches = [json.loads(line) for path in files for line in open(path).read().splitlines()]
    assert {m["kind"] for m in matches} == {"rule", "query", "metric"}
    assert "0 failed, 0 pending" in err
    assert ", 0 rejected" in err
    # every rule with notify alerted at least once, and the receiver verified each alert
    for name in ("card_testing", "stolen_card_use", "unpaid_order", "acme_news",
                 "merchant_velocity", "brute_force_success", "card_testing_abroad",
                 "watched_merchant_sale"):
        line = next(ln for ln in err.splitlines() if f" {name} " in ln)
        assert int(line.split()[-1]) >= 1, line
