"""Rendering, all in one place: the terminal leaderboard, the Markdown and HTML reports, the
per-layer plots and the gate's Markdown verdict."""
