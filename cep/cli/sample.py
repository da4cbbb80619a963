"""Deterministic, realistic sample event streams with planted patterns for the example rules.

``vigil sample --out DIR --events N`` writes JSON lines, each event naming its stream, in
event-time order (with a little bounded disorder, as real sources have). Background traffic
looks like ordinary card payments, logins, orders, market ticks and news; on top of it the
generator plants the situations the example rules look for and lists them in
``DIR/_planted.json`` so tests can check that every one is found.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from cep.cli.arguments import UsageError
from query_lang.timestamps import format_iso_ms

START = datetime(2026, 3, 2, 9, 0, 0, tzinfo=UTC)
CITIES = {
    "new_york": (40.7128, -74.0060),
    "chicago": (41.8781, -87.6298),
    "london": (51.5074, -0.1278),
    "tokyo": (35.6762, 139.6503),
    "sydney": (-33.8688, 151.2093),
    "paris": (48.8566, 2.3522),
}
MERCHANTS = [
    "corner_grocery", "city_fuel", "book_nook", "coffee_lab", "tech_mart", "fashion_hub",
    "home_depot_42", "pharma_plus", "cinema_max", "pet_world", "sushi_bar", "shoe_box",
]
STOLEN_CARDS = ("4000123412341234", "4000999988887777")
TOPICS = [
    ("Local team wins the cup", "Fans celebrated downtown after the final whistle."),
    ("Rain expected all week", "Forecasters warn of flooding near the river."),
    ("New library opens", "The city opened a new public library with a maker space."),
    ("Tech giant reports earnings", "Revenue grew on strong cloud demand."),
    ("Markets close higher", "Stocks rallied as bond yields eased."),
]
SOURCES = ["wire", "daily_post", "tabloid", "business_weekly", "city_news"]
SERVICES = ["checkout", "search", "catalog", "payments-api", "auth-api"]


@dataclass
class Planted:
    """What was planted, per rule, so a test can check it is found."""

    card_testing: list[str] = field(default_factory=list)
    impossible_travel: list[str] = field(default_factory=list)
    stolen_card_use: list[str] = field(default_factory=list)
    unpaid_order: list[str] = field(default_factory=list)
    v_shape: list[str] = field(default_factory=list)
    acme_news: list[str] = field(default_factory=list)
    merchant_velocity: list[str] = field(default_factory=list)
    account_takeover: list[str] = field(default_factory=list)
    error_burst: list[str] = field(default_factory=list)
    latency_p99: list[str] = field(default_factory=list)
    brute_force_success: list[str] = field(default_factory=list)
    breach_watch: list[str] = field(default_factory=list)
    new_card_checkout: list[str] = field(default_factory=list)
    card_testing_abroad: list[str] = field(default_factory=list)
    watched_merchant_sale: list[str] = field(default_factory=list)


def _iso(t: datetime) -> str:
    return format_iso_ms(round(t.timestamp() * 1000))


def generate(n_events: int, seed: int = 7) -> tuple[list[dict], Planted]:
    """``n_events`` (about) events in event-time order and what was planted among them."""
    rng = random.Random(seed)
    events: list[tuple[datetime, int, dict]] = []
    planted = Planted()
    span = timedelta(seconds=max(3600, n_events * 2))  # ~0.5 events per second of event time
    counter = iter(range(10**12))

    def add(stream: str, t: datetime, **fields) -> None:
        fields["ts"] = _iso(t)
        events.append((t, next(counter), {"stream": stream, **fields}))

    def at(fraction: float) -> datetime:
        return START + span * fraction

    n_cards = max(20, n_events // 40)
    cards = [f"4{rng.randrange(10**14, 10**15):015d}" for _ in range(n_cards)]
    home = {c: rng.choice(list(CITIES)) for c in cards}
    users = [f"user_{i:05d}" for i in range(max(10, n_events // 80))]
    user_city = {u: rng.choice(list(CITIES)) for u in users}

    # background traffic, by share of the stream mix
    n_background = int(n_events * 0.9)
    for i in range(n_background):
        t = at(rng.random())
        kind = rng.random()
        if kind < 0.40:
            card = rng.choice(cards)
            lat, lon = CITIES[home[card]]
            add("txn", t, card_id=card, amount=round(math.exp(rng.gauss(3.3, 0.8)) + 1.5, 2),
                merchant=rng.choice(MERCHANTS), country="US", lat=lat, lon=lon)
        elif kind < 0.50:
            user = rng.choice(users)
            lat, lon = CITIES[user_city[user]]
            add("logins", t, user_id=user, lat=lat, lon=lon)
        elif kind < 0.58:
            user = rng.choice(users)
            action = rng.choice(["login", "login", "login", "transfer", "password_reset"])
            add("account", t, user_id=user, action=action, device=f"dev-{user[-3:]}",
                amount=round(rng.uniform(5, 900), 2) if action == "transfer" else None)
        elif kind < 0.72:
            service = rng.choice(SERVICES)
            level = rng.choices(["info", "warn", "error"], [0.9, 0.08, 0.02])[0]
            add("app_log", t, service=service, level=level, message=f"{service} handled request",
                latency_ms=round(math.exp(rng.gauss(3.5, 0.5)), 1))
        elif kind < 0.78:
            user = rng.choice(users)
            if rng.random() < 0.1:
                add("auth", t - timedelta(seconds=8), user_id=user, source_ip="10.0.0.8",
                    outcome="failure")
            add("auth", t, user_id=user, source_ip="10.0.0.8", outcome="success")
        elif kind < 0.84:
            order = f"o-{i:07d}"
            amount = round(rng.uniform(10, 400), 2)
            add("orders", t, order_id=order, status="placed", amount=amount)
            add("payments", t + timedelta(seconds=rng.randint(5, 600)), order_id=order,
                amount=amount)
        elif kind < 0.97:
            pass  # ticks are generated as walks below
        else:
            title, body = rng.choice(TOPICS)
            add("news", t, id=f"n-{i:07d}", title=title, body=body,
                source=rng.choice(SOURCES), views=rng.randint(10, 50_000))

    # market ticks: per symbol a random walk in runs of twelve steps up or down
    symbols = ["ACME", "GLOBEX", "INITECH", "UMBRELLA"]
    n_ticks = max(40, int(n_events * 0.15))
    for s_i, symbol in enumerate(symbols):
        price = 100.0 + 10 * s_i
        t = START
        step = span / (n_ticks // len(symbols) + 1)
        direction = 1
        for k in range(n_ticks // len(symbols)):
            if k % 12 == 0:
                direction = -direction
            price = round(max(1.0, price + direction * rng.uniform(0.05, 0.5)), 2)
            t = t + step
            add("ticks", t, symbol=symbol, price=price)

    plant = max(1, n_events // 2000)
    for p in range(plant):
        # early enough that ordinary traffic follows every planted situation: a stream has no
        # end, so a streaming engine only closes what later events' watermark passes
        base = at(rng.uniform(0.05, 0.6))
        # card testing: 3-5 tiny charges, then a large one elsewhere, within 10 minutes
        card = f"4{rng.randrange(10**14, 10**15):015d}"
        probes = rng.randint(3, 5)
        for k in range(probes):
            add("txn", base + timedelta(seconds=40 * k), card_id=card,
                amount=round(rng.uniform(0.10, 0.95), 2), merchant="probe_shop", country="US",
                lat=40.7, lon=-74.0)
        add("txn", base + timedelta(seconds=40 * probes + 60), card_id=card,
            amount=round(rng.uniform(600, 2500), 2), merchant="luxury_watches", country="US",
            lat=40.7, lon=-74.0)
        planted.card_testing.append(card)

        # impossible travel: New York then Tokyo twenty minutes later
        user = f"traveller_{p:04d}"
        add("logins", base, user_id=user, lat=CITIES["new_york"][0], lon=CITIES["new_york"][1])
        add("logins", base + timedelta(minutes=20), user_id=user, lat=CITIES["tokyo"][0],
            lon=CITIES["tokyo"][1])
        planted.impossible_travel.append(user)

        # an order that is never paid
        order = f"unpaid-{p:05d}"
        add("orders", base, order_id=order, status="placed", amount=199.0)
        planted.unpaid_order.append(order)

        # a news article the standing query must find
        doc = f"acme-{p:05d}"
        add("news", base, id=doc, title="ACME Corp announces restructuring",
            body="The company confirmed layoffs across three divisions after the merger talks.",
            source="wire", views=rng.randint(1_000, 90_000))
        planted.acme_news.append(doc)

        # account takeover: reset, new device, large transfer within 30 minutes
        victim = f"victim_{p:04d}"
        add("account", base, user_id=victim, action="password_reset", device="dev-old",
            amount=None)
        add("account", base + timedelta(minutes=4), user_id=victim, action="device_added",
            device=f"dev-unknown-{p}", amount=None)
        add("account", base + timedelta(minutes=9), user_id=victim, action="transfer",
            device=f"dev-unknown-{p}", amount=round(rng.uniform(1500, 9000), 2))
        planted.account_takeover.append(victim)

        # brute force: eight failures then a success from one address
        target = f"admin_{p:04d}"
        for k in range(8):
            add("auth", base + timedelta(seconds=10 * k), user_id=target,
                source_ip="203.0.113.7", outcome="failure")
        add("auth", base + timedelta(seconds=95), user_id=target, source_ip="203.0.113.7",
            outcome="success")
        planted.brute_force_success.append(target)

        # a breach story about a portfolio company
        doc = f"breach-{p:05d}"
        add("news", base + timedelta(minutes=1), id=doc, title="Globex confirms data breach",
            body="Globex said a data breach exposed customer records; ransomware is suspected.",
            source="business_weekly", views=rng.randint(100, 9000))
        planted.breach_watch.append(doc)

    # one V shape per symbol, in a quiet stretch after the walk
    for s_i, symbol in enumerate(symbols):
        t = START + span + timedelta(minutes=5 + s_i)
        prices = [150.0, 149.0, 147.5, 146.0, 148.0, 151.0]
        for k, price in enumerate(prices):
            add("ticks", t + timedelta(seconds=k), symbol=f"{symbol}_V", price=price)
        planted.v_shape.append(f"{symbol}_V")

    # stolen cards used once each
    for k, card in enumerate(STOLEN_CARDS):
        add("txn", at(0.3 + 0.2 * k), card_id=card, amount=42.0, merchant="city_fuel",
            country="US", lat=41.9, lon=-87.6)
        planted.stolen_card_use.append(card)

    # a card-testing bot: 60 distinct cards at one merchant within five minutes
    burst = at(0.5)
    for k in range(60):
        add("txn", burst + timedelta(seconds=5 * k), card_id=f"5{k:015d}", amount=12.0,
            merchant="bot_target_store", country="US", lat=37.7, lon=-122.4)
    planted.merchant_velocity.append("bot_target_store")

    # an incident: one service logs a burst of errors and slows down for a few minutes
    incident = at(0.6)
    for k in range(120):
        add("app_log", incident + timedelta(seconds=2 * k), service="inventory",
            level="error" if k % 3 == 0 else "info", message="inventory timeout talking to db",
            latency_ms=round(rng.uniform(700, 2500), 1))
    planted.error_burst.append("inventory")
    planted.latency_p99.append("inventory")

    events.sort(key=lambda e: (e[0], e[1]))
    # bounded disorder: swap neighbours less than 5 s apart now and then, as real feeds do
    out = [e[2] for e in events]
    times = [e[0] for e in events]
    for i in range(1, len(out)):
        if rng.random() < 0.02 and (times[i] - times[i - 1]).total_seconds() < 5:
            out[i - 1], out[i] = out[i], out[i - 1]
    # The mobile app's events and the tables' changelogs come last, each from its own
    # generator, so that adding them left every other stream's events as they were.
    more = mobile_app(n_events, seed, span, planted)
    more += changelogs(n_events, seed, span, planted, home)
    return merge_arrivals(out, times, more), planted


#: Device clock skews of the mobile app's phones: most right, some minutes or hours off.
_SKEWS = (timedelta(0),) * 6 + (
    timedelta(seconds=95), timedelta(seconds=-40), timedelta(hours=-3), timedelta(hours=5),
)


def mobile_app(
    n_events: int, seed: int, span: timedelta, planted: Planted
) -> list[tuple[datetime, dict]]:
    """The ``app_events`` stream: a phone app's events stamped by the phone's clock (``ts``,
    ``sent_at``) and the server's (``received_at``), with their arrival times (when received).
    Phones with a skewed clock are hours off; old app versions on a right clock send no
    ``sent_at``. Planted: a card added then a large checkout, on a phone six hours behind."""
    rng = random.Random(seed * 1000 + 25)
    users = [f"app_user_{i:04d}" for i in range(max(5, n_events // 200))]
    skew = {u: rng.choice(_SKEWS) for u in users}
    found: list[tuple[datetime, dict]] = []

    def add(user: str, t: datetime, device: timedelta, *, old: bool = False, **fields) -> None:
        sent = t + timedelta(milliseconds=rng.randint(0, 20_000))  # queued on the phone
        received = sent + timedelta(milliseconds=rng.randint(40, 900))
        event = {"stream": "app_events", "user_id": user, **fields, "ts": _iso(t + device)}
        if not old:
            event["sent_at"] = _iso(sent + device)
        event["received_at"] = _iso(received)
        found.append((received if not old else t, event))

    for _ in range(max(20, n_events // 30)):
        user = rng.choice(users)
        t = START + span * rng.uniform(0.0, 0.95)
        action = rng.choice(["open", "view", "view", "card_added", "checkout"])
        amount = round(rng.uniform(5, 400), 2) if action == "checkout" else None
        add(user, t, skew[user], old=skew[user] == timedelta(0) and rng.random() < 0.2,
            action=action, amount=amount)
    for p in range(max(1, n_events // 2000)):
        user = f"app_victim_{p:04d}"
        base = START + span * rng.uniform(0.1, 0.6)
        behind = timedelta(hours=-6)
        add(user, base, behind, action="card_added", amount=None)
        add(user, base + timedelta(seconds=70), behind, action="checkout",
            amount=round(rng.uniform(1500, 4000), 2))
        planted.new_card_checkout.append(user)
    return found


#: The country of each city the background cards live in.
COUNTRY = {"new_york": "US", "chicago": "US", "london": "GB", "tokyo": "JP", "sydney": "AU",
           "paris": "FR"}
#: The merchant the risk team puts on its watch list for a while (no background sale there).
WATCHED_MERCHANT = "gold_exchange_24"


def changelogs(
    n_events: int, seed: int, span: timedelta, planted: Planted, home: dict[str, str]
) -> list[tuple[datetime, dict]]:
    """The changelog streams of the example tables, with the sales that read them, as (time,
    event). ``card_changes``: a snapshot (``r``) of every card's home country before the day
    starts, then moves (``u``) and a closed card (``d``) during it. ``merchant_changes``: a
    snapshot of the merchants, none watched, then one put on the watch list and taken off.
    Planted: probe charges then a large purchase abroad on a card whose home is FR (it moves
    to GB half an hour later, so only the table as of the purchase says FR), and a large sale
    at the watched merchant while it is watched. Not matching: a card that moved to GB just
    before its probes and purchase there, and large sales at the merchant before it is
    watched and after it is taken off."""
    rng = random.Random(seed * 1000 + 26)
    found: list[tuple[datetime, dict]] = []
    cards = list(home)

    def add(stream: str, t: datetime, **fields) -> None:
        found.append((t, {"stream": stream, **fields, "ts": _iso(t)}))

    def card_change(t: datetime, card: str, country: str | None, op: str) -> None:
        add("card_changes", t, card_id=card, home_country=country, op=op)

    def txn(t: datetime, card: str, amount: float, merchant: str, city: str) -> None:
        lat, lon = CITIES[city]
        add("txn", t, card_id=card, amount=amount, merchant=merchant,
            country=COUNTRY[city], lat=lat, lon=lon)

    def new_card() -> str:
        return f"4{rng.randrange(10**14, 10**15):015d}"

    snapshot = START - timedelta(minutes=1)
    plant = max(1, n_events // 2000)
    abroad = [new_card() for _ in range(plant)]
    moved = [new_card() for _ in range(plant)]
    for card in cards:
        card_change(snapshot, card, COUNTRY[home[card]], "r")
    for card in planted.card_testing:
        card_change(snapshot, card, "US", "r")
    for card in abroad:
        card_change(snapshot, card, "FR", "r")
    for card in moved:
        card_change(snapshot, card, "US", "r")

    # background: some customers move, one closes a card
    for _ in range(max(3, len(cards) // 15)):
        card = rng.choice(cards)
        country = rng.choice(sorted(set(COUNTRY.values()) - {COUNTRY[home[card]]}))
        card_change(START + span * rng.uniform(0.05, 0.95), card, country, "u")
    card_change(START + span * rng.uniform(0.85, 0.95), rng.choice(cards), None, "d")

    for p in range(plant):
        # a card at home in France: probes, then a large purchase in London, all at one
        # London shop (so the card_testing rule, which wants another merchant, stays quiet)
        base = START + span * rng.uniform(0.1, 0.6)
        probes = rng.randint(3, 4)
        for k in range(probes):
            txn(base + timedelta(seconds=40 * k), abroad[p], round(rng.uniform(0.10, 0.95), 2),
                "london_gadgets", "london")
        big = base + timedelta(seconds=40 * probes + 60)
        txn(big, abroad[p], round(rng.uniform(800, 3000), 2), "london_gadgets", "london")
        card_change(big + timedelta(minutes=30), abroad[p], "GB", "u")  # moved, later
        planted.card_testing_abroad.append(abroad[p])

        # the same pattern on a card whose customer reported a move to London minutes before:
        # at home there by then
        base = START + span * rng.uniform(0.1, 0.6)
        card_change(base, moved[p], "GB", "u")
        for k in range(3):
            txn(base + timedelta(minutes=5, seconds=40 * k), moved[p],
                round(rng.uniform(0.10, 0.95), 2), "london_gadgets", "london")
        txn(base + timedelta(minutes=7), moved[p], round(rng.uniform(800, 3000), 2),
            "london_gadgets", "london")

    # the merchants, none watched; one goes on the watch list and comes off it later
    for merchant in [*MERCHANTS, WATCHED_MERCHANT]:
        add("merchant_changes", snapshot, merchant=merchant, watched=False, reason=None, op="r")
    watched = START + span * rng.uniform(0.25, 0.4)
    cleared = watched + span * rng.uniform(0.3, 0.4)
    add("merchant_changes", watched, merchant=WATCHED_MERCHANT, watched=True,
        reason="chargebacks under review", op="u")
    add("merchant_changes", cleared, merchant=WATCHED_MERCHANT, watched=False,
        reason="cleared by the risk team", op="u")

    def sale(t: datetime, amount: float) -> None:
        txn(t, rng.choice(cards), amount, WATCHED_MERCHANT, "new_york")

    sale(watched - timedelta(minutes=10), round(rng.uniform(400, 900), 2))  # not yet watched
    sale(watched + timedelta(minutes=6), round(rng.uniform(20, 150), 2))  # watched, small
    sale(watched + timedelta(minutes=15), round(rng.uniform(400, 900), 2))  # planted
    planted.watched_merchant_sale.append(WATCHED_MERCHANT)
    sale(cleared + timedelta(minutes=8), round(rng.uniform(400, 900), 2))  # taken off since
    return found


def merge_arrivals(
    events: list[dict], times: list[datetime], more: list[tuple[datetime, dict]]
) -> list[dict]:
    """``events`` (arriving about at ``times``) with ``more`` placed among them by arrival
    time; the order of ``events`` is kept."""
    pending = sorted(more, key=lambda item: item[0])
    out: list[dict] = []
    k = 0
    for event, t in zip(events, times, strict=True):
        while k < len(pending) and pending[k][0] <= t:
            out.append(pending[k][1])
            k += 1
        out.append(event)
    out.extend(item[1] for item in pending[k:])
    return out


def write_sample(out_dir: str, n_events: int, *, seed: int = 7, files: int = 4) -> Planted:
    """Write the events as ``part-NNNNN.jsonl`` files (in time order across files) plus
    ``_planted.json``; returns what was planted."""
    events, planted = generate(n_events, seed)
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):
        if name.startswith("part-") and name.endswith(".jsonl"):
            os.remove(os.path.join(out_dir, name))
    per_file = max(1, math.ceil(len(events) / files))
    for f in range(0, len(events), per_file):
        path = os.path.join(out_dir, f"part-{f // per_file:05d}.jsonl")
        with open(path, "w", encoding="utf-8") as fh:
            for event in events[f : f + per_file]:
                fh.write(json.dumps(event, separators=(",", ":")) + "\n")
    with open(os.path.join(out_dir, "_planted.json"), "w", encoding="utf-8") as fh:
        json.dump(planted.__dict__, fh, indent=2)
        fh.write("\n")
    return planted


def configure_parser(sub) -> None:
    parser = sub.add_parser("sample", help="write sample events with planted patterns")
    parser.add_argument("--out", required=True, help="directory to write part-*.jsonl into")
    parser.add_argument("--events", type=int, default=20_000, help="about how many events")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--files", type=int, default=4, help="number of part files")
    parser.set_defaults(handler=_cmd_sample)


def _cmd_sample(args: argparse.Namespace) -> int:
    if args.events < 1 or args.files < 1:

        raise UsageError("--events and --files must be at least 1")
    planted = write_sample(args.out, args.events, seed=args.seed, files=args.files)
    total = sum(len(v) for v in planted.__dict__.values())
    print(f"wrote about {args.events} events to {args.out}/part-*.jsonl "
          f"({total} planted situations in _planted.json)")
    return 0
