r"""Evaluate a predictions file of any model, e.g. ImageNet's 50,000 validation images.

  python -m top1_jax.launch.evaluate --config=top1_jax/configs/imagenet_eval.py \
      --config.predictions=resnet50_val.npz --workdir=runs/imagenet
  python -m top1_jax.launch.evaluate --config=top1_jax/configs/imagenet_eval.py \
      --config.logits=logits.npy --config.labels=labels.npy --workdir=runs/imagenet

The file: see top1_jax.io.predictions ([N, K] logits or probabilities, or
[S, N, K] MC-dropout / ensemble samples, with [N] labels).
"""

from top1_jax.configs import fashion_mnist


def get_config():
  config = fashion_mnist.get_config()
  config.dataset = "imagenet2012"
  config.predictions = ""  # give it: --config.predictions=a.npz,b.npz (or globs)
  config.topk = (1, 5)
  config.n_bins = (10, 20, 50, 100)
  return config
