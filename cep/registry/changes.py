"""Live changes: what turns the engine running registry version U into one running version V,
leaving every other rule, query and metric — and its state — as it was.

Rules, queries and metrics added, replaced or removed are registered and unregistered one by
one (:meth:`Engine.register`, :meth:`Engine.unregister`): a replaced one starts fresh, the
others keep their partial matches and windows. The engine cannot take back a stream, list or
webhook, so a change that replaces or removes one *rebuilds* the engine: a new engine runs the
whole program of V and restores the old one's state (:meth:`Engine.restore`), which keeps the
state of every form whose compiled identity did not change and starts the others fresh.
Streams, lists and webhooks that are only added are registered in place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from cep.engine import Engine
from cep.registry.store import STANDING, Entry

__all__ = ["ProgramChange", "apply_change", "build_engine", "written_change"]


@dataclass(frozen=True)
class ProgramChange:
    """The difference between two registry versions' declarations."""

    added: list[Entry] = field(default_factory=list)
    replaced: list[Entry] = field(default_factory=list)
    removed: list[Entry] = field(default_factory=list)

    @property
    def rebuilds(self) -> bool:
        """Whether a stream, list or webhook is replaced or removed (the engine is rebuilt)."""
        return any(e.space != STANDING for e in [*self.replaced, *self.removed])

    @property
    def empty(self) -> bool:
        return not (self.added or self.replaced or self.removed)

    def names(self) -> dict[str, list[str]]:
        return {
            "added": [e.name for e in self.added],
            "replaced": [e.name for e in self.replaced],
            "removed": [e.name for e in self.removed],
        }


def written_change(
    before: Mapping[tuple[str, str], Entry], written: Sequence[Entry]
) -> ProgramChange:
    """What the entries ``written`` by later versions change of the program ``before`` (by
    space and name): the cost of the change, not of the program (see
    :meth:`~cep.registry.store.RegistryStore.written`).

    Examples
    --------
    >>> a = Entry("standing", "big", "rule", 1, "rule big ...")
    >>> gone = Entry("standing", "big", "rule", 2, None)
    >>> new = Entry("standing", "new", "rule", 2, "rule new ...")
    >>> written_change({("standing", "big"): a}, [gone, new]).names()
    {'added': ['new'], 'replaced': [], 'removed': ['big']}
    """
    change = ProgramChange()
    for entry in written:
        was = before.get((entry.space, entry.name))
        if entry.text is None:
            if was is not None:
                change.removed.append(was)
        elif was is None:
            change.added.append(entry)
        elif was.text != entry.text or was.kind != entry.kind:
            change.replaced.append(entry)
    return change


def build_engine(
    entries: Sequence[Entry], make: Callable[[], Engine], previous: Engine | None = None
) -> Engine:
    """A new engine running ``entries``; with ``previous``, it continues from its state
    (what :meth:`Engine.restore` keeps)."""
    engine = make()
    text = _text(entries)
    if text:
        engine.register(text)
    if previous is not None:
        engine.restore(previous.snapshot())
    return engine


def apply_change(
    engine: Engine,
    change: ProgramChange,
    after: Sequence[Entry],
    make: Callable[[], Engine],
) -> Engine:
    """The engine that runs ``after``: ``engine`` itself, changed in place, or a rebuilt one
    (see the module's docstring). The old engine is not to be used when another is returned."""
    if change.rebuilds:
        return build_engine(after, make, previous=engine)
    for entry in [*change.removed, *change.replaced]:
        engine.unregister(entry.name)
    # Streams, lists and webhooks first: the rules that come with them read them.
    incoming = sorted([*change.added, *change.replaced], key=lambda e: e.space == STANDING)
    text = _text(incoming)
    if text:
        try:
            engine.register(text)
        except Exception:
            # The registry checked this program whole; if the engine still refuses part of
            # it, do not leave it half changed: rebuild from the whole program.
            return build_engine(after, make, previous=engine)
    return engine


def _text(entries: Sequence[Entry]) -> str:
    # Newlines: Engine.register reads a one-line string without one as a file path.
    return "".join(f"{e.text.strip()}\n\n" for e in entries if e.text)
