"""The job side of orch: the built-in Transformer fine-tune (`python -m training.run RUN_DIR`) and
`OrchCallback` for users' own Lightning scripts. Kept import-light on purpose."""
