"""The Java check's rules, against hand-written ``java -version`` outputs (no process is started)."""
import pytest

from mpca.errors import UserError
from mpca.runtime.java import java_binary, java_major, required_java


@pytest.mark.parametrize("output, major", [
    ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment (build 17.0.15+6)', 17),
    ('java version "1.8.0_392"\nJava(TM) SE Runtime Environment (build 1.8.0_392-b08)', 8),
    ('openjdk version "11.0.21" 2023-10-17', 11),
    ('openjdk version "21" 2023-09-19', 21),
    ('openjdk version "25-ea" 2025-09-16', 25),
    ("Error: could not find libjava.so", None),
])
def test_java_major_reads_both_version_schemes(output, major):
    assert java_major(output) == major


@pytest.mark.parametrize("pyspark, need", [("4.3.0", 17), ("4.0.1", 17), ("3.5.9", 8), ("3.5.0", 8)])
def test_spark_4_needs_java_17_and_spark_3_5_java_8(pyspark, need):
    assert required_java(pyspark) == need


def test_java_binary_follows_spark_class(tmp_path):
    with pytest.raises(UserError, match="JAVA_HOME='/nonexistent' has no executable bin/java"):
        java_binary("/nonexistent", path_lookup=lambda _: "/usr/bin/java")  # JAVA_HOME wins over PATH
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").write_text("")  # present, not executable
    with pytest.raises(UserError, match="no executable bin/java"):
        java_binary(str(tmp_path))
    with pytest.raises(UserError, match="no Java found"):
        java_binary(None, path_lookup=lambda _: None)
    assert java_binary(None, path_lookup=lambda _: "/opt/j/bin/java") == ("/opt/j/bin/java", "PATH")
