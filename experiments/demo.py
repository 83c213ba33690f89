r"""Demo of the core on synthetic logits: calibrated Top-1 bins for several scores.

  python experiments/demo.py --num_examples=20000 --workdir=/tmp/top1_demo

Its flags: ``top1_jax.launch.demo``.
"""

from top1_jax import launch

launch.catch_stops()  # Ctrl-C while JAX loads: one line, no traceback

from top1_jax.launch import demo, runner  # noqa: E402

if __name__ == "__main__":
  runner.run(demo.main)
