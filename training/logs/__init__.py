"""The built-in runner's metric logs: metrics.csv, TensorBoard event files, and the rows both write."""
