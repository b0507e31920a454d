"""Framework integrations; each submodule imports its framework only when used."""
