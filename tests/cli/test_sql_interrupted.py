"""Trial EP: Ctrl-C on ``tinystore sql --write`` printed click's "Aborted!" (exit 1) while the write went on in the
server and committed. It says so now, and exits 130 (128 + SIGINT), as a shell's interrupted command does."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from ..helpers import ServerProcess
from .support import popen_cli, run_cli

LONG_INSERT = (
    "insert into big select x from (with recursive c(x) as (select 1 union all select x + 1 from c "
    "where x < 6000000) select x from c)"
)


def test_ctrl_c_on_a_write_says_it_goes_on_in_the_server(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    server = ServerProcess(directory).start()
    try:
        made = run_cli("sql", str(directory), "create table big (x)", "--write", "--create", "--db", "app")
        assert made.returncode == 0, made.stderr
        proc = popen_cli("sql", str(directory), "--db", "app", LONG_INSERT, "--write", stderr=-1, stdout=-1)
        time.sleep(1.5)  # sent, and running in the server
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert b"interrupted: the write was sent, and Ctrl-C does not stop a write" in err, err
        assert b"Aborted" not in err
        assert server.proc is not None and server.proc.poll() is None
    finally:
        server.stop()
