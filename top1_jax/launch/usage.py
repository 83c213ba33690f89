"""What the command line says of its flags and config fields: ``--help``, "did you mean"."""

import difflib
import re
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

HELP_FLAGS = {"--help": False, "-h": False, "-?": False, "--helpshort": False, "--helpfull": True}
"""The flags that ask for ``help_text``, and whether each asks for absl's flags too."""


def describe(config: Mapping[str, Any], meanings: Mapping[str, str], width: int = 80) -> str:
  """Every field of ``config`` as ``--help`` lists it: flag and meaning, then value; in the
  order of ``meanings`` (field -> meaning, ``default.HELP``), fields it lacks last."""
  names = [n for n in meanings if n in config] + sorted(n for n in config if n not in meanings)
  paragraphs = []
  for name in names:
    text = f"--config.{name}: {meanings.get(name, '(no description)')}"
    shown = "unset" if config[name] is None else repr(config[name])
    paragraphs.append(textwrap.fill(text, width, initial_indent="  ", subsequent_indent="    "))
    paragraphs.append(textwrap.fill(f"(default: {shown})", width, initial_indent="    "))
  return "\n".join(paragraphs)


def help_text(flag_values: Any, doc: str | None, full: bool = False) -> str:
  """A launcher's ``--help``: ``doc``, its flags, and every field of its ``--config``;
  ``full`` (``--helpfull``) adds the libraries' flags (absl's ``--verbosity``, orbax's...)."""
  shown = [m for m in flag_values.flags_by_module_dict() if full or m.startswith("top1_jax")]
  parts = [(doc or "").strip(), *(flag_values.module_help(m) for m in shown)]
  if "config" in flag_values and flag_values["config"].value is not None:
    from top1_jax.configs import default  # ml_collections: for a launcher with a config

    name = str(flag_values["config"].config_filename).rsplit("/", 1)[-1].removesuffix(".py")
    fields = describe(flag_values["config"].value, default.HELP)
    parts.append(f"The fields of --config={name} (--config.<field>=<value> sets one):\n{fields}")
  parts.append("" if full else "--helpfull also lists the libraries' flags (--verbosity, ...).")
  return "\n\n".join(part for part in parts if part)


def closest(name: str, names: Iterable[str]) -> str | None:
  """The one of ``names`` that ``name`` is most likely a typo of, or None."""
  found = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
  return found[0] if found else None


def _field_names() -> list[str]:
  from top1_jax.configs import default  # ml_collections: only when a message needs it

  return list(default.HELP)


def unknown_field(argv: list[str]) -> str:
  """One line for the first ``--config.<field>`` of ``argv`` that no config has."""
  names = [m[1] for m in map(re.compile(r"--?(?:no)?config\.(\w+)").match, argv) if m]
  name = next((n for n in names if n not in _field_names()), names[0] if names else "<field>")
  near = closest(name, _field_names())
  hint = f"did you mean --config.{near}? " if near else ""
  return f"--config.{name}: no such field; {hint}(--help lists every field)"


def unknown_flag(name: str, flag_values: Any) -> str:
  """One line for an unknown ``--<name>``, with the flag or config field it may mean."""
  if name.startswith("config."):
    return unknown_field([f"--{name}"])
  fields = "config" in flag_values  # a sweep launcher: a config field may be meant
  field = (name if name in _field_names() else closest(name, _field_names())) if fields else None
  hint = f"; did you mean --config.{field}?" if field else ""
  if fields and name in ("logits", "probs"):  # input_kind's values: an array of them
    hint = f"; an array of {name} is --config.inputs=<.npy> --config.input_kind={name} "
    hint += "--config.labels=<.npy>"
  elif not field and closest(name, flag_values):
    hint = f"; did you mean --{closest(name, flag_values)}?"
  listed = "--help lists every flag and field" if fields else "--help lists every flag"
  return f"--{name}: no such flag ({listed}){hint}"
