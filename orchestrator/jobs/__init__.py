"""An attempt's life: submit, cancel, retry; begin and settle an attempt; the outcome table; backoff;
and before a job is queued, its admission, pre-flight and estimate (with the probe)."""
