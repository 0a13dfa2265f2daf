"""Reading a node's Prometheus exposition in tests, with prometheus_client's own parser
(never a hand-split of the lines: a label's quoting or a family's `_total` would fool it)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]


def samples(text: str) -> dict[tuple[str, Labels], float]:
    """Every sample of `text`: (sample name, its labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def unlabelled(text: str) -> dict[str, float]:
    """The samples of `text` that carry no label, by name."""
    return {name: v for (name, labels), v in samples(text).items() if not labels}


def value(text: str, name: str, **labels: str) -> float:
    """The sample `name` whose labels are exactly `labels`, or 0 when it is absent (a
    labelled counter is exported only once one of its children has counted)."""
    return samples(text).get((name, frozenset(labels.items())), 0.0)
