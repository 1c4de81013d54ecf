"""For tests and benchmarks: which processes are a control plane's sandboxes, a `Runtime`
that runs none, and a `SecretSource` that holds its secrets in a dict (`FakeSecrets`).

`FakeRuntime` passes the same contract suite as `ProcessRuntime`
(tests/node/sandbox/test_runtime_contract.py): `start` refuses a missing directory with an
`OSError`, `pump` hands every byte to `forward` and to the log file and returns once the process has
exited, `wait` returns the exit code, `stop` sends a SIGTERM and a SIGKILL after the grace,
`tail` is the last lines. What a fake process does is a `FakeProgram`, named by the first word
of its command; a test makes one crash with `exit`. A program that `serve_http` answers every
HTTP request with 200 on its `$HOST:$PORT`, so the node agent's probe finds it ready; that
needs the runtime entered (`async with`), whose task group runs the listeners. Fake pids lie
above Linux's `pid_max`, so no signal ever reaches a real process by mistake.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import anyio
import anyio.abc

from wakeful.node.jail.bwrap import SLOT_MARK, SLOT_PROGRAM
from wakeful.node.jail.jailed import descendants
from wakeful.node.sandbox.output import RECENT_BYTES, tail_of
from wakeful.node.sandbox.runtime import UNNAMED, Identity, ImageRun, Runtime
from wakeful.node.sandbox.workdir import Packed, fill_workdir
from wakeful.node.secrets import SecretSource

FIRST_FAKE_PID = 10_000_000
"""Above Linux's largest `pid_max` (2**22)."""


def sandbox_pids(data_dir: Path) -> list[int]:
    """Every process of `data_dir`'s sandboxes (Linux /proc): unisolated ones by their working
    directory; isolated ones are bwrap processes whose command names a sandbox directory,
    and everything under them, unless that is an idle warm slot (`idle_slot`)."""
    root = str((data_dir / "sandboxes").resolve())
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "cwd").startswith(root):
                found.add(int(entry.name))
            elif root + "/" in _command(int(entry.name)):
                tree = [int(entry.name), *descendants(int(entry.name))]
                if not any(idle_slot(_argv(pid)) for pid in tree):
                    found.update(tree)
        except OSError:
            continue
    return sorted(found)


def process_states(pids: Sequence[int]) -> set[str]:
    """The scheduler states (`R`, `S`, `T` for stopped, ...) of those of `pids` still alive."""
    found = set()
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        found.add(next(line.split()[1] for line in status.splitlines() if line[:6] == "State:"))
    return found


def idle_slot(argv: Sequence[str]) -> bool:
    """`argv` is the slot program of an idle warm slot (`Jail.slot_command`): a Python run with
    `-I -S` on `SLOT_PROGRAM` and `SLOT_MARK`. Not bwrap nor the namespace's init, whose own
    command lines end with those words, and not the app a slot became (its exec replaced them)."""
    return list(argv[1:5]) == ["-I", "-S", SLOT_PROGRAM, SLOT_MARK]


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def _command(pid: int) -> str:
    return " ".join(_argv(pid))


def app_pids(data_dir: Path, marker: str) -> list[int]:
    """The sandbox processes of `data_dir` whose command line contains `marker` (host pids)."""
    found = []
    for pid in sandbox_pids(data_dir):
        command = _command(pid)
        if marker in command and "bwrap" not in command:
            found.append(pid)
    return found


@dataclass(frozen=True)
class FakeProgram:
    output: bytes = b""
    """Written as soon as it starts."""
    exit_code: int | None = None
    """Exits by itself with this code right after its output; None: runs until stopped."""
    on_terminate: int | None = 0
    """The code it exits with on SIGTERM; None: it ignores SIGTERM and is killed after the
    grace (exit code -SIGKILL, as `ProcessRuntime` reports a killed process)."""
    serve_http: bool = False
    """Answers every HTTP request on `$HOST:$PORT` with 200 `fake <pid>` until it exits."""
    answer_after: anyio.Event | None = None
    """With `serve_http`: hold every answer until this is set (a slow boot the test ends)."""


class FakeProcess:
    def __init__(
        self,
        pid: int,
        program: FakeProgram,
        command: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        app_dir: Path | None = None,
    ) -> None:
        self._pid = pid
        self._app_dir = app_dir if app_dir is not None else log_path.with_name("app")
        self.program = program
        self.command = list(command)
        self.env = dict(env)
        self.log_path = log_path
        self.terminated = False
        """A SIGTERM was sent (`stop` was called)."""
        self._pending: list[bytes] = [program.output] if program.output else []
        self._recent = bytearray()
        self._changed = anyio.Event()
        self._exited = anyio.Event()
        self._code: int | None = None
        self._listening = anyio.CancelScope()
        self.frozen = False
        """Frozen by the suspended tier: it answers nothing until thawed."""
        self._thawed = anyio.Event()
        self._thawed.set()
        self.freezes = 0
        """How many times it was frozen."""

    @property
    def pid(self) -> int:
        return self._pid

    async def freeze(self) -> int:
        if self.terminated or self._exited.is_set() or self.frozen:
            return 0
        self.frozen = True
        self.freezes += 1
        self._thawed = anyio.Event()
        return 1 << 20

    async def thaw(self) -> None:
        self.frozen = False
        self._thawed.set()

    def exit(self, code: int) -> None:
        """The process ends with `code` (a crash, when nobody asked it to stop)."""
        if not self._exited.is_set():
            self._code = code
            self._exited.set()
            self._changed.set()
            self._listening.cancel()

    async def pump(self, forward: Callable[[bytes], None] | None = None) -> None:
        while True:
            while self._pending:
                chunk = self._pending.pop(0)
                self._recent += chunk
                del self._recent[: max(0, len(self._recent) - RECENT_BYTES)]
                self._append(chunk)
                if forward is not None:
                    forward(chunk)
            if self._exited.is_set():
                return
            await self._changed.wait()
            self._changed = anyio.Event()

    def _append(self, chunk: bytes) -> None:
        with self.log_path.open("ab") as log:
            log.write(chunk)

    async def wait(self) -> int:
        await self._exited.wait()
        assert self._code is not None
        return self._code

    async def stop(self, grace: float) -> int:
        """SIGTERM, then SIGKILL after `grace` seconds if the program ignores it."""
        self.terminated = True
        await self.thaw()
        if self.program.on_terminate is not None:
            self.exit(self.program.on_terminate)
        with anyio.move_on_after(grace):
            await self._exited.wait()
        self.exit(-signal.SIGKILL)  # a no-op when it has exited
        return await self.wait()

    def tail(self) -> str:
        return tail_of(self._recent)

    def reason(self) -> str | None:
        return None

    def owns_port(self, port: int) -> bool:
        return True

    @property
    def listening(self) -> Callable[[], bool] | None:
        return None

    def settled(self) -> None:
        pass

    @property
    def app_dir(self) -> Path:
        return self._app_dir

    def dispose(self) -> None:
        pass

    async def _serve(self, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        with self._listening:
            async with listener:
                await listener.serve(self._answer)

    async def _answer(self, stream: anyio.abc.SocketStream) -> None:
        await self._thawed.wait()  # frozen: the connection waits in the backlog, as a real one
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                head = b""
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    head += await stream.receive()
                if self.program.answer_after is not None:
                    await self.program.answer_after.wait()
                body = f"fake {self._pid}".encode()
                await stream.send(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                    % (len(body), body)
                )


class FakeRuntime:
    """Starts `FakeProcess`es for the programs it knows; `started` lists them in order."""

    def __init__(self, programs: Mapping[str, FakeProgram] | None = None) -> None:
        self.programs = dict(programs or {})
        self.started: list[FakeProcess] = []
        self.identities: list[Identity] = []
        self.images: list[ImageRun | None] = []
        """The image of every start, in order (None for a directory app)."""
        """What each start was told about its sandbox (id, app, limits), in order."""
        self._next_pid = FIRST_FAKE_PID
        self._exit_stack: contextlib.AsyncExitStack | None = None
        self._tasks: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> FakeRuntime:
        self._exit_stack = contextlib.AsyncExitStack()
        self._tasks = await self._exit_stack.enter_async_context(anyio.create_task_group())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        assert self._exit_stack is not None and self._tasks is not None
        self._tasks.cancel_scope.cancel()  # every listener goes
        stack, self._exit_stack, self._tasks = self._exit_stack, None, None
        return await stack.__aexit__(exc_type, exc, traceback)

    async def start(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        workdir: Path,
        log_path: Path,
        identity: Identity = UNNAMED,
        packed: Packed | None = None,
        image: ImageRun | None = None,
    ) -> FakeProcess:
        """An image app runs as its command says, its image only recorded (`images`)."""
        self.images.append(image)
        if packed is not None:
            fill_workdir(workdir, packed)  # checked and unpacked, as a real start does
        _check_paths(workdir, log_path)
        program = self.programs.get(command[0])
        if program is None:
            raise FileNotFoundError(errno.ENOENT, "no such program", command[0])
        process = FakeProcess(self._next_pid, program, command, env, log_path, workdir)
        self._next_pid += 1
        if program.serve_http:
            if self._tasks is None:
                raise RuntimeError("enter the FakeRuntime (async with) to serve HTTP")
            listener = await anyio.create_tcp_listener(
                local_host=env["HOST"], local_port=int(env["PORT"])
            )
            self._tasks.start_soon(process._serve, listener)
        self.started.append(process)
        self.identities.append(identity)
        if program.exit_code is not None:
            process.exit(program.exit_code)
        return process


class FakeSecrets:
    """A `SecretSource` (`wakeful.node.secrets`): `env` for every sandbox, or `failure` raised
    (an `OSError` for a control plane that cannot answer now, `SecretsRefused` for one that
    refuses). `asked` lists the sandboxes asked for, in order."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(env or {})
        self.failure: Exception | None = None
        self.asked: list[str] = []

    async def env_for(self, sandbox_id: str) -> dict[str, str]:
        self.asked.append(sandbox_id)
        if self.failure is not None:
            raise self.failure
        return dict(self.env)


def _check_paths(workdir: Path, log_path: Path) -> None:
    """As a real start: a missing working directory is an OSError; the log's is made."""
    if not workdir.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such directory", str(workdir))
    log_path.parent.mkdir(parents=True, exist_ok=True)


def _is_a_runtime(fake: FakeRuntime) -> Runtime:
    return fake  # mypy checks that the fake has the interface the agent takes


def _is_a_source(fake: FakeSecrets) -> SecretSource:
    return fake
