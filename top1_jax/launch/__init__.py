"""The command line: flags, settings, one-line errors, signals; the maths lives below it.
A main calls ``catch_stops`` first, so Ctrl-C or SIGTERM during its imports (JAX) ends it in
one line; ``runner.run`` then installs the handlers that unwind a run."""

import os
import signal
import sys

STOPS = {
  signal.SIGINT: (130, "interrupted (Ctrl-C); rerun the same command to resume"),
  signal.SIGTERM: (143, "terminated (SIGTERM); rerun the same command to resume"),
}
"""Each signal that stops a run: its exit status (128 + the signal) and its one line."""


def _stop_at_once(signum: int, frame) -> None:
  del frame  # nothing has started: nothing to unwind
  status, line = STOPS[signum]
  print(line, file=sys.stderr, flush=True)
  os._exit(status)


def catch_stops(handler=_stop_at_once) -> None:
  """Handles SIGINT and SIGTERM by ``handler``, unless ignored (nohup, a background job)."""
  for signum in STOPS:
    if signal.getsignal(signum) is not signal.SIG_IGN:
      signal.signal(signum, handler)
