"""Command-line experiments (absl). Thin: flags, files and progress; maths lives in top1_jax."""
