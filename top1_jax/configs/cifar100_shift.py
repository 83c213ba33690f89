r"""The cifar100 config's networks under dataset shift (CIFAR-10-C-like corruptions): a GPU job.

  python -m top1_jax.launch.shift --config=cifar100_shift --workdir=runs/cifar100

Reuses the networks ``--config=cifar100`` trained in the same work dir (the training
fields are cifar100's). The defaults are the shift config's (1,000 examples, one
MC-dropout rate, 16 samples); on a GPU raise them, e.g.
``--config.shift_examples=10000 --config.num_samples=32``.
"""

from top1_jax.configs import cifar100, shift


def get_config():
  """``cifar100``'s training, evaluated as the ``shift`` config evaluates the main job's."""
  return shift.under_shift(cifar100.get_config())
