"""`vigil alerts` given an endpoint or outbox that does not exist: a usage error (exit 2) that
names what was asked for and what there is, never a traceback."""

from __future__ import annotations

import pytest

from cep.alerts import Endpoint, Outbox
from cep.cli import main
from cep.cli.arguments import EXIT_USAGE

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def alert(i: int) -> dict:
    return {"kind": "rule", "name": "big", "version": 1, "match_id": f"m{i}",
            "key": {"card_id": "c1"}, "events": {"b": [i]}, "values": {},
            "start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:00:00Z", "severity": "high"}


@pytest.fixture
def outbox(tmp_path) -> str:
    """A real outbox holding one alert for each of two endpoints."""
    path = str(tmp_path / "outbox.sqlite")
    endpoints = [Endpoint(name, f"http://127.0.0.1:9/{name}", (SECRET,))
                 for name in ("fraud_team", "ops")]
    with Outbox(path) as box:
        box.enqueue(alert(1), endpoints)
    return path


@pytest.mark.parametrize("action", [
    ["replay", "--since", "2000-01-01"],
    ["log"],
])
def test_an_unknown_endpoint_is_a_usage_error_naming_the_known_ones(action, outbox, capsys):
    assert main(["alerts", *action, "--endpoint", "nope", "--outbox", outbox]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.err == (
        f"vigil: --endpoint 'nope': no such endpoint in {outbox} (known: fraud_team, ops)\n"
    )
    assert "Traceback" not in captured.err and captured.out == ""


def test_an_empty_outbox_says_it_has_no_endpoints(tmp_path, capsys):
    path = str(tmp_path / "empty.sqlite")
    Outbox(path).close()
    assert main(["alerts", "replay", "--since", "2000-01-01", "--endpoint", "ops",
                 "--outbox", path]) == EXIT_USAGE
    assert capsys.readouterr().err == (
        f"vigil: --endpoint 'ops': no such endpoint in {path} (it has no endpoints yet)\n"
    )


def test_a_known_endpoint_still_replays_and_logs(outbox, capsys):
    assert main(["alerts", "replay", "--since", "2000-01-01", "--endpoint", "ops",
                 "--outbox", outbox]) == 0
    # nothing was delivered yet, so nothing is queued again
    assert capsys.readouterr().out == "queued 0 alert(s) for delivery again\n"
    assert main(["alerts", "log", "--endpoint", "ops", "--outbox", outbox]) == 0


def test_a_file_that_is_not_an_outbox_is_a_usage_error(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    for action in (["status"], ["log"], ["replay", "--since", "2000-01-01"]):
        assert main(["alerts", *action, "--outbox", str(path)]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert err.startswith("vigil: ") and "is not a usable outbox" in err
        assert str(path) in err and "Traceback" not in err
