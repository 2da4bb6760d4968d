"""Command-line tools: `pw-opt`."""
