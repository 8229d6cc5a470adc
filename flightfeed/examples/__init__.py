"""Runnable examples that double as templates (see chunk_scan for a feed-backed leaf)."""
