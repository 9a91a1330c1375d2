"""Math that several method families share, public so that third-party plugins use it too:
rollout and residual mixing, the attention family's flow, the norm-family decomposition,
Jacobian token contributions, and which row and tokens an evaluator scores."""
