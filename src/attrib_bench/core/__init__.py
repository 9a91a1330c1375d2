"""The public types and the plugin machinery: what a plugin sees (examples, batches,
attributions, the Attributor/Evaluator protocols, the target, architecture specs, trace fields),
the hook specifications, and the registry that finds plugins. Imports nothing above it."""
