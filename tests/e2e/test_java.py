"""The Java mistakes of Spark hosts through ``mpca train``: one line, exit 2, before Spark starts (a stand-in
``java`` script plays an old Java)."""
import os
import time

import pytest

from mpca.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fake_java_home(tmp_path, version_line: str) -> str:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(0o755)
    return str(home)


def _one_too_old() -> str:
    """``java -version``'s first line for the Java just below what the installed pyspark needs (16 for Spark
    4, 7 in the old "1.7" scheme for Spark 3.5)."""
    import pyspark

    from mpca.runtime.java import required_java

    need = required_java(pyspark.__version__)
    return f'openjdk version "{need - 1}.0.2" 2021-01-19' if need > 9 else f'java version "1.{need - 1}.0_80"'


CASES = {
    "JAVA_HOME without bin/java": (lambda tmp: {"JAVA_HOME": "/nonexistent"},
                                   "JAVA_HOME='/nonexistent' has no executable bin/java"),
    "no java at all": (lambda tmp: {"JAVA_HOME": None, "PATH": str(tmp)}, "no Java found"),
    "Java older than pyspark needs": (lambda tmp: {"JAVA_HOME": _fake_java_home(tmp, _one_too_old())},
                                      "but pyspark"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_java_mistakes_are_one_line_exit_2(tmp_path, monkeypatch, capsys, case):
    from pyspark.sql import SparkSession

    env, expected = CASES[case]
    for k, v in env(tmp_path).items():
        monkeypatch.delenv(k, raising=False) if v is None else monkeypatch.setenv(k, v)
    monkeypatch.chdir(ROOT)
    t0 = time.time()
    code = main(["train", "-c", "conf/digits.yaml", f"run.output_dir={tmp_path}/out"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and expected in err, err
    assert time.time() - t0 < 15 and SparkSession.getActiveSession() is None
