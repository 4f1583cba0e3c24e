"""Fast tests of trainer.resize: the per-replica batch from the global batch, the resume point of a
backup written by another shape of cluster, and the record kept beside the backup."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainer import cli, resize
from trainer.cluster import TaskInfo
from trainer.resize import Keeper, Record, RecordError, Shape

pytestmark = pytest.mark.unit

THREE = Shape(workers=3, replicas=3, global_batch=96, steps_per_epoch=14)
TWO = Shape(workers=2, replicas=2, global_batch=96, steps_per_epoch=14)


@pytest.mark.parametrize("global_batch, replicas, expected", [
    (96, 3, (32, 96)), (96, 2, (48, 96)), (192, 2, (96, 192)),
    (100, 3, (33, 99)),     # 33.3: rounded down
    (101, 2, (51, 102)),    # 50.5: halves round up
    (2, 3, (1, 3)),         # never below 1 per replica
    (7, 1, (7, 7)),
])
def test_the_per_replica_batch_is_the_global_batch_shared_out_and_rounded(global_batch, replicas, expected):
    assert resize.split_batch(global_batch, replicas) == expected


def test_a_global_batch_that_does_not_divide_is_said_in_one_line():
    assert resize.uneven_note(96, 3) is None
    assert resize.uneven_note(100, 3) == ("the global batch 100 does not divide among 3 replicas: "
                                          "33 per replica, a global batch of 99 in this attempt")


def test_the_global_batch_is_the_option_else_the_recorded_one_else_the_first_attempts():
    record = Record(96, (THREE,))
    assert resize.target_global_batch(None, 32, 3, None) == 96      # the first attempt: as before
    assert resize.target_global_batch(None, 32, 2, record) == 96    # later attempts keep it
    assert resize.target_global_batch(128, 32, 2, record) == 128    # --global-batch names it


@pytest.mark.parametrize("epoch, steps_done, expected", [
    (2, 5, (2, 5)),      # mid-epoch, same shape: right after the saved step
    (2, 14, (3, 0)),     # after the epoch's last step: the next epoch
    (3, 0, (3, 0)),
])
def test_a_backup_of_the_same_shape_resumes_where_it_was_taken(epoch, steps_done, expected):
    assert resize.resume_point(epoch, steps_done, Record(96, (TWO,)), TWO) == expected
    assert resize.resume_point(epoch, steps_done, None, TWO) == expected  # no record: as before


@pytest.mark.parametrize("epoch, steps_done, expected", [
    (2, 5, (2, 0)),      # mid-epoch: the start of that epoch, not step 5 of another size
    (2, 13, (2, 0)),
    (2, 14, (3, 0)),     # a finished epoch is finished whatever the shape
    (3, 0, (3, 0)),
])
def test_a_backup_of_another_worker_count_resumes_at_the_start_of_its_epoch(epoch, steps_done, expected):
    assert resize.resume_point(epoch, steps_done, Record(96, (THREE,)), TWO) == expected


def test_another_global_batch_or_replica_count_with_the_same_workers_also_resumes_at_the_epochs_start():
    gpus = Shape(workers=2, replicas=4, global_batch=96, steps_per_epoch=14)
    assert resize.resume_point(1, 7, Record(96, (TWO,)), gpus) == (1, 0)
    bigger = Shape(workers=2, replicas=2, global_batch=128, steps_per_epoch=10)
    assert resize.resume_point(1, 7, Record(96, (TWO,)), bigger) == (1, 0)
    # An epoch of the old shape's 14 steps was finished although the new shape's has 10.
    assert resize.resume_point(1, 12, Record(96, (TWO,)), bigger) == (1, 0)
    assert resize.resume_point(1, 14, Record(96, (TWO,)), bigger) == (2, 0)


def test_a_record_naming_two_shapes_repeats_an_epoch_in_doubt():
    # Written around a resized attempt's first backup: either shape may have written the backup.
    shorter = Shape(workers=3, replicas=3, global_batch=99, steps_per_epoch=13)
    record = Record(96, (shorter, TWO))
    assert resize.resume_point(4, 13, record, TWO) == (4, 0)
    assert resize.resume_point(4, 14, record, TWO) == (5, 0)


def test_the_resize_line_names_both_worker_counts_the_epoch_and_the_batches():
    record = Record(192, (Shape(3, 3, 192, 7),))
    assert resize.resize_note(record, Shape(2, 2, 192, 7), 3) == (
        "the backup was written by 3 workers, this attempt has 2: resuming at the start of epoch 4 "
        "with the same global batch 192 (96 per replica)")
    assert resize.resize_note(Record(100, (Shape(2, 2, 100, 13),)), Shape(3, 3, 99, 13), 0) == (
        "the backup was written by 2 workers, this attempt has 3: resuming at the start of epoch 1 "
        "with a global batch of 99 (33 per replica; it was 100)")
    assert resize.resize_note(Record(96, (Shape(1, 2, 96, 14),)), Shape(1, 1, 96, 14), 0).startswith(
        "the backup was written by 2 replicas, this attempt has 1:")


def test_the_record_is_written_whole_and_read_back(tmp_path):
    assert resize.read_record(str(tmp_path)) is None
    record = Record(96, (THREE, TWO))
    resize.write_record(str(tmp_path), record)
    assert resize.read_record(str(tmp_path)) == record
    assert [p.name for p in (tmp_path / "chief").iterdir()] == ["trainer-shape.json"]


@pytest.mark.parametrize("text, fragment", [
    ("{", "not valid JSON"),
    ("[]", "expected a JSON object"),
    ('{"global_batch": 0, "written_by": []}', "global_batch: expected a positive integer, got 0"),
    ('{"global_batch": 96, "written_by": []}', "written_by: expected a non-empty list"),
    ('{"global_batch": 96, "written_by": [{"workers": 3}]}', "written_by[0]: replicas: expected a positive"),
    ('{"global_batch": true, "written_by": [1]}', "global_batch: expected a positive integer, got True"),
])
def test_a_bad_record_is_named_with_its_field(tmp_path, text, fragment):
    (tmp_path / "chief").mkdir()
    (tmp_path / "chief" / "trainer-shape.json").write_text(text)
    with pytest.raises(RecordError) as error:
        resize.read_record(str(tmp_path))
    assert str(error.value).startswith(str(tmp_path / "chief" / "trainer-shape.json") + ": ")
    assert fragment in str(error.value)


def test_the_chief_records_the_first_attempt_and_a_new_shape_around_its_first_backup(tmp_path):
    folder = str(tmp_path)
    first = Keeper(folder, None, 96, THREE, writes=True)
    first.start()
    assert resize.read_record(folder) == Record(96, (THREE,))
    # A worker of the next attempt only reads.
    Keeper(folder, Record(96, (THREE,)), 96, TWO, writes=False).before_backup()
    assert resize.read_record(folder) == Record(96, (THREE,))
    chief = Keeper(folder, Record(96, (THREE,)), 96, TWO, writes=True)
    chief.start()  # a record exists: nothing to write before training
    assert resize.read_record(folder) == Record(96, (THREE,))
    chief.before_backup()
    assert resize.read_record(folder) == Record(96, (THREE, TWO))
    chief.after_backup()
    assert resize.read_record(folder) == Record(96, (TWO,))
    (tmp_path / "chief" / "trainer-shape.json").unlink()
    chief.before_backup()
    chief.after_backup()  # settled: later backups leave the record alone
    assert resize.read_record(folder) is None


def test_the_keeper_says_nothing_for_a_backup_of_its_own_shape():
    assert Keeper("/nowhere", Record(96, (TWO,)), 96, TWO, writes=False).note(2) is None
    assert Keeper("/nowhere", None, 96, TWO, writes=False).note(2) is None
    assert Keeper("/nowhere", Record(96, (THREE,)), 96, TWO, writes=False).note(2).startswith(
        "the backup was written by 3 workers, this attempt has 2: resuming at the start of epoch 3")


def test_workers_count_the_tasks_that_take_steps():
    assert TaskInfo().num_workers == 1
    assert TaskInfo({"worker": ("a", "b", "c")}, "worker", 0).num_workers == 3
    assert TaskInfo({"chief": ("a",), "worker": ("b",), "evaluator": ("c",)}, "chief", 0).num_workers == 2
    assert TaskInfo({"chief": ("a",), "worker": ("b", "c"), "ps": ("d",)}, "chief", 0).num_workers == 2


def test_global_batch_option():
    assert cli.parse_args([], environ={}).global_batch is None
    assert cli.parse_args(["--global-batch", "192"], environ={}).global_batch == 192


@pytest.mark.parametrize("argv, fragment", [
    (["--global-batch", "0"], "--global-batch: expected a positive integer, got 0"),
    (["--global-batch", "96", "--batch-per-worker", "16"], "not allowed with argument"),
])
def test_a_bad_global_batch_is_one_line_and_exit_2(argv, fragment):
    result = subprocess.run([sys.executable, "-c", "from trainer import cli; cli.parse_args()", *argv],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and fragment in result.stderr, result.stderr
