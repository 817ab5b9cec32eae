"""The built-in job's data: load files / a save_to_disk folder / a hub dataset, tokenize once with
a cached `datasets.map`, map string labels to ids, and serve padded batches through a resumable
train loader (StatefulDataLoader + a sampler whose state counts samples)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from training.builtin.rows import DataError, tokenize_batch  # noqa: F401 (DataError: raised here, importable from here as before)
from training.builtin.rows import FILE_FORMATS, LOADER_OPTIONS, unsupported_type
from training.resume.sampler import ResumableSampler

# Bump when tokenize_batch changes meaning: it is part of the cache fingerprint.
TOKENIZE_VERSION = "2"
MODEL_COLUMNS = ("input_ids", "token_type_ids", "labels")


def load_split(source: str, split: str):
    """One split as a datasets.Dataset from a file, a save_to_disk folder, or a hub id
    (`name` or `name:config`; `split` is train or validation)."""
    import datasets

    from orchestrator.spec.jobspec import empty_problem

    path = Path(source)
    if path.is_file():
        unsupported = unsupported_type(path.suffix)
        if unsupported:
            raise DataError(f"data.{split}: {source} {unsupported}")
        fmt = FILE_FORMATS[path.suffix.lower()]
        empty = empty_problem(path)
        if empty:  # datasets would say `StopIteration` or 'Instruction "train" corresponds to no data!'
            raise DataError(f"data.{split}: {source} {empty}")
        try:
            options = LOADER_OPTIONS.get(path.suffix.lower(), {})
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train", **options)
        except datasets.exceptions.DatasetGenerationError as exc:
            cause = unreadable_cause(exc)
            if cause is None:
                raise  # not the file's content (a disk, a cache folder): a plain failure, retried
            raise DataError(f"data.{split}: cannot read {source} as {fmt}: {cause}") from None
        except ValueError as exc:
            if "corresponds to no data" not in str(exc):  # datasets' words for a file of no rows
                raise
            ds = None
        if ds is None or len(ds) == 0:
            raise DataError(f"data.{split}: {source} has no rows (a header alone?): there is nothing to train on")
        return ds
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise DataError(f"{source}: no {split!r} split in this saved DatasetDict (has {', '.join(loaded)})")
            return loaded[split]
        return loaded
    name, _, config = source.partition(":")
    return datasets.load_dataset(name, config or None, split=split)


def unreadable_cause(exc: BaseException) -> Optional[str]:
    """The parse error behind a datasets generation error (bad JSON, a ragged CSV, a type that
    changes between rows), in one line; None when the cause is not the file's content."""
    import pyarrow

    seen: Optional[BaseException] = exc
    while seen is not None:
        if isinstance(seen, (pyarrow.ArrowInvalid, pyarrow.ArrowTypeError, json.JSONDecodeError, UnicodeDecodeError)):
            text = str(seen).strip().splitlines()
            return f"{type(seen).__name__}: {text[0] if text else ''}"[:300]
        seen = seen.__cause__ or seen.__context__
    return None


def tokenizer_fingerprint(tokenizer) -> str:
    """Content hash of a tokenizer (not its path: the same tokenizer elsewhere reuses the cache)."""
    h = hashlib.sha256(type(tokenizer).__name__.encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:
        h.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    h.update(repr((tokenizer.padding_side, tokenizer.truncation_side)).encode())
    return h.hexdigest()[:16]


def label_mapping(train, label_field: str) -> tuple[Optional[dict[str, int]], Optional[list[str]]]:
    """(label2id for string labels or None, label names or None). String labels are sorted so
    every attempt and every job maps them the same way."""
    import datasets

    if label_field not in train.column_names:
        raise DataError(
            f"no label column {label_field!r} in the training data (columns: {', '.join(train.column_names)})"
        )
    feature = train.features[label_field]
    if isinstance(feature, datasets.ClassLabel):
        return None, list(feature.names)
    if getattr(feature, "dtype", None) in ("string", "large_string"):
        names = sorted(str(v) for v in train.unique(label_field))
        return {name: i for i, name in enumerate(names)}, names
    return None, None


class TextClassificationData(pl.LightningDataModule):
    def __init__(
        self,
        *,
        tokenizer,
        train: str,
        validation: Optional[str],
        text_field: str = "text",
        text_pair_field: Optional[str] = None,
        label_field: str = "label",
        max_length: int = 128,
        batch_size: int = 32,
        num_workers: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 42,
        num_labels: Optional[int] = None,
    ):
        super().__init__()
        self.tokenizer = tokenizer
        self.sources = {"train": train, "validation": validation}
        self.text_field, self.text_pair_field, self.label_field = text_field, text_pair_field, label_field
        self.max_length = max_length
        self.batch_size = batch_size
        self.num_workers = min(4, os.cpu_count() or 1) if num_workers is None else num_workers
        self.shuffle = shuffle
        self.seed = seed
        self.num_labels = num_labels
        self.label2id: Optional[dict[str, int]] = None
        self.label_names: Optional[list[str]] = None
        self.splits: dict[str, Any] = {}
        self.tokenize_seconds = 0.0

    # -- loading and tokenizing (done once per process, before the Trainer exists) --------------
    def prepare(self) -> None:
        import time

        raw = {name: load_split(src, name) for name, src in self.sources.items() if src}
        self.label2id, self.label_names = label_mapping(raw["train"], self.label_field)
        for name, ds in raw.items():
            self._check_columns(name, ds)
        if self.label2id is not None:
            for name, ds in raw.items():
                unknown = sorted({str(v) for v in ds.unique(self.label_field)} - set(self.label2id))
                if unknown:
                    raise DataError(f"{name} data has labels the training data lacks: {', '.join(unknown[:5])}")
        elif self.label_names is None and self.num_labels is not None:
            for name, ds in raw.items():
                values = [int(v) for v in ds.unique(self.label_field)]
                if values and (min(values) < 0 or max(values) >= self.num_labels):
                    raise DataError(
                        f"{name} data has label {max(values) if max(values) >= self.num_labels else min(values)} "
                        f"but model.num_labels = {self.num_labels}: labels must be 0..{self.num_labels - 1} "
                        "(or strings, which are mapped to ids for you)"
                    )
        start = time.perf_counter()
        for name, ds in raw.items():
            self.splits[name] = self._tokenize(ds)
        self.tokenize_seconds = time.perf_counter() - start

    def _check_columns(self, name: str, ds) -> None:
        for field in (self.text_field, self.text_pair_field, self.label_field):
            if field and field not in ds.column_names:
                raise DataError(f"{name} data has no column {field!r} (columns: {', '.join(ds.column_names)})")

    def _tokenize(self, ds):
        kwargs = dict(
            tokenizer=self.tokenizer,
            text_field=self.text_field,
            text_pair_field=self.text_pair_field,
            max_length=self.max_length,
            label_field=self.label_field,
            label2id=self.label2id,
        )
        return self._map(
            ds,
            tokenize_batch,
            kwargs,
            [
                self.text_field,
                self.text_pair_field,
                self.max_length,
                self.label_field,
                sorted((self.label2id or {}).items()),
            ],
        )

    def _map(self, ds, fn, kwargs: dict[str, Any], key_parts: list, columns=MODEL_COLUMNS):
        """ds.map(fn) cached under a fingerprint of the data, the tokenizer and `key_parts` (what
        else changes the result); the other tasks (training/builtin/tasks/) tokenize through this too."""
        key = json.dumps([TOKENIZE_VERSION, ds._fingerprint, tokenizer_fingerprint(self.tokenizer), *key_parts])
        fingerprint = hashlib.sha256(key.encode()).hexdigest()[:16]
        out = ds.map(
            fn,
            batched=True,
            fn_kwargs=kwargs,
            remove_columns=ds.column_names,
            new_fingerprint=fingerprint,
            desc="tokenizing",
        )
        return out.select_columns([c for c in columns if c in out.column_names])

    def collator(self):
        """Rows -> a padded batch (the other tasks pad labels and positions their own way)."""
        return PadCollator(self.tokenizer.pad_token_id or 0)

    @property
    def resolved_num_labels(self) -> Optional[int]:
        return len(self.label_names) if self.label_names else None

    # -- checkpointed: StatefulDataLoader can only restore a position into the same worker count --
    def state_dict(self) -> dict[str, Any]:
        return {"num_workers": self.num_workers}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("num_workers")
        if saved is not None and saved != self.num_workers:
            print(
                f"[orch] resuming with num_workers = {saved} as the checkpoint was taken with it "
                f"(this attempt would use {self.num_workers})",
                flush=True,
            )
            self.num_workers = int(saved)

    # -- loaders -----------------------------------------------------------------------------
    def _rank_world(self) -> tuple[int, int]:
        trainer = getattr(self, "trainer", None)
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _loader_kwargs(self) -> dict[str, Any]:
        workers = self.num_workers
        return dict(
            collate_fn=self.collator(),
            num_workers=workers,
            persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(),
            worker_init_fn=ignore_sigterm if workers > 0 else None,
        )

    def train_dataloader(self) -> StatefulDataLoader:
        rank, world = self._rank_world()
        ds = self.splits["train"]
        sampler = ResumableSampler(len(ds), shuffle=self.shuffle, seed=self.seed, rank=rank, world_size=world)
        # A private generator: creating loader iterators must not draw from the global RNG, or a
        # resumed run's dropout stream would differ from an uninterrupted one.
        gen = torch.Generator()
        gen.manual_seed(self.seed)
        return StatefulDataLoader(
            ds, batch_size=self.batch_size, sampler=sampler, generator=gen, **self._loader_kwargs()
        )

    def val_dataloader(self):
        if "validation" not in self.splits:
            return []
        gen = torch.Generator()
        gen.manual_seed(self.seed + 1)
        # Every rank validates the whole set: metrics are exact and identical on all ranks.
        return DataLoader(
            self.splits["validation"],
            batch_size=self.batch_size * 2,
            shuffle=False,
            generator=gen,
            **self._loader_kwargs(),
        )


def ignore_sigterm(worker_id: int) -> None:
    """DataLoader workers ignore SIGTERM: the main process decides when to stop (a group-wide
    SIGTERM would otherwise kill them and fail the run)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


class PadCollator:
    """Dynamic padding to the longest row of the batch (numpy fill, one tensor per field)."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        n = len(rows)
        width = max(len(r["input_ids"]) for r in rows)
        ids = np.full((n, width), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        types = np.zeros((n, width), dtype=np.int64) if "token_type_ids" in rows[0] else None
        for i, row in enumerate(rows):
            k = len(row["input_ids"])
            ids[i, :k] = row["input_ids"]
            mask[i, :k] = 1
            if types is not None:
                types[i, :k] = row["token_type_ids"]
        batch = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if types is not None:
            batch["token_type_ids"] = torch.from_numpy(types)
        batch["labels"] = torch.tensor([int(r["labels"]) for r in rows], dtype=torch.long)
        return batch
