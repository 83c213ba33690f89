r"""Demo of the core on synthetic logits: calibrated Top-1 bins for several scores.

  python experiments/demo.py --num_examples=20000 --workdir=/tmp/top1_demo

Its flags: ``top1_jax.launch.demo``.
"""

from top1_jax.launch import demo, runner

if __name__ == "__main__":
  runner.run(demo.main)
