"""Tests for top1_jax.io.checkpoints: round trips and the refusals that name the mismatch."""

import errno

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
  with checkpoints.RunCheckpoints(directory) as run:
    with pytest.raises(ValueError, match="is damaged"):
      run.latest(template)


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
    with pytest.raises(ValueError, match=r"no checkpoint at .*epoch_7 \(no metadata/ and state/"):
      run.latest(template)
