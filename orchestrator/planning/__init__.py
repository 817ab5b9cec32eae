"""Which queued job starts now, and when each active job will start and finish."""
