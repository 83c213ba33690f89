"""Ctrl-C (SIGINT) and SIGTERM stop a launcher with one line, the lock released, 130 / 143.

Before, Ctrl-C printed a KeyboardInterrupt traceback (and, during an XLA compile in
evaluate, sometimes ended in "Fatal Python error: Segmentation fault" at the
interpreter's shutdown), and SIGTERM, a scheduler's preemption, ended the run at once
with no word and its .lock left behind. Each launcher here is stopped mid-run, as a
user or a scheduler stops it.
"""

import signal
import subprocess
import sys
import time

import numpy as np
import processes
import pytest

from top1_jax import launch
from top1_jax.io import idx, lock
from top1_jax.io import predictions as predictions_lib

needs_fmnist = pytest.mark.skipif(
  not (idx.FASHION_MNIST_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
  reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)


def _default_sigint():
  # A child of a shell's background job inherits SIGINT ignored, which Python keeps
  # (and so does the launcher): give the launcher the terminal's default.
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop_when(text: str, signum: int, module: str, *args: str) -> tuple[int, str]:
  """Runs a launcher, sends ``signum`` once a line holds ``text``; (exit status, output)."""
  process = subprocess.Popen(
    [sys.executable, processes.script(module), *args],
    cwd=processes.ROOT,
    env=processes.LAUNCHER_ENV,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    preexec_fn=_default_sigint,
  )
  seen = []
  try:
    for line in process.stdout:
      seen.append(line)
      if text in line:
        process.send_signal(signum)
        break
    seen.append(process.communicate(timeout=120)[0])
  finally:
    process.kill()
    process.wait()
  return process.returncode, "".join(seen)


def _stopped_cleanly(status: int, output: str, workdir, expected_status: int, line: str):
  assert status == expected_status, output[-3000:]
  lines = [text for text in output.splitlines() if text.strip()]
  assert lines[-1] == line, output[-3000:]
  assert "Traceback" not in output and "Fatal Python error" not in output, output[-3000:]
  assert not (workdir / lock.LOCK_NAME).exists()  # the next run starts without a note
  assert not list(workdir.rglob("*.tmp"))  # an atomic write cut short cleaned up


@needs_fmnist
@pytest.mark.slow
def test_sigterm_during_training_and_ctrl_c_during_evaluate_stop_in_one_line(tmp_path):
  train_dir = tmp_path / "train"
  args = ["--config=quick", "--config.limit_train=5000", "--config.limit_test=500"]
  args += ["--config.num_epochs=50", "--config.ensemble_size=0", f"--workdir={train_dir}"]
  status, output = _stop_when(" epochs", signal.SIGTERM, "train", *args)
  assert "epoch 50/50" not in output  # stopped mid-run
  _stopped_cleanly(
    status, output, train_dir, 143, "terminated (SIGTERM); rerun the same command to resume"
  )

  # evaluate's comparison compiles in a thread beside the sweep: a stop does not wait for it.
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 10, 400)
  logits = rng.normal(size=(400, 10)) + 3 * np.eye(10)[labels]
  path = tmp_path / "p.npz"
  predictions_lib.save_predictions(
    path, predictions_lib.Predictions(labels=labels, logits=logits, meta={"dataset": "x"})
  )
  evaluate_dir = tmp_path / "evaluate"
  args = ["--config=evaluate_files", f"--config.inputs={path}", f"--workdir={evaluate_dir}"]
  status, output = _stop_when("[1/", signal.SIGINT, "evaluate", *args)
  assert not (evaluate_dir / "results.csv").exists()  # stopped mid-run
  _stopped_cleanly(
    status, output, evaluate_dir, 130, "interrupted (Ctrl-C); rerun the same command to resume"
  )


def test_a_signal_inside_a_garbage_collector_callback_is_seen_as_such():
  # Python drops an exception raised inside a gc callback (JAX registers one), so the
  # launchers' handler delivers such a signal again once the collection is over.
  import gc

  from top1_jax.engine import parallel

  seen = []

  def callback(phase, info):
    seen.append(parallel.in_garbage_collection(sys._getframe()))

  gc.callbacks.append(callback)
  try:
    gc.collect()
  finally:
    gc.callbacks.remove(callback)
  assert seen and all(seen)
  assert not parallel.in_garbage_collection(sys._getframe())


@pytest.mark.slow
@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_while_the_imports_run_is_one_line(tmp_path, signum, status):
  # Ctrl-C in the first ~1.3 s (JAX's import) printed a 25-line traceback; SIGTERM then
  # ended with no word at all. The handlers come first now.
  process = subprocess.Popen(
    [sys.executable, processes.script("evaluate"), f"--workdir={tmp_path}"],
    cwd=processes.ROOT,
    env=processes.LAUNCHER_ENV,
    stderr=subprocess.PIPE,
    text=True,
    preexec_fn=_default_sigint,
  )
  time.sleep(0.6)  # after the first lines of the main, before JAX has loaded
  process.send_signal(signum)
  _, err = process.communicate(timeout=60)
  assert process.returncode == status, err
  assert err.splitlines() == [f"{launch.STOPS[signum][1]}"], err
