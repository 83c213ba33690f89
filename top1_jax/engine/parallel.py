"""Processes and devices: one process, or several joined by ``jax.distributed``.

Every process runs the same program on the same host data and feeds only the rows that
live on its own devices; only process 0 writes shared files (``is_writer``).
"""

import collections
import functools
import gc
import importlib.util
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def _count(environ: Mapping[str, str], name: str) -> int:
  try:
    return int(environ.get(name, "1"))
  except ValueError:
    return 1


def detected_cluster(environ: Mapping[str, str]) -> str | None:
  """``"slurm"``, ``"openmpi"`` or ``"tpu"``: a multi-process cluster JAX joins; else None."""
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
  """Joins this process to the others of its run, if any; call it before using a device.
  Without ``coordinator_address`` (``host:port`` of process 0) the run is one process,
  unless ``environ`` (pass ``os.environ``; None looks nowhere) describes a cluster."""
  _check_topology(coordinator_address, num_processes, process_id)
  if coordinator_address is None and (environ is None or detected_cluster(environ) is None):
    return
  # The CPU backend needs a collectives library across processes, chosen before it starts.
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
  """The array leaves of ``tree`` (the same in every process) replicated over ``mesh``."""
  replicated = NamedSharding(mesh, P())
  devices = set(mesh.devices.flat)

  def put(leaf):
    on_mesh = isinstance(leaf, jax.Array) and leaf.sharding.device_set == devices
    if on_mesh and leaf.is_fully_replicated:  # e.g. on the one device of a one-device mesh
      return leaf
    copies = [jax.device_put(leaf, device) for device in mesh.local_devices]
    return jax.make_array_from_single_device_arrays(np.shape(leaf), replicated, copies)

  return jax.tree_util.tree_map(put, tree)


def shard_rows(data: np.ndarray, indices: np.ndarray, mesh: Mesh, axis: int = 0) -> jax.Array:
  """The global array ``data[indices]``, split along ``axis`` of ``indices`` over a 1-D mesh;
  every process holds all of ``data`` [N, ...] and gathers only its own devices' rows."""
  spec = P(*([None] * axis), mesh.axis_names[0])
  shape = indices.shape + data.shape[1:]
  return jax.make_array_from_callback(
    shape, NamedSharding(mesh, spec), lambda index: data[indices[index[: indices.ndim]]]
  )


def to_local(tree: Any) -> Any:
  """Replicated arrays as this process's copy on its first device (no transfer)."""

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


# A device's share of the training data: at most this fraction of its memory, or these
# bytes where it reports no memory size (XLA:CPU).
DEVICE_DATA_FRACTION = 0.25
HOST_DEVICE_DATA_BYTES = 2 << 30


def fits_on_devices(num_bytes: int, mesh: Mesh) -> bool:
  """The one rule for data on the devices: whether each device's share of ``num_bytes`` fits."""
  share = -(-num_bytes // mesh.devices.size)
  limits = [(device.memory_stats() or {}).get("bytes_limit") for device in mesh.local_devices]
  if all(limits):
    return share <= DEVICE_DATA_FRACTION * min(limits)
  return share <= HOST_DEVICE_DATA_BYTES


@functools.cache
def _cast(dtype: Any, sharding: NamedSharding) -> Callable:
  return jax.jit(lambda x: x.astype(dtype), out_shardings=sharding, donate_argnums=0)


def put_rows(data: np.ndarray, mesh: Mesh, dtype: Any = None) -> jax.Array:
  """A host array [N, ...] split by rows over a 1-D mesh (N padded with zero rows to a
  multiple of its size), cast there to ``dtype`` (None: kept)."""
  size, num_rows = mesh.devices.size, data.shape[0]
  padded = -(-num_rows // size) * size
  sharding = NamedSharding(mesh, P(mesh.axis_names[0]))

  def rows(index):
    block = data[index[0]]
    missing = len(range(*index[0].indices(padded))) - block.shape[0]
    return np.pad(block, [(0, missing)] + [(0, 0)] * (block.ndim - 1)) if missing else block

  array = jax.make_array_from_callback((padded, *data.shape[1:]), sharding, rows)
  if dtype is None or array.dtype == dtype:
    return array
  return _cast(np.dtype(dtype), sharding)(array)


def _local_rows(shard, indices, axis_name: str):
  """Inside ``shard_map``: the device's rows of ``indices``, reduce-scattered over the batch."""
  rows = shard.shape[0]
  local = indices - jax.lax.axis_index(axis_name) * rows
  mine = (local >= 0) & (local < rows)
  picked = jnp.take(shard, jnp.clip(local, 0, rows - 1), axis=0)
  picked = jnp.where(mine.reshape(mine.shape + (1,) * (shard.ndim - 1)), picked, 0)
  # Exactly one device holds each row: the sum adds zeros only, so it is exact.
  return jax.lax.psum_scatter(picked, axis_name, scatter_dimension=indices.ndim - 1, tiled=True)


def gather_rows(data: Any, indices: jax.Array, mesh: Mesh) -> Any:
  """``leaf[indices]`` of every leaf of ``data`` (``put_rows``), split along B, in a jit.
  ``indices`` [..., B] is the same on every device, B a multiple of the mesh size."""
  if mesh.devices.size == 1:
    return jax.tree_util.tree_map(lambda leaf: jnp.take(leaf, indices, axis=0), data)
  (axis,) = mesh.axis_names

  def local(shards, idx):
    return jax.tree_util.tree_map(lambda shard: _local_rows(shard, idx, axis), shards)

  batch_spec = P(*([None] * (indices.ndim - 1)), axis)
  sharded = jax.shard_map(local, mesh=mesh, in_specs=(P(axis), P()), out_specs=batch_spec)
  return sharded(data, indices)


def use_compilation_cache(cache_dir: str) -> None:
  """JAX's persistent compilation cache for a launcher: a rerun skips most of its compiling."""
  jax.config.update("jax_compilation_cache_dir", cache_dir)
  # Every program: JAX caches only those compiling in >= 1 s by default.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  if importlib.util.find_spec("filelock"):  # JAX's size limit needs it
    jax.config.update("jax_compilation_cache_max_size", 2 << 30)  # least recent dropped


MAX_CPU_DEVICES = 8


def one_cpu_device_per_core(num_cores: int, xla_flags: str) -> bool:
  """One JAX CPU device per core (at most ``MAX_CPU_DEVICES``), so chunks score in parallel;
  XLA_FLAGS that set the device count are left alone. False when JAX had already started."""
  if "xla_force_host_platform_device_count" in xla_flags:
    return True
  try:
    jax.config.update("jax_num_cpu_devices", max(1, min(num_cores, MAX_CPU_DEVICES)))
  except RuntimeError:  # JAX already started in this process (e.g. called from Python)
    return False
  return True


def in_garbage_collection(frame) -> bool:
  """Whether ``frame`` runs inside a garbage-collector callback (JAX registers one), where
  Python drops a raised exception: a signal handler must let it end first."""
  callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
  while frame is not None:
    if frame.f_code in callbacks:
      return True
    frame = frame.f_back
  return False


def prefetch(iterator: Iterable[Any], size: int) -> Iterator[Any]:
  """The items of ``iterator``, ``size`` of them made ahead of the one handed out."""
  iterator, ahead = iter(iterator), collections.deque()
  for item in iterator:
    ahead.append(item)
    if len(ahead) > size:
      yield ahead.popleft()
  while ahead:
    yield ahead.popleft()
