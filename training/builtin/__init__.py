"""The built-in fine-tune (`python -m training.run`): one attempt's plan, Trainer and end, the data and
LightningModule, the per-row tokenizing the pre-flight shares, and tasks/ (one per [model] task)."""
