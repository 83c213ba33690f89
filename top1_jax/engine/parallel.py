"""Processes and devices: one process, or several joined by ``jax.distributed``.

The one place for the rules of a multi-process run:

* ``initialize``: joins the processes, from explicit launcher flags or from a
  cluster's environment that JAX can read itself (SLURM, Open MPI, TPU pods).
* ``is_writer``: only process 0 writes the files the processes share (results,
  figures); orbax coordinates checkpoints by itself.
* ``barrier``: every process waits here for all others, so that no process exits
  (and tears down the coordinator) while process 0 still writes.
* ``use_compilation_cache``, ``one_cpu_device_per_core``: a launcher's JAX, set
  before it starts.
* Data-parallel training over the devices of all processes: the state
  replicated (``replicate``), each global batch split by rows
  (``check_global_batch``): gathered on the devices from data split by rows
  (``put_rows``, ``gather_rows``) where the data fits (``fits_on_devices``), else
  gathered on the hosts (``shard_rows``); the final state handed back as every
  process's local copy (``to_local``).

Every process runs the same program on the same host data; each one feeds only
the rows that live on its own devices.
"""

import functools
import gc
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
  "initialize",
  "detected_cluster",
  "is_writer",
  "process_count",
  "barrier",
  "replicate",
  "shard_rows",
  "to_local",
  "check_global_batch",
  "fits_on_devices",
  "put_rows",
  "gather_rows",
  "use_compilation_cache",
  "one_cpu_device_per_core",
]


def _count(environ: Mapping[str, str], name: str) -> int:
  try:
    return int(environ.get(name, "1"))
  except ValueError:
    return 1


def detected_cluster(environ: Mapping[str, str]) -> str | None:
  """The multi-process cluster that ``environ`` describes, or None for one process.

  These are the environments where ``jax.distributed.initialize()`` finds the
  coordinator, process count and process id by itself. A one-task SLURM job or
  a one-host TPU is a single process: joining it would only add a coordinator.

  Args:
    environ: the process environment (``os.environ``).

  Returns:
    ``"slurm"``, ``"openmpi"``, ``"tpu"`` or None.
  """
  slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
  if all(name in environ for name in slurm) and _count(environ, "SLURM_NTASKS") > 1:
    return "slurm"
  if "OMPI_MCA_orte_hnp_uri" in environ and _count(environ, "OMPI_COMM_WORLD_SIZE") > 1:
    return "openmpi"
  hosts = environ.get("TPU_WORKER_HOSTNAMES") or environ.get("TPU_PROCESS_ADDRESSES") or ""
  if len([h for h in hosts.split(",") if h]) > 1 or environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "tpu"
  return None


def _check_topology(coordinator_address, num_processes, process_id) -> None:
  """One-line ``ValueError``s that name the launcher flag to fix."""
  if coordinator_address is None:
    if num_processes not in (None, 1) or process_id not in (None, 0):
      raise ValueError(
        "--coordinator_address: required with --num_processes and --process_id"
        " (host:port of process 0, e.g. 10.0.0.1:1234); leave all three unset for one process"
      )
    return
  host, _, port = str(coordinator_address).rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(
      f"--coordinator_address: expected host:port (e.g. 10.0.0.1:1234), got {coordinator_address!r}"
    )
  for flag, value in (("--num_processes", num_processes), ("--process_id", process_id)):
    if value is None:
      raise ValueError(
        f"{flag}: required with --coordinator_address; give every process the same"
        " --num_processes and its own --process_id from 0 to --num_processes - 1"
      )
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      raise ValueError(f"{flag}: expected an integer, got {value!r}")
  if num_processes < 1:
    raise ValueError(f"--num_processes: expected an integer >= 1, got {num_processes}")
  if not 0 <= process_id < num_processes:
    raise ValueError(
      f"--process_id: expected 0 <= --process_id < --num_processes = {num_processes},"
      f" got {process_id}"
    )


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  *,
  environ: Mapping[str, str] | None = None,
) -> None:
  """Joins this process to the others of its run, if there are others.

  Call it first, before anything touches a device. With ``coordinator_address``
  every process of the run calls it with the same address and
  ``num_processes`` and its own ``process_id``. Without it the run is one
  process, unless ``environ`` (pass ``os.environ``) describes a cluster that JAX
  reads by itself (``detected_cluster``); the library reads no environment on
  its own.

  Args:
    coordinator_address: ``host:port`` of process 0, or None.
    num_processes: how many processes join (with ``coordinator_address``).
    process_id: this process's rank in [0, num_processes).
    environ: the environment to look for a cluster in; None looks nowhere.

  Raises:
    ValueError: for an incomplete or inconsistent topology, naming the flag.
  """
  _check_topology(coordinator_address, num_processes, process_id)
  if coordinator_address is None and (environ is None or detected_cluster(environ) is None):
    return
  # The CPU backend reduces across processes only with a collectives library;
  # it has to be chosen before the backend starts. Other backends ignore it.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if coordinator_address is None:
    jax.distributed.initialize()
  else:
    jax.distributed.initialize(coordinator_address, int(num_processes), int(process_id))


def is_writer() -> bool:
  """Whether this process writes the run's shared files (process 0 does)."""
  return jax.process_index() == 0


def process_count() -> int:
  """The number of processes in the run (1 without ``jax.distributed``)."""
  return jax.process_count()


def barrier(name: str) -> None:
  """Waits until every process has reached the barrier ``name``; no-op for one process."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def replicate(tree: Any, mesh: Mesh) -> Any:
  """The array leaves of ``tree`` as global arrays replicated over ``mesh``.

  Every process passes the same values (host or local device arrays); each
  copies them to its own devices only. Leaves already replicated over the mesh's
  devices are kept as they are.
  """
  replicated = NamedSharding(mesh, P())
  devices = set(mesh.devices.flat)

  def put(leaf):
    if isinstance(leaf, jax.Array) and leaf.sharding.device_set == devices:
      if leaf.is_fully_replicated:  # e.g. on the one device of a one-device mesh
        return leaf
    copies = [jax.device_put(leaf, device) for device in mesh.local_devices]
    return jax.make_array_from_single_device_arrays(np.shape(leaf), replicated, copies)

  return jax.tree_util.tree_map(put, tree)


def shard_rows(data: np.ndarray, indices: np.ndarray, mesh: Mesh, axis: int = 0) -> jax.Array:
  """The global array ``data[indices]``, split along ``axis`` over the mesh's one axis.

  Every process holds all of ``data`` and the same ``indices``; each gathers
  only the rows of its own devices.

  Args:
    data: [N, ...] host array.
    indices: int array of any shape, entries in [0, N); ``indices.shape[axis]``
      must be a multiple of the mesh size.
    mesh: a 1-D mesh.
    axis: the axis of ``indices`` to split.

  Returns:
    [*indices.shape, ...] global array.
  """
  spec = P(*([None] * axis), mesh.axis_names[0])
  shape = indices.shape + data.shape[1:]
  return jax.make_array_from_callback(
    shape, NamedSharding(mesh, spec), lambda index: data[indices[index[: indices.ndim]]]
  )


def to_local(tree: Any) -> Any:
  """Replicated arrays as this process's copy on its first device (no transfer).

  What a process keeps of a replicated state: it can be used, saved or fed to
  another run like a state that never left one device.
  """

  def local(leaf):
    multi_device = isinstance(leaf, jax.Array) and len(leaf.sharding.device_set) > 1
    return leaf.addressable_data(0) if multi_device and leaf.is_fully_replicated else leaf

  return jax.tree_util.tree_map(local, tree)


def check_global_batch(name: str, size: int) -> None:
  """Refuses a global batch that does not split evenly over every device of every process."""
  devices = jax.device_count()
  if size % devices:
    lower = max(devices, size // devices * devices)
    raise ValueError(
      f"{name}: {size} does not split evenly over the {devices} devices of all processes;"
      f" use a multiple of {devices}, e.g. {lower} or {lower + devices}"
    )


DEVICE_DATA_FRACTION = 0.25
"""Training data lives on the devices when each device's share is at most this fraction
of the device's memory (``fits_on_devices``); the rest is the model's, the optimizer's
and the activations'."""

HOST_DEVICE_DATA_BYTES = 2 << 30
"""A device's share of the data may be this many bytes where the device reports no memory
size (XLA:CPU: its memory is the host's, which holds the data already)."""


def fits_on_devices(num_bytes: int, mesh: Mesh) -> bool:
  """The one rule for data on the devices: each device's share of ``num_bytes`` (split by
  rows over the mesh) is at most ``DEVICE_DATA_FRACTION`` of the smallest local device's
  memory (``bytes_limit`` of ``device.memory_stats()``), or ``HOST_DEVICE_DATA_BYTES``
  where a device reports none. Every process of a run must see the same devices, so that
  all decide alike."""
  share = -(-num_bytes // mesh.devices.size)
  limits = [(device.memory_stats() or {}).get("bytes_limit") for device in mesh.local_devices]
  if all(limits):
    return share <= DEVICE_DATA_FRACTION * min(limits)
  return share <= HOST_DEVICE_DATA_BYTES


@functools.cache
def _cast(dtype: Any, sharding: NamedSharding) -> Callable:
  return jax.jit(lambda x: x.astype(dtype), out_shardings=sharding, donate_argnums=0)


def put_rows(data: np.ndarray, mesh: Mesh, dtype: Any = None) -> jax.Array:
  """A host array [N, ...] on the mesh's devices, split by rows, cast there to ``dtype``.

  Every process holds all of ``data``; each copies only its own devices' rows. N is
  padded with zero rows to a multiple of the mesh size (``gather_rows`` never reads
  them).

  Args:
    data: [N, ...] host array.
    mesh: a 1-D mesh.
    dtype: the dtype on the devices; None keeps ``data``'s.

  Returns:
    [ceil(N / D) * D, ...] global array, rows split over the mesh's axis.
  """
  size, num_rows = mesh.devices.size, data.shape[0]
  padded = -(-num_rows // size) * size
  sharding = NamedSharding(mesh, P(mesh.axis_names[0]))

  def rows(index):
    block = data[index[0]]
    missing = len(range(*index[0].indices(padded))) - block.shape[0]
    if not missing:
      return block
    return np.concatenate([block, np.zeros((missing, *data.shape[1:]), data.dtype)])

  array = jax.make_array_from_callback((padded, *data.shape[1:]), sharding, rows)
  if dtype is None or array.dtype == dtype:
    return array
  return _cast(np.dtype(dtype), sharding)(array)


def _local_rows(shard, indices, axis_name: str):
  """Inside ``shard_map``: this device's rows of ``indices`` (zeros for the others'),
  summed over the devices and split along the batch axis (the last of ``indices``)."""
  rows = shard.shape[0]
  local = indices - jax.lax.axis_index(axis_name) * rows
  mine = (local >= 0) & (local < rows)
  picked = jnp.take(shard, jnp.clip(local, 0, rows - 1), axis=0)
  picked = jnp.where(mine.reshape(mine.shape + (1,) * (shard.ndim - 1)), picked, 0)
  # Exactly one device holds each row: the sum adds zeros only, so it is exact.
  return jax.lax.psum_scatter(picked, axis_name, scatter_dimension=indices.ndim - 1, tiled=True)


def gather_rows(data: Any, indices: jax.Array, mesh: Mesh) -> Any:
  """``leaf[indices]`` of every leaf of ``data``, on the devices (traceable, in a jit over
  ``mesh``).

  Args:
    data: arrays [N, ...] split by rows over the mesh (``put_rows``).
    indices: [..., B] int rows in [0, N), the same on every device; B a multiple of the
      mesh size.
    mesh: a 1-D mesh.

  Returns:
    [..., B, ...] arrays split along the B axis over the mesh, as ``shard_rows`` splits
    a batch: each device gathers the rows it holds, and one reduce-scatter over the mesh
    (a batch's bytes) hands every device its part of the batch.
  """
  if mesh.devices.size == 1:
    return jax.tree_util.tree_map(lambda leaf: jnp.take(leaf, indices, axis=0), data)
  (axis,) = mesh.axis_names
  batch_spec = P(*([None] * (indices.ndim - 1)), axis)
  local = functools.partial(_local_rows, axis_name=axis)
  return jax.shard_map(
    lambda shards, idx: jax.tree_util.tree_map(lambda shard: local(shard, idx), shards),
    mesh=mesh,
    in_specs=(P(axis), P()),
    out_specs=batch_spec,
  )(data, indices)


def use_compilation_cache(cache_dir: str) -> None:
  """JAX's persistent compilation cache for a launcher: a rerun skips most of its compiling.

  An evaluate of 50,000 x 1,000 logits spends most of a cold run compiling on a
  2-core CPU (about 5 of 8 s in one process).

  Args:
    cache_dir: the cache's folder (JAX_ENABLE_COMPILATION_CACHE=false, JAX's own
      variable, turns the cache off).
  """
  jax.config.update("jax_compilation_cache_dir", cache_dir)
  # Every program: most compile in 0.01-1 s (JAX caches only those >= 1 s by default).
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if importlib.util.find_spec("filelock"):  # JAX's size limit needs it
    jax.config.update("jax_compilation_cache_max_size", 2 << 30)  # least recent dropped


MAX_CPU_DEVICES = 8
"""At most this many JAX CPU devices from ``one_cpu_device_per_core`` (chunks in flight)."""


def one_cpu_device_per_core(num_cores: int, xla_flags: str) -> bool:
  """One JAX CPU device per core (at most ``MAX_CPU_DEVICES``), before JAX starts.

  ``chunked.from_chunks`` scores a predictions file's chunks on all of them at once:
  XLA runs parts of a chunk's scoring (the covariance norms' small matmuls) on one
  core per device.

  Args:
    num_cores: the machine's cores (``os.cpu_count()``).
    xla_flags: the XLA_FLAGS variable; one that sets the device count is left alone.

  Returns:
    False when JAX had already started (its devices stay as they are).
  """
  if "xla_force_host_platform_device_count" in xla_flags:
    return True
  try:
    jax.config.update("jax_num_cpu_devices", max(1, min(num_cores, MAX_CPU_DEVICES)))
  except RuntimeError:  # JAX already started in this process (e.g. called from Python)
    return False
  return True


def in_garbage_collection(frame) -> bool:
  """Whether ``frame`` (e.g. where a signal arrived) runs inside a garbage-collector
  callback (JAX registers one). Python reports and drops an exception raised there, so a
  signal handler that stops the run by raising must let the collection end first."""
  callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
  while frame is not None:
    if frame.f_code in callbacks:
      return True
    frame = frame.f_back
  return False
