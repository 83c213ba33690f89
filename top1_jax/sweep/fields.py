"""Reading a config's fields: one checked value each, a failure one line naming the field.

``plan.check`` and the sweep's other modules read tuple fields through ``items``: a
tuple given on the command line (``'--config.n_bins=(10,20)'``) may arrive as one
string, which is split here.
"""

import math
import re

from top1_jax.core.validation import SettingError


def fail(field: str, message: str):
  """A setting that cannot work: one line naming the field."""
  raise SettingError(f"{field}: {message}")


def items(config, field: str) -> tuple:
  """A tuple field, also when given unquoted on the command line: (a,b) arrives as "(a,b)".

  ml_collections keeps an override it cannot parse as one string: a typo such as
  ``(0.1`` (a parenthesis missing) would otherwise run as the value 0.1 and be recorded
  as ``["(0.1"]``, so parentheses that do not pair up are refused.
  """
  value = config[field]
  if isinstance(value, str):
    value = (value,)
  out = []
  for item in value if isinstance(value, (tuple, list)) else (value,):
    if isinstance(item, str):
      _check_parentheses(field, item)
      out += [part for part in re.split(r"[,\s()]+", item) if part]
    else:
      out.append(item)
  return tuple(out)


def _check_parentheses(field: str, item: str) -> None:
  """Parentheses that pair up: ``(a,b)`` and ``a,b``, not ``(a`` or ``a)``."""
  depth = 0
  for char in item:
    depth += {"(": 1, ")": -1}.get(char, 0)
    if depth < 0:
      break
  if depth:
    fail(
      field,
      f"malformed value {item!r}: its parentheses do not pair up; write (a,b) or (a,), "
      f"quoted for the shell: '--config.{field}=(a,b)'",
    )


def finite(config) -> None:
  """Every float of the config (a field, or an item of a tuple field) is a finite number."""
  for field, value in config.items() if hasattr(config, "items") else ():
    values = value if isinstance(value, (tuple, list)) else (value,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in values):
      fail(
        field, f"expected {'finite numbers' if values is value else 'a finite number'}, got {value}"
      )


def numbers(config, field: str, kind, low=None, high=None, allow_empty=False) -> tuple:
  values = items(config, field)
  try:
    parsed = tuple(kind(v) for v in values)
  except (TypeError, ValueError, OverflowError):  # OverflowError: int("inf")
    fail(field, f"expected {kind.__name__} values, got {values}")
  if not all(math.isfinite(v) for v in parsed):  # "nan" in an unquoted tuple parses
    fail(field, f"expected finite numbers, got {values}")
  if not parsed and not allow_empty:
    fail(field, "expected at least one value, got ()")
  if kind is int and any(float(v) != int(v) for v in values):
    fail(field, f"expected integers, got {values}")
  if low is not None and any(v < low for v in parsed):
    fail(field, f"expected values >= {low}, got {values}")
  if high is not None and any(v >= high for v in parsed):
    fail(field, f"expected values in [{low}, {high}), got {values}")
  return tuple(dict.fromkeys(parsed))


def at_least(config, field: str, low, kind=int):
  value = config[field]
  if value is None:
    return None
  if not isinstance(value, (int, float)) or value < low:
    fail(field, f"expected {'an integer' if kind is int else 'a number'} >= {low}, got {value}")
  return kind(value)
