"""Stores without Spark: the local disk and pyarrow URIs; which URIs are checked before Spark starts."""
import pytest

from mpca import storage
from mpca.errors import UserError


@pytest.mark.parametrize("uri", [False, True])
def test_roundtrip_list_delete(tmp_path, uri):
    loc = f"file://{tmp_path}/d" if uri else str(tmp_path / "d")
    s = storage.open_store(loc)
    assert isinstance(s, storage.ArrowStore if uri else storage.LocalStore)
    s.makedirs()
    s.write_atomic("a.bin", b"\x00\x01")
    s.write_atomic("a.bin", b"\x02")  # replaced whole
    assert s.read("a.bin") == b"\x02" and s.list() == ["a.bin"]
    s.delete("a.bin")
    assert s.list() == []


def test_which_uris_are_checked_before_spark():
    storage.check_location("/any/local/path")  # local: the job checks writability itself
    storage.check_location("s3a://bucket/x")  # a cluster's Hadoop may know it: checked once Spark is up
    storage.check_location("hdfs://nn:8020/x")
    with pytest.raises(UserError, match="unknown scheme 'nosuch'"):
        storage.check_location("nosuch://x/y")
    assert storage.is_uri("dbfs:/mnt/x") and storage.is_uri("s3a://b/k") and not storage.is_uri("runs/x")
