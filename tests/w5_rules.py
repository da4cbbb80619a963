"""The rules of W5's mix (``bench/bench_rules.py``) with small drawn parameters, so that matches
happen on a few dozen events: the rule-index suites of both engines draw from here."""

from __future__ import annotations

from hypothesis import strategies as st

STREAMS = """
stream ev (id int, key string, kind string, amount float, merchant string, price float,
           ts timestamp)
  time ts unit ms lateness 5ms id id
stream flags (key string, level int, ts timestamp) time ts unit ms lateness 5ms
"""
KINDS = ("order", "payment", "login")


@st.composite
def rule_text(draw, name: str) -> str:
    """One rule of the W5 mix with drawn parameters (small, so that matches happen)."""
    shape = draw(st.sampled_from(
        ["threshold", "sequence", "absence", "join", "prev", "prev_relaxed"]))
    window = draw(st.sampled_from(["5ms", "20ms", "60ms"]))
    above = draw(st.sampled_from([1, 3, 5]))
    if shape == "threshold":
        probes = draw(st.integers(1, 2))
        return (f"rule {name} from ev by key pattern probe{{{probes},}} big\n"
                f"  define probe as amount < 2,\n"
                f"         big as amount > {above} and merchant != last(probe).merchant\n"
                f"  within {window}\n")
    if shape == "sequence":
        a, b, c = (draw(st.sampled_from(KINDS)) for _ in range(3))
        return (f"rule {name} from ev by key pattern a b c\n"
                f'  define a as kind == "{a}" and amount > {above}, b as kind == "{b}",\n'
                f'         c as kind == "{c}"\n'
                f"  within {window}\n")
    if shape == "absence":
        return (f"rule {name} from ev by key pattern placed !paid\n"
                f'  define placed as kind == "order" and amount > {above},\n'
                f'         paid as kind == "payment"\n'
                f"  within {window}\n")
    if shape == "join":
        level = draw(st.integers(0, 2))
        return (f"rule {name} from flags, ev by key pattern f e\n"
                f"  define f as flags where level >= {level},\n"
                f"         e as ev where amount > {above}\n"
                f"  within {window}\n")
    rise = draw(st.sampled_from([0, 1]))
    contiguity = "  contiguity strict\n" if shape == "prev" else ""
    return (f"rule {name} from ev by key pattern a b\n{contiguity}"
            f"  define a as amount > {above}, b as price > prev(price) + {rise}\n")


def scans_counted(monkeypatch) -> list[str]:
    """The names of the rules whose strict scans run from now on (``cep.nfa.strict``'s
    ``process_events``), one per scan, in order."""
    import cep.nfa.strict as strict_module

    scanned: list[str] = []
    real = strict_module.process_events

    def counting(rule, state, events, bits, times=None):
        scanned.append(rule.name)
        return real(rule, state, events, bits, times)

    monkeypatch.setattr(strict_module, "process_events", counting)
    return scanned
