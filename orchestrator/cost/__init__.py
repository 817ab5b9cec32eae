"""Money: the one cost formula, a job's goodput ledger, and the advice it gives."""
