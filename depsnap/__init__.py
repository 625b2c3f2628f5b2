"""depsnap: reserved; built in its own issue."""
