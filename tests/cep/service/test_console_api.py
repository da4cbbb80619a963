"""The endpoints the console uses that the API gained with it: the overview of standing
queries, trying a text before saving it, the automaton as SVG, alert replay, and the console's
static files."""

from __future__ import annotations

import shutil
import time

import pytest
from service_support import STREAM, T0, in_process_client, lines, make_service, rule, txn

from cep.alerts import WebhookReceiver, new_secret
from cep.service import create_app
from cep.service.recent import MAX_DOCUMENT

PROBLEM = "application/problem+json"


def problem(answer, status: int) -> dict:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == PROBLEM
    return answer.json()


def test_overview_counts_matches_by_name_in_the_last_hour_and_day(api):
    api.put("big", STREAM + rule("big", "amount > 100").replace("\n", " severity high\n"))
    api.put("q", "query q from txn match card:c1\n")
    api.put("m", "metric m from txn window tumbling 1h select count() as n\n")
    api.post(lines(txn("c1", 500, 0), txn("c2", 500, 7200), txn("c1", 5, 90000)))
    data = api.client.get("/overview", headers=api.r).json()
    rows = {row["name"]: row for row in data["queries"]}
    assert sorted(rows) == ["big", "m", "q"]
    big = rows["big"]
    assert (big["kind"], big["streams"], big["version"], big["severity"], big["notify"]) == \
        ("rule", ["txn"], 1, "high", [])
    # Counted back from the newest match (the c1 query match at 25 h): the 0 h one is older
    # than a day, the 2 h one within it.
    assert data["as_of"] == "2026-01-02T01:00:00.000Z"
    assert (big["matches_total"], big["matches_day"], big["matches_hour"]) == (2, 1, 0)
    assert big["last_match"] == "2026-01-01T02:00:00.000Z"
    assert (rows["q"]["matches_total"], rows["q"]["matches_hour"]) == (2, 1)
    assert rows["m"]["kind"] == "metric"
    problem(api.client.get("/overview"), 401)


def test_overview_of_an_empty_log(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    data = api.client.get("/overview", headers=api.r).json()
    assert data["as_of"] is None and data["queries"][0]["matches_total"] == 0


def test_try_runs_a_text_over_pasted_events_and_stores_nothing(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    body = {"text": rule("huge", "amount > 1000"),
            "events": lines(txn("c1", 5000, 0), txn("c1", 50, 1)).decode(), "stream": None}
    answer = api.client.post("/try", json=body, headers=api.r)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert (data["source"], data["events"], data["names"]) == ("pasted", 2, ["huge"])
    assert [(m["name"], m["events"]) for m in data["matches"]] == [("huge", {"b": [0]})]
    assert api.client.get("/status", headers=api.r).json()["registry_version"] == 1
    assert api.matches() == []
    # A pasted last line without its newline is an event too.
    unterminated = {**body, "events": lines(txn("c2", 2000, 5)).decode().rstrip("\n")}
    data = api.client.post("/try", json=unterminated, headers=api.r).json()
    assert data["events"] == 1 and len(data["matches"]) == 1


def test_try_uses_the_last_events_posted_to_its_stream(api_factory):
    api = api_factory(recent=3)
    api.put("big", STREAM + rule("big", "amount > 100"))
    api.post(lines(*(txn("c1", 10 * i, i) for i in range(10))))  # 0, 10, ... 90
    api.post(lines(txn("c2", 700, 20)), stream="txn")
    answer = api.client.post("/try", json={"text": rule("t", "amount > 85"), "last": 10},
                             headers=api.r).json()
    assert (answer["source"], answer["events"]) == ("recent", 3)  # the ring keeps 3: 80, 90, 700
    assert [m["values"]["card"] for m in answer["matches"]] == ["c1", "c2"]  # 90, then 700
    answer = api.client.post("/try", json={"text": rule("t", "amount > 85"), "last": 1},
                             headers=api.r).json()
    assert answer["events"] == 1 and len(answer["matches"]) == 1


def test_try_explains_a_query_with_its_highlights(api):
    api.put("txn", STREAM.replace("amount float", "amount float, memo text"))
    doc = {"stream": "txn", "card": "c1", "amount": 1, "ts": 1767225600,
           "memo": "refund for the acme order"}
    answer = api.client.post("/try", headers=api.r, json={
        "text": "query acme from txn match memo:acme\n",
        "events": lines(doc, {**doc, "memo": "nothing here"}).decode()}).json()
    assert [m["name"] for m in answer["matches"]] == ["acme"]
    first, second = answer["explain"]
    assert first["matched"] and first["highlights"] == {"memo": [[15, 19]]}
    assert "memo:acme" in first["explain"] and first["document"]["memo"].startswith("refund")
    assert not second["matched"] and second["highlights"] == {}


def test_try_reports_errors_at_their_place(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    bad = problem(api.client.post("/try", headers=api.r,
                                  json={"text": "rule t from txn by card pattern b\n"
                                                "  define b as amout > 1\n", "events": ""}), 400)
    assert bad["errors"] == [{"file": "<body>", "line": 2, "column": 15,
                              "message": "undeclared field 'amout': not a field of the stream"}]
    syntax = problem(api.client.post("/try", headers=api.r, json={"text": "rule t frm txn"}),
                     400)
    assert syntax["errors"][0]["line"] == 1
    problem(api.client.post("/try", headers=api.r, content=b"not json"), 400)
    problem(api.client.post("/try", headers=api.r, json={"text": "x", "last": -1}), 400)


def test_the_automaton_of_a_rule_as_dot_and_svg(api, unavailable):
    api.put("big", STREAM + rule("big", "amount > 100"))
    api.put("q", "query q from txn match card:c1\n")
    dot = api.client.get("/queries/big/automaton.dot", headers=api.r)
    assert dot.status_code == 200 and dot.text.startswith('digraph "big" {')
    assert 'legend [shape=note, fontsize=11, label="b: amount > 100\\l"]' in dot.text
    assert "not-found" in problem(api.client.get("/queries/q/automaton.svg", headers=api.r),
                                  404)["type"]
    assert "only a rule" in problem(api.client.get("/queries/q/automaton.dot", headers=api.r),
                                    404)["detail"]
    problem(api.client.get("/queries/nope/automaton.svg", headers=api.r), 404)
    if shutil.which("dot") is None:
        unavailable("Graphviz's dot is not installed")
    svg = api.client.get("/queries/big/automaton.svg", headers=api.r)
    assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
    assert "<svg" in svg.text and "accept" in svg.text and "b: amount &gt; 100" in svg.text


def test_the_automaton_without_graphviz_is_a_503_problem(api, monkeypatch):
    api.put("big", STREAM + rule("big", "amount > 100"))
    monkeypatch.setenv("PATH", "/nonexistent")
    body = problem(api.client.get("/queries/big/automaton.svg", headers=api.r), 503)
    assert body["type"] == "urn:vigil:problem:tool-missing" and "dot" in body["detail"]


def test_alerts_are_replayed_by_endpoint(api_factory):
    secret = new_secret()
    with WebhookReceiver(secret) as receiver:
        api = api_factory(env={"OPS_SECRET": secret})
        api.put("ops", f'webhook ops url "{receiver.url}" secret env OPS_SECRET\n')
        api.put("big", STREAM + rule("big", "amount > 100", notify="ops"))
        api.post(lines(txn("c1", 500, 0)))
        give_up = time.monotonic() + 20
        while len(receiver.webhook_ids) < 1 and time.monotonic() < give_up:
            time.sleep(0.05)
        assert len(receiver.webhook_ids) == 1
        problem(api.client.post("/alerts/replay", headers=api.r), 403)
        problem(api.client.post("/alerts/replay", headers=api.w, params={"endpoint": "nope"}),
                404)
        answer = api.client.post("/alerts/replay", headers=api.w, params={"endpoint": "ops"})
        assert answer.status_code == 200 and answer.json()["replayed"] == 1
        later = api.client.post("/alerts/replay", headers=api.w,
                                params={"since": "2999-01-01T00:00:00Z"})
        assert later.json()["replayed"] == 0
        while receiver.duplicates < 1 and time.monotonic() < give_up:
            time.sleep(0.05)
        # Delivered again under the same webhook-id, which the receiver recognises.
        assert receiver.duplicates == 1 and len(receiver.webhook_ids) == 1


def test_status_says_the_tokens_scope_and_the_schema_lists_the_new_routes(api):
    assert api.client.get("/status", headers=api.r).json()["scope"] == "read"
    assert api.client.get("/status", headers=api.w).json()["scope"] == "write"
    paths = set(api.client.get("/openapi.json").json()["paths"])
    assert {"/overview", "/try", "/queries/{name}/automaton.svg",
            "/queries/{name}/automaton.dot", "/alerts/replay"} <= paths
    assert "/" not in paths  # the console's files are no part of the API


@pytest.mark.parametrize("path, media", [("/", "text/html"),
                                         ("/console/console.js", "text/javascript"),
                                         ("/console/highlight.js", "text/javascript"),
                                         ("/console/console.css", "text/css")])
def test_the_console_files_are_served_without_a_token(api, path, media):
    answer = api.client.get(path)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith(media)
    policy = answer.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "http" not in answer.text.replace("http://www.w3.org/2000/svg", "")  # no CDN


def test_only_the_console_files_are_served(api):
    problem(api.client.get("/console/__init__.py"), 404)
    problem(api.client.get("/console/..%2F..%2Fapp.py"), 404)


def test_the_events_a_rule_match_names_are_kept_at_their_positions(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    api.post(lines(txn("c1", 5, 0)) + b"{not json\n" + lines(txn("c2", 500, 1)))
    api.post(lines(txn("c3", 700, 2)), stream="txn")
    matches = api.matches(name="big")
    positions = [m["events"]["b"][0] for m in matches]
    assert positions == [2, 3]  # the dead letter took position 1
    answer = api.client.get("/events/recent", headers=api.r,
                            params={"positions": "2,3,1,99"}).json()
    assert [(e["position"], e["stream"], e["event"]["card"]) for e in answer["events"]] == \
        [(2, "txn", "c2"), (3, "txn", "c3")]
    assert answer["missing"] == [1, 99]
    last = api.client.get("/events/recent", headers=api.r,
                          params={"stream": "txn", "limit": 2}).json()["events"]
    assert [e["event"]["card"] for e in last] == ["c2", "c3"]
    assert api.client.get("/events/recent", headers=api.r).json() == {
        "streams": {"txn": 3}, "size": 1000, "persistent": True, "restored": 0}
    problem(api.client.get("/events/recent", headers=api.r, params={"positions": "x"}), 400)


def test_positions_continue_after_a_restart(tmp_path):
    service = make_service(tmp_path)
    write = {"Authorization": f"Bearer {service.tokens.create('ana', 'write')}"}
    with in_process_client(create_app(service)) as client:
        client.put("/queries/big", content=STREAM + rule("big", "amount > 100"), headers=write)
        client.post("/events", content=lines(txn("c1", 500, 0), txn("c1", 5, 1)), headers=write)
    # Stopped: a checkpoint at batch 1, two positions taken. The next service goes on, and
    # still has the events posted to the one before it.
    with in_process_client(create_app(make_service(tmp_path))) as client:
        client.post("/events", content=lines(txn("c2", 900, 2)), headers=write)
        [first, second] = client.get("/matches", headers=write).json()["matches"]
        assert (first["events"], second["events"]) == ({"b": [0]}, {"b": [2]})
        found = client.get("/events/recent", headers=write,
                           params={"positions": "0,1,2"}).json()["events"]
        assert [(e["position"], e["event"]["card"]) for e in found] == \
            [(0, "c1"), (1, "c1"), (2, "c2")]


NEWS = "stream news (title text, ts timestamp) time ts\n"
NEWS_WITH_ID = "stream wire (title text, ts timestamp, ref string) time ts id ref\n"


def test_a_query_match_carries_the_document_it_matched(api):
    api.put("news", NEWS)
    api.put("wire", NEWS_WITH_ID)
    api.put("acme", "query acme from news, wire match title:acme\n")
    api.put("big", STREAM + rule("big", "amount > 100"))
    plain = {"stream": "news", "title": "Big acme merger", "ts": T0}
    with_id = {"stream": "wire", "title": "acme again", "ts": T0 + 1, "ref": "r-7"}
    # A dead letter and other events before them: the documents are found by position, and
    # by id where the stream has one.
    body = (b"{broken\n" + lines(txn("c1", 500, 0), {**plain, "title": "no match"}, plain,
                                  with_id))
    assert api.post(body).json()["matches"] == 3
    by_name = {}
    for match in api.matches():
        by_name.setdefault(match["name"], []).append(match)
    first, second = by_name["acme"]
    assert (first["document_id"], first["document_position"], first["document"]) == \
        ("3", 3, plain)
    assert first["highlights"] == {"title": [[4, 8]]}
    assert (second["document_id"], second["document_position"], second["document"]) == \
        ("r-7", 4, with_id)
    [big] = by_name["big"]  # a rule's match names its events; it carries none
    assert big["events"] == {"b": [1]} and "document" not in big
    # A stream bound by the request: its lines need not say it.
    api.post(lines({"title": "acme", "ts": T0 + 2}), stream="news")
    last = api.matches(name="acme")[-1]
    assert last["document"] == {"title": "acme", "ts": T0 + 2} and last["document_position"] == 5


def test_a_large_document_is_found_by_its_position(api):
    api.put("news", NEWS.replace("title text", "title text, body text"))
    api.put("acme", "query acme from news match title:acme\n")
    big = {"stream": "news", "title": "acme", "ts": T0, "body": "x" * (MAX_DOCUMENT + 1)}
    api.post(lines(big))
    [match] = api.matches(name="acme")
    assert match["document_position"] == 0 and "document" not in match
    found = api.client.get("/events/recent", headers=api.r, params={"positions": "0"}).json()
    assert found["events"][0]["event"]["body"] == big["body"]


def test_the_newest_matches_of_a_name(api):
    api.put("big", STREAM + rule("big", "amount > 100"))
    api.put("q", "query q from txn match card:c1\n")
    api.post(lines(*(txn(f"c{i % 2}", 500, i) for i in range(10))))  # 10 big, 5 q
    answer = api.client.get("/matches/newest", headers=api.r,
                            params={"name": "big", "limit": 3}).json()
    assert [m["values"]["card"] for m in answer["matches"]] == ["c1", "c0", "c1"]
    cursors = [m["cursor"] for m in answer["matches"]]
    assert cursors == sorted(cursors) and answer["next"] == cursors[-1]
    assert cursors[-1] == max(m["cursor"] for m in api.matches(name="big"))
    everything = api.client.get("/matches/newest", headers=api.r,
                                params={"limit": 1000}).json()
    assert len(everything["matches"]) == 15
    none = api.client.get("/matches/newest", headers=api.r, params={"name": "nope"}).json()
    assert none == {"matches": [], "next": everything["next"]}  # follow from now on
    problem(api.client.get("/matches/newest", headers=api.r, params={"limit": 0}), 400)
    problem(api.client.get("/matches/newest"), 401)


def test_try_over_recent_events_says_what_the_service_keeps(api):
    api.put("news", NEWS)
    api.put("big", STREAM + rule("big", "amount > 100"))
    api.post(lines(txn("c1", 500, 0)))
    answer = api.client.post("/try", headers=api.r, json={
        "text": "query acme from news match title:acme\n" + rule("t", "amount > 1")}).json()
    assert answer["source"] == "recent" and answer["events"] == 1
    assert answer["recent"] == {"streams": {"news": 0, "txn": 1}, "size": 1000,
                                "persistent": True, "restored": 0}
    pasted = api.client.post("/try", headers=api.r, json={
        "text": rule("t", "amount > 1"), "events": ""}).json()
    assert "recent" not in pasted
