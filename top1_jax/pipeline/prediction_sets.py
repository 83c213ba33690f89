"""A file's prediction sets with a coverage guarantee (``evaluation.sets``) as results.csv's
rows: the file's columns, ``score`` ``results.SET_SCORE``, ``estimator`` the method,
``alpha`` and ``results.SET_METRICS``.
"""

import functools
from collections.abc import Sequence

from absl import logging

from top1_jax.evaluation import sets
from top1_jax.io import results
from top1_jax.pipeline.settings import Settings

_EXTRA = ("randomized", "k_reg", "lam")


def rows(settings: Settings, clean, shifted: Sequence = ()) -> list[dict]:
  """The set rows of ``clean`` (a ``sources.Source``) and of each ``shifted`` source. A
  method the file is too small for is left out with a warning."""
  named = {source.name: source for source in shifted}
  given = {name: (s.log_probs, s.labels) for name, s in named.items()}
  evaluate = functools.partial(
    sets.evaluate_sets, clean.log_probs, clean.labels, clean.splits,
    alphas=settings.set_alphas, seed=clean.columns["seed"], shifted=given or None,
  )  # fmt: skip
  try:  # every method from one ranking of the rows
    found = evaluate(methods=settings.set_methods)
  except ValueError:  # some method the file is too small for: each alone, to name it
    found = []
    for method in settings.set_methods:
      try:
        found += evaluate(methods=(method,))
      except ValueError as e:
        logging.warning("prediction sets: no %s sets of %s (%s)", method, clean.name, e)
  out = []
  for row in found:
    source = clean if row["set"] == "clean" else named[row["set"]]
    metrics = {k: v for k, v in row.items() if k.removesuffix("_std") in results.SET_METRICS}
    tidy = {**source.columns, "score": results.SET_SCORE, "topk": None, "estimator": row["method"]}
    tidy.update(n_bins=None, alpha=row["alpha"], **metrics, **{k: row[k] for k in _EXTRA})
    out.append(tidy | {"label": source.label})
  return out
