"""Analyses beyond the leaderboard: token identifiability and hidden-token attribution (Brunner
et al. 2020)."""
