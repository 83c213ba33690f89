"""Files and datasets: the only part of the library that reads or writes files, with
`top1_jax.plots`."""
