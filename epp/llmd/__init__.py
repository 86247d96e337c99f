"""Compatibility with the llm-d Router: its config file's data-layer entries read into
ours, and its command-line flags."""
