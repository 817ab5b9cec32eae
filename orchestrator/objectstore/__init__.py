"""The mirror's storage side: where a job's durable copy lives (url.py), the one client wrapper
around obstore (remote.py), the manifest that is the commit point of a job's copy (manifest.py)
and taking a job over on another machine (orchestrator/adopt/). Imported only by the daemon's uploader and
the `orch adopt` / `orch storage check` commands, never by `orch status`."""
