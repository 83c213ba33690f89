"""Performance plumbing, named for the job: row-block reductions, top-entry passes,
the compile policy of small programs, the covariance norm. Imports nothing of top1_jax."""
