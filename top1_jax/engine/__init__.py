"""The Monte Carlo engine: Flax models, MC dropout and ensembles (vmap, sharded),
training, processes, streaming a predictions file through the devices."""
