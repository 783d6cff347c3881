"""The two locations' commit protocols, each through the one interface: a local folder stages in
`.step-N.tmp` and renames it into place; an object store writes in place and its marker is the commit."""

import uuid

import pytest

from titan_checkpoint import CheckpointCorruptError
from titan_checkpoint.location import LocalFolder, ObjectStorePrefix, as_location

MARKER = "titan_meta.json"


@pytest.fixture(params=["local", "memory"])
def folder(request, tmp_path):
    return as_location(tmp_path if request.param == "local" else f"memory://location-{uuid.uuid4().hex}/")


def test_a_folder_string_becomes_the_location_of_its_kind(tmp_path):
    assert as_location(tmp_path) == LocalFolder(tmp_path) == as_location(f"file://{tmp_path}")
    assert as_location("memory://a/b/") == ObjectStorePrefix("memory://a/b")
    assert str(as_location("memory://a/b").join("step-1")) == "memory://a/b/step-1"


def test_a_save_is_complete_only_once_published_and_discarding_leaves_nothing(folder):
    final = folder.join("step-3")
    final.begin(MARKER)
    staging = final.staging()
    assert staging.name == (".step-3.tmp" if isinstance(folder, LocalFolder) else "step-3")
    staging.join("data").write_json({"x": 1})
    staging.join(MARKER).write_json({})
    final.publish()
    assert final.committed(MARKER) and final.join("data").read_text() == '{\n "x": 1\n}'
    assert sorted(folder.list_dir()) == [("step-3", True)]
    final.discard(MARKER)
    assert folder.list_dir() == []


def test_a_step_folder_without_its_marker_is_unfinished_in_a_store_and_corrupt_on_disk(folder):
    final = folder.join("step-4")
    final.make_dirs()
    final.join("data").write_json({})
    if isinstance(folder, LocalFolder):
        with pytest.raises(CheckpointCorruptError, match="titan_meta.json is missing"):
            final.committed(MARKER)
    else:
        assert not final.committed(MARKER)
