"""The vectorised prefilter: ``CompiledRule.columnar_mask`` and skipping rows that fit nothing."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from cep.events.event import Event
from cep.nfa.compiler import compile_rule
from cep.nfa.runtime import advance_watermark, new_state, process_event
from query_lang import ast
from query_lang.parser import parse

HEADER = "stream txn (card_id string, amount float, merchant string, ts timestamp) time ts\n"
CARD = HEADER + """
rule card_testing from txn by card_id
  pattern probe{3,} big
  define probe as amount < 1.00,
         big   as amount > 500 and merchant != last(probe).merchant
  within 10m
"""


def rule_of(text: str):
    module = parse(text)
    streams = {d.name: d for d in module.of_type(ast.StreamDecl)}
    return compile_rule(module.of_type(ast.RuleDecl)[0], streams=streams)


def test_mask_bits_follow_the_variables():
    rule = rule_of(CARD)
    df = pd.DataFrame({
        "card_id": ["c"] * 4,
        "amount": [0.5, 50.0, 900.0, None],
        "merchant": ["m", "m", "n", "m"],
        "ts": [0, 1, 2, 3],
    })
    mask = rule.columnar_mask(df)
    assert mask.dtype == np.int64
    probe, big = 1 << rule.variables.index("probe"), 1 << rule.variables.index("big")
    # big reads last(probe), but its columnar conjunct amount > 500 still filters rows.
    assert list(mask) == [probe, 0, big, 0]
    assert rule.pure_bits == probe
    assert not rule.needs_every_event


def test_mask_is_zero_for_rows_that_fit_nothing():
    rule = rule_of(HEADER + "rule r from txn by card_id pattern a b "
                   "define a as amount < 1, b as amount > 500")
    df = pd.DataFrame({"card_id": ["c"] * 3, "amount": [0.5, 50.0, 900.0],
                       "merchant": ["m"] * 3, "ts": [0, 1, 2]})
    assert list(rule.columnar_mask(df)) == [1, 0, 2]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.3, 0.6, 5.0, 700.0]), max_size=30),
       st.lists(st.sampled_from(["m", "n"]), min_size=30, max_size=30))
def test_skipping_mask_zero_rows_changes_nothing(amounts, merchants):
    rule = rule_of(CARD)
    df = pd.DataFrame({
        "card_id": ["c"] * len(amounts), "amount": amounts,
        "merchant": merchants[: len(amounts)], "ts": [i * 1000 for i in range(len(amounts))],
    })
    mask = rule.columnar_mask(df)
    rows = df.to_dict("records")

    def feed(use_mask: bool):
        state = new_state(rule)
        out = []
        for i, row in enumerate(rows):
            if use_mask and mask[i] == 0:
                continue
            event = Event(i, "txn", row["ts"], i, row)
            out += process_event(rule, state, event, int(mask[i]) if use_mask else None)
        out += advance_watermark(rule, state, math.inf)
        return [m.to_json() for m in out]

    assert feed(True) == feed(False)
