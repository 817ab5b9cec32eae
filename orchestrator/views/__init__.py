"""What `orch status`, `show`, `cost` and the dashboard render: data dicts and text."""
