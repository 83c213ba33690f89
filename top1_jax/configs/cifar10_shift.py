r"""The cifar10 config's networks under dataset shift (CIFAR-10-C-like corruptions): a GPU job.

  python -m top1_jax.launch.shift --config=cifar10_shift --workdir=runs/cifar10

Reuses the networks ``--config=cifar10`` trained in the same work dir (the training
fields are cifar10's). The defaults are the shift config's (1,000 examples, one
MC-dropout rate, 16 samples); on a GPU raise them, e.g.
``--config.shift_examples=10000 --config.num_samples=32``.
"""

from top1_jax.configs import cifar10, shift


def get_config():
  """``cifar10``'s training, evaluated as the ``shift`` config evaluates the main job's."""
  return shift.under_shift(cifar10.get_config())
