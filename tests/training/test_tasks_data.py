"""What the causal-lm and token-classification tasks feed the model: prompt tokens labelled -100,
chat turns through the tokenizer's template, packed rows that keep attention within each
example, NER labels on each word's first sub-token, and seqeval's entity spans."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.builtin.tasks.spans import entities, span_scores
from training.toy import build_tiny_bert, write_jsonl
from training.toys.lm_and_ner import build_tiny_llama, instruction_rows, ner_rows

IGNORE = -100


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    texts = [r["prompt"] + r["response"] + " " + r["text"] for r in instruction_rows(300, seed=1)]
    return build_tiny_llama(tmp_path_factory.mktemp("llama"), texts, vocab_size=400)


@pytest.fixture(scope="module")
def tiny_ner_bert(tmp_path_factory) -> Path:
    return build_tiny_bert(
        tmp_path_factory.mktemp("bert"),
        [" ".join(r["tokens"]) for r in ner_rows(600, seed=1)],
        hidden=32,
        layers=2,
        heads=2,
        vocab_size=120,
        max_positions=64,
    )


def lm_data(tokenizer, train: Path, **kwargs):
    from training.builtin.tasks.causal_lm import CausalLMData

    data = CausalLMData(
        tokenizer=tokenizer,
        train=str(train),
        validation=None,
        batch_size=4,
        num_workers=0,
        **{"max_length": 64, **kwargs},
    )
    data.prepare()
    return data


def test_seqeval_spans_on_known_cases():
    assert entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
    assert entities(["I-PER", "I-PER", "O"]) == [("PER", 0, 1)]  # an I- after O starts an entity (conlleval)
    assert entities(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]  # a type change ends one
    assert entities(["B-PER", "B-PER"]) == [("PER", 0, 0), ("PER", 1, 1)]
    assert entities(["S-LOC", "B-ORG", "E-ORG", "O"]) == [("LOC", 0, 0), ("ORG", 1, 2)]  # IOBES
    assert entities(["O", "O"]) == []
    # seqeval's README example: precision = recall = f1 = 0.5
    gold = [["O", "O", "O", "B-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    pred = [["O", "O", "B-MISC", "I-MISC", "I-MISC", "I-MISC", "O"], ["B-PER", "I-PER", "O"]]
    assert span_scores(gold, pred) == {"precision": 0.5, "recall": 0.5, "f1": 0.5}
    # 2 gold, 3 predicted, 1 right: P 1/3, R 1/2, F1 0.4
    scores = span_scores([["B-PER", "O", "B-LOC"]], [["B-PER", "B-ORG", "B-ORG"]])
    assert scores["precision"] == pytest.approx(1 / 3) and scores["recall"] == 0.5
    assert scores["f1"] == pytest.approx(0.4)
    assert span_scores([["O"]], [["O"]]) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}


def test_sft_prompt_tokens_are_labelled_minus_100(tiny_llama, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    rows = instruction_rows(20, seed=5)
    data = lm_data(tok, write_jsonl(tmp_path / "t.jsonl", rows), prompt_field="prompt", response_field="response")
    ds = data.splits["train"]
    assert len(ds) == 20
    for row, example in zip(rows, ds):
        prompt = [tok.bos_token_id] + tok(row["prompt"], add_special_tokens=False)["input_ids"]
        response = tok(row["response"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        assert example["input_ids"] == prompt + response
        assert example["labels"] == [IGNORE] * len(prompt) + response  # loss on the response only

    # ... and the loss the training step takes is the cross-entropy of the response tokens alone
    import torch
    from transformers import AutoModelForCausalLM

    from training.builtin.tasks.causal_lm import LMCollator
    from training.builtin.tasks.modules import CausalLMModule

    module = CausalLMModule(str(tiny_llama), 1, model=AutoModelForCausalLM.from_pretrained(str(tiny_llama))).eval()
    batch = LMCollator(tok.pad_token_id)([ds[0], ds[1]])
    with torch.no_grad():
        out = module(**batch)
    logits, labels = out.logits[:, :-1], batch["labels"][:, 1:]
    trained = labels != IGNORE
    manual = torch.nn.functional.cross_entropy(logits[trained], labels[trained])
    assert int(trained.sum()) == sum(sum(t != IGNORE for t in ds[i]["labels"]) for i in (0, 1))
    assert torch.allclose(out.loss, manual, atol=1e-6)


def test_messages_use_the_chat_template_and_train_on_assistant_turns_only(tiny_llama, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    rows = [
        {
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "the plot was dull"},
                {"role": "assistant", "content": "negative"},
                {"role": "user", "content": "and the cast ?"},
                {"role": "assistant", "content": "positive"},
            ]
        }
    ]
    example = lm_data(tok, write_jsonl(tmp_path / "m.jsonl", rows), messages_field="messages").splits["train"][0]
    assert tok.decode(example["input_ids"]) == tok.apply_chat_template(rows[0]["messages"], tokenize=False)
    trained = tok.decode([t for t in example["labels"] if t != IGNORE])
    assert trained == "negative<|end|>\npositive<|end|>\n"


def test_truncation_drops_examples_with_nothing_to_train_on(tiny_llama, tmp_path):
    from transformers import AutoTokenizer

    from training.builtin.data import DataError

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    short = {"prompt": "q :", "response": " positive"}
    rows = instruction_rows(4, seed=6) + [short]
    data = lm_data(
        tok, write_jsonl(tmp_path / "t.jsonl", rows), prompt_field="prompt", response_field="response", max_length=12
    )  # the long prompts leave no response token within 12
    assert len(data.splits["train"]) == 1 and data.dropped["train"] == 4
    assert all(len(r["input_ids"]) <= 12 for r in data.splits["train"])
    with pytest.raises(DataError, match="no example has a token to train on within max_length = 12"):
        lm_data(
            tok,
            write_jsonl(tmp_path / "u.jsonl", rows[:4]),
            prompt_field="prompt",
            response_field="response",
            max_length=12,
        )


def test_conversations_without_an_assistant_turn_are_named_as_the_reason_not_max_length(tiny_llama, tmp_path, capfd):
    from transformers import AutoTokenizer

    from training.builtin.data import DataError

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    no_answer = {"messages": [{"role": "user", "content": "the plot was dull"}]}
    empty: dict = {"messages": []}
    answered = {"messages": [{"role": "user", "content": "dull ?"}, {"role": "assistant", "content": "negative"}]}
    with pytest.raises(DataError) as refused:
        lm_data(tok, write_jsonl(tmp_path / "none.jsonl", [no_answer, empty, no_answer]), messages_field="messages")
    assert str(refused.value) == (
        "train data: no conversation has an assistant turn to train on (the loss is on the assistant's turns): "
        "2 without an assistant turn and 1 with an empty 'messages'"
    )
    data = lm_data(tok, write_jsonl(tmp_path / "some.jsonl", [answered, no_answer]), messages_field="messages")
    assert len(data.splits["train"]) == 1
    assert (
        "[orch] warning: train data: 1 of 2 conversations skipped (1 without an assistant turn): nothing to train on"
        in capfd.readouterr().err
    )


def test_chat_data_without_a_template_says_it_writes_role_content_lines(tiny_llama, tmp_path, capfd):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    tok.chat_template = None
    rows = [{"messages": [{"role": "user", "content": "dull ?"}, {"role": "assistant", "content": "negative"}]}]
    example = lm_data(tok, write_jsonl(tmp_path / "plain.jsonl", rows), messages_field="messages").splits["train"][0]
    assert tok.decode(example["input_ids"]) == "user: dull ?\nassistant: negative\n"
    warnings = [line for line in capfd.readouterr().err.splitlines() if "chat template" in line]
    assert len(warnings) == 1 and "'role: content' lines" in warnings[0], warnings


def test_packing_keeps_attention_within_each_example(tiny_llama, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama))
    train = write_jsonl(tmp_path / "t.jsonl", instruction_rows(12, seed=7))
    plain = lm_data(tok, train, prompt_field="prompt", response_field="response").splits["train"]
    packed = lm_data(tok, train, prompt_field="prompt", response_field="response", max_length=128, packing=True).splits[
        "train"
    ]
    assert len(packed) < len(plain)
    assert sum(len(r["input_ids"]) for r in packed) == sum(len(r["input_ids"]) for r in plain)
    from training.builtin.tasks.causal_lm import LMCollator
    from training.builtin.tasks.modules import CausalLMModule

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama)).eval()
    module = CausalLMModule(str(tiny_llama), 1, model=model).eval()  # the forward training uses
    batch = LMCollator(tok.pad_token_id)([packed[0], packed[1]])
    assert "attention_mask" not in batch
    with torch.no_grad():
        logits = module(**batch).logits[0]
        start = 0
        for example in plain:
            n = len(example["input_ids"])
            if start + n > int((batch["labels"][0] != -100).nonzero().max()) + 1:
                break
            alone = model(input_ids=torch.tensor([example["input_ids"]])).logits[0]
            assert torch.allclose(logits[start : start + n], alone, atol=1e-5), f"example at {start} saw its neighbours"
            start += n
        assert start > 0


def test_token_labels_sit_on_each_words_first_sub_token(tiny_ner_bert, tmp_path):
    from transformers import AutoTokenizer

    from training.builtin.tasks.token_cls import TokenClassificationData

    tok = AutoTokenizer.from_pretrained(str(tiny_ner_bert))
    rows = [
        {
            "tokens": ["anna", "maria", "lopez", "works", "for", "globex", "corporation"],
            "tags": ["B-PER", "I-PER", "I-PER", "O", "O", "B-ORG", "I-ORG"],
        }
    ]
    data = TokenClassificationData(
        tokenizer=tok,
        train=str(write_jsonl(tmp_path / "n.jsonl", rows)),
        validation=None,
        batch_size=2,
        num_workers=0,
        max_length=64,
    )
    data.prepare()
    assert data.label_names == ["B-ORG", "B-PER", "I-ORG", "I-PER", "O"]  # sorted: the same ids every attempt
    example = data.splits["train"][0]
    enc = tok(rows[0]["tokens"], is_split_into_words=True)
    assert example["input_ids"] == enc["input_ids"]
    assert len(enc["input_ids"]) > len(rows[0]["tokens"]) + 2, "the test needs words split into sub-tokens"
    expected, previous = [], None
    for word in enc.word_ids():
        expected.append(IGNORE if word is None or word == previous else data.label_names.index(rows[0]["tags"][word]))
        previous = word
    assert example["labels"] == expected
    assert [data.label_names[t] for t in example["labels"] if t != IGNORE] == rows[0]["tags"]
