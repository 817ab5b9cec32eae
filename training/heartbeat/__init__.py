"""What a running job tells the daemon while it trains: progress.json (and the Lightning hooks that
write it), where an attempt's time goes (goodput), training health (NaN, a flat loss), what torch
says about the machine."""
