"""The vocabulary every part shares: job states and the transitions table, records, sweep records, errors."""
