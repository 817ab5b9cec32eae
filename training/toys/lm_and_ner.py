"""Tiny offline things for the causal-lm and token-classification tasks: a Llama-architecture
causal LM (hidden 32, 2 layers) with a byte-level BPE tokenizer and a chat template, trained
on nothing; instruction, chat and plain-text rows built from the sentiment templates; and a
small NER dataset (people, places, organisations). For the tests and examples/sft-lora, examples/ner."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterable

from training.toys.sentiment import sentiment_rows

SPECIAL = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
QUESTIONS = [
    "is this review positive or negative ?",
    "what is the sentiment here ?",
    "classify the sentiment of this text .",
    "does the writer like it ?",
]


def instruction_rows(n: int, seed: int = 0) -> list[dict]:
    """{"prompt", "response", "messages", "text"}: one sentiment question per row, in each format."""
    rng = random.Random(seed)
    rows = []
    for row in sentiment_rows(n, seed=seed):
        answer = "positive" if row["label"] else "negative"
        question = f"{rng.choice(QUESTIONS)} {row['text']}"
        rows.append(
            {
                "prompt": f"question : {question}\nanswer :",
                "response": f" {answer}",
                "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
                "text": f"{row['text']} . that was {answer} .",
            }
        )
    return rows


def build_tiny_llama(
    folder: str | Path,
    texts: Iterable[str],
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    vocab_size: int = 512,
    max_positions: int = 256,
    seed: int = 0,
    initializer_range: float = 0.2,
) -> Path:
    """A byte-level BPE tokenizer trained on `texts` with a chat template, and a randomly
    initialised LlamaForCausalLM, saved with save_pretrained into `folder`. The weights start
    10x larger than Llama's default: with hidden size 32 a frozen output layer at the default
    scale spans logits of about +-0.6, so LoRA (which leaves it frozen) could not learn anything."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(
        list(texts),
        trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=max_positions,
        additional_special_tokens=SPECIAL[3:],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2,
        max_position_embeddings=max_positions,
        pad_token_id=fast.pad_token_id,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        initializer_range=initializer_range,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).save_pretrained(str(folder))
    return folder


PEOPLE = [["john", "smith"], ["mary"], ["ali", "khan"], ["wei", "zhang"], ["anna", "maria", "lopez"], ["tom"]]
PLACES = [["paris"], ["new", "york"], ["berlin"], ["tokyo"], ["rio", "de", "janeiro"], ["cairo"]]
ORGS = [["acme"], ["united", "nations"], ["red", "cross"], ["globex", "corporation"], ["unesco"]]
NER_TEMPLATES = [
    "{P} visited {L} last week",
    "{P} works for {O} in {L}",
    "yesterday {P} met {P2}",
    "{O} opened an office in {L}",
    "{P} said {O} will grow",
    "the weather in {L} was mild",
    "{P} and {P2} moved to {L}",
    "nothing happened today",
]


def _span(words: list[str], kind: str) -> list[tuple[str, str]]:
    return [(w, ("B-" if i == 0 else "I-") + kind) for i, w in enumerate(words)]


def ner_rows(n: int, seed: int = 0) -> list[dict]:
    """{"tokens": [...], "tags": [...]} with IOB2 tags PER, LOC, ORG."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        template = rng.choice(NER_TEMPLATES)
        fill = {
            "{P}": _span(rng.choice(PEOPLE), "PER"),
            "{P2}": _span(rng.choice(PEOPLE), "PER"),
            "{L}": _span(rng.choice(PLACES), "LOC"),
            "{O}": _span(rng.choice(ORGS), "ORG"),
        }
        pairs: list[tuple[str, str]] = []
        for word in template.split():
            pairs += fill.get(word, [(word, "O")])
        rows.append({"tokens": [w for w, _ in pairs], "tags": [t for _, t in pairs]})
    return rows
