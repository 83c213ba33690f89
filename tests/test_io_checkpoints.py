"""Tests for top1_jax.io.checkpoints: round trips and the refusals that name the mismatch."""

import errno
import json
import logging
import os
import shutil

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from etils import epath
from toy_data import gaussian_blobs

from top1_jax.engine import models, train
from top1_jax.io import checkpoints


def _assert_trees_equal(a, b):
  jax.tree_util.tree_map(np.testing.assert_array_equal, a, b)


_MLP = models.MLP(num_classes=4, hidden_sizes=(16,))
_TX = optax.adam(1e-2)


@pytest.mark.slow  # trains an ensemble
def test_checkpoint_round_trip_of_an_ensemble_and_refusals(tmp_path):
  images, labels = gaussian_blobs()
  ensemble = train.init_ensemble(_MLP, _TX, jax.random.key(0), images[:1], ensemble_size=2)
  ensemble = train.fit_ensemble(
    ensemble, images, labels, jax.random.key(1), num_steps=3, batch_size=16
  )
  path = checkpoints.save_checkpoint(tmp_path / "ensemble", ensemble)
  fresh = train.init_ensemble(_MLP, _TX, jax.random.key(9), images[:1], ensemble_size=2)
  restored = checkpoints.restore_checkpoint(path, fresh)
  _assert_trees_equal(restored.params, ensemble.params)
  _assert_trees_equal(restored.opt_state, ensemble.opt_state)
  np.testing.assert_array_equal(restored.step, [3, 3])

  with pytest.raises(ValueError, match="directory"):
    checkpoints.save_checkpoint(path, ensemble)
  checkpoints.save_checkpoint(path, restored, overwrite=True)

  other_width = models.MLP(num_classes=4, hidden_sizes=(17,))
  template = train.init_ensemble(other_width, _TX, jax.random.key(0), images[:1], ensemble_size=2)
  with pytest.raises(ValueError, match=r"architecture mismatch.*hidden_sizes"):
    checkpoints.restore_checkpoint(path, template)
  cnn = train.create_train_state(
    models.CNN(num_classes=4), _TX, jax.random.key(0), np.zeros((1, 28, 28, 1))
  )
  with pytest.raises(ValueError, match=r"architecture mismatch.*class"):
    checkpoints.restore_checkpoint(path, cnn)
  single = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1])
  with pytest.raises(ValueError, match="holds 2 stacked members"):
    checkpoints.restore_checkpoint(path, single)
  single_path = checkpoints.save_checkpoint(tmp_path / "single", single)
  with pytest.raises(ValueError, match="the template is an ensemble"):
    checkpoints.restore_checkpoint(single_path, fresh)
  three = train.init_ensemble(_MLP, _TX, jax.random.key(0), images[:1], ensemble_size=3)
  with pytest.raises(ValueError, match="parameter shapes differ"):
    checkpoints.restore_checkpoint(path, three)
  with pytest.raises(ValueError, match="directory"):
    checkpoints.restore_checkpoint(tmp_path / "missing", fresh)


@pytest.mark.parametrize("part", ["state", "metadata"])
def test_a_damaged_checkpoint_is_one_value_error(part, tmp_path):
  images, _ = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1])
  path = checkpoints.save_checkpoint(tmp_path / "ckpt", state)
  for file in (path / part).rglob("*"):
    if file.is_file() and file.name != "commit_success.txt":
      file.write_text("garbage")
  with pytest.raises(ValueError, match="is damaged") as info:
    checkpoints.restore_checkpoint(path, state)
  assert "\n" not in str(info.value)


def test_a_missing_manifest_is_reported_before_orbax_reads(tmp_path, capfd):
  images, _ = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1])
  path = checkpoints.save_checkpoint(tmp_path / "ckpt", state)
  (path / "state" / "manifest.ocdbt").unlink()
  with pytest.raises(ValueError, match=r"damaged \(manifest.ocdbt is missing\)"):
    checkpoints.restore_checkpoint(path, state)
  assert "Traceback" not in capfd.readouterr().err


def test_run_checkpoints_keep_the_last_epoch_and_resume(tmp_path):
  images, labels = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1])
  template = train.create_train_state(_MLP, _TX, jax.random.key(9), images[:1])
  later = train.fit(state, images, labels, jax.random.key(1), num_steps=2, batch_size=16)
  directory = epath.Path(tmp_path) / "run"  # epath, as for a gs:// URL
  with checkpoints.RunCheckpoints(directory) as run:
    epoch, restored = run.latest(template)
    assert epoch == 0 and restored is template
    run.save(1, state)
    run.save(2, later)
    with pytest.raises(
      ValueError, match="epoch: expected an integer after the latest saved epoch 2"
    ):
      run.save(2, later)
  assert sorted(p.name for p in directory.iterdir() if p.is_dir()) == ["2"]
  with checkpoints.RunCheckpoints(directory) as run:  # a new run resumes
    epoch, restored = run.latest(template)
    assert epoch == 2 and int(restored.step) == 2
    _assert_trees_equal(restored.params, later.params)
    _assert_trees_equal(restored.opt_state, later.opt_state)
    ensemble = train.init_ensemble(_MLP, _TX, jax.random.key(0), images[:1], ensemble_size=2)
    with pytest.raises(ValueError, match="the template is an ensemble"):
      run.latest(ensemble)  # the same rule as restore_checkpoint
  for file in (tmp_path / "run" / "2" / "state").rglob("*"):
    if file.is_file() and file.name != "commit_success.txt":
      file.write_text("garbage")
  with checkpoints.RunCheckpoints(directory) as run:  # set aside: trained again from scratch
    assert run.latest(template) == (0, template)
  assert sorted(p.name for p in directory.iterdir()) == ["2.damaged"]


def test_a_failed_save_is_one_error_naming_the_folder_and_leaves_no_temporary_folder(
  tmp_path, monkeypatch
):
  # A full disk: orbax's threads printed 3 to 13 tracebacks, the error named no setting
  # (tensorstore's "RESOURCE_EXHAUSTED ... [os_error_code='28']"), *.orbax-checkpoint-tmp
  # folders stayed. Simulated here; tests/test_experiments.py fills a real (tmpfs) disk.
  images, _ = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1])
  template = train.create_train_state(_MLP, _TX, jax.random.key(9), images[:1])
  directory = tmp_path / "run"
  real_save = ocp.CheckpointManager.save
  with checkpoints.RunCheckpoints(directory) as run:
    run.save(1, state)

    def full_disk(manager, step, *args, **kwargs):
      (directory / f"{step}.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
      raise ValueError(f"RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='{error}']")

    monkeypatch.setattr(ocp.CheckpointManager, "save", full_disk)
    for epoch, error in ((2, errno.ENOSPC), (3, errno.EROFS)):
      with pytest.raises(OSError) as info:
        run.save(epoch, state)
      assert info.value.errno == error and info.value.filename == str(directory / str(epoch))
      assert sorted(p.name for p in directory.iterdir()) == ["1"]  # epoch 1 kept, no temp
    monkeypatch.setattr(ocp.CheckpointManager, "save", lambda *a, **k: 1 / 0)
    with pytest.raises(ValueError, match=r"checkpoint .*/4 could not be saved \(ZeroDivision"):
      run.save(4, state)
  monkeypatch.setattr(ocp.CheckpointManager, "save", real_save)
  # A temporary folder that a run left (killed mid-save, or written after the failure by
  # tensorstore's threads) goes when the next run opens the folder.
  (directory / "5.orbax-checkpoint-tmp" / "state").mkdir(parents=True)
  with checkpoints.RunCheckpoints(directory) as run:
    assert sorted(p.name for p in directory.iterdir()) == ["1"]
    assert run.latest(template)[0] == 1


def test_run_checkpoints_read_the_epoch_folders_of_save_checkpoint(tmp_path):
  images, _ = gaussian_blobs()
  state = train.create_train_state(_MLP, _TX, jax.random.key(0), images[:1])
  template = train.create_train_state(_MLP, _TX, jax.random.key(9), images[:1])
  checkpoints.save_checkpoint(tmp_path / "epoch_2", state)
  checkpoints.save_checkpoint(tmp_path / "epoch_3", state)
  (tmp_path / "config.json").write_text("{}")  # a launcher's file beside them
  with checkpoints.RunCheckpoints(tmp_path) as run:
    epoch, restored = run.latest(template)
    assert epoch == 3
    _assert_trees_equal(restored.params, state.params)
    run.save(4, restored)
    assert run.latest(template)[0] == 4
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "epoch_7").mkdir()  # a folder that is no checkpoint
  with checkpoints.RunCheckpoints(tmp_path / "other") as run:
    assert run.latest(template) == (0, template)  # set aside, as a damaged checkpoint is
  assert [p.name for p in (tmp_path / "other").iterdir()] == ["epoch_7.damaged"]


# ----------------------------------------------------------------------------
# A damaged checkpoint is set aside and its epoch retrained. None of 14 damaged
# checkpoints had been: each rerun exited 1 with the work dir stuck, some after a
# 200-line orbax traceback, two blaming the wrong thing ("logits: 20000 non-finite
# values" from a flipped byte, "Out of range float values are not JSON compliant").

# Wide enough that orbax keeps the kernel's bytes in a data file of their own, where
# nothing but the CRC-32 saved beside them notices a flipped byte.
_WIDE = models.MLP(num_classes=4, hidden_sizes=(64,))
_SAMPLE = gaussian_blobs()[0][:1]


def _largest_file(folder):
  return max((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _flip_at(data: bytes, at: int) -> bytes:
  return data[:at] + bytes([data[at] ^ 0x40]) + data[at + 1 :]


def _cut_at(data: bytes, at: int) -> bytes:
  return data[:at]


def _damage_array(checkpoint, saved, change):
  """``change(bytes, offset)`` inside every stored copy of a saved array's first 16 values:
  where orbax puts an array varies from save to save, and it keeps copies a restore never
  reads (a byte flipped there is no damage). Its compressor stores these as they are."""
  raw = np.asarray(saved.params["Dense_0"]["bias"]).tobytes()[:64]
  found = 0
  for path in (p for p in (checkpoint / "state").rglob("*") if p.is_file()):
    data = path.read_bytes()
    if (at := data.find(raw)) >= 0:
      path.write_bytes(change(data, at + len(raw) // 2))
      found += 1
  assert found, "the array's bytes are not stored as they are"


def _rewrite(path, change):
  path.write_bytes(change(path.read_bytes()))


def _remove_state_files(checkpoint):
  for part in (checkpoint / "state").iterdir():
    shutil.rmtree(part) if part.is_dir() else part.unlink()


_DAMAGE = {
  "a flipped byte in the array data": (
    lambda c, saved: _damage_array(c, saved, _flip_at),
    "CRC-32|DATA_LOSS",  # ours, or tensorstore's own check where a block has one
  ),
  "a flipped byte in the metadata": (  # its JSON
    lambda c, _: _rewrite(c / "metadata" / "metadata", lambda b: _flip_at(b, b.index(b":"))),
    "Decode",
  ),
  "a flipped byte in an array's name": (  # the CRC-32 table's last (after the shapes')
    lambda c, _: _rewrite(c / "metadata" / "metadata", lambda b: _flip_at(b, b.rindex(b"['") + 2)),
    "CRC-32 table",
  ),
  "truncated array data": (lambda c, saved: _damage_array(c, saved, _cut_at), "rror"),
  "truncated array metadata": (
    lambda c, _: _rewrite(c / "state" / "_METADATA", lambda b: b[:100]),
    "JSONDecodeError",
  ),
  "empty array data": (lambda c, _: _rewrite(_largest_file(c / "state"), lambda b: b""), "rror"),
  "garbage metadata": (lambda c, _: (c / "metadata" / "metadata").write_text("garbage"), "JSON"),
  "metadata of something else": (
    lambda c, _: (c / "metadata" / "metadata").write_text('{"a": 1}'),
    "not a top1_jax checkpoint",
  ),
  "no manifest": (
    lambda c, _: (c / "state" / "manifest.ocdbt").unlink(),
    "manifest.ocdbt is missing",
  ),
  "an empty state folder": (lambda c, _: _remove_state_files(c), "rror"),
  "the state folder deleted": (lambda c, _: shutil.rmtree(c / "state"), "no metadata/ and state/"),
  "the metadata folder deleted": (lambda c, _: shutil.rmtree(c / "metadata"), "no metadata/ and"),
  "a FIFO for the metadata": (
    lambda c, _: ((c / "metadata" / "metadata").unlink(), os.mkfifo(c / "metadata" / "metadata")),
    "metadata/metadata is not a regular file",
  ),
  "a link to /dev/zero for the array data": (
    lambda c, _: (
      _largest_file(c / "state").unlink(),
      (c / "state" / "zero").symlink_to("/dev/zero"),
    ),
    "state/zero is not a regular file",
  ),
}


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
  """A run's checkpoint folder holding epochs 1 (kept by a second manager) and 2, and the
  states saved there."""
  images, labels = gaussian_blobs()
  first = train.create_train_state(_WIDE, _TX, jax.random.key(0), images[:1])
  second = train.fit(first, images, labels, jax.random.key(1), num_steps=2, batch_size=16)
  folder = tmp_path_factory.mktemp("run") / "checkpoints"
  with checkpoints.RunCheckpoints(folder) as run:
    run.save(1, first)
    shutil.copytree(folder / "1", folder.parent / "kept")
    run.save(2, second)
  shutil.copytree(folder.parent / "kept", folder / "1")  # as a run killed before deleting 1
  return folder, first, second


def _copy(saved_run, tmp_path, epochs=("1", "2")):
  folder = tmp_path / "checkpoints"
  folder.mkdir()
  for epoch in epochs:
    shutil.copytree(saved_run[0] / epoch, folder / epoch)
  return folder


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_a_damaged_checkpoint_is_set_aside_and_its_epoch_trained_again(
  saved_run, tmp_path, damage, caplog
):
  _, first, second = saved_run
  template = train.create_train_state(_WIDE, _TX, jax.random.key(9), _SAMPLE)
  folder = _copy(saved_run, tmp_path, epochs=("2",))
  damage_files, why = _DAMAGE[damage]
  damage_files(folder / "2", second)
  with checkpoints.RunCheckpoints(folder) as run, caplog.at_level(logging.WARNING):
    epoch, state = run.latest(template)
    assert (epoch, state) == (0, template)  # nothing else saved: a fresh start
    run.save(1, first)  # the rerun trains on and saves
  (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert warning.startswith(f"checkpoint {folder / '2'} is damaged (")
  assert any(reason in warning for reason in why.split("|")), warning
  assert warning.endswith("; set aside as 2.damaged, and its epoch is trained again")
  assert "\n" not in warning
  assert sorted(p.name for p in folder.iterdir()) == ["1", "2.damaged"]
  with checkpoints.RunCheckpoints(folder) as run:
    assert run.latest(template)[0] == 1


def test_a_failed_reads_report_during_the_restore_is_not_a_second_message(
  saved_run, tmp_path, monkeypatch, caplog
):
  # tensorstore's failed futures report through asyncio ("Task exception was never
  # retrieved") whenever the garbage collector finds them, in a fresh clone's CI during the
  # restore itself: those about this run's checkpoints are dropped, the others shown.
  _, _, second = saved_run
  template = train.create_train_state(_WIDE, _TX, jax.random.key(9), _SAMPLE)
  folder = _copy(saved_run, tmp_path, epochs=("2",))
  _damage_array(folder / "2", second, _cut_at)
  restore = ocp.CheckpointManager.restore

  def restore_and_report(manager, *args, **kwargs):
    report = logging.getLogger("asyncio").error
    report("Task exception was never retrieved\nfuture: <Task exception=ValueError('%s')>", folder)
    report("Task exception was never retrieved elsewhere")
    return restore(manager, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "restore", restore_and_report)
  with checkpoints.RunCheckpoints(folder) as run, caplog.at_level(logging.WARNING):
    assert run.latest(template)[0] == 0
  messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  assert "Task exception was never retrieved elsewhere" in messages  # others' are shown
  (ours,) = [message for message in messages if str(folder) in message]
  assert "is damaged" in ours


def test_the_checkpoint_before_a_damaged_one_is_resumed_and_each_damage_kept(saved_run, tmp_path):
  _, first, _ = saved_run
  template = train.create_train_state(_WIDE, _TX, jax.random.key(9), _SAMPLE)
  folder = _copy(saved_run, tmp_path)
  _damage_array(folder / "2", saved_run[2], _flip_at)
  with checkpoints.RunCheckpoints(folder) as run:
    epoch, state = run.latest(template)
    assert epoch == 1
    _assert_trees_equal(state.params, first.params)
    _assert_trees_equal(state.opt_state, first.opt_state)
  (folder / "2.damaged").rename(folder / "2")  # damaged again: both are kept
  shutil.copytree(folder / "2", folder / "3")
  with checkpoints.RunCheckpoints(folder) as run:
    assert run.latest(template)[0] == 1
  assert sorted(p.name for p in folder.iterdir()) == ["1", "2.damaged", "3.damaged"]


def test_arrays_that_are_not_finite_are_damage(saved_run, tmp_path, caplog):
  # A NaN where the CRC-32 cannot tell (a checkpoint written before they were saved).
  _, first, _ = saved_run
  template = train.create_train_state(_WIDE, _TX, jax.random.key(9), _SAMPLE)
  broken = first.replace(params=jax.tree.map(lambda x: x.at[0].set(np.nan), first.params))
  with checkpoints.RunCheckpoints(tmp_path) as run:
    run.save(1, broken)
  metadata = tmp_path / "1" / "metadata" / "metadata"
  saved = json.loads(metadata.read_text())
  del saved["crc32"]
  metadata.write_text(json.dumps(saved))
  with checkpoints.RunCheckpoints(tmp_path) as run, caplog.at_level(logging.WARNING):
    assert run.latest(template) == (0, template)
  assert "holds NaN or infinite values" in caplog.records[-1].getMessage()
  with pytest.raises(checkpoints.DamagedCheckpointError, match="holds NaN or infinite"):
    checkpoints.restore_checkpoint(tmp_path / "1.damaged", template)


def test_a_checkpoint_saved_without_crc32s_still_restores(saved_run, tmp_path):
  _, first, _ = saved_run
  template = train.create_train_state(_WIDE, _TX, jax.random.key(9), _SAMPLE)
  folder = _copy(saved_run, tmp_path, epochs=("1",))
  metadata = folder / "1" / "metadata" / "metadata"
  saved = json.loads(metadata.read_text())
  assert set(saved["crc32"]) == set(_crc_paths(first))
  del saved["crc32"]
  metadata.write_text(json.dumps(saved))
  with checkpoints.RunCheckpoints(folder) as run:
    epoch, state = run.latest(template)
  assert epoch == 1
  _assert_trees_equal(state.params, first.params)


def _crc_paths(state):
  arrays = {"step": state.step, "params": state.params, "model_state": state.model_state}
  arrays["opt_state"] = state.opt_state
  return [jax.tree_util.keystr(path) for path, _ in jax.tree_util.tree_flatten_with_path(arrays)[0]]


def test_a_mismatch_is_still_refused_not_set_aside(saved_run, tmp_path):
  folder = _copy(saved_run, tmp_path, epochs=("1",))
  three = train.init_ensemble(_WIDE, _TX, jax.random.key(0), _SAMPLE, ensemble_size=3)
  with checkpoints.RunCheckpoints(folder) as run:
    with pytest.raises(ValueError, match="the template is an ensemble"):
      run.latest(three)
  assert [p.name for p in folder.iterdir()] == ["1"]
