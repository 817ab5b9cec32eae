"""`orch dashboard`: a read-only local web page of the queue, each job's curves and events, and
the bill. server.py serves it (standard library only); data.py builds its JSON from the same
views as the CLI; static/ is the page itself (no CDN, no build step)."""
