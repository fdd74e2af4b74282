"""The watch: every rank of a multi-rank run beats a heartbeat to one hub, so a rank that dies with
its node is known to the others within seconds, by rank and node, whatever MPI says.

Why not MPI or the pid: a rank on another node cannot be seen by its pid, and MPI says nothing
about a peer that went silent (a crashed machine sends no reset: a collective waits until
``runtime.timeout_s``); a peer whose connection was reset (its process killed, its kernel alive)
makes Open MPI abort the waiting rank at once (exit 14, MPI_ERR_UNKNOWN) before any Python code
runs, so rank 0 cannot even mark its result file. The watch sees both: a connection closed
without a goodbye, or no heartbeat for ``runtime.lost_after_s``.

- :class:`Hub`: a thread with a listening TCP socket. Every rank says ``hello RANK NODE PID
  LOST_AFTER``, then ``beat`` each second; the hub beats back. The first rank lost (connection
  closed without ``done``, or silent) is the verdict: the hub tells every other rank
  (``lost TEXT``) and writes it to its state file. Rank 0 also tells it the result file and
  checkpoint folder it writes (``file OUT CKPT``), so that whoever settles the run knows them.
- :class:`Heartbeat`: a rank's side, a daemon thread; ``lost`` is the verdict the hub sent (or
  the hub's own loss: rank 0's node or the launcher gone), read by ``World._wait`` between polls.
- Where the hub runs: in ``launch/fedmpi-launch`` (``python -m fedmpi.runtime.watch serve``),
  outside the MPI job, so it survives every rank, and after the job ``settle`` marks a result
  file whose rank 0 was killed (``failed``, the lost rank and node named) and records the exit
  code for the launcher. Without it (``FEDMPI_WATCH`` unset: plain ``mpiexec``/``srun``) rank 0
  runs the hub in a thread of its own, and a lost peer is still seen while rank 0 lives.

Exit code 5 (``RankLost``): a rank was lost and the last checkpoint is kept, so a rerun resumes
(slurm/job.sh requeues); 1 instead when the run was lost again before saving a newer checkpoint
than at the previous loss (``lost_checkpoint``), so a loss that repeats is not requeued forever.
Torch-free.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import RankLost

BEAT_S = 1.0  # heartbeat period, both ways
STUCK_S = 60.0  # a rank told of a loss that has not ended by then is stuck in a collective: it leaves (exit 5)


def advertised_host(all_local: bool) -> str:
    """The address other ranks reach this machine at: ``FEDMPI_WATCH_ADDR``, 127.0.0.1 when
    every rank runs on this machine, else this host name's address."""
    env = os.environ.get("FEDMPI_WATCH_ADDR")
    if env:
        return env
    return "127.0.0.1" if all_local else socket.gethostbyname(socket.gethostname())


@dataclass
class _Peer:
    sock: socket.socket
    buf: bytes = b""
    rank: int = -1
    node: str = "?"
    pid: int = 0
    heard: float = field(default_factory=time.monotonic)
    done: bool = False

    def name(self) -> str:
        return f"rank {self.rank} (node {self.node}, pid {self.pid})"


class Hub:
    """The ranks' meeting point for heartbeats (see the module docstring). ``state``: a JSON file
    rewritten at each event that matters after the run (result file, verdict, ranks done)."""

    def __init__(self, host: str = "", state: str | None = None):
        self._listen = socket.create_server((host, 0))
        self._listen.setblocking(False)
        self.port = self._listen.getsockname()[1]
        self.state_path = state
        self.state: dict[str, Any] = {}
        self.lost: str = ""
        self.lost_after = 30.0
        self._peers: dict[socket.socket, _Peer] = {}
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listen, selectors.EVENT_READ)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Hub":
        self._thread = threading.Thread(target=self.serve, name="fedmpi-watch-hub", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Say goodbye to every rank (no loss), stop serving."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * BEAT_S)

    def serve(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=BEAT_S / 4):
                if key.fileobj is self._listen:
                    self._accept()
                else:
                    self._read(self._peers.get(key.fileobj))
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + BEAT_S
                for peer in list(self._peers.values()):
                    self._send(peer, b"beat\n")
            for peer in list(self._peers.values()):
                if not peer.done and now - peer.heard > self.lost_after:
                    self._lose(peer, f"no heartbeat for {now - peer.heard:.0f} s (its node crashed, froze or "
                                     f"was cut off)")
        for peer in list(self._peers.values()):
            self._send(peer, b"bye\n")
            self._drop(peer)
        self._listen.close()

    def _accept(self) -> None:
        try:
            sock, _ = self._listen.accept()
        except OSError:
            return
        sock.setblocking(False)
        self._peers[sock] = _Peer(sock)
        self._sel.register(sock, selectors.EVENT_READ)

    def _read(self, peer: _Peer | None) -> None:
        if peer is None:
            return
        try:
            data = peer.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            if not peer.done and peer.rank >= 0:
                self._lose(peer, "its connection closed without a goodbye (its process or node died)")
            self._drop(peer)
            return
        peer.heard = time.monotonic()
        peer.buf += data
        while b"\n" in peer.buf:
            line, peer.buf = peer.buf.split(b"\n", 1)
            try:
                self._message(peer, line.decode(errors="replace"))
            except ValueError:  # not one of ours: ignored
                pass

    def _message(self, peer: _Peer, line: str) -> None:
        word, _, rest = line.partition(" ")
        if word == "hello":
            rank, node, pid, lost_after = rest.split(" ")
            peer.rank, peer.node, peer.pid, peer.done = int(rank), node, int(pid), False
            self.lost_after = float(lost_after)  # runtime.lost_after_s: the same on every rank
        elif word == "file":
            out, _, ckpt = rest.partition("\t")
            self._save(out=out, checkpoint=ckpt, rank0=peer.name())
        elif word == "closed":
            self._save(out=None)
        elif word == "done":
            peer.done = True
            if peer.rank == 0:
                self._save(rank0_done=True)

    def _lose(self, peer: _Peer, how: str) -> None:
        peer.done = True  # judged once
        if self.lost:
            return
        self.lost = f"lost {peer.name()}: {how}"
        self._save(lost=self.lost, lost_rank=peer.rank, lost_node=peer.node)
        for other in list(self._peers.values()):
            if other is not peer:
                self._send(other, f"lost {self.lost}\n".encode())

    def _send(self, peer: _Peer, data: bytes) -> None:
        try:
            peer.sock.send(data)
        except (BlockingIOError, InterruptedError):
            pass  # a full buffer: that rank is not reading, its heartbeats decide
        except OSError:
            pass  # its read side will tell

    def _drop(self, peer: _Peer) -> None:
        self._peers.pop(peer.sock, None)
        try:
            self._sel.unregister(peer.sock)
        except (KeyError, ValueError):
            pass
        peer.sock.close()

    def _save(self, **changes: Any) -> None:
        self.state.update(changes)
        if self.state_path:
            tmp = f"{self.state_path}.tmp"
            with open(tmp, "w") as fh:
                json.dump(self.state, fh)
            os.replace(tmp, self.state_path)


class Heartbeat:
    """This rank's link to the hub at ``address`` ("host:port"): a daemon thread beats every
    second and reads the hub's words. ``lost``: "" while all is well, else the one line that
    says which rank (and node) was lost, or that the hub itself went away."""

    def __init__(self, address: str, rank: int, node: str, lost_after_s: float):
        host, port = address.rsplit(":", 1)
        self._lost, self._lost_at = "", 0.0
        self.lost_after_s = lost_after_s
        self._sock = socket.create_connection((host, int(port)), timeout=30)
        self._sock.settimeout(None)
        self._lock = threading.Lock()
        self._closing = False
        self._say(f"hello {rank} {node} {os.getpid()} {lost_after_s:g}")
        self._thread = threading.Thread(target=self._run, name="fedmpi-heartbeat", daemon=True)
        self._thread.start()

    def report(self, line: str) -> None:
        """Tell the hub something (``file OUT\\tCKPT``, ``closed``); never raises."""
        self._say(line)

    def close(self) -> None:
        """A controlled end of this rank (any exit code): goodbye, so its closing is no loss."""
        if self._closing:
            return
        self._say("done")
        self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _say(self, line: str) -> None:
        if self._closing:
            return
        with self._lock:
            try:
                self._sock.sendall(f"{line}\n".encode())
            except OSError:
                pass  # the reader sees the hub gone

    @property
    def lost(self) -> str:
        return self._lost

    @lost.setter
    def lost(self, text: str) -> None:
        self._lost, self._lost_at = text, time.monotonic()

    def _leave(self) -> None:
        """The main thread is stuck in a collective that the lost rank will never join (a blocking
        MPI or NCCL call cannot be polled): end this process, so the job ends and the launcher's
        watch settles the result file."""
        print(f"fedmpi: {self._lost}; this rank is stuck in a collective {STUCK_S:g} s later: leaving",
              file=sys.stderr, flush=True)
        os._exit(RankLost.exit_code)

    def _run(self) -> None:
        buf, heard, next_beat = b"", time.monotonic(), 0.0
        sel = selectors.DefaultSelector()
        try:
            sel.register(self._sock, selectors.EVENT_READ)
        except (ValueError, OSError):
            return
        while not self._closing:
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + BEAT_S
                self._say("beat")
            try:
                ready = sel.select(timeout=BEAT_S / 4)
                data = self._sock.recv(4096) if ready else None
            except (OSError, ValueError):
                data = b""
            if self._closing:
                return
            if self.lost and time.monotonic() - self._lost_at > STUCK_S:
                self._leave()
            if data is None:
                if time.monotonic() - heard > self.lost_after_s and not self.lost:
                    self.lost = (f"lost the watch: no word from it for {time.monotonic() - heard:.0f} s (the node of "
                                 f"rank 0 or of the launcher crashed, froze or was cut off)")
                continue
            if not data:
                if not self.lost:
                    self.lost = "lost the watch: its connection closed (rank 0 or the launcher died)"
                return
            heard = time.monotonic()
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                word, _, rest = line.decode(errors="replace").partition(" ")
                if word == "lost" and not self.lost:
                    self.lost = rest
                elif word == "bye":
                    return


# ----------------------------------------------------------------------------- after the job

def checkpoint_round(folder: str) -> int | None:
    """The round of the committed checkpoint in ``folder`` (its manifest), None when none."""
    try:
        with open(os.path.join(folder, "manifest.json")) as fh:
            return int(json.load(fh)["round"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lost_code(previous: Any, checkpoint: int | None) -> int:
    """Exit code of a run that lost a rank: 5 (resumable: requeue), or 1 when its last checkpoint
    is the one it had at the previous loss (``previous``, the file's ``lost_checkpoint``): a loss
    that repeats before any progress must not be requeued forever."""
    if previous is not None and int(previous) == (-1 if checkpoint is None else checkpoint):
        return 1
    return 5


def lost_notes(text: str, checkpoint: int | None, code: int) -> dict[str, Any]:
    """The result file's attributes for a lost rank: ``lost`` (what happened, what is kept)
    and ``lost_checkpoint`` (the round resumable from; -1 when none)."""
    kept = f"the checkpoint of round {checkpoint} is kept" if checkpoint is not None else "no checkpoint yet"
    again = "; lost again before a newer checkpoint: not requeued" if code == 1 else ""
    return {"lost": f"{text}; {kept}{again}", "lost_checkpoint": -1 if checkpoint is None else checkpoint}


def settle(state_path: str, exit_file: str) -> int:
    """After the job, when rank 0 recorded no exit code (it was killed: by MPI after a peer's
    connection reset, by the launcher, by the kernel) but a result file was being written: mark it
    ``failed`` with what the hub saw, and record 5 (or 1) in ``exit_file``. Returns that code, 0
    when there was nothing to settle."""
    try:
        with open(exit_file) as fh:
            if fh.read().strip():
                return 0  # rank 0 ended by itself and said how
    except OSError:
        pass
    try:
        with open(state_path) as fh:
            state = json.load(fh)
    except (OSError, ValueError):
        return 0
    out = state.get("out")
    if not out or state.get("rank0_done"):
        return 0
    text = state.get("lost") or f"lost {state.get('rank0', 'rank 0')}: it ended without finishing (killed)"
    checkpoint = checkpoint_round(state.get("checkpoint") or f"{out}.ckpt")
    code = _mark(out, text, checkpoint)
    if code:
        with open(exit_file, "w") as fh:
            fh.write(f"{code}\n")
        print(f"fedmpi: {text}; {out} marked failed; "
              + (f"resumable from round {checkpoint}" if code == 5 and checkpoint is not None else
                 "restarts from round 0" if code == 5 else "not requeued (lost again at the same checkpoint)"),
              file=sys.stderr)
    return code


def _mark(path: str, text: str, checkpoint: int | None) -> int:
    """Mark a ``running`` result file whose writer is gone; its exit code, 0 when not marked (no
    such file, another process still holds it, or it does not open)."""
    import fcntl

    import h5py

    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as results.hdf5.claim: the writer is gone
        with h5py.File(path, "a", locking=False) as f:
            if f.attrs.get("status") != "running":
                return 0
            code = lost_code(f.attrs.get("lost_checkpoint"), checkpoint)
            f.attrs.update(lost_notes(text, checkpoint, code))
            f.attrs["status"] = "failed"
        return code
    except (OSError, RuntimeError):
        return 0
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    """``serve STATE``: run a hub, print its "host:port" on stdout, serve until stdin closes.
    ``settle STATE EXIT_FILE``: see :func:`settle`."""
    if len(argv) == 2 and argv[0] == "serve":
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):  # the launcher's to act on
            signal.signal(sig, signal.SIG_IGN)
        hub = Hub(state=argv[1])
        hub.start()
        try:
            host = advertised_host(False)
        except OSError:  # this host name does not resolve: only ranks on this machine will reach it
            host = "127.0.0.1"
        print(f"{host}:{hub.port}", flush=True)
        sys.stdin.read()  # until the launcher closes it (or dies)
        hub.close()
        return 0
    if len(argv) == 3 and argv[0] == "settle":
        settle(argv[1], argv[2])
        return 0
    print("usage: python -m fedmpi.runtime.watch serve STATE | settle STATE EXIT_FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
