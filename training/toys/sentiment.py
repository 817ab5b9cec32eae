"""Small deterministic things to train without any download: a templated sentiment dataset and a
tiny BERT with a WordPiece tokenizer trained on it. Used by examples/quickstart, the tests and the
overhead benchmark."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Iterable, Optional

POSITIVE = [
    "good",
    "great",
    "excellent",
    "wonderful",
    "delightful",
    "superb",
    "lovely",
    "brilliant",
    "enjoyable",
    "charming",
    "pleasant",
    "fantastic",
    "moving",
    "fresh",
    "clever",
]
NEGATIVE = [
    "bad",
    "awful",
    "terrible",
    "boring",
    "dull",
    "horrible",
    "dreadful",
    "weak",
    "tedious",
    "clumsy",
    "messy",
    "painful",
    "poor",
    "bland",
    "stale",
]
SUBJECTS = [
    "the movie",
    "this film",
    "the plot",
    "the acting",
    "the script",
    "the soundtrack",
    "the ending",
    "the cast",
    "the story",
    "the director's work",
    "the dialogue",
    "the pacing",
    "the visuals",
]
TEMPLATES = [
    "{s} was {a}",
    "{s} is {a} and {b}",
    "i found {s} {a}",
    "honestly , {s} felt {a}",
    "{s} turned out {a} , really {b}",
    "what a {a} experience , {s} was {b}",
    "critics said {s} is {a}",
    "{s} seemed {a} from start to finish",
]
FILLER = ["today", "overall", "in my opinion", "to be fair", "for a sunday", "as expected", "at times", ""]
LABEL_NAMES = ["negative", "positive"]


def sentiment_rows(n: int, seed: int = 0, *, string_labels: bool = False) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        label = rng.randrange(2)
        words = POSITIVE if label else NEGATIVE
        text = rng.choice(TEMPLATES).format(s=rng.choice(SUBJECTS), a=rng.choice(words), b=rng.choice(words))
        filler = rng.choice(FILLER)
        if filler:
            text = f"{text} {filler}" if rng.random() < 0.5 else f"{filler} {text}"
        rows.append({"text": text, "label": LABEL_NAMES[label] if string_labels else label})
    return rows


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def build_tiny_bert(
    folder: str | Path,
    texts: Iterable[str],
    *,
    num_labels: int = 2,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 2,
    vocab_size: int = 400,
    max_positions: int = 128,
    seed: int = 0,
    label_names: Optional[list[str]] = None,
) -> Path:
    """Train a WordPiece tokenizer on `texts`, build a randomly initialised BERT classifier, and
    save both with save_pretrained into `folder` (loadable offline with Auto*.from_pretrained)."""
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(list(texts), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special))
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_positions,
    )
    fast.save_pretrained(str(folder))
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=hidden * 2,
        max_position_embeddings=max_positions,
        num_labels=num_labels,
        pad_token_id=tok.token_to_id("[PAD]"),
    )
    if label_names:
        config.id2label = {i: n for i, n in enumerate(label_names)}
        config.label2id = {n: i for i, n in enumerate(label_names)}
    torch.manual_seed(seed)
    BertForSequenceClassification(config).save_pretrained(str(folder))
    return folder


def prepare_example(
    folder: Path,
    *,
    train_rows: int,
    dev_rows: int,
    train_seed: int,
    dev_seed: int,
    vocab_rows: int,
    vocab_seed: int = 1,
    say: bool = False,
    **model: Any,
) -> Path:
    """An example's data/train.jsonl, data/dev.jsonl and tiny-bert/ in `folder` (deterministic,
    idempotent, no download): what each examples/*/prepare.py makes."""
    folder = Path(folder)
    data = folder / "data"
    train, dev = data / "train.jsonl", data / "dev.jsonl"
    if not (train.is_file() and dev.is_file()):
        write_jsonl(train, sentiment_rows(train_rows, seed=train_seed))
        write_jsonl(dev, sentiment_rows(dev_rows, seed=dev_seed))
        if say:
            print(f"wrote {train} and {dev}")
    tiny = folder / "tiny-bert"
    if not (tiny / "config.json").is_file():
        build_tiny_bert(tiny, [r["text"] for r in sentiment_rows(vocab_rows, seed=vocab_seed)], **model)
        if say:
            print(f"wrote {tiny}")
    return folder
