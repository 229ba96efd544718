"""Shared fixtures: a real OpenSSH server on loopback, and the guards that keep every test there.

Safety rule: no test may reach anything outside 127.0.0.0/8 and ::1, least of
all the `gpu` inventory's host. Three layers enforce it:
- in this process, pytest-socket: `connect()` to any other address raises
  before a packet leaves (configured below, so no command line can drop it);
- in Python subprocesses, and in sessions on the test sshd, a generated
  `sitecustomize` that does the same (and refuses DNS names but `localhost`);
- AERIE_TEST_ONLY_LOOPBACK=1, which aerie's SSH transport honours by refusing
  any address that is not loopback, whatever the inventory says.
The user's ~/.ssh, ~/.invoke.yaml and ssh-agent are out of reach: HOME is an
empty directory and SSH_AUTH_SOCK is unset for the whole session.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.session import session_root
from tests.needs import need
from tests.slurm_fixtures import slurm  # noqa: F401 (the session's Slurm cluster, a fixture)
from benchmarks.harness.checkout import Bench, compile_checkout, copy_checkout
from benchmarks.harness.sshd import SshServer, SshServerError, free_port as _free_port, require_openssh, start_server
from remote.control_plane import collector

LOOPBACK_ONLY_ENV = "AERIE_TEST_ONLY_LOOPBACK"
LOOPBACK_HOSTS = "127.0.0.0/8,::1,localhost"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "ftp_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "FTP_PROXY")
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

# NOTE: written out as sitecustomize.py and put first on PYTHONPATH, so that every Python
# started by a test (an `inv` subprocess, a job on the test sshd) carries the guard too.
SUBPROCESS_GUARD = '''\
"""aerie's test guard: this interpreter reaches loopback and Unix sockets only."""
import errno, ipaddress, socket

_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo


def _is_loopback(host):
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return host in (None, "", "localhost")


def _check(sock, address):
    if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(address[0]):
        raise OSError(errno.ENETUNREACH, f"aerie tests reach loopback only, not {address[0]}")


def _guarded_connect(self, address):
    _check(self, address)
    return _connect(self, address)


def _guarded_connect_ex(self, address):
    _check(self, address)
    return _connect_ex(self, address)


def _is_address(host):
    try:
        return bool(ipaddress.ip_address(str(host).split("%")[0]))
    except ValueError:
        return False


def _guarded_getaddrinfo(host, *args, **kwargs):
    host = host.decode() if isinstance(host, bytes) else host
    if not (_is_address(host) or _is_loopback(host)):  # addresses are checked on connect
        raise socket.gaierror(socket.EAI_NONAME, f"aerie tests resolve loopback names only, not {host}")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _guarded_connect
socket.socket.connect_ex = _guarded_connect_ex
socket.getaddrinfo = _guarded_getaddrinfo
'''


#: Fixtures that build or run a real model (torch, transformers): a test that needs one is end-to-end.
MODEL_FIXTURES = frozenset({"tiny_target", "demo_target", "extracted", "kimi_target", "kimi_extracted", "trained"})


#: Session services a worker starts on first use (`tests.helpers.session.built_once`): the tests that use one
#: share a worker, so that the suite starts each once, not once per worker.
SERVICES = {"slurm": "slurm-cluster", "sglang": "sglang-0.5.23", "live_server": "transformers-serve"}


# NOTE: tryfirst: before `-m` deselects (the unit tier, `-m "not e2e"`, runs in under a minute) and before
# xdist names the groups.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    for item, group in worker_groups(items).items():
        item.add_marker(pytest.mark.xdist_group(group))
    # The slowest first: on two cores a long end-to-end test started last would run on alone.
    items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported frozen: it lives as long as the process, and no full collection need walk it
    again. In an xdist worker: fail at once where a group would be ignored (pytest 9.2 with pytest-xdist 3.8
    drops the group from the test's id, and the tests of a group are then spread over every worker, silently)."""
    gc.freeze()
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist ignores the xdist_group of {len(lost)} test(s) (e.g. {lost[0]}) with "
                                f"pytest {pytest.__version__}: install pyproject's pinned pytest (.ci/setup)")


def worker_groups(items: list[pytest.Item]) -> dict[pytest.Item, str]:
    """The worker group of each test that has none of its own: the tests that use a service (`SERVICES`) share
    a worker, and so do those that use a module-scoped fixture (their module's name, or the one service the
    module's tests use), so that the fixture is built once, not once per worker that draws one of the module's
    tests, nor again each time that worker comes back to the module."""
    mine = [item for item in items if item.get_closest_marker("xdist_group") is None]
    service = {item: _service(item) for item in mine}
    services: dict[str, set[str]] = {}
    for item, used in service.items():
        if used:
            services.setdefault(item.nodeid.split("::")[0], set()).add(used)
    groups = {}
    for item in mine:
        module = item.nodeid.split("::")[0]
        if _uses_a_module_fixture(item):
            shared = services.get(module, set())
            groups[item] = next(iter(shared)) if len(shared) == 1 else module
        elif service[item]:
            groups[item] = service[item]
    return groups


def _service(item: pytest.Item) -> str | None:
    names = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("slurm") is not None:  # the bench of backend slurm asks for the cluster when it runs
        names.add("slurm")
    return next((group for fixture, group in SERVICES.items() if fixture in names), None)


def _uses_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for chain in info.name2fixturedefs.values() for d in chain)


#: Before torch is imported anywhere, for this process and every process it starts: the tensors are tiny, and on
#: two cores shared by four workers a second OpenMP thread only spins (inventories/local.yaml sets it for its jobs).
THREADS = {"OMP_NUM_THREADS": "1"}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", BACKENDS_MARKER)
    os.environ.update(THREADS)
    collector.tune()  # a worker imports torch, transformers and SpecForge, as a stage does
    # Some machines set PYTHONDONTWRITEBYTECODE: without it, Python caches bytecode as on a user's laptop and host,
    # and not every `inv`, job and host command compiles aerie's modules again. The controller compiles the
    # checkout once, before a worker copies it (`copy_checkout` keeps the bytecode).
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    if not hasattr(config, "workerinput"):
        compile_checkout()
    # Before pytest-socket reads its options: loopback only, whatever the command line says.
    if config.getoption("--force-enable-socket"):
        raise pytest.UsageError("aerie's tests reach loopback only: --force-enable-socket is refused")
    config.option.allow_hosts = LOOPBACK_HOSTS
    config.option.allow_unix_socket = True


@pytest.fixture(scope="session", autouse=True)
def hermetic_environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Loopback-only, offline, and blind to the user's home; yields what sessions on the test sshd get."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ssh").mkdir(mode=0o700)
    guard = tmp_path_factory.mktemp("guard")
    (guard / "sitecustomize.py").write_text(SUBPROCESS_GUARD)
    python_path = os.pathsep.join(filter(None, [str(guard), os.environ.get("PYTHONPATH")]))
    shared = {LOOPBACK_ONLY_ENV: "1", "PYTHONPATH": python_path, **OFFLINE}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**shared, "HOME": str(home), "no_proxy": "*", "NO_PROXY": "*"}.items():
            patch.setenv(name, value)
        for name in (*PROXY_VARIABLES, "SSH_AUTH_SOCK"):
            patch.delenv(name, raising=False)
        yield {**shared, "PYTHONPATH": str(guard)}


def _share_validations(checkout: Path, shared: Path) -> None:
    """The checkout's validation cache is the session's: a sample, prep code, tokenizer and settings that passed
    in one test's deploy are not validated again in the next (each entry is keyed by all of them, see
    local/validation/cache.py). The tests of validation itself, and of the cache, keep a cache of their own."""
    from local.validation.cache import CACHE, REPO

    shared.mkdir(exist_ok=True)
    link = checkout / CACHE.relative_to(REPO)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(shared, target_is_directory=True)


def _openssh_or_skip() -> None:
    need(require_openssh, SshServerError, "a real sshd")


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory, hermetic_environment: dict[str, str]) -> Iterator[SshServer]:
    """One real OpenSSH server on 127.0.0.1 for the whole session (one per xdist worker)."""
    _openssh_or_skip()
    server = start_server(tmp_path_factory.mktemp("sshd"), environment=hermetic_environment)
    yield server
    server.stop()


@pytest.fixture
def ssh_server_factory(tmp_path: Path, hermetic_environment: dict[str, str]) -> Iterator[Callable[..., SshServer]]:
    """Start extra servers for one test, each with its own host key, stopped afterwards.

    `ssh_server_factory(identity=sshd.identity)` accepts the session server's client key,
    so a refusal can only come from the host key.
    """
    _openssh_or_skip()
    servers: list[SshServer] = []

    def start(identity: Path | None = None) -> SshServer:
        server = start_server(tmp_path / f"sshd-{len(servers)}", identity=identity, environment=hermetic_environment)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on: connecting to it is refused at once."""
    return _free_port()


BACKENDS_MARKER = ("backends(*names, **host_settings): each test of it that takes `bench` runs once per backend "
                   "(local, ssh, slurm); a keyword named after a backend holds `host:` keys for that one only, any "
                   "other keyword `host:` keys for all")


def _backends(marker: pytest.Mark | None) -> list[tuple[str, dict[str, Any]]]:
    """The `backends` marker's backends, each with its `host:` keys; none: the local backend alone."""
    if marker is None:
        return [("local", {})]
    shared = {key: value for key, value in marker.kwargs.items() if key not in marker.args}
    return [(name, {**shared, **marker.kwargs.get(name, {})}) for name in marker.args]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`bench` once per backend of the test's `backends` marker (its module's `pytestmark`, or its own)."""
    choices = _backends(metafunc.definition.get_closest_marker("backends"))
    if "bench" in metafunc.fixturenames and len(choices) > 1:
        params = [pytest.param(choice, id=choice[0], marks=[pytest.mark.slurm] if choice[0] == "slurm" else [])
                  for choice in choices]
        metafunc.parametrize("bench", params, indirect=True)


@pytest.fixture
def bench(request: pytest.FixtureRequest, tmp_path: Path) -> Bench:
    """A private copy of the checkout and an empty host root, on the local backend unless the test's
    `backends` marker names others; the ssh backend rides the session's sshd, slurm its cluster."""
    backend, host_settings = getattr(request, "param", None) or _backends(request.node.get_closest_marker("backends"))[0]
    sshd = request.getfixturevalue("sshd") if backend == "ssh" else None
    made = Bench(copy_checkout(tmp_path / "checkout"), tmp_path / "root", backend, sshd, host_settings=dict(host_settings))
    _share_validations(made.checkout, session_root(request) / "validations")
    if backend == "slurm":  # jobs sbatched on the test cluster; the login node is this machine
        made.slurm = request.getfixturevalue("slurm")
    return made
