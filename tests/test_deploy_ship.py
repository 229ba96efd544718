"""What `inv deploy` sends and keeps (issue 29): the user's own files beside remote/ (`deploy.ship`), and the
releases it prunes to `deploy.keep`, never the live one nor one a running job runs from."""

from __future__ import annotations

import pytest

from benchmarks.harness.checkout import SCRIPTED, Bench

pytestmark = pytest.mark.e2e


def releases(bench: Bench) -> set[str]:
    return {p.name for p in (bench.root / "releases").iterdir() if not p.name.startswith(".")}


def live(bench: Bench) -> str:
    return (bench.root / "current").resolve().name


def test_deploy_ships_the_files_the_inventory_names_and_a_dry_run_lists_them(bench: Bench) -> None:
    scripts = bench.checkout / "scripts"
    scripts.mkdir()
    (scripts / "hello.py").write_text("print('hello from the host')\n")
    bench.inventory({"A": {"source": "x", "kind": "native"}}, deploy={"ship": ["scripts"]})

    dry = bench.inv("deploy", "--dry-run")
    assert "  add    scripts/hello.py" in dry.stdout
    assert "it sends remote/, inventories/samples/ and deploy.ship: scripts." in dry.stdout
    assert not (bench.root / "current").exists()

    bench.inv("deploy")
    shipped = bench.root / "current" / "scripts" / "hello.py"
    assert shipped.read_text() == "print('hello from the host')\n"
    (scripts / "hello.py").write_text("print('changed')\n")
    assert "  change scripts/hello.py" in bench.inv("deploy").stdout  # sent again only when it changed


def test_a_shipped_path_that_is_not_in_the_checkout_is_one_line(bench: Bench) -> None:
    bench.inventory({"A": {"source": "x", "kind": "native"}}, deploy={"ship": ["scripts/nope.py"]})
    done = bench.inv("deploy", check=False)
    assert done.returncode == 2
    assert done.stderr.strip().startswith("aerie: deploy.ship: 'scripts/nope.py' is not in the checkout")
    bench.inventory({"A": {"source": "x", "kind": "native"}}, deploy={"ship": ["../elsewhere"]})
    outside = bench.inv("deploy", check=False)
    assert outside.returncode == 2 and "deploy.ship: '../elsewhere' is not a path inside the checkout" in outside.stderr


def test_deploy_prunes_to_deploy_keep_but_never_the_live_release_nor_one_a_running_job_runs_from(bench: Bench) -> None:
    marker = bench.checkout / "remote" / "demo" / "deploy_marker.py"

    def deploy_a_change(n: int) -> str:
        marker.write_text(f"DEPLOY = {n}\n")  # other files each time: a release of its own
        bench.inv("deploy")
        return live(bench)

    bench.inventory({"A": {"source": "records=1 sleep=60", "kind": "native"}},
                    {"prep": {"command": f"{{python}} {SCRIPTED}"}}, deploy={"keep": 2})
    first = deploy_a_change(0)
    bench.inv("launch", "--stage", "prep")
    bench.wait_state("A/prep", {"running"})
    later = [deploy_a_change(n) for n in range(1, 4)]

    assert releases(bench) == {first, later[-2], later[-1]}  # the running job's, and the newest two
    assert live(bench) == later[-1]

    bench.inv("stop", "-d", "A")
    marker.write_text("DEPLOY = 4\n")
    done = bench.inv("deploy")
    assert "removed 2 older releases (deploy.keep: 2)" in done.stdout
    assert releases(bench) == {later[-1], live(bench)}  # its job ended: the first release went too
