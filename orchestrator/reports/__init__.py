"""What the runner wrote into the run folder, as the daemon and the CLI read it."""
