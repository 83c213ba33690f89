"""Files and datasets: with `top1_jax.plots`, the only part that reads or writes files."""
