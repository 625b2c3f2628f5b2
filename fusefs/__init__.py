"""fusefs: reserved; built in its own issue."""
