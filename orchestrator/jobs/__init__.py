"""An attempt's life: submit, cancel, retry; begin and settle an attempt; the outcome table; backoff."""
