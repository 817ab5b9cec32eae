"""Entity spans from IOB/IOBES tag sequences and their precision/recall/F1, as seqeval computes
them by default (conlleval's rules: an I- after O or after another type starts a new entity)."""

from __future__ import annotations

from typing import Iterable, Sequence


def _split(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', '_'). seqeval reads the prefix as the first character."""
    return tag[0] if tag else "O", tag[1:].split("-", maxsplit=1)[-1] or "_"


def _ends(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag not in ("O", ".") and prev_type != type_


def _starts(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    if tag in ("B", "S"):
        return True
    if prev_tag in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag not in ("O", ".") and prev_type != type_


def entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The entities of one sentence as (type, first word, last word), inclusive."""
    found: list[tuple[str, int, int]] = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, chunk in enumerate(list(tags) + ["O"]):
        tag, type_ = _split(chunk)
        if _ends(prev_tag, tag, prev_type, type_):
            found.append((prev_type, begin, i - 1))
        if _starts(prev_tag, tag, prev_type, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return found


def span_scores(gold: Iterable[Sequence[str]], predicted: Iterable[Sequence[str]]) -> dict[str, float]:
    """Micro-averaged precision, recall and F1 over entity spans (exact type and boundaries)."""
    true_spans, pred_spans = set(), set()
    for n, (g, p) in enumerate(zip(gold, predicted, strict=True)):
        true_spans.update((n, *e) for e in entities(g))
        pred_spans.update((n, *e) for e in entities(p))
    hits = len(true_spans & pred_spans)
    precision = hits / len(pred_spans) if pred_spans else 0.0
    recall = hits / len(true_spans) if true_spans else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}
