"""Tests for top1_jax.engine.parallel: two processes train as one, and the topology checks.

One two-process run (``multihost_worker.py``, 2 fake CPU devices per process, so
4 in all) covers data-parallel ``fit`` and ``fit_ensemble``, evaluation, the
batch-size check and ``RunCheckpoints`` in a shared folder; it is compared with
the same training in this one-device process.
"""

import importlib.util
import os
import pathlib

import numpy as np
import processes
import pytest

from top1_jax.engine import parallel

_TESTS = pathlib.Path(__file__).resolve().parent
_TIMEOUT_S = 120  # far beyond a working run; a process that fails leaves the other waiting


def _load_worker():
  spec = importlib.util.spec_from_file_location("multihost_worker", _TESTS / "multihost_worker.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _start_two_processes(workdir: pathlib.Path) -> list:
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": processes.xla_flags(2)}
  env["PYTHONPATH"] = str(_TESTS.parent)
  port = processes.free_port()
  commands = [
    [str(_TESTS / "multihost_worker.py"), str(port), str(i), str(workdir)] for i in range(2)
  ]
  return processes.start(commands, env)


@pytest.mark.slow
def test_two_processes_train_and_checkpoint_as_one(tmp_path):
  workers = _start_two_processes(tmp_path)
  try:  # the reference, in this one-device process while the workers run
    _, expected = _load_worker().train_case()
  finally:
    processes.wait(workers, _TIMEOUT_S)
  for process_id in range(2):
    got = dict(np.load(tmp_path / f"process{process_id}.npz"))
    assert int(got["process_count"]) == 2 and int(got["device_count"]) == 4
    assert bool(got["is_writer"]) == (process_id == 0)
    for name, value in expected.items():
      np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    assert "batch_size: 10 does not split evenly over the 4 devices" in str(got["batch_error"])
    assert int(got["epoch_before"]) == 0 and int(got["epoch_after"]) == 2
    for name in (n for n in expected if n.startswith("fit[")):
      np.testing.assert_array_equal(got["restored" + name[3:]], got[name], err_msg=name)
  # One checkpoint, the last epoch's, written by process 0 alone.
  checkpoint = tmp_path / "checkpoints"
  assert sorted(p.name for p in checkpoint.iterdir() if p.is_dir()) == ["2"]
  assert [p.name for p in (checkpoint / "2" / "state").glob("ocdbt.process_*")] == [
    "ocdbt.process_0"
  ]


@pytest.mark.parametrize(
  ("args", "message"),
  [
    (("10.0.0.1:1234", None, 0), "--num_processes: required with --coordinator_address"),
    (("10.0.0.1:1234", 2, None), "--process_id: required with --coordinator_address"),
    ((None, 2, 0), "--coordinator_address: required with --num_processes"),
    (("10.0.0.1", 2, 0), "--coordinator_address: expected host:port"),
    (("10.0.0.1:1234", 0, 0), "--num_processes: expected an integer >= 1, got 0"),
    (("10.0.0.1:1234", 2, 2), r"--process_id: expected 0 <= --process_id < --num_processes = 2"),
    (("10.0.0.1:1234", 2, -1), r"--process_id: expected 0 <= --process_id"),
    (("10.0.0.1:1234", "2", 0), "--num_processes: expected an integer, got '2'"),
  ],
)
def test_bad_topologies_name_the_flag(args, message):
  with pytest.raises(ValueError, match=message) as info:
    parallel.initialize(*args)
  assert "\n" not in str(info.value)


def test_one_process_without_a_cluster():
  parallel.initialize()  # no address, no environment: one process, nothing joined
  parallel.initialize(None, 1, 0)  # the one-process topology, spelt out
  parallel.initialize(environ={"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1"})
  assert parallel.process_count() == 1 and parallel.is_writer()
  parallel.barrier("alone")  # a no-op
  slurm = dict.fromkeys(
    ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_LOCALID"), "0"
  )
  assert parallel.detected_cluster({**slurm, "SLURM_NTASKS": "4"}) == "slurm"
  assert parallel.detected_cluster({**slurm, "SLURM_NTASKS": "1"}) is None
  assert parallel.detected_cluster({"TPU_WORKER_HOSTNAMES": "t0,t1"}) == "tpu"
  assert parallel.detected_cluster({"TPU_WORKER_HOSTNAMES": "t0"}) is None
  mpi = {"OMPI_MCA_orte_hnp_uri": "1;tcp://10.0.0.1:1", "OMPI_COMM_WORLD_SIZE": "2"}
  assert parallel.detected_cluster(mpi) == "openmpi"
  assert parallel.detected_cluster({}) is None
