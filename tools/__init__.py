"""Tools run from a checkout of the repository (not installed with orch): the GPU check."""
