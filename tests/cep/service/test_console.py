"""The web console in a real browser: headless Chromium (Debian's ``chromium``, which
``.ci/run`` installs) driven by Playwright, against a real ``vigil serve`` on a loopback port.
One browser for the session, one service for the module, a fresh page per test; each scenario
leaves a screenshot in its ``tmp_path``."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx
import pytest
from service_support import STREAM, T0, LiveServer, lines, make_service, rule, txn

from cep.alerts import WebhookReceiver, new_secret

CHROMIUM = "/usr/bin/chromium"
TIMEOUT_MS = 15_000
TRIAL_MS = 60_000
"""How long a trial (``POST /try``) may take to show: a second alone, but CI's two cores,
shared with Spark's tests, once made it outlast :data:`TIMEOUT_MS`. Waiting with ``expect``
says what the page showed instead, should it fail."""
NEWS = "stream news (title text, ts timestamp) time ts\n"


def expect(locator):
    """Playwright's ``expect``, waiting as long as the pages do. (``wait_for_function`` is not
    used: it evaluates its text with ``eval`` in the page, which the console's
    Content-Security-Policy forbids whenever its first try is false.)"""
    from playwright.sync_api import expect as playwright_expect
    playwright_expect.set_options(timeout=TIMEOUT_MS)
    return playwright_expect(locator)


def _unavailable(reason: str) -> None:
    """As the ``unavailable`` fixture does, for the session's fixtures: fail under
    ``CI=true``, where ``.ci/run`` installs Chromium; skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: .ci/run provides it, so this is a failure)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser() -> Iterator:
    if not os.path.exists(CHROMIUM) and shutil.which("chromium") is None:
        _unavailable("chromium is not installed (apt-get install -y chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (pip install -e '.[dev]')")
    executable = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True,
                                              args=["--no-sandbox", "--disable-gpu"])
        yield launched
        launched.close()


class Console:
    """The service under test: its URL, tokens, a client for the API, the webhook receiver."""

    def __init__(self, server: LiveServer, write: str, read: str,
                 receiver: WebhookReceiver) -> None:
        self.server, self.url = server, server.url
        self.write, self.read = write, read
        self.receiver = receiver
        self.api = httpx.Client(base_url=server.url, timeout=30,
                                headers={"Authorization": f"Bearer {write}"})

    def put(self, name: str, text: str) -> None:
        answer = self.api.put(f"/queries/{name}", content=text, params={"wait": "true"})
        assert answer.status_code in (200, 201), answer.text

    def post(self, body: bytes) -> dict:
        answer = self.api.post("/events", content=body)
        assert answer.status_code == 200, answer.text
        return answer.json()


@contextmanager
def running_console(state) -> Iterator[Console]:
    secret = new_secret()
    with WebhookReceiver(secret) as receiver:
        service = make_service(state, env={"OPS_SECRET": secret})
        write = service.tokens.create("ana", "write")
        read = service.tokens.create("bo", "read")
        server = LiveServer(service)
        running = Console(server, write, read, receiver)
        try:
            yield running
        finally:
            running.api.close()
            server.stop()


@pytest.fixture(scope="module")
def console(tmp_path_factory) -> Iterator[Console]:
    """One service for the module's scenarios: they post to ``txn`` only, each later in event
    time than the one before (the engine's watermark is the slowest stream's)."""
    with running_console(tmp_path_factory.mktemp("console")) as running:
        yield running


@pytest.fixture
def own_console(tmp_path) -> Iterator[Console]:
    """A service of its own, for a scenario that posts to other streams than ``txn``."""
    with running_console(tmp_path / "service") as running:
        yield running


@pytest.fixture
def page(browser, console) -> Iterator:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))

    def on_console(message) -> None:
        # Refusals the scenarios provoke (400, 401, 403) are logged by the browser; anything
        # else, a Content-Security-Policy violation first of all, is a failure.
        if message.type == "error" and "Failed to load resource" not in message.text:
            errors.append(message.text)

    opened.on("console", on_console)
    requests: list[tuple[str, str]] = []
    opened.on("request", lambda request: requests.append((request.method, request.url)))
    yield opened
    context.close()
    assert errors == [], f"the page reported errors: {errors}"
    # The page calls the public API (its schema's routes) and loads its own files, no more.
    routes = [(method.upper(), re.compile(re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(path)) + "$"))
              for path, methods in console.api.get("/openapi.json").json()["paths"].items()
              for method in methods]
    # (Not blob: URLs: the automaton's picture is drawn from a blob the page fetched.)
    requests = [(method, url) for method, url in requests if url.startswith("http")]
    assert len({urlsplit(url).netloc for _, url in requests}) <= 1, requests  # one origin
    for method, url in requests:
        parsed = urlsplit(url)
        if method == "GET" and (parsed.path == "/" or parsed.path.startswith("/console/")):
            continue
        assert any(m == method and pattern.match(parsed.path) for m, pattern in routes), \
            f"{method} {parsed.path} is not a route of the API"


def sign_in(page, console: Console, token: str) -> None:
    page.goto(console.url + "/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.locator("#app").wait_for(state="visible")


def shot(page, tmp_path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 0


def test_sign_in_with_a_token(page, console, tmp_path):
    page.goto(console.url + "/")
    page.get_by_label("API token").fill("vgl_not_a_token")
    page.get_by_label("API token").press("Enter")  # the keyboard is enough
    page.get_by_role("alert").filter(has_text="unknown or revoked").wait_for()
    assert page.locator("#app").is_hidden()
    sign_in(page, console, console.write)
    assert page.locator("#who").inner_text().startswith("ana (write)")
    assert page.evaluate("sessionStorage.getItem('vigil-token')") == console.write
    page.reload()  # the tab keeps the token
    page.locator("#app").wait_for(state="visible")
    shot(page, tmp_path, "signed-in")
    page.get_by_role("button", name="Sign out").click()
    assert page.evaluate("sessionStorage.getItem('vigil-token')") is None


def test_a_typo_is_shown_at_its_line_then_fixed_saved_and_diffed(page, console, tmp_path):
    sign_in(page, console, console.write)
    page.get_by_role("button", name="New").click()
    page.get_by_label("Name").fill("spend")
    editor = page.get_by_label("Definition")
    editor.fill(STREAM + "rule spend from txn by card pattern b\n  define b as amout > 100\n")
    problems = page.locator("#problems li")
    problems.filter(has_text="line 3, column 15: undeclared field 'amout'").wait_for()
    page.locator('#highlight .line-error[data-line="3"]').wait_for()
    # The token at the error's column is marked too.
    assert page.locator("#highlight .at-error").all_inner_texts() == ["amout"]
    assert page.locator("#highlight .tok-keyword").first.inner_text() == "stream"
    shot(page, tmp_path, "typo")

    editor.fill(STREAM + "rule spend from txn by card pattern b\n  define b as amount > 100\n")
    problems.filter(has_text="No problems.").wait_for()
    assert page.locator("#highlight .line-error").count() == 0
    page.get_by_role("button", name="Save").click()
    page.locator("#save-result").filter(has_text="Saved spend: added, version").wait_for()
    assert console.api.get("/queries/spend").json()["kind"] == "rule"

    text = console.api.get("/queries/spend").json()["text"]
    editor.fill(text.replace("amount > 100", "amount > 200"))
    page.get_by_role("button", name="Save").click()
    page.locator("#save-result").filter(has_text="Saved spend: replaced").wait_for()
    page.get_by_role("button", name="History").click()
    page.locator("#diff .del").filter(has_text="amount > 100").wait_for()
    page.locator("#diff .add").filter(has_text="amount > 200").wait_for()
    shot(page, tmp_path, "saved-and-diff")

    page.get_by_role("tab", name="Standing queries").click()
    row = page.locator('#query-table tbody tr[data-name="spend"]')
    row.wait_for()
    assert "rule" in row.inner_text() and "txn" in row.inner_text()


def test_a_match_appears_live_and_expands(page, console, tmp_path):
    console.put("big", STREAM + rule("big", "amount > 100"))
    sign_in(page, console, console.write)
    page.get_by_role("tab", name="Live matches").click()
    page.locator('#live-state[data-connected="true"]').wait_for()
    console.post(lines(txn("c9", 5000, 0), txn("c8", 1, 1)))
    item = page.locator('#matches li[data-name="big"]').filter(has_text="c9")
    item.wait_for()
    item.locator("summary").first.focus()
    page.keyboard.press("Enter")  # opens with the keyboard
    event = item.locator(".match-events li")  # the events of the match, by variable
    event.locator('[data-field="amount"]').filter(has_text="amount: 5000").wait_for()
    assert event.locator("strong").first.inner_text().startswith("b #")
    assert event.locator('[data-field="card"]').inner_text() == "card: c9"
    raw = item.locator("details.raw")  # and the whole record, one click further
    raw.locator("summary").click()
    assert '"match_id"' in raw.locator("pre").inner_text()
    shot(page, tmp_path, "live")


def test_a_query_match_appears_live_and_opens_to_its_document(page, own_console, tmp_path):
    own_console.put("news", NEWS)
    own_console.put("acme", "query acme from news match title:acme\n")
    sign_in(page, own_console, own_console.read)
    page.get_by_role("tab", name="Live matches").click()
    page.locator('#live-state[data-connected="true"]').wait_for()
    own_console.post(lines({"stream": "news", "title": "Quarterly results of Acme Corp",
                            "ts": T0 + 2}))
    item = page.locator('#matches li[data-name="acme"]').first
    item.wait_for()
    item.locator("summary").first.click()
    document = item.get_by_role("group", name="The document, what matched marked")
    document.wait_for()
    title = document.locator('[data-field="title"]')
    assert title.inner_text() == "title: Quarterly results of Acme Corp"
    assert title.locator("mark").all_inner_texts() == ["Acme"]
    assert document.locator('[data-field="ts"]').inner_text() == f"ts: {T0 + 2}"
    assert "marked in title" in item.locator(".match-body > p").first.inner_text()
    shot(page, tmp_path, "live-query")
    # A reload shows the newest matches before following: the same match, still open-able.
    page.reload()
    page.locator("#app").wait_for(state="visible")
    page.get_by_role("tab", name="Live matches").click()
    page.locator('#matches li[data-name="acme"]').first.wait_for()


def test_the_table_filters_sorts_and_charts_a_metric(page, console, tmp_path):
    console.put("big", STREAM + rule("big", "amount > 100"))
    console.put("per_minute", "metric per_minute from txn window tumbling 1m "
                              "select count() as n\n")
    # Windows of 1, 3 and 2 events (10, 11 and 12 minutes in), closed by the last event.
    console.post(lines(*(txn("c1", 1, second)
                         for second in (600, 660, 670, 680, 720, 730, 790))))
    sign_in(page, console, console.write)
    names = page.locator("#query-table tbody tr td:first-child")
    row = page.locator('#query-table tbody tr[data-name="per_minute"]')
    row.wait_for()
    # Each column as the API counts it.
    [shown] = [r for r in console.api.get("/overview").json()["queries"]
               if r["name"] == "per_minute"]
    cells = row.locator("td").all_inner_texts()
    assert cells[1:7] == ["metric", "txn", str(shown["version"]), str(shown["matches_hour"]),
                          str(shown["matches_day"]), shown["last_match"] or ""]
    assert shown["matches_day"] >= 3
    # The chart draws the windows' values: 1, 3, 2 from left to right.
    figure = page.locator('#charts figure[data-metric="per_minute"][data-field="n"]')
    figure.wait_for()
    points = [tuple(map(float, p.split(","))) for p in
              figure.locator("polyline").get_attribute("points").split()]
    assert len(points) == 3 and points[0][0] < points[1][0] < points[2][0]
    assert points[1][1] < points[2][1] < points[0][1]  # y grows downwards: 3 > 2 > 1
    assert figure.locator("figcaption").inner_text() == \
        "per_minute · n · 3 window(s) to 2026-01-01T00:13:00.000Z"
    page.locator("#query-table th[data-key=name] button").click()  # descending now
    assert names.all_inner_texts() == sorted(names.all_inner_texts(), reverse=True)
    page.get_by_label("Filter").fill("metric")
    expect(page.locator("#query-table tbody tr")).to_have_count(1)
    assert names.all_inner_texts() == ["per_minute"]
    shot(page, tmp_path, "table")
    # The tabs follow the arrow keys, Home and End.
    page.get_by_role("tab", name="Standing queries").press("ArrowLeft")
    assert page.get_by_role("tab", name="Alerts").get_attribute("aria-selected") == "true"
    assert page.locator("#alerts").is_visible() and page.locator("#queries").is_hidden()
    page.get_by_role("tab", name="Alerts").press("Home")
    assert page.get_by_role("tab", name="Standing queries").get_attribute("aria-selected") == \
        "true"


def test_every_control_is_labelled_and_focus_is_visible(page, console, tmp_path):
    sign_in(page, console, console.write)
    unlabelled = page.evaluate("""() => [...document.querySelectorAll(
        'input, select, textarea, button, [role=tab]')].filter((c) => !(
          (c.labels && c.labels.length) || c.getAttribute('aria-label') ||
          c.getAttribute('aria-labelledby') || (c.tagName === 'BUTTON' && c.textContent.trim())
        )).map((c) => c.id || c.outerHTML)""")
    assert unlabelled == []
    panels = page.evaluate("""() => [...document.querySelectorAll('[role=tabpanel]')]
        .map((p) => document.getElementById(p.getAttribute('aria-labelledby'))?.textContent)""")
    assert panels == ["Standing queries", "Editor", "Live matches", "Alerts"]
    page.keyboard.press("Tab")
    page.keyboard.press("Tab")
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("none", ""), page.evaluate("document.activeElement.outerHTML")
    # Sorting from the keyboard: a column header is a button.
    page.locator("#query-table th[data-key=kind] button").focus()
    page.keyboard.press("Enter")
    assert page.locator("#query-table th[data-key=kind]").get_attribute("aria-sort") == \
        "ascending"
    shot(page, tmp_path, "keyboard")


def test_the_automaton_picture(page, console, tmp_path):
    if shutil.which("dot") is None:
        _unavailable("Graphviz's dot is not installed (apt-get install -y graphviz)")
    console.put("big", STREAM + rule("big", "amount > 100"))
    sign_in(page, console, console.write)
    page.get_by_role("button", name="Edit big").click()
    page.get_by_label("Name").wait_for()
    expect(page.locator("#source")).to_have_value(re.compile("rule big"))
    page.get_by_role("button", name="Automaton").click()
    picture = page.get_by_role("img", name="The compiled automaton of rule big")
    picture.wait_for()
    expect(picture).to_have_js_property("complete", True)
    assert picture.evaluate("(img) => img.naturalWidth") > 0
    shot(page, tmp_path, "automaton")


def test_try_a_query_on_a_pasted_document(page, console, tmp_path):
    console.put("news", NEWS)
    sign_in(page, console, console.write)
    page.get_by_role("button", name="New").click()
    page.get_by_label("Name").fill("acme")
    page.get_by_label("Definition").fill("query acme from news match title:acme\n")
    document = {"stream": "news", "title": "Big acme merger", "ts": 1767225600}
    page.get_by_label("Events, one JSON object per line").fill(json.dumps(document))
    page.get_by_role("button", name="Try", exact=True).click()
    result = page.locator("#try-result")
    expect(result).to_contain_text("1 match(es) over 1 pasted event(s)", timeout=TRIAL_MS)
    assert result.locator("h3").inner_text() == "Query acme on event 1: matches"
    assert result.locator(".doc mark").all_inner_texts() == ["acme"]
    assert "found in title" in result.locator("pre").last.inner_text()
    shot(page, tmp_path, "try")
    # Nothing was saved.
    assert console.api.get("/queries/acme").status_code == 404


def test_try_over_the_recent_events_and_why_there_are_none(page, own_console, tmp_path):
    own_console.put("quiet", "stream quiet (msg text, ts timestamp) time ts\n")
    own_console.post(lines(txn("k1", 1, 3000)))
    sign_in(page, own_console, own_console.write)
    page.get_by_role("button", name="New").click()
    page.get_by_label("Name").fill("hush")
    page.get_by_label("Definition").fill("query hush from quiet match msg:hush\n")
    kept = page.locator("#try-kept")
    kept.filter(has_text="Kept by the service (the last 1000 of each stream, across "
                         "restarts)").wait_for()
    assert "txn " in kept.inner_text() and "quiet" not in kept.inner_text()
    page.get_by_role("button", name="Try", exact=True).click()
    result = page.locator("#try-result")
    expect(result.locator(".notice")).to_contain_text(
        "No recent events of quiet: none has been posted to it through this service",
        timeout=TRIAL_MS)
    assert "0 match(es) over 0 recent event(s)" in result.inner_text()
    shot(page, tmp_path, "try-recent-empty")
    own_console.post(lines({"stream": "quiet", "msg": "hush now", "ts": T0 + 3001},
                           {"stream": "quiet", "msg": "loud", "ts": T0 + 3002}))
    page.get_by_role("button", name="Try", exact=True).click()
    expect(result).to_contain_text("1 match(es) over 2 recent event(s)", timeout=TRIAL_MS)
    assert result.locator(".notice").count() == 0
    assert result.locator(".doc mark").all_inner_texts() == ["hush"]
    shot(page, tmp_path, "try-recent")


def test_alerts_per_endpoint_and_replay(page, console, tmp_path):
    console.put("ops", f'webhook ops url "{console.receiver.url}" secret env OPS_SECRET\n')
    console.put("big", STREAM + rule("big", "amount > 100", notify="ops"))
    # A webhook whose secret the service's environment lacks: its alerts are counted only.
    console.put("ghost", 'webhook ghost url "http://127.0.0.1:9/" secret env GHOST_SECRET\n')
    console.put("haunt", rule("haunt", "amount > 800", notify="ghost"))
    console.post(lines(txn("a1", 900, 3600)))
    give_up = time.monotonic() + 20
    while not console.receiver.webhook_ids and time.monotonic() < give_up:
        time.sleep(0.05)
    sign_in(page, console, console.write)
    page.get_by_role("tab", name="Alerts").click()
    row = page.locator("#alert-table tbody tr").filter(has_text="ops")
    row.wait_for()
    # Delivered once: the endpoint's breaker is there, closed.
    assert row.locator("td").nth(6).inner_text() == "closed"
    assert "lacks the secret of ghost" in page.locator("#alert-secrets").inner_text()
    page.get_by_role("button", name="Replay the alerts of ops").click()
    page.locator("#alert-result").filter(has_text="queued again").wait_for()
    while console.receiver.duplicates < 1 and time.monotonic() < give_up:
        time.sleep(0.05)
    assert console.receiver.duplicates >= 1
    shot(page, tmp_path, "alerts")


def test_a_read_token_sees_but_cannot_save(page, console, tmp_path):
    console.put("big", STREAM + rule("big", "amount > 100"))
    sign_in(page, console, console.read)
    assert page.locator("#who").inner_text().startswith("bo (read)")
    page.locator('#query-table tbody tr[data-name="big"]').wait_for()
    page.get_by_role("button", name="New").click()
    page.get_by_label("Name").fill("sneaky")
    page.get_by_label("Definition").fill(rule("sneaky", "amount > 1"))
    page.locator("#problems li").filter(has_text="No problems.").wait_for()  # may check
    page.get_by_role("button", name="Save").click()
    page.locator("#save-result").filter(has_text="Not saved (403)").wait_for()
    assert "scope read" in page.locator("#save-result").inner_text()
    assert console.api.get("/queries/sneaky").status_code == 404
    shot(page, tmp_path, "read-only")


def test_a_metric_chart_shows_its_newest_windows(page, own_console, tmp_path):
    own_console.put("ticks", "stream ticks (host string, load float, ts timestamp) time ts\n")
    own_console.put("load", "metric load from ticks by host window tumbling 1m "
                            "select max(load) as peak\n")
    # 1,100 windows of host a, 10 of host b: more than a page of the log.
    base = T0 + 7200
    events = [{"stream": "ticks", "host": "a", "load": m % 7, "ts": base + 60 * m}
              for m in range(1101)]
    events += [{"stream": "ticks", "host": "b", "load": 9, "ts": base + 60 * m + 1}
               for m in range(1090, 1100)]
    own_console.post(lines(*sorted(events, key=lambda e: e["ts"])))
    sign_in(page, own_console, own_console.read)
    figure = page.locator('#charts figure[data-metric="load"]')
    figure.wait_for()
    caption = figure.locator("figcaption").inner_text()
    # The last 200 windows, up to the newest closed one (minute 1,100), not the first ones.
    assert caption == "load · peak · 200 window(s) to 2026-01-01T20:20:00.000Z"
    assert figure.locator("polyline").count() == 2  # a line per host
    assert figure.locator(".legend li").all_inner_texts() == ["host=a", "host=b"]
    shot(page, tmp_path, "metric-newest")
