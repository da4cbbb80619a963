"""Benchmark of the indexed percolator on Debian package descriptions, against no filtering and
against tantivy run as a batch reverse search (``bench/peers/tantivy_batch.py``).

Documents are the packages known to apt on this machine (``apt-cache dumpavail`` joined with the
long descriptions of apt's Translation-en lists, which ``apt-get update -o Acquire::Languages=en``
fetches once; without them, the installed packages of ``/var/lib/dpkg/status``). Standing
queries are generated deterministically from the corpus in realistic shapes. Reports
documents/s, queries verified per document, the ratio against verifying every query and
against tantivy (the best of batches of 100, 1,000 and 10,000 documents), and memory per
stored query; writes ``bench/results/percolator.md``.

Run: ``python bench/bench_percolator.py`` (``--sizes 10000 100000`` for a shorter run).
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import resource
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "peers"))

from tantivy_batch import TantivyBatchPercolator  # noqa: E402

from percolator import (  # noqa: E402
    COLUMNAR_THRESHOLD,
    AnalyzedDocument,
    BatchResult,
    BatchStats,
    IndexedPresearcher,
    NoFilterPresearcher,
    Percolator,
    Schema,
    Selectivity,
    analyze_text,
)
from percolator.interning import INTERN_POOL  # noqa: E402
from query_lang.ast import (  # noqa: E402
    SearchAnd,
    SearchCompare,
    SearchNode,
    SearchNot,
    SearchOr,
    SearchPhrase,
    SearchPrefix,
    SearchRange,
    SearchRegex,
    SearchTerm,
    SearchWildcard,
)

SCHEMA = Schema.of(
    {
        "title": "text",
        "body": "text",
        "section": "string",
        "priority": "string",
        "maintainer": "string",
        "size": "int",
    },
    default_fields=["title", "body"],
)

STOPWORDS = frozenset(
    "a an and are as at be by for from in into is it its of on or that the this to with you "
    "your can will which these this package contains provides".split()
)


# ---------------------------------------------------------------- corpus


def _stanzas(text: str, description: str) -> Iterator[dict[str, str]]:
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line.startswith((" ", "\t")) and key:
                fields[key] += "\n" + line[1:]
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Package" in fields and description in fields:
            yield fields


def _translations() -> dict[str, str]:
    """Long English descriptions from apt's Translation-en lists (after ``apt-get update``)."""
    descriptions: dict[str, str] = {}
    for path in sorted(Path("/var/lib/apt/lists").glob("*_i18n_Translation-en*")):
        try:
            text = subprocess.run(
                ["/usr/lib/apt/apt-helper", "cat-file", str(path)],
                capture_output=True, text=True, check=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        for stanza in _stanzas(text, "Description-en"):
            descriptions[stanza["Package"]] = stanza["Description-en"]
    return descriptions


def load_corpus() -> tuple[list[dict[str, Any]], str]:
    """Package stanzas as documents, one per package name, in a stable order.

    Uses apt's package lists joined with their long English descriptions when ``apt-get
    update`` has fetched them, else the installed packages of ``/var/lib/dpkg/status``.
    """
    translations = _translations()
    text = ""
    if len(translations) >= 1000:
        try:
            text = subprocess.run(
                ["apt-cache", "dumpavail"], capture_output=True, text=True, check=True
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            text = ""
    source = "apt-cache dumpavail + Translation-en"
    if text.count("\nPackage:") < 1000:
        text = Path("/var/lib/dpkg/status").read_text(encoding="utf-8", errors="replace")
        source = "/var/lib/dpkg/status"
        translations = {}
    documents: dict[str, dict[str, Any]] = {}
    for stanza in _stanzas(text, "Description"):
        description = translations.get(stanza["Package"], stanza["Description"])
        title, _, body = description.partition("\n")
        body = "\n".join("" if ln.strip() == "." else ln for ln in body.splitlines())
        size = stanza.get("Installed-Size", "")
        documents[stanza["Package"]] = {
            "id": stanza["Package"],
            "title": title,
            "body": body,
            "section": stanza.get("Section", "unknown"),
            "priority": stanza.get("Priority", "optional"),
            "maintainer": stanza.get("Maintainer", ""),
            "size": int(size) if size.isdigit() else None,
        }
    return [documents[name] for name in sorted(documents)], source


# ---------------------------------------------------------------- standing queries


class QueryGenerator:
    """Deterministic standing queries drawn from documents of the training half of the corpus,
    so they look like what users write about packages: distinctive words that co-occur."""

    def __init__(self, training: list[dict[str, Any]], seed: int = 42) -> None:
        self.rng = random.Random(seed)
        self.docs = training
        df: Counter[str] = Counter()
        self.words: list[list[str]] = []
        for doc in training:
            words = analyze_text(doc["title"] + " " + doc["body"])
            self.words.append(words)
            df.update(set(words))
        total = len(training)
        self.df = df
        self.frequency = {t: n / total for t, n in df.items()}
        # Words a user would watch for: not stopwords, not numbers, seen in 2+ documents but
        # fewer than 1% of them (alerting queries name something specific).
        self.useful = {
            t for t, n in df.items()
            if t not in STOPWORDS and not t.isdigit() and len(t) > 2 and 2 <= n <= 0.01 * total
        }
        self.sections = sorted({d["section"] for d in training})
        self.vocabulary = sorted(self.useful)
        self._by_section: dict[str, list[int]] | None = None

    def _doc_words(self) -> tuple[dict[str, Any], list[str]]:
        while True:
            index = self.rng.randrange(len(self.docs))
            words = self.words[index]
            useful = sorted({w for w in words if w in self.useful})
            if len(useful) >= 5:
                return self.docs[index], useful

    def _section_doc_words(self, section: str) -> tuple[dict[str, Any], list[str]]:
        """A random training document of ``section`` with 5 useful words or more, and them."""
        if self._by_section is None:
            self._by_section = {}
            for index, doc in enumerate(self.docs):
                self._by_section.setdefault(doc["section"], []).append(index)
        indexes = self._by_section[section]
        for _ in range(100):
            index = indexes[self.rng.randrange(len(indexes))]
            useful = sorted({w for w in self.words[index] if w in self.useful})
            if len(useful) >= 5:
                return self.docs[index], useful
        return self._doc_words()

    def _field(self) -> str | None:
        return self.rng.choice([None, None, "body", "title"])

    def query(self) -> SearchNode:
        rng = self.rng
        doc, useful = self._doc_words()
        shape = rng.random()
        field = self._field()
        if shape < 0.35:
            terms = rng.sample(useful, rng.choice([2, 3, 3, 4, 4, 5]))
            return SearchAnd(tuple(SearchTerm(field, t) for t in terms))
        if shape < 0.50:
            # A phrase starting at a distinctive word, as in "network manager".
            words = analyze_text(doc["title"] + " " + doc["body"])
            starts = [i for i, w in enumerate(words[:-1]) if w in self.useful]
            start = rng.choice(starts) if starts else 0
            return SearchPhrase(field, " ".join(words[start:start + rng.choice([2, 3, 3])]))
        if shape < 0.65:
            picked = rng.sample(useful, 5)
            group = SearchOr(tuple(SearchTerm(field, t) for t in picked[:3]))
            return SearchAnd((group, *(SearchTerm(field, t) for t in picked[3:])))
        if shape < 0.75:
            word = rng.choice([w for w in useful if len(w) >= 5] or useful)
            prefix = word[: rng.randint(4, max(4, len(word) - 1))]
            return SearchAnd((SearchPrefix(field, prefix), SearchTerm(field, rng.choice(useful))))
        if shape < 0.80:
            word = rng.choice([w for w in useful if len(w) >= 7] or useful)
            hole = rng.randrange(1, len(word) - 1)
            pattern = word[:hole] + "?" + word[hole + 1:] + rng.choice(["", "*"])
            return SearchWildcard(field, pattern)
        if shape < 0.84:
            word = rng.choice([w for w in useful if len(w) >= 5] or useful)
            return SearchAnd((SearchRegex("title", word[:4] + "[a-z0-9]*"),
                              SearchTerm(field, rng.choice(useful))))
        if shape < 0.90:
            low = rng.choice([0, 10, 100, 1000, 10000])
            ranged = SearchRange("size", low, low * rng.choice([2, 10, 100]) or 50)
            return SearchAnd((SearchTerm(field, rng.choice(useful)), ranged))
        if shape < 0.95:
            keep, drop = rng.sample(useful, 2)
            return SearchAnd((SearchTerm(field, keep), SearchTerm(field, rng.choice(useful)),
                              SearchNot(SearchTerm(field, drop))))
        return SearchAnd((
            SearchTerm("section", doc["section"]),
            SearchTerm(field, rng.choice(useful)),
            SearchCompare("size", rng.choice([">", "<="]), rng.choice([100, 1000, 10000])),
        ))

    def needle_query(self) -> SearchNode:
        """A query of distinctive words drawn independently of each other: what monitoring
        for many unrelated names looks like. Conjunctions of such words rarely match; a single
        word AND a size range (10% of the queries) matches as often as its word does, so these
        give most of the matches. Matches per document grow with the number of queries: about
        0.1 at 10,000 queries, 1 at 100,000, 10 at 1,000,000."""
        rng = self.rng
        useful = self.vocabulary
        field = self._field()
        shape = rng.random()
        if shape < 0.45:
            return SearchAnd(tuple(
                SearchTerm(field, t) for t in rng.sample(useful, rng.choice([2, 2, 3, 4]))
            ))
        if shape < 0.60:
            return SearchPhrase(field, " ".join(rng.sample(useful, 2)))
        if shape < 0.75:
            word = rng.choice(useful)
            return SearchAnd((SearchPrefix(field, word[: max(4, len(word) - 2)]),
                              SearchTerm(field, rng.choice(useful))))
        if shape < 0.85:
            picked = rng.sample(useful, 4)
            group = SearchOr(tuple(SearchTerm(field, t) for t in picked[:3]))
            return SearchAnd((group, SearchTerm(field, picked[3])))
        if shape < 0.90:
            keep, also, drop = rng.sample(useful, 3)
            return SearchAnd((SearchTerm(field, keep), SearchTerm(field, also),
                              SearchNot(SearchTerm(field, drop))))
        low = rng.choice([0, 10, 100, 1000, 10000])
        return SearchAnd((SearchTerm(field, rng.choice(useful)),
                          SearchRange("size", low, low * 10 or 50)))

    def alert_query(self, count: int) -> SearchNode:
        """A query of the alerts mix for ``count`` standing queries: a *tail term* (a word of
        one training document whose document frequency in the training half is at most
        :func:`tail_cutoff` of ``count``: the more queries, the rarer) AND a clause of other
        words of the same document, with more partner words as ``count`` grows (one at
        10,000, two at 100,000, three at 1,000,000). So queries get more specific as their
        number grows and matches per document stay bounded, as in alerting, where most
        documents match nothing.

        Past :data:`ALERTS_ABOUT_DOCUMENTS` queries there are more queries than a training
        document's words can make specific (~30 per document at 1,000,000, and Debian's
        sibling packages share their descriptions, so a test document would match all of a
        sibling's): only that many queries, drawn at random, take their other words from the
        tail term's document; the others take them from another document of the same section
        (a watched name in the context of its domain), and rarely match."""
        rng = self.rng
        cutoff = tail_cutoff(count)
        partners = alert_partners(count)
        elsewhere = count > ALERTS_ABOUT_DOCUMENTS and (
            rng.random() >= ALERTS_ABOUT_DOCUMENTS / count
        )
        while True:
            doc, useful = self._doc_words()
            words = analyze_text(doc["title"] + " " + doc["body"])
            tail = sorted({
                w for w in words
                if self.df.get(w, 0) <= cutoff and len(w) > 2 and not w.isdigit()
                and w not in STOPWORDS
            })
            if tail and elsewhere:
                doc, useful = self._section_doc_words(doc["section"])
                words = analyze_text(doc["title"] + " " + doc["body"])
            others = [w for w in useful if w not in tail]
            if tail and len(others) >= partners + 2:
                break
        term = rng.choice(tail)
        field = rng.choice([None, None, None, "body"])
        rest = rng.sample(others, partners + 2)
        shape = rng.random()
        clauses: list[SearchNode] = [SearchTerm(field, term)]
        clauses += [SearchTerm(field, w) for w in rest[: partners - 1]]
        last = rest[partners - 1]
        if shape < 0.45:
            clauses.append(SearchTerm(field, last))
        elif shape < 0.60:
            starts = [i for i, w in enumerate(words[:-1]) if w == last]
            start = rng.choice(starts) if starts else 0
            clauses.append(SearchPhrase(field, " ".join(words[start:start + 2])))
        elif shape < 0.75:
            clauses.append(SearchPrefix(field, last[: max(4, len(last) - 2)]))
        elif shape < 0.85:
            clauses.append(SearchOr(tuple(SearchTerm(field, w) for w in rest[-3:])))
        elif shape < 0.93:
            clauses.append(SearchTerm(field, last))
            clauses.append(SearchNot(SearchTerm(field, rng.choice(self.vocabulary))))
        else:
            low = rng.choice([0, 10, 100, 1000])
            clauses.append(SearchRange("size", low, low * 100 or 50))
        return SearchAnd(tuple(clauses))

    def queries(
        self, count: int, workload: str = "cooccurring"
    ) -> list[tuple[str, SearchNode, tuple[str, ...]]]:
        if workload == "alerts":
            return [(f"q{i}", self.alert_query(count), ()) for i in range(count)]
        make = self.needle_query if workload == "needle" else self.query
        return [(f"q{i}", make(), ()) for i in range(count)]


#: Alert queries about one training document's words, at most (see ``alert_query``).
ALERTS_ABOUT_DOCUMENTS = 100_000


def tail_cutoff(count: int) -> int:
    """The largest training document frequency of an alert's tail term at ``count`` queries:
    30 at 10,000, 3 at 100,000, 1 from 300,000 on."""
    return max(1, round(30 * 10_000 / count))


def alert_partners(count: int) -> int:
    """Words of the alert's document besides its tail term: one more per factor 10 of
    queries from 10,000 on (the tail cannot get rarer than words seen once)."""
    partners = 1
    while count >= 100_000 * 10 ** (partners - 1):
        partners += 1
    return partners


def split_corpus(
    corpus: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The corpus shuffled (seed 7) and halved: queries come from the first half (training),
    matched documents from the second (testing)."""
    shuffled = corpus[:]
    random.Random(7).shuffle(shuffled)
    return shuffled[: len(shuffled) // 2], shuffled[len(shuffled) // 2:]


# ---------------------------------------------------------------- measuring


def build(queries: list, presearcher: Any) -> tuple[Percolator, float]:
    percolator = Percolator(SCHEMA, presearcher)
    start = time.perf_counter()
    percolator.add_many(queries)
    return percolator, time.perf_counter() - start


def run(
    percolator: Percolator, docs: list[dict[str, Any]], highlights: bool = False
) -> tuple[float, Any]:
    """CPU seconds of matching ``docs`` in this process, and the batch result.

    CPU time rather than wall time: the benchmark machine is shared, and a process waiting
    for a core would otherwise count as a slow percolator.
    """
    gc.collect()
    start = time.process_time()
    result = percolator.match_batch(docs, highlights=highlights)
    return time.process_time() - start, result


def repeated(
    percolator: Percolator, stream: list[dict[str, Any]], chunk: int, highlights: bool = False
) -> tuple[float, Any]:
    """CPU seconds of matching ``stream`` ``chunk`` documents at a time (one pass of 3,000
    documents takes a fraction of a second, which a noisy machine skews either way; the
    peer's rate is likewise the mean over as many batches as fit its budget), and the result
    of all of them as one. Every document is new to the index, as in a stream: what a segment
    learns of the terms it meets is paid for as a stream pays for it, not once for documents
    seen again."""
    total = 0.0
    matches: list[tuple] = []
    per_doc: list[int] = []
    matched = decided = 0
    result = None
    for start in range(0, len(stream), chunk):
        seconds, result = run(percolator, stream[start:start + chunk], highlights)
        total += seconds
        matches.extend(result.matches)
        per_doc.extend(result.stats.candidates_per_doc)
        matched += result.stats.matched
        decided += result.stats.decided
    assert result is not None
    stats = BatchStats(
        documents=len(per_doc), candidates_per_doc=tuple(per_doc), verified=sum(per_doc),
        matched=matched, always_run=result.stats.always_run, decided=decided,
    )
    return total, BatchResult(tuple(matches), stats)


def fresh_streams(
    testing: list[dict[str, Any]], length: int
) -> tuple[list[dict[str, Any]], ...]:
    """Disjoint slices of the test documents: the stream matched without highlights (the
    first ``length``, where the baseline and the peer are checked), the one matched with
    them, the one only presearched, the documents that warm each index up before (the
    last 1,000: a stream already running, whose terms the index has met), and those between
    the streams and the warm-up, which a large segment's layout trial may take after it."""
    if 3 * length + WARM_DOCUMENTS > len(testing):
        raise SystemExit(
            f"{len(testing)} test documents cannot hold three streams of {length} and "
            f"{WARM_DOCUMENTS} to warm up with: lower --docs or --repeats"
        )
    return (
        testing[:length], testing[length:2 * length], testing[2 * length:3 * length],
        testing[-WARM_DOCUMENTS:], testing[3 * length:-WARM_DOCUMENTS],
    )


def settle_layouts(percolator: Percolator, docs: list[dict[str, Any]]) -> tuple[int, float]:
    """Match ``docs``, a chunk at a time, while a sealed segment still times its two layouts
    (a segment of ``columnar_threshold`` queries or more does on its first ~1,150 documents,
    then frees the layout it does not keep): a stream already running has chosen. Returns
    the documents it took and their CPU seconds (0 and 0.0 when no segment was on trial)."""
    taken, seconds = 0, 0.0
    while percolator.stats().trials and taken < len(docs):
        chunk_seconds, _ = run(percolator, docs[taken:taken + SETTLE_CHUNK])
        seconds += chunk_seconds
        taken = min(len(docs), taken + SETTLE_CHUNK)
    if percolator.stats().trials:
        print(f"  a segment still times both layouts after {taken:,} documents: the measured "
              "passes include the rest of its trial", flush=True)
    return taken, seconds


#: Documents matched per call while a layout trial runs.
SETTLE_CHUNK = 256

#: Documents matched before each measurement, from the end of the test half.
WARM_DOCUMENTS = 1000

PEER_FIELDS = {name: kind for name, kind in SCHEMA.fields}
PEER_HELD = 200_000


def peer_rates(
    queries: list, testing: list[dict[str, Any]], batches: list[int], budget: float,
    expected: tuple,
) -> dict[str, Any]:
    """tantivy as a batch reverse search over the same queries: documents/s (CPU, this
    process: tantivy's indexing thread included) per batch size, over as many batches of
    the test documents as fit ``budget`` seconds (at least one), and whether its matches
    equal Vigil's (``expected``, for the first documents)."""
    start = time.process_time()
    # Past PEER_HELD queries, tantivy holds them PEER_HELD at a time (memory), translated per
    # batch; the translating is left out of its rate.
    peer = TantivyBatchPercolator(
        PEER_FIELDS, SCHEMA.default_fields or (), ((n, q) for n, q, _ in queries),
        held=PEER_HELD if len(queries) > PEER_HELD else None,
    )
    translate = time.process_time() - start
    rates: dict[int, float] = {}
    differ = checked = 0
    example = None
    for size in batches:
        done = 0
        spent = 0.0
        while done + size <= len(testing) and (done == 0 or spent < budget):
            batch = testing[done:done + size]
            gc.collect()
            start = time.process_time()
            translating = peer.translating
            found = peer.match_batch(batch)
            if peer.held and not translate:
                translate = peer.translating - translating
            spent += time.process_time() - start - (peer.translating - translating)
            for offset, names in enumerate(found):
                position = done + offset
                if position < len(expected):
                    mine = [m.name for m in expected[position]]
                    checked += 1
                    if mine != names:
                        differ += 1
                        example = example or (testing[position]["id"], mine, names)
            done += size
        if done:
            rates[size] = done / spent
        print(f"  tantivy batch {size}: {rates.get(size, 0):,.0f} docs/s", flush=True)
    best = max(rates, key=rates.__getitem__)
    if differ:
        print(f"  tantivy and Vigil differ on {differ} of {checked} documents, e.g. {example}",
              flush=True)
    return {"rates": rates, "best_batch": best, "best": rates[best], "translate": translate,
            "differ": differ, "checked": checked}


def stage(workload: str, size: int, what: str) -> None:
    """Print the process's resident memory now and at its peak (the benchmark holds one index
    at a time; at 1M queries these lines show which stage needs the memory)."""
    with open("/proc/self/statm") as statm:
        now = int(statm.read().split()[1]) * resource.getpagesize() / 2**30
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"  [{workload} {size:,}] {what}: RSS {now:.1f} GiB, peak {peak:.1f} GiB", flush=True)


def presearch_rate(percolator: Percolator, docs: list[dict[str, Any]]) -> float:
    """Documents/s (CPU) of analysis plus candidate selection alone, without verification
    (``docs`` new to the index, as the matched streams are)."""
    gc.collect()
    start = time.process_time()
    for document in docs:
        percolator.index.candidates(AnalyzedDocument(document, SCHEMA))
    return len(docs) / (time.process_time() - start)


def memory_per_query(generator: QueryGenerator, selectivity: Selectivity, count: int) -> float:
    queries = generator.queries(count)
    # Repeated values are shared through a table the earlier runs filled: start it empty, so
    # what these queries put in it counts.
    INTERN_POOL.clear()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    percolator, _ = build(queries, IndexedPresearcher(selectivity))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del percolator
    return (after - before) / count


def live_updates(percolator: Percolator, generator: QueryGenerator, count: int) -> float:
    """Changes/s (CPU) of adding ``count`` queries one by one, then deleting half of them."""
    new = generator.queries(count)
    start = time.process_time()
    for name, query, _ in new:
        percolator.add("live_" + name, query)
    for name, _, _ in new[: count // 2]:
        percolator.delete("live_" + name)
    return (count + count // 2) / (time.process_time() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--docs", type=int, default=3000, help="documents matched per size")
    parser.add_argument("--baseline-seconds", type=float, default=20.0,
                        help="time budget of the no-filter baseline per size")
    parser.add_argument("--memory-size", type=int, default=100_000)
    parser.add_argument("--workloads", nargs="+", default=["cooccurring", "needle", "alerts"],
                        choices=["cooccurring", "needle", "alerts"])
    parser.add_argument("--peer-batches", type=int, nargs="*", default=[100, 1_000, 10_000],
                        help="tantivy batch sizes (none: no peer)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="passes of --docs new documents each whose mean rate Vigil reports")
    parser.add_argument("--peer-seconds", type=float, default=20.0,
                        help="time budget of the peer per batch size (at least one batch)")
    parser.add_argument("--columnar-threshold", type=int, default=COLUMNAR_THRESHOLD,
                        help="queries from which a sealed segment times flat postings too")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "percolator.md")
    args = parser.parse_args(argv)

    corpus, source = load_corpus()
    training, testing = split_corpus(corpus)
    docs = testing[: args.docs]
    stream, highlight_stream, prefilter_stream, warm, settling = fresh_streams(
        testing, args.docs * args.repeats
    )
    words_per_doc = sum(len(analyze_text(d["title"] + " " + d["body"])) for d in docs) / len(docs)
    print(f"corpus: {len(corpus)} packages from {source}; {len(docs)} test documents, "
          f"{words_per_doc:.0f} words each on average", flush=True)
    generator = QueryGenerator(training)
    selectivity = Selectivity.from_documents(training, SCHEMA)

    analysis_start = time.process_time()
    for doc in docs:
        view = AnalyzedDocument(doc, SCHEMA)
        view.terms("title"), view.terms("body"), view.terms("*")
    analysis_rate = len(docs) / (time.process_time() - analysis_start)

    sections: dict[str, list[dict[str, Any]]] = {}
    for workload, size in [(w, n) for w in args.workloads for n in args.sizes]:
        rows = sections.setdefault(workload, [])
        generator.rng.seed(size)
        queries = generator.queries(size, workload)
        stage(workload, size, "queries generated")
        indexed, build_seconds = build(
            queries, IndexedPresearcher(selectivity, columnar_threshold=args.columnar_threshold)
        )
        stage(workload, size, "index built")
        run(indexed, warm)  # a stream already running: the index has met its common terms
        # ... and its large segments have chosen their layout (a one-time cost, reported).
        trial_docs, trial_seconds = settle_layouts(indexed, settling)
        seconds, result = repeated(indexed, stream, args.docs)
        stats = result.stats
        rate = stats.documents / seconds
        highlighted_seconds, highlighted = repeated(
            indexed, highlight_stream, args.docs, highlights=True
        )
        highlighted_rate = highlighted.stats.documents / highlighted_seconds
        # Highlights change no match: the same documents again without them (untimed).
        _, plain_again = run(indexed, highlight_stream)
        if [[m.name for m in f] for f in highlighted.matches] != [
            [m.name for m in f] for f in plain_again.matches
        ]:
            raise SystemExit(f"matches with highlights differ at {size} queries")
        del plain_again
        stage(workload, size, "matched, with and without highlights")
        prefilter_rate = presearch_rate(indexed, prefilter_stream)
        updates = live_updates(indexed, generator, 2000)
        index_stats = indexed.stats()
        # One index at a time from here on (three at 1M queries do not fit 24 GB): what the
        # baseline and the peer are compared with is kept, the index is dropped.
        del indexed, highlighted
        gc.collect()
        # Baseline: verify every query, on as many documents as fit the time budget (none
        # with a budget of 0).
        base_rate = sample = 0
        if args.baseline_seconds > 0:
            plain, _ = build(queries, NoFilterPresearcher())
            probe_seconds, _ = run(plain, docs[:2])
            sample = max(2, min(len(docs),
                                int(args.baseline_seconds / max(probe_seconds / 2, 1e-9))))
            base_seconds, base_result = run(plain, docs[:sample])
            base_rate = base_result.stats.documents / base_seconds
            if base_result.matches != result.matches[:sample]:
                raise SystemExit(f"indexed matches differ from the baseline at {size} queries")
            stage(workload, size, "baseline run")
            del plain
        peer = None
        if args.peer_batches:
            gc.collect()
            peer = peer_rates(queries, testing, args.peer_batches, args.peer_seconds,
                              result.matches)
            gc.collect()
            stage(workload, size, "peer run")
        row = {
            "workload": workload,
            "size": size,
            "build": build_seconds,
            "rate": rate,
            "highlighted": highlighted_rate,
            "peer": peer,
            "presearch": prefilter_rate,
            "candidates": stats.mean_candidates,
            "fraction": stats.mean_candidates / size,
            "max_candidates": max(stats.candidates_per_doc),
            "decided": stats.decided / stats.documents,
            "matches": stats.matched / stats.documents,
            "always": stats.always_run,
            "base_rate": base_rate,
            "base_docs": sample,
            "speedup": rate / base_rate if base_rate else 0.0,
            "updates": updates,
            "segments": index_stats.segments,
            "columnar": index_stats.columnar,
            "trial_docs": trial_docs,
            "trial_seconds": trial_seconds,
        }
        rows.append(row)
        print(row, flush=True)
        del result, queries
        gc.collect()

    memory = memory_per_query(generator, selectivity, args.memory_size) if args.memory_size else 0
    print(f"memory per stored query at {args.memory_size}: {memory:.0f} bytes", flush=True)
    write_report(args.out, sections, memory, args, source, len(corpus), len(docs),
                 words_per_doc, analysis_rate)


WORKLOAD_TEXT = {
    "cooccurring": (
        "Co-occurring queries: words drawn from one training document each (so queries "
        "match like real interests do, and matches per document grow with the number of "
        "queries): 2-5 term conjunctions (35%), 2-3 word phrases (15%), an OR group of three "
        "AND two terms (15%), a prefix AND a term (10%), a wildcard with a `?` hole (5%), a "
        "title regex AND a term (4%), a term AND a size range (6%), two terms AND NOT a term "
        "(5%), a section keyword AND a term AND a size comparison (5%)."
    ),
    "needle": (
        "Needle queries: distinctive words drawn independently (monitoring many unrelated "
        "names): 2-4 term conjunctions (45%), 2-word phrases (15%), a prefix AND a term "
        "(15%), an OR group of three AND a term (10%), two terms AND NOT a term (5%), a term "
        "AND a size range (10%). The conjunctions of independent words rarely match; a term "
        "AND a size range matches as often as its term, and these give about 90% of the "
        "matches (at 100,000 queries: 0.94 of 1.0 matches per document)."
    ),
    "alerts": (
        "Alerts: queries that get more specific as their number grows, so that matches per "
        "document stay bounded. Each is a *tail term* AND words of the same training "
        "document: the tail term's document frequency in the training half is at most 30 at "
        "10,000 queries, 3 at 100,000 and 1 from 300,000 on, and the words besides it are one "
        "at 10,000, two at 100,000 and three at 1,000,000; the last of them is a term (45%), a "
        "two-word phrase (15%), a prefix (15%), an OR group of three terms (10%), a term AND "
        "NOT a word (8%), or a size range instead (7%)."
    ),
}


def per_match(row: dict[str, Any]) -> str:
    """µs per match of the time beyond the prefilter, or a dash when too few matches tell."""
    if row["matches"] < 0.5:
        return "–"
    beyond = 1e6 / row["rate"] - 1e6 / row["presearch"]
    return f"{max(beyond, 0.0) / row['matches']:.1f}"


def goal_lines(workload: str, rows: list[dict[str, Any]]) -> list[str]:
    """One line per goal of issue 27 saying whether it holds for ``workload``."""
    by_size = {r["size"]: r for r in rows}
    lines = [f"Goals for the {workload} queries (highlights off):", ""]
    worst = max(r["fraction"] for r in rows)
    lines.append(
        f"- under 1% of queries verified per document: "
        f"{'met' if worst < 0.01 else 'not met'} (at most {100 * worst:.3f}%)."
    )
    for r in rows:
        if r["peer"] is not None:
            ratio = r["rate"] / r["peer"]["best"]
            need = 3.0 if r["size"] == 100_000 else 1.0
            lines.append(
                f"- faster than tantivy at {r['size']:,} queries"
                f"{' (at least 3x)' if need > 1 else ''}: "
                f"{'met' if ratio >= need else 'not met'} ({ratio:.2f}x)."
            )
    at_100k = by_size.get(100_000)
    goal = {"alerts": 20_000, "cooccurring": 5_000}.get(workload)
    if at_100k is not None and goal is not None:
        met = at_100k["rate"] >= goal
        lines.append(
            f"- {goal:,} documents/s at 100,000 queries: {'met' if met else 'not met'} "
            f"({at_100k['rate']:,.0f} documents/s)."
        )
    if workload == "alerts":
        worst_matches = max(r["matches"] for r in rows)
        lines.append(
            f"- at most 5 matches per document on average at every size: "
            f"{'met' if worst_matches <= 5 else 'not met'} (at most {worst_matches:.2f})."
        )
        low, high = by_size.get(10_000), by_size.get(1_000_000)
        if low is not None and high is not None:
            ratio = high["rate"] / low["rate"]
            lines.append(
                f"- throughput at 1,000,000 queries within a factor 2 of 10,000: "
                f"{'met' if ratio >= 0.5 else 'not met'} ({ratio:.2f}; matches per document "
                f"{low['matches']:.2f} -> {high['matches']:.2f})."
            )
    return lines


def trial_text(row: dict[str, Any]) -> str:
    """After how many documents and CPU seconds a layout trial chose, if one ran."""
    if not row.get("trial_docs"):
        return ""
    return f"; chosen after {row['trial_docs']:,} docs, {row['trial_seconds']:.1f} s"


def peer_text(row: dict[str, Any]) -> tuple[str, str, str]:
    """The peer's best rate (with its batch size), Vigil's ratio to it, and its rate per
    batch size, as table cells."""
    peer = row["peer"]
    if peer is None:
        return "–", "–", "–"
    each = " / ".join(f"{peer['rates'].get(b, 0):,.0f}" for b in sorted(peer["rates"]))
    same = "" if not peer["differ"] else f" ({peer['differ']} of {peer['checked']} differ)"
    return (f"{peer['best']:,.0f} ({peer['best_batch']:,}){same}",
            f"{row['rate'] / peer['best']:.1f}x", each)


def write_report(
    out: Path, sections: dict[str, list[dict[str, Any]]], memory: float,
    args: argparse.Namespace, source: str, corpus_size: int, docs: int, words: float,
    analysis_rate: float,
) -> None:
    lines = [
        "# Percolator benchmark",
        "",
        "Generated by `python bench/bench_percolator.py` (one process; throughput is CPU time "
        "of that process on one core, since the machine is shared; "
        f"Python {platform.python_version()}, {platform.machine()}).",
        "",
        f"- Corpus: {corpus_size} Debian packages from `{source}`; documents are "
        "`{title: short description, body: long description, section, priority, maintainer, "
        "size}`, text fields `title` and `body` (also the default fields).",
        "- Standing queries are generated deterministically from the words of the training "
        "half of the corpus that occur in 2 or more but under 1% of its documents; a third of "
        "them name `title` or `body`, the rest search the default fields.",
        f"- Matched: {docs} documents of the other half ({words:.0f} words each on average). "
        "Term statistics of the training half choose each query's anchor clause "
        "(`Selectivity.from_documents(training, schema)`).",
        "- *verified/doc* is the number of queries proposed by the prefilter per document "
        "(Lucene Monitor's \"queries run\"); the always-run bucket is included in it. "
        "*decided/doc* is how many of them the index decided on its own (their requirement is "
        "exact: every clause a term, keyword, prefix, `*`-wildcard, inclusive range or field "
        "presence, combined by AND and OR, as Elasticsearch's percolator marks fully extracted "
        "queries verified): they match without running the evaluator, which runs for the "
        "others. *prefilter-only* is analysis plus candidate selection without verification.",
        "- *docs/s* is without highlights (the library's default; see docs/percolator.md), "
        "*docs/s with highlights* with every match highlighted; both are "
        f"the mean of {args.repeats} passes of {args.docs:,} documents, each document new to "
        f"the index (the stream with highlights is another {args.repeats * args.docs:,} "
        "documents, prefilter-only a third), after the index has matched "
        f"{WARM_DOCUMENTS:,} others (a stream already running): what a segment learns of "
        "the terms it meets is paid for as a stream pays for it. A segment that times both "
        "layouts of its postings (below) has first matched as many more new documents as "
        "its trial took, so that the passes measure the layout it keeps.",
        "- *tantivy*: the same queries translated to tantivy queries "
        "(`bench/peers/tantivy_batch.py`) run as a batch reverse search: each batch of test "
        "documents indexed in RAM, then every query run over it (Luwak's batch mode, "
        "Meltwater's percolator); CPU time of this process (tantivy's indexing thread "
        "included), as many batches as fit the budget (at least one), the best batch size "
        "reported, its matches compared with Vigil's on the documents both ran.",
        "- *µs per match* is the time per document beyond the prefilter (verifying the "
        "undecided candidates and building each match, without highlights) divided by the "
        "matches per document: the cost that grows with the output rather than with the "
        "index.",
        "- The no-filter baseline verifies every query; it runs on the first *baseline docs* "
        f"documents only (a budget of about {args.baseline_seconds:.0f} s per size), and its "
        "matches are checked equal to the indexed run on those documents.",
        "- *live add+delete/s*: 2,000 queries added one by one to the loaded index, then "
        "1,000 of them deleted. *segments*: sealed segments after that, and how many of them "
        "keep their postings as flat arrays (a segment of `columnar_threshold` queries or more, "
        f"here {args.columnar_threshold:,}, times both layouts on its first documents and keeps "
        "the faster; one still timing counts as flat), and after how many documents beyond "
        "the warm-up, in how many CPU seconds, such a trial chose (a one-time cost of a new "
        "index, not in the rates).",
        "- Analysis alone (tokenising title and body into term sets): "
        f"{analysis_rate:,.0f} documents/s.",
        "",
    ]
    for workload, rows in sections.items():
        lines += [
            f"## {workload}",
            "",
            WORKLOAD_TEXT[workload],
            "",
            "| standing queries | build s | docs/s | docs/s with highlights | tantivy docs/s "
            "(batch) | vs tantivy | tantivy per batch of 100 / 1,000 / 10,000 | "
            "prefilter-only docs/s | verified/doc | "
            "decided/doc | % of queries verified | max verified | matches/doc | matches/s | "
            "µs per match | always-run | baseline docs/s (baseline docs) | speed-up | "
            "live add+delete/s | segments |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            "---:|---:|---:|---:|",
        ]
        for r in rows:
            best, ratio, each = peer_text(r)
            lines.append(
                f"| {r['size']:,} | {r['build']:.1f} | {r['rate']:,.0f} | "
                f"{r['highlighted']:,.0f} | {best} | {ratio} | {each} | "
                f"{r['presearch']:,.0f} | {r['candidates']:.1f} | {r['decided']:.1f} | "
                f"{100 * r['fraction']:.3f}% | {r['max_candidates']} | {r['matches']:.2f} | "
                f"{r['rate'] * r['matches']:,.0f} | {per_match(r)} | "
                f"{r['always']} | {r['base_rate']:,.2f} ({r['base_docs']}) | "
                f"{r['speedup']:,.0f}x | {r['updates']:,.0f} | {r['segments']} "
                f"({r['columnar']} flat{trial_text(r)}) |"
            )
        lines.append("")
        if len(rows) >= 2:
            first, last = rows[0], rows[-1]
            lines += [
                f"Throughput at {last['size']:,} queries is "
                f"{last['rate'] / first['rate']:.2f} of that at {first['size']:,} "
                f"(prefilter-only: {last['presearch'] / first['presearch']:.2f}), while "
                f"matches per document grew {last['matches'] / max(first['matches'], 1e-9):.0f}x "
                f"and matches/s went from {first['rate'] * first['matches']:,.0f} to "
                f"{last['rate'] * last['matches']:,.0f} (µs per match: "
                f"{' / '.join(per_match(r) for r in rows)}).",
                "",
            ]
        lines += goal_lines(workload, rows) + [""]
    lines += [
        f"Memory per stored query (tracemalloc, {args.memory_size:,} co-occurring queries, "
        "including the query AST, its compiled matcher, requirement and index postings): "
        f"{memory:,.0f} bytes.",
        "",
    ]
    lines.append(
        "Goals (issue 27; docs/s with highlights off): faster than tantivy at every size, at "
        "least 3x at 100,000 queries; alerts at 1,000,000 queries within a factor 2 of "
        "10,000 and at least 20,000 documents/s at 100,000; co-occurring at least 5,000 "
        "documents/s at 100,000; under 1% of queries verified per document. *matches/s* "
        "(docs/s x matches/doc) is the output rate: where matches per document grow with the "
        "number of queries, so does the work no prefilter can skip."
    )
    lines.append("")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

