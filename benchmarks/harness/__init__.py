"""What the benchmarks and the tests share: the real parts they run against.

A loopback OpenSSH server (`sshd`), a one-node Slurm cluster (`slurm_cluster`), the tasks run from a
copy of the checkout as a user runs them (`checkout`), the scripted stage (`scripted_stage`), the
tiny model's real server and the infer stage's files (`infer_servers`), a server that saturates
(`saturating_server`); and how the benchmarks time two commands in turn (`pairing`), one of them in a
checkout of another commit (`ref_checkout`). pytest fixtures in `tests/` wrap these; nothing here imports `tests/`.
"""
