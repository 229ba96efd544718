"""The `slurm` fixture: one real single-node Slurm cluster per test session (per xdist worker).

Import it into a test module (``from tests.slurm_fixtures import slurm``) or into
conftest.py. However many modules import it, the session starts one cluster:
it is kept in the pytest config's stash and stopped when the session ends.
"""

from __future__ import annotations

import pytest

from tests.needs import need
from benchmarks.harness.slurm_cluster import SlurmCluster, SlurmClusterError, require_slurm, start_cluster

_CLUSTER = pytest.StashKey[SlurmCluster]()


def slurm_or_skip() -> None:
    need(require_slurm, SlurmClusterError, "a real Slurm cluster")


@pytest.fixture(scope="session")
def slurm(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, hermetic_environment: dict[str, str]
) -> SlurmCluster:
    """munged + slurmctld + slurmd on 127.0.0.1; clients need `slurm.env` (SLURM_CONF).

    Started inside the hermetic environment, so jobs inherit its loopback guard.
    """
    cluster = request.config.stash.get(_CLUSTER, None)
    if cluster is None:
        slurm_or_skip()
        cluster = start_cluster(tmp_path_factory.mktemp("slurm"))
        request.config.stash[_CLUSTER] = cluster
        request.config.add_cleanup(cluster.stop)
    return cluster
