"""The Monte Carlo engine: Flax models, MC dropout and ensembles, training, processes."""
