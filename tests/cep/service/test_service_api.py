"""The API of `vigil serve`, endpoint by endpoint, with every refusal as a problem detail."""

from __future__ import annotations

import pytest
from service_support import STREAM, lines, make_service, rule, txn

from cep.service import ServiceError

PROBLEM = "application/problem+json"


def problem(answer, status: int) -> dict:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    body = answer.json()
    assert body["status"] == status and body["title"] and body["type"]
    return body


def test_create_get_list_replace_history_and_delete(api):
    created = api.put("big", STREAM + rule("big", "amount > 100"))
    assert created.status_code == 201 and created.headers["location"] == "/queries/big"
    assert created.json()["status"] == "added" and created.json()["added"] == ["txn", "big"]
    again = api.put("big", STREAM + rule("big", "amount > 100"))
    assert again.status_code == 200 and again.json()["status"] == "unchanged"
    replaced = api.put("big", rule("big", "amount > 900"))
    assert replaced.status_code == 200 and replaced.json()["status"] == "replaced"
    assert replaced.json()["version"] == 2

    one = api.client.get("/queries/big", headers=api.r).json()
    assert (one["kind"], one["version"], one["history"]) == ("rule", 2, "/queries/big/history")
    assert "amount > 900" in one["text"]
    listed = api.client.get("/queries", headers=api.r).json()
    assert {(q["name"], q["kind"]) for q in listed["queries"]} == {("big", "rule"),
                                                                  ("txn", "stream")}
    assert [q["name"] for q in api.client.get("/queries", headers=api.r,
                                              params={"kind": "stream"}).json()["queries"]] \
        == ["txn"]
    history = api.client.get("/queries/big/history", headers=api.r).json()["history"]
    assert [(h["version"], h["author"]) for h in history] == [(1, "ana"), (2, "ana")]

    gone = api.client.delete("/queries/big", headers=api.w)
    assert gone.status_code == 200 and gone.json()["removed"] == ["big"]
    problem(api.client.get("/queries/big", headers=api.r), 404)


def test_bad_dsl_is_400_with_its_location_and_nothing_is_stored(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    body = problem(api.put("typo", rule("typo", "amout > 1")), 400)
    assert body["errors"] == [{"file": "<body>", "line": 1, "column": 50,
                               "message": "undeclared field 'amout': not a field of the stream"}]
    syntax = problem(api.put("broken", "rule broken from txn pattern\n"), 400)
    assert syntax["errors"][0]["file"] == "<body>" and syntax["errors"][0]["line"] == 1
    assert api.client.get("/status", headers=api.r).json()["registry_version"] == 1


def test_a_body_must_be_self_contained(api):
    body = problem(api.put("x", 'include "other.vigil"\n' + rule("x", "amount > 1")), 400)
    assert "include is not accepted" in body["errors"][0]["message"]
    body = problem(api.put("risky", 'list risky from "/etc/passwd"\n'), 400)
    assert "reads a file" in body["errors"][0]["message"]


def test_unknown_names_are_404(api):
    problem(api.client.get("/queries/nope", headers=api.r), 404)
    problem(api.client.get("/queries/nope/history", headers=api.r), 404)
    problem(api.client.delete("/queries/nope", headers=api.w), 404)


def test_name_clashes_are_409(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    mismatch = problem(api.put("other", rule("big", "amount > 5")), 409)
    assert "defines 'big', not 'other'" in mismatch["detail"]
    taken = problem(api.put("big", "query big from txn match card:c1\n"), 409)
    assert taken["type"] == "urn:vigil:problem:name-taken" and "is a rule" in taken["detail"]
    several = problem(api.put("a", rule("a", "amount > 1") + rule("b", "amount > 2")), 400)
    assert "a, b" in several["detail"]


def test_removing_what_others_need_is_409_with_the_errors(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    body = problem(api.client.delete("/queries/txn", headers=api.w), 409)
    assert body["errors"][0] == {"file": "<registry v1>", "line": 2, "column": 8,
                                 "message": "undeclared stream 'txn'"}


def test_check_validates_without_storing(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    ok = api.client.post("/check", content=rule("small", "amount < 1"), headers=api.r)
    assert ok.status_code == 200 and ok.json()["would_add"] == ["small"]
    bad = problem(api.client.post("/check", content=rule("s", "amout < 1"), headers=api.r), 400)
    assert bad["errors"][0]["line"] == 1
    assert api.client.get("/queries", headers=api.r).json()["registry_version"] == 1


def test_tokens_scopes_and_revocation(api):
    problem(api.client.get("/queries"), 401)
    unknown = problem(api.client.get("/queries", headers={"Authorization": "Bearer vgl_x"}),
                      401)
    assert unknown["detail"] == "the token is unknown or revoked"
    assert api.client.get("/queries").headers["www-authenticate"].startswith("Bearer")
    forbidden = problem(api.client.put("/queries/big", content=STREAM, headers=api.r), 403)
    assert "scope read" in forbidden["detail"]
    problem(api.client.post("/events", content=b"{}\n", headers=api.r), 403)
    problem(api.client.delete("/queries/big", headers=api.r), 403)
    api.service.tokens.revoke("bo")
    problem(api.client.get("/queries", headers=api.r), 401)


def test_an_oversized_body_is_413(api_factory):
    api = api_factory(max_body=1000)
    problem(api.post(b"{}\n" * 400), 413)
    problem(api.put("big", STREAM + "#" * 1000), 413)
    assert api.post(b"{}\n" * 10).status_code == 200


def test_the_rate_limit_is_429_with_retry_after(api_factory):
    api = api_factory(rate=1, burst=3)
    codes = [api.client.get("/queries", headers=api.r).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    limited = api.client.get("/queries", headers=api.r)
    problem(limited, 429)
    assert int(limited.headers["retry-after"]) >= 1
    assert api.client.get("/queries", headers=api.w).status_code == 200  # its own bucket


def test_events_are_counted_and_bad_lines_become_dead_letters(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    body = lines(txn("c1", 500, 0), txn("c1", 5, 1)) + b"{oops\n" + lines(
        {"stream": "txn", "card": "c2", "amount": "many", "ts": 2}, {"stream": "nope"})
    answer = api.post(body)
    assert answer.status_code == 200
    counts = answer.json()
    assert (counts["received"], counts["accepted"], counts["dead"], counts["late"]) == (5, 2, 3, 0)
    assert counts["reasons"] == {"invalid_json": 1, "unknown_stream": 1, "wrong_type": 1}
    assert counts["matches"] == 1 and counts["registry_version"] == 1
    late = api.post(lines(txn("c1", 700, -100)))
    assert late.json()["late"] == 1
    dead = api.client.get("/dead-letters", headers=api.r).json()
    assert [d["reason"] for d in dead["dead_letters"]] == [
        "invalid_json", "wrong_type", "unknown_stream", "late"]
    assert dead["dead_letters"][0]["line"] == 3 and dead["next"] == 4
    only = api.client.get("/dead-letters", headers=api.r, params={"name": "late"}).json()
    assert [d["cursor"] for d in only["dead_letters"]] == [4]


def test_a_last_line_without_a_line_break_is_an_event_too(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    answer = api.post(lines(txn("c1", 500, 0)).rstrip(b"\n"))
    assert (answer.json()["received"], answer.json()["matches"]) == (1, 1)
    answer = api.post(lines(txn("c2", 500, 1)) + lines(txn("c3", 500, 2)).rstrip(b"\n"))
    assert (answer.json()["received"], answer.json()["matches"]) == (2, 2)


def test_the_stream_parameter_binds_every_line(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    answer = api.post(b'{"card": "c1", "amount": 500, "ts": 1767225600}\n', stream="txn")
    assert answer.json()["accepted"] == 1 and answer.json()["matches"] == 1


def test_matches_are_paged_by_cursor_and_filtered_by_name(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    api.put("small", rule("small", "amount < 10"))
    api.post(lines(*[txn(f"c{i}", 500 if i % 2 else 1, i) for i in range(10)]))
    first = api.client.get("/matches", headers=api.r, params={"limit": 4}).json()
    assert [m["cursor"] for m in first["matches"]] == [1, 2, 3, 4] and first["next"] == 4
    rest = api.client.get("/matches", headers=api.r, params={"after": 4}).json()
    assert [m["cursor"] for m in rest["matches"]] == list(range(5, 11))
    assert {m["name"] for m in api.matches(name="small")} == {"small"}
    assert len(api.matches(name="small")) == 5
    problem(api.client.get("/matches", headers=api.r, params={"limit": 0}), 400)
    problem(api.client.get("/matches", headers=api.r, params={"after": "x"}), 400)


def test_webhook_secrets_are_never_returned(api):
    hook = ('webhook ops url "https://user:pw@hooks.example.com/in?key=k" '
            'secret "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"\n')
    assert api.put("ops", hook).status_code == 201
    text = api.client.get("/queries/ops", headers=api.r).json()["text"]
    history = api.client.get("/queries/ops/history", headers=api.r).text
    for shown in (text, history):
        assert "whsec_" not in shown and "pw@" not in shown and "key=k" not in shown
    assert 'secret "***"' in text


def test_status_and_the_openapi_schema(api):
    api.put("big", STREAM + rule("big", "amount > 100"), wait="true")
    status = api.client.get("/status", headers=api.r).json()
    assert status["registry_version"] == status["applied_version"] == 1
    schema = api.client.get("/openapi.json").json()
    assert {"/queries/{name}", "/events", "/matches/stream", "/alerts"} <= set(schema["paths"])
    problem(api.client.get("/nowhere", headers=api.r), 404)


@pytest.mark.parametrize("name", ["1abc", "a-b", "x" * 300])
def test_names_must_be_names(api, name):
    problem(api.put(name, rule("x", "amount > 1")), 400)


def test_one_service_per_state_directory(api, tmp_path):
    with pytest.raises(ServiceError, match="another vigil serve"):
        make_service(tmp_path)
