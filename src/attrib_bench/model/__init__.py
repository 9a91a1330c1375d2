"""Model loading, architecture adapters, the one-pass trace and fine-tuning."""
