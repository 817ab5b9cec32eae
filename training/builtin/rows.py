"""The built-in job's per-row work, importing nothing heavy: the map functions that turn a batch of
rows into token ids (one per task) and DataError. The runner maps them over the whole dataset
(training/builtin/data.py, training/builtin/tasks/); the pre-flight (training/ahead/preflight.py) runs them on one
batch at submit, so both see the same errors."""

from __future__ import annotations

from typing import Optional

IGNORE = -100  # the label of a token the loss skips

# The data files the runner reads, by suffix: datasets' loader and its options. The pre-flight
# peeks into the same types and refuses any other at submit (training/ahead/samples.py).
# utf-8-sig: a byte-order mark (Excel's "CSV UTF-8") is not part of the first column's name.
FILE_FORMATS = {
    ".csv": "csv",
    ".tsv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".pq": "parquet",
}
LOADER_OPTIONS = {".csv": {"encoding": "utf-8-sig"}, ".tsv": {"sep": "\t", "encoding": "utf-8-sig"}}
FILE_TYPES_TEXT = "csv, tsv, json, jsonl or parquet"


def unsupported_type(suffix: str) -> Optional[str]:
    """Why a data file of this suffix cannot be read, or None."""
    if suffix.lower() in FILE_FORMATS:
        return None
    return f"is an unsupported file type ({suffix or 'no suffix'}): use {FILE_TYPES_TEXT}"


class DataError(ValueError):
    """The data does not fit the job spec (missing column, unknown label, ...)."""


# A tokenizer saved without a length says so with a huge sentinel (transformers' VERY_LARGE_INTEGER).
NO_LIMIT = 1_000_000


def usable_max_length(max_length: int, tokenizer) -> int:
    """data.max_length, cut to what the model takes (its tokenizer's model_max_length), as
    transformers' own examples do: a longer row would index past the position embeddings and
    crash the run at whatever step it is drawn."""
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < NO_LIMIT:
        return min(max_length, limit)
    return max_length


def max_length_note(max_length: int, tokenizer) -> Optional[str]:
    usable = usable_max_length(max_length, tokenizer)
    if usable == max_length:
        return None
    return (
        f"data.max_length = {max_length} is more than this model takes ({usable} tokens, its tokenizer's "
        f"model_max_length): rows are cut at {usable}"
    )


def tokenize_batch(
    batch: dict[str, list],
    tokenizer,
    text_field: str,
    text_pair_field: Optional[str],
    max_length: int,
    label_field: str,
    label2id: Optional[dict[str, int]],
) -> dict[str, list]:
    """The map function. Module level so its fingerprint (and so the cache) is stable."""
    pairs = batch[text_pair_field] if text_pair_field else None
    enc = tokenizer(batch[text_field], pairs, truncation=True, max_length=max_length)
    # attention_mask is rebuilt by the collator; token_type_ids matter only for pairs (else all 0)
    out = {"input_ids": enc["input_ids"]}
    if pairs is not None and "token_type_ids" in enc:
        out["token_type_ids"] = enc["token_type_ids"]
    labels = batch[label_field]
    out["labels"] = [label2id[str(v)] for v in labels] if label2id is not None else [int(v) for v in labels]
    return out


def align_tokenize(
    batch: dict[str, list],
    tokenizer,
    tokens_field: str,
    tags_field: str,
    max_length: int,
    tag2id: Optional[dict[str, int]],
) -> dict[str, list]:
    """The map function (module level: a stable cache fingerprint). tag2id None: the tags are
    already ids (a ClassLabel sequence)."""
    enc = tokenizer(batch[tokens_field], is_split_into_words=True, truncation=True, max_length=max_length)
    labels = []
    for i, tags in enumerate(batch[tags_field]):
        row, previous = [], None
        for word in enc.word_ids(i):
            if word is None or word == previous:
                row.append(IGNORE)
            else:
                row.append(int(tags[word]) if tag2id is None else tag2id[str(tags[word])])
            previous = word
        labels.append(row)
    return {"input_ids": enc["input_ids"], "labels": labels}


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_segments(tokenizer, messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
    """(text, trained) pieces of a conversation: each assistant turn is trained on, what comes
    before it (the template's role header included) is not. Without a chat template the turns
    are written `role: content` one per line."""
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise DataError(f"a message must be an object with 'role' and 'content' (got {str(m)[:80]})")
    if not getattr(tokenizer, "chat_template", None):
        return [(f"{m['role']}: {m['content']}\n", m["role"] == "assistant") for m in messages]
    segments, done = [], ""
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            prefix = tokenizer.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
            if prefix.startswith(done) and len(prefix) > len(done):
                segments.append((prefix[len(done) :], False))
                done = prefix
        upto = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not upto.startswith(done):
            raise DataError("the tokenizer's chat template renders earlier turns differently once later ones are added")
        segments.append((upto[len(done) :], m["role"] == "assistant"))
        done = upto
    return segments


def sft_tokenize(
    batch: dict[str, list], tokenizer, mode: str, fields: dict[str, Optional[str]], max_length: int
) -> dict[str, list]:
    """The map function (module level: a stable cache fingerprint). Rows whose trained tokens
    are all cut off by max_length are dropped (a row with no loss would make the batch's loss NaN)."""
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    out: dict[str, list] = {"input_ids": [], "labels": []}
    for i in range(len(next(iter(batch.values())))):
        if mode == "messages":
            pieces = [
                (_ids(tokenizer, text), trained)
                for text, trained in chat_segments(tokenizer, batch[fields["messages"]][i])
            ]
        elif mode == "prompt":
            pieces = [
                (bos + _ids(tokenizer, str(batch[fields["prompt"]][i])), False),
                (_ids(tokenizer, str(batch[fields["response"]][i])) + eos, True),
            ]
        else:
            pieces = [(bos + _ids(tokenizer, str(batch[fields["text"]][i])) + eos, True)]
        ids, labels = [], []
        for piece, trained in pieces:
            ids += piece
            labels += piece if trained else [IGNORE] * len(piece)
        ids, labels = ids[:max_length], labels[:max_length]
        if labels:
            labels[0] = IGNORE  # nothing predicts the first token (and in a packed row it follows another example)
        if any(x != IGNORE for x in labels):
            out["input_ids"].append(ids)
            out["labels"].append(labels)
    return out


def conversation_problem(messages: object) -> Optional[str]:
    """Why a conversation gives no token to train on whatever max_length is (None: it can)."""
    if not isinstance(messages, list):
        return f"messages must be a list of {{'role', 'content'}} objects (got {str(messages)[:60]})"
    if not messages:
        return "an empty conversation (no messages)"
    if not any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
        return "no assistant turn (the loss is on the assistant's turns)"
    return None
