"""The files people write, read into checked models: job.toml, config.toml, their tables, checks and limits."""
