"""bench/instructions.py counts two revisions' instructions a message under valgrind's callgrind. Its figures are
not checked here (they belong to bench/); that it runs both revisions, subtracts the setup and tells more work
from less is, on lmdb with a few hundred messages."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import instructions  # noqa: E402  (bench/ is not a package)


def test_a_rows_count_is_its_work_over_the_messages_its_setup_taken_off() -> None:
    assert instructions.per_message(setup=1_000_000, full=4_000_000, messages=1000) == 3000
    args = instructions.parse_args(["HEAD", ".", "--store", "lmdb", "--rows", "drain1, batched"])
    assert args.rows == ["drain1", "batched"] and args.base == "HEAD" and args.head == "."


def test_an_unknown_row_or_too_few_messages_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, says in ((["--rows", "drain9"], "unknown row(s) drain9"), (["--messages", "10"], "at least 100")):
        with pytest.raises(SystemExit) as exited:
            instructions.parse_args(argv)
        assert exited.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (Debian: apt-get install valgrind)")
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the repository's git history")
def test_two_revisions_are_counted_under_callgrind_and_the_extra_work_shows(tmp_path: Path) -> None:
    """The same revision twice counts the same within a few percent; a row that does more work a message (drain8's
    threads and prefetch against drain1) counts more: the count tells work apart."""
    done = subprocess.run([sys.executable, "bench/instructions.py", "HEAD", ".", "--store", "lmdb", "--rows",
                           "drain1,publish_many", "--messages", "400", "--json", "--keep", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    rows = {r["row"]: r for r in result["rows"]}
    assert set(rows) == {"drain1", "publish_many"} and result["store"] == "lmdb"
    for row in rows.values():
        assert row["base"] > 0 and row["head"] > 0
        assert 0.9 < row["ratio"] < 1.1, row  # (one library, counted twice)
    # publishing a thousand a call costs a message far less than a fire and an ack each
    assert rows["publish_many"]["head"] < rows["drain1"]["head"] / 2, rows
    assert sorted(p.name for p in tmp_path.glob("callgrind.*")) == sorted(
        f"callgrind.{side}.{row}.{phase}" for side in ("base", "head") for row in rows for phase in ("setup", "full"))
